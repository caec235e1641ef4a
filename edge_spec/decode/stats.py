"""Per-request statistics: acceptance (overall and per draft position) and the time split."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from edge_spec.decode.engine import Prefill, Step


@dataclass(frozen=True)
class GenerationStats:
    """tokens_per_s counts generated tokens over the decode time (total minus prefill);
    time_to_first_token_s includes the prefill. other_s is what is neither drafting, verifying
    nor prefill: detokenizing, stop-string checks, bookkeeping. decode_s is the time inside
    llama_decode after the prefill (target and draft model); overhead_s is everything else
    after the prefill -- lookups, planning, sampling, verification, text -- the orchestration
    the runtime adds to the models' own work."""

    n_prompt_tokens: int
    n_cached_tokens: int
    n_generated: int
    n_steps: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float  # n_accepted / n_drafted (0 when nothing was drafted)
    mean_accepted_per_step: float  # accepted draft tokens per step
    tokens_per_step: float  # tokens produced per target pass (accepted + the target's own)
    # How often draft position i was proposed (by a chain, or by any branch of a token tree)
    # and accepted.
    drafted_per_position: tuple[int, ...]
    accepted_per_position: tuple[int, ...]
    acceptance_per_position: tuple[float, ...]  # their ratio
    steps_by_source: dict[str, int]  # which source drafted each step ("none": a plain step)
    drafted_by_source: dict[str, int]  # draft tokens proposed, per source
    accepted_by_source: dict[str, int]  # draft tokens accepted, per source
    k_chosen: tuple[int, ...]  # histogram: how many steps the policy planned k = 0, 1, 2, ...
    tokens_per_s: float
    time_to_first_token_s: float
    prefill_s: float
    draft_s: float
    verify_s: float
    other_s: float
    total_s: float
    decode_s: float = 0.0
    overhead_s: float = 0.0
    n_tree_steps: int = 0  # steps that verified a token tree
    n_branch_drafted: int = 0  # of n_drafted, the trees' branch tokens
    n_branch_accepted: int = 0  # of n_accepted, the tokens accepted along a branch
    # Under a grammar: the time spent on its masks, checks and forced text (llguidance)
    constraint_s: float = 0.0
    # Draft sources that failed and were set aside for the rest of the request: name -> error
    sources_set_aside: dict[str, str] = field(default_factory=dict)
    # The steps that drafted nothing: how many, their time, and of it the time outside
    # llama_decode (lookup, planning, sampling): what a request that never drafts pays.
    n_plain_steps: int = 0
    plain_s: float = 0.0
    plain_overhead_s: float = 0.0

    @property
    def overhead_per_step_s(self) -> float:
        return self.overhead_s / self.n_steps if self.n_steps else 0.0

    @property
    def overhead_fraction(self) -> float:
        """Orchestration overhead over the wall time after the prefill."""
        decode_wall_s = self.total_s - self.prefill_s
        return self.overhead_s / decode_wall_s if decode_wall_s > 0 else 0.0

    @property
    def plain_overhead_fraction(self) -> float:
        """Orchestration overhead over the time of the steps that drafted nothing."""
        return self.plain_overhead_s / self.plain_s if self.plain_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        out["overhead_per_step_s"] = self.overhead_per_step_s
        out["overhead_fraction"] = self.overhead_fraction
        out["plain_overhead_fraction"] = self.plain_overhead_fraction
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> GenerationStats:
        """The inverse of to_dict (the `stats` of `edge-spec generate --json`)."""
        kept = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        for name, value in kept.items():
            if isinstance(value, list):
                kept[name] = tuple(value)
        return cls(**kept)  # type: ignore[arg-type]


