"""How far this build's batched logits move from its one-token logits, per batch size.

Verification decodes k + 1 tokens in one pass; the target alone decodes one. Where a build's
kernels sum a dot product in another order for a batch than for one token (tinyBLAS on a CPU
beyond the project's small-batch kernel; on CUDA as llama.cpp ships, a warp count that changes
with the number of columns, tensor-core kernels for attention's products, tiled kernels beyond 8
columns; a CUDA build with scripts/patches/cuda/ avoids them, docs/gpu.md), a position's logits
differ slightly between the two, and a greedy choice or a seeded draw can move where two tokens
are closer than that difference. This measures it: a fixed text, each position decoded alone
(twice, to see whether one-token passes repeat bit for bit), then in batches of n, and per n the
largest change of a logit, the largest change of a logit difference within a row (what can flip
a choice) and how many greedy choices moved. `edge-spec profile --deviation` prints it; the
exactness tests allow a greedy divergence only at a tie closer than what they measure the same
way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge_spec.backend import LlamaModel, cuda_batch_invariant, supports_gpu_offload

TEXT = (
    "The water cycle, explained for a school textbook. Water evaporates from the oceans, rises "
    "as vapour, cools into clouds and falls again as rain or snow. Rivers carry it back to the "
    "sea, and the cycle begins again. Plants return water to the air through their leaves."
)
BATCH_SIZES = (2, 3, 4, 5, 8, 12, 16)
PREFIX = 8  # tokens decoded once before the compared positions
KV_PAD_CELLS = 256  # llama.cpp pads the attended KV view to a multiple of this many cells
BOUNDARY_BATCH = 8  # the batch measured across that step: a verification of 7 drafted tokens
# GGML_CUDA_BATCH_INVARIANT as the patched CUDA library reports it (1: "on")
CUDA_INVARIANCE = {
    0: "off (GGML_CUDA_BATCH_INVARIANT=0)",
    2: "on, quantized weights through mul_mat_q (=2)",
}


@dataclass(frozen=True)
class BatchDeviation:
    """One batch size against one-token passes, over the same positions."""

    n: int  # tokens per decode
    rows: int  # positions compared
    max_logit_change: float
    max_gap_change: float  # the largest change of a difference of two logits in one row
    argmax_moved: int  # positions whose greedy choice differs


@dataclass(frozen=True)
class Numerics:
    """A model's batch deviation on this build and device."""

    model: str  # file name
    n_gpu_layers: int  # as asked
    offload_build: bool  # the build can offload (else every layer ran on the CPU)
    alone_repeatable: bool  # two one-token passes over the text gave identical logits
    batches: tuple[BatchDeviation, ...]
    cuda_batch_invariant: int | None = None  # backend.cuda_batch_invariant(); None: not there
    # A batch across the KV view's first 256-cell step; None where n_ctx has no such step.
    boundary: BatchDeviation | None = None

    @property
    def worst_gap_change(self) -> float:
        measured = [*self.batches, *([self.boundary] if self.boundary else [])]
        return max((b.max_gap_change for b in measured), default=0.0)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "n_gpu_layers": self.n_gpu_layers,
            "offload_build": self.offload_build,
            "alone_repeatable": self.alone_repeatable,
            "cuda_batch_invariant": self.cuda_batch_invariant,
            "worst_gap_change": self.worst_gap_change,
            "batches": [b.__dict__ for b in self.batches],
            "boundary": self.boundary.__dict__ if self.boundary else None,
        }


def _alone_rows(model: LlamaModel, ids: Sequence[int], prefix: int = PREFIX) -> np.ndarray:
    """The logits of ids[prefix:] decoded one at a time after ids[:prefix] (cached)."""
    model.truncate(prefix)
    return np.stack([model.decode([t], [0])[0].copy() for t in ids[prefix:]])


def _batched_rows(
    model: LlamaModel, ids: Sequence[int], n: int, prefix: int = PREFIX
) -> np.ndarray:
    """The same rows decoded in batches of n."""
    model.truncate(prefix)
    rows = []
    for start in range(prefix, len(ids), n):
        chunk = ids[start : start + n]
        rows.append(model.decode(chunk, range(len(chunk))).copy())
    return np.concatenate(rows)


