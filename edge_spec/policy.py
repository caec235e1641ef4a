"""k policies: per step, which draft source to use and how many tokens to draft (k, down to 0).

The engine asks `plan()` before each step, lets a model draft stop early through
`keep_drafting()`, and reports every step's outcome to `update()`. The same objects drive
`edge-spec simulate`, which replays recorded acceptance traces against device cost curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

SourceName = Literal["model", "ngram", "none"]


@dataclass(frozen=True)
class CostCurve:
    """What a step costs on one device for one model pair, in seconds.

    verify_s[n - 1] is one target pass over a batch of n tokens (n = 1..len(verify_s)); longer
    batches extrapolate linearly from the last two points. draft_token_s is one draft-model
    decode of a single token; ngram_s one n-gram lookup.
    """

    verify_s: tuple[float, ...]
    draft_token_s: float = 0.0
    ngram_s: float = 2e-5

    def t(self, n: int) -> float:
        """Seconds for a target pass over n >= 1 tokens."""
        if n <= len(self.verify_s):
            return self.verify_s[n - 1]
        last, prev = self.verify_s[-1], self.verify_s[-2] if len(self.verify_s) > 1 else 0.0
        return last + (n - len(self.verify_s)) * max(last - prev, 0.0)

    @property
    def c(self) -> float:
        """Draft cost ratio: one draft token over one plain target step."""
        return self.draft_token_s / self.verify_s[0]


@dataclass(frozen=True)
class NgramCandidate:
    """What the n-gram lookup could propose this step (computed before planning: it is cheap)."""

    tokens: tuple[int, ...]
    match_len: int  # length of the suffix n-gram that matched (0: no match)


@dataclass(frozen=True)
class StepPlan:
    source: SourceName
    k: int  # draft at most k tokens (0: a plain target step)


@dataclass(frozen=True)
class StepOutcome:
    source: SourceName
    n_drafted: int
    n_accepted: int
    confidences: tuple[float, ...]  # the draft's probability of each drafted token (model only)
    match_len: int  # n-gram source: the matched n-gram length; else 0
    draft_s: float
    verify_s: float


class KPolicy(Protocol):
    name: str

    def begin(self) -> None:
        """A new request starts (estimates may carry over; per-request state resets)."""

    def plan(
        self, sources: Sequence[SourceName], k_cap: int, ngram: NgramCandidate | None
    ) -> StepPlan:
        """Requires k_cap >= 0 and 'none' in sources; returns a plan with k <= k_cap, k <=
        len(ngram.tokens) for the n-gram source, and a source from `sources`."""

    def keep_drafting(self, i: int, confidence: float) -> bool:
        """After the model draft proposed token i (0-based) with this probability: draft i + 1?"""

    def update(self, outcome: StepOutcome) -> None:
        """What the step's plan produced."""