class StatsCollector:
    """Accumulates Prefill and Step events for one request."""

    def __init__(self, source_names: Mapping[str, str] | None = None) -> None:
        # What each policy slot holds, as reported ("model" -> "head" when a head drafts there).
        self._names = dict(source_names or {})
        self._t_start = time.perf_counter()
        self._first_token_s: float | None = None
        self.n_prompt_tokens = 0
        self.n_cached = 0
        self.prefill_s = 0.0
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.n_steps = 0
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.steps_by_source: dict[str, int] = {}
        self.drafted_by_source: dict[str, int] = {}
        self.accepted_by_source: dict[str, int] = {}
        self.decode_s = 0.0
        self.k_chosen: list[int] = []
        self.n_drafted = self.n_accepted = 0
        self.n_tree_steps = self.n_branch_drafted = self.n_branch_accepted = 0
        self.sources_set_aside: dict[str, str] = {}
        self.n_plain_steps = 0
        self.plain_s = self.plain_overhead_s = 0.0

    def prefill(self, event: Prefill) -> None:
        self.n_cached = event.n_cached
        self.prefill_s += event.prefill_s
        self._set_aside(event.set_aside)

    def _set_aside(self, failures: tuple[tuple[str, str], ...]) -> None:
        for slot, reason in failures:
            self.sources_set_aside[self._names.get(slot, slot)] = reason

    def step(self, event: Step) -> None:
        self._set_aside(event.set_aside)
        if self._first_token_s is None:
            self._first_token_s = time.perf_counter() - self._t_start
        self.n_steps += 1
        self.draft_s += event.draft_s
        self.verify_s += event.verify_s
        self.decode_s += event.decode_s
        if event.n_drafted == 0:
            self.n_plain_steps += 1
            self.plain_s += event.draft_s + event.verify_s
            self.plain_overhead_s += event.draft_s + event.verify_s - event.decode_s
        source = self._names.get(event.source, event.source)
        self.steps_by_source[source] = self.steps_by_source.get(source, 0) + 1
        # A grammar's forced text is its own source's draft, ahead of the step's source.
        for name, drafted, accepted in (
            ("grammar", event.n_forced, event.n_forced_accepted),
            (source, event.n_drafted - event.n_forced, event.n_accepted - event.n_forced_accepted),
        ):
            if drafted:
                self.drafted_by_source[name] = self.drafted_by_source.get(name, 0) + drafted
                self.accepted_by_source[name] = self.accepted_by_source.get(name, 0) + accepted
        self.k_chosen += [0] * max(event.k_planned + 1 - len(self.k_chosen), 0)
        self.k_chosen[event.k_planned] += 1
        self.n_drafted += event.n_drafted
        self.n_accepted += event.n_accepted
        if event.n_branch_nodes:
            self.n_tree_steps += 1
            self.n_branch_drafted += event.n_branch_nodes
            self.n_branch_accepted += event.n_branch_accepted
        grow = max(event.n_positions - len(self.drafted), 0)
        self.drafted += [0] * grow
        self.accepted += [0] * grow
        for i in range(event.n_positions):
            self.drafted[i] += 1
        for i in range(event.n_accepted):
            self.accepted[i] += 1

    def result(
        self, n_prompt: int, n_generated: int, total_s: float, constraint_s: float = 0.0
    ) -> GenerationStats:
        n_drafted, n_accepted = self.n_drafted, self.n_accepted
        decode_s = max(total_s - self.prefill_s, 1e-9)
        steps = max(self.n_steps, 1)
        return GenerationStats(
            n_prompt_tokens=n_prompt,
            n_cached_tokens=self.n_cached,
            n_generated=n_generated,
            n_steps=self.n_steps,
            n_drafted=n_drafted,
            n_accepted=n_accepted,
            acceptance_rate=n_accepted / n_drafted if n_drafted else 0.0,
            mean_accepted_per_step=n_accepted / steps,
            tokens_per_step=n_generated / steps,
            drafted_per_position=tuple(self.drafted),
            accepted_per_position=tuple(self.accepted),
            acceptance_per_position=tuple(
                a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)
            ),
            steps_by_source=dict(self.steps_by_source),
            drafted_by_source=dict(self.drafted_by_source),
            accepted_by_source=dict(self.accepted_by_source),
            k_chosen=tuple(self.k_chosen),
            tokens_per_s=n_generated / decode_s,
            time_to_first_token_s=self._first_token_s or total_s,
            prefill_s=self.prefill_s,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            other_s=max(total_s - self.prefill_s - self.draft_s - self.verify_s, 0.0),
            total_s=total_s,
            decode_s=self.decode_s,
            overhead_s=max(total_s - self.prefill_s - self.decode_s, 0.0),
            n_tree_steps=self.n_tree_steps,
            n_branch_drafted=self.n_branch_drafted,
            n_branch_accepted=self.n_branch_accepted,
            constraint_s=constraint_s,
            sources_set_aside=dict(self.sources_set_aside),
            n_plain_steps=self.n_plain_steps,
            plain_s=self.plain_s,
            plain_overhead_s=max(self.plain_overhead_s, 0.0),
        )