def _boundary(model: LlamaModel, ids: Sequence[int], n: int) -> BatchDeviation | None:
    """One batch of n tokens whose first half lies before the KV view's first 256-cell step and
    whose second half after it, against the same tokens decoded one at a time (the text
    repeated to reach it); None where the context ends before that step."""
    if model.n_ctx < KV_PAD_CELLS + n or model.n_batch < n:
        return None
    start = KV_PAD_CELLS - n // 2
    window = (list(ids) * (KV_PAD_CELLS // len(ids) + 2))[: start + n]
    model.reset()
    model.decode(window[:start])
    alone = _alone_rows(model, window, start)
    return deviation(alone, _batched_rows(model, window, n, start), n)


def deviation(alone: np.ndarray, batched: np.ndarray, n: int) -> BatchDeviation:
    """The comparison of two (positions, vocabulary) logit arrays."""
    delta = batched.astype(np.float64) - alone.astype(np.float64)
    return BatchDeviation(
        n=n,
        rows=len(alone),
        max_logit_change=float(np.abs(delta).max()),
        max_gap_change=float((delta.max(axis=1) - delta.min(axis=1)).max()),
        argmax_moved=int((alone.argmax(axis=1) != batched.argmax(axis=1)).sum()),
    )


def measure(
    model: LlamaModel,
    n_gpu_layers: int,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    text: str = TEXT,
) -> Numerics:
    """The batch deviation of `model` (as loaded with `n_gpu_layers`, which the result
    records) over `text`, and of a batch of BOUNDARY_BATCH across the KV view's first 256-cell
    step where the model's context reaches past it."""
    if any(n < 2 or n > model.n_batch for n in batch_sizes):
        raise ValueError(f"batch sizes must be 2..{model.n_batch}, got {list(batch_sizes)}")
    ids = model.tokenize(text)
    if len(ids) < PREFIX + max(batch_sizes, default=2):
        raise ValueError(f"the text ({len(ids)} tokens) is too short for these batch sizes")
    if len(ids) + 1 > model.n_ctx:
        raise ValueError(f"the text ({len(ids)} tokens) does not fit n_ctx {model.n_ctx}")
    model.reset()
    model.decode(ids[:PREFIX])
    alone = _alone_rows(model, ids)
    repeatable = bool(np.array_equal(alone, _alone_rows(model, ids)))
    batches = tuple(deviation(alone, _batched_rows(model, ids, n), n) for n in batch_sizes)
    boundary = _boundary(model, ids, BOUNDARY_BATCH)
    model.reset()
    return Numerics(
        model.path.name,
        n_gpu_layers,
        supports_gpu_offload(),
        repeatable,
        batches,
        cuda_batch_invariant(),
        boundary,
    )


def format_numerics(numerics: Numerics) -> str:
    """The table `edge-spec profile --deviation` prints."""
    offload = "every layer" if numerics.n_gpu_layers < 0 else f"{numerics.n_gpu_layers} layers"
    if not numerics.offload_build:
        offload = "none (a CPU build)"
    lines = [
        f"batched logits against one-token logits: {numerics.model}, GPU offload {offload}; "
        f"one-token passes repeat bit for bit: {'yes' if numerics.alone_repeatable else 'no'}",
    ]
    if numerics.cuda_batch_invariant is not None:
        state = CUDA_INVARIANCE.get(numerics.cuda_batch_invariant, "on")
        lines.append(f"CUDA batch invariance (scripts/patches/cuda/): {state}")
    lines.append(" n  rows  max |Δ logit|  max |Δ gap|  greedy moved")

    def row(b: BatchDeviation) -> str:
        return (
            f"{b.n:>2}  {b.rows:>4}  {b.max_logit_change:>13.4g}  {b.max_gap_change:>11.4g}  "
            f"{b.argmax_moved:>12}"
        )

    lines.extend(row(b) for b in numerics.batches)
    across = numerics.boundary
    if across is not None:
        lines.append(f"{row(across)}  across the KV view's {KV_PAD_CELLS}-cell step")
    moved = [str(b.n) for b in numerics.batches if b.max_gap_change > 0]
    if across is not None and across.max_gap_change > 0:
        moved.append(f"{across.n} across {KV_PAD_CELLS} cells")
    if not moved:
        lines.append("Bit-exact at every batch size measured: drafting cannot move a choice.")
    else:
        lines.append(
            f"Batches of {', '.join(map(str, moved))} move logits: a greedy choice (or a seeded "
            "draw) can move where two tokens are closer than Δ gap."
        )
    return "\n".join(lines)
