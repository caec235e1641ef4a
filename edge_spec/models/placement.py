"""Placement and memory: will the target, the draft and their KV caches fit, and where?

From a memory budget (free RAM by default, or the user's) the planner decides n_gpu_layers for
target and draft and checks the context's KV size, before anything is loaded. When the pair
cannot fit it refuses with a message that says what to change. On a CPU build the layer plan is
trivial (everything in RAM) but the budget check is real: llama.cpp would otherwise fail late,
or the OS would start swapping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edge_spec.errors import EdgeSpecError, InvalidRequestError
from edge_spec.gguf.facts import GgufFacts, read_facts

MIB = 1 << 20
# Compute buffers and logit rows beyond weights and KV: measured here as ~14 MiB (SmolLM2,
# 49k vocab) and ~40 MiB (Gemma-3, 262k vocab) at 4096 context; budget generously above that.
OVERHEAD_BASE_BYTES = 32 * MIB
OVERHEAD_LOGIT_ROWS = 64
HEADROOM_FRACTION = 0.10
HEADROOM_MIN_BYTES = 256 * MIB


class PlacementError(EdgeSpecError):
    """The models cannot be placed within the memory budget."""


@dataclass(frozen=True)
class ModelPlacement:
    name: str
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    n_layer: int
    n_gpu_layers: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes


@dataclass(frozen=True)
class PlacementPlan:
    target: ModelPlacement
    draft: ModelPlacement | None
    n_ctx: int
    ram_budget_bytes: int
    vram_budget_bytes: int | None
    headroom_bytes: int
    ram_needed_bytes: int
    vram_needed_bytes: int
    remote_needed_bytes: int = 0  # the target's layers on RPC servers

    def describe(self) -> str:
        parts = [f"target {self.target.total_bytes / MIB:.0f} MiB"]
        if self.draft is not None:
            parts.append(f"draft {self.draft.total_bytes / MIB:.0f} MiB")
        where = (
            f", {self.vram_needed_bytes / MIB:.0f} MiB on the GPU" if self.vram_needed_bytes else ""
        )
        if self.remote_needed_bytes:
            where += f", {self.remote_needed_bytes / MIB:.0f} MiB on the RPC servers"
        return (
            f"{' + '.join(parts)} at n_ctx={self.n_ctx}: {self.ram_needed_bytes / MIB:.0f} MiB of "
            f"RAM{where}, budget {self.ram_budget_bytes / MIB:.0f} MiB "
            f"(headroom {self.headroom_bytes / MIB:.0f} MiB)"
        )


def parse_size(text: str) -> int:
    """'800M', '2G', '1.5GiB', '1048576' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not match:
        raise InvalidRequestError(f"cannot read a memory size from {text!r} (try 800M or 2G)")
    value, unit = float(match.group(1)), match.group(2)
    return int(value * (1 << (10 * " kmgt".index(unit or " "))))


def free_ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _model(facts: GgufFacts, name: str, n_ctx: int, n_gpu_layers: int) -> ModelPlacement:
    return ModelPlacement(
        name=name,
        weights_bytes=facts.file_size_bytes,
        kv_bytes=facts.kv_bytes(n_ctx),
        overhead_bytes=OVERHEAD_BASE_BYTES + OVERHEAD_LOGIT_ROWS * facts.n_vocab * 4,
        n_layer=facts.n_layer,
        n_gpu_layers=n_gpu_layers,
    )


def plan_placement(
    target_path: Path,
    draft_path: Path | None,
    *,
    n_ctx: int,
    ram_budget_bytes: int | None = None,
    vram_budget_bytes: int | None = None,
    remote_budget_bytes: int | None = None,
) -> PlacementPlan:
    """Requires GGUF paths; returns a plan that fits the budget with headroom, or raises
    PlacementError naming what to change. vram_budget_bytes None means no GPU offload: every
    layer stays in RAM. With a GPU budget, the draft goes on the GPU first (it runs k times per
    step), then as many target layers as fit; what does not fit stays in RAM.
    remote_budget_bytes: the free memory the target's RPC servers report; the target's layers
    and their KV go there (all of them, or PlacementError), the rest stays here."""
    target = read_facts(target_path)
    draft = read_facts(draft_path) if draft_path is not None else None
    n_ctx = min(n_ctx, target.n_ctx_train or n_ctx)
    budget = free_ram_bytes() if ram_budget_bytes is None else ram_budget_bytes
    headroom = max(int(budget * HEADROOM_FRACTION), min(HEADROOM_MIN_BYTES, budget // 4))

    t_place = _model(target, "target", n_ctx, 0)
    d_place = _model(draft, "draft", n_ctx, 0) if draft else None
    vram_needed = 0
    if vram_budget_bytes:
        free_vram = vram_budget_bytes - max(int(vram_budget_bytes * HEADROOM_FRACTION), 64 * MIB)
        if d_place is not None and draft is not None and d_place.total_bytes <= free_vram:
            d_place = _model(draft, "draft", n_ctx, draft.n_layer)
            free_vram -= d_place.total_bytes
            vram_needed += d_place.total_bytes
        per_layer = target.layer_bytes() + target.kv_bytes(n_ctx) // max(target.n_layer, 1)
        layers = min(target.n_layer, max(free_vram, 0) // max(per_layer, 1))
        t_place = _model(target, "target", n_ctx, int(layers))
        vram_needed += int(layers) * per_layer

    remote_needed = 0
    if remote_budget_bytes is not None:
        per_layer = target.layer_bytes() + target.kv_bytes(n_ctx) // max(target.n_layer, 1)
        remote_needed = per_layer * target.n_layer
        if remote_needed > remote_budget_bytes:
            raise PlacementError(
                f"the target's {target.n_layer} layers need {remote_needed / MIB:.0f} MiB on the "
                f"RPC servers, which report {remote_budget_bytes / MIB:.0f} MiB free: add a "
                "server or use a smaller quantization"
            )
        t_place = _model(target, "target", n_ctx, target.n_layer)
    ram_needed = sum(p.total_bytes for p in (t_place, d_place) if p is not None)
    ram_needed -= vram_needed + remote_needed
    plan = PlacementPlan(
        t_place,
        d_place,
        n_ctx,
        budget,
        vram_budget_bytes,
        headroom,
        ram_needed,
        vram_needed,
        remote_needed,
    )
    if ram_needed + headroom > budget:
        raise PlacementError(_refusal(plan, target, draft))
    return plan


def _refusal(plan: PlacementPlan, target: GgufFacts, draft: GgufFacts | None) -> str:
    """What does not fit, and the changes that would make it fit."""
    over = plan.ram_needed_bytes + plan.headroom_bytes - plan.ram_budget_bytes
    advice = []
    kv_per_token = target.kv_bytes(1) + (draft.kv_bytes(1) if draft else 0)
    if kv_per_token:
        fits_ctx = plan.n_ctx - -(-over // kv_per_token)
        if fits_ctx >= 256:
            advice.append(f"--ctx-size {fits_ctx // 256 * 256}")
    if plan.draft is not None and plan.draft.total_bytes >= over:
        advice.append("--draft-mode ngram (no draft model)")
    advice.append(f"--mem-budget above {(plan.ram_needed_bytes + plan.headroom_bytes) / MIB:.0f}M")
    return (
        f"the models do not fit: {plan.describe()}, {over / MIB:.0f} MiB over; "
        f"try {', or '.join(advice)}"
    )
