"""What every k policy shares: the device's cost curve, a step's plan and outcome, and the
KPolicy protocol the engine drives (plan before a step, keep_drafting during a model draft,
update after it). The policies themselves: edge_spec.policy (make_policy), .simple, .cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from edge_spec.drafts.candidates import NgramCandidate
from edge_spec.policy.trees import MAX_TREE_LEAVES

SourceName = Literal["model", "ngram", "none"]
DRAFT_SOURCES: tuple[SourceName, ...] = ("model", "ngram")


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
    # The draft model's own batch curve, like verify_s (optional: without it a draft batch is
    # taken to scale like the target's, draft_token_s * t(n) / t(1)).
    draft_verify_s: tuple[float, ...] = ()

    def t(self, n: int) -> float:
        """Seconds for a target pass over n >= 1 tokens."""
        return _curve(self.verify_s, n)

    @property
    def c(self) -> float:
        """Draft cost ratio: one draft token over one plain target step."""
        return self.draft_token_s / self.verify_s[0]

    def rel(self, n: int) -> float:
        """t(n) / t(1): how much a batch of n costs relative to one token."""
        return self.t(n) / self.verify_s[0]

    def draft_s(self, k: int, n_fresh: int = 1) -> float:
        """A model draft of k >= 1 tokens whose first decode is a batch of n_fresh tokens.

        A model draft re-decodes the context tokens its cache lacks (at least the target's last
        token) in one batch that also yields its first token, then one decode per further
        token: k decodes in all.
        """
        n_fresh = max(n_fresh, 1)
        if self.draft_verify_s:
            batch = _catch_up(self.draft_verify_s, n_fresh)
            return batch + (k - 1) * self.draft_verify_s[0]
        return self.draft_token_s * (_catch_up(self.verify_s, n_fresh) / self.verify_s[0] + k - 1)


def _catch_up(points: tuple[float, ...], n: int) -> float:
    """A batch of n tokens, where n may be far past the curve (a draft model re-decoding a
    prompt it never saw): at least the curve's average cost per token beyond the first goes on.
    Its last two points alone are noisy (a draft curve flat from 10 to 16 tokens made a
    440-token catch-up look like 38 ms; it took 690)."""
    if n <= len(points) or len(points) < 2:
        return _curve(points, n)
    average = (points[-1] - points[0]) / (len(points) - 1)
    return max(_curve(points, n), points[-1] + (n - len(points)) * average)


def _curve(points: tuple[float, ...], n: int) -> float:
    """points[n - 1], extrapolated linearly from the last two points past the end."""
    if n <= len(points):
        return points[n - 1]
    last, prev = points[-1], points[-2] if len(points) > 1 else 0.0
    return last + (n - len(points)) * max(last - prev, 0.0)


@dataclass(frozen=True)
class StepPlan:
    source: SourceName
    k: int  # draft at most k tokens (0: a plain target step)
    # n-gram source: how many tokens of each of the candidate's branches to verify with the k
    # main tokens as one token tree (token_tree); empty: a chain.
    branches: tuple[int, ...] = ()

    @property
    def tree_nodes(self) -> int:
        """The tree's branch tokens (0: a chain)."""
        return sum(self.branches)


PLAIN = StepPlan("none", 0)


@dataclass(frozen=True)
class StepOutcome:
    source: SourceName
    n_drafted: int
    n_accepted: int
    confidences: tuple[float, ...]  # the draft's probability of each drafted token (model only)
    match_len: int  # n-gram source: the matched n-gram length; else 0
    draft_s: float
    verify_s: float
    # The tokens the step produced (accepted draft tokens, then the target's token). Optional:
    # when given, the cost model scores the step's n-gram candidate against them for free.
    tokens: tuple[int, ...] = ()
    # A token tree: how many of the n_drafted tokens were branch nodes (beyond the main
    # path), and how many of the accepted tokens came from a branch.
    n_branch_nodes: int = 0
    n_branch_accepted: int = 0
    branch_weight: float = 0.0  # the branch nodes' summed Branch.weights (what was expected)
    # Seconds spent loading a draft model on first use for this step (measured; not in draft_s).
    load_s: float = 0.0


def model_lag_after(n_fresh: int, outcome: StepOutcome) -> int:
    """How many tokens a model draft's first decode will cover after `outcome` (1: only the
    target's new token). After a model draft of d tokens the draft's cache holds all but the
    last drafted token; other steps add their tokens to what it lacks."""
    if outcome.source == "model" and outcome.n_drafted > 0:
        return 2 if outcome.n_accepted == outcome.n_drafted else 1
    return n_fresh + outcome.n_accepted + 1


class KPolicy(Protocol):
    name: str
    # The most branch tokens a plan may add to a draft (0: chains only): the engine asks the
    # n-gram lookup for branches, and a learned draft's alternates, only then.
    tree_nodes: int

    def wants_model(self, model_lag: int = 1, model_load_s: float = 0.0) -> bool:
        """Asked before begin(): whether the model draft is likely to draft enough in the
        coming request to pay for prefilling the model_lag tokens of the prompt it lacks (and
        for loading it first: model_load_s, 0 when it is loaded). The engine prefills the
        draft model only then; otherwise the draft's first proposal catches up, a cost the
        policy weighs (begin's model_lag)."""

    def begin(self, model_lag: int = 1, model_load_s: float = 0.0) -> None:
        """A new request starts (estimates may carry over; per-request state resets).
        model_lag: how many tokens the model draft's first decode would cover (1 when its
        cache holds the prompt); model_load_s: what loading the draft model would cost before
        its first draft (0 when it is loaded)."""

    def plan(
        self, sources: Sequence[SourceName], k_cap: int, ngram: NgramCandidate | None
    ) -> StepPlan:
        """Requires k_cap >= 0 and 'none' in sources; returns a plan with k <= k_cap, k <=
        len(ngram.tokens) for the n-gram source, and a source from `sources`."""

    def keep_drafting(self, i: int, confidence: float) -> bool:
        """After the model draft proposed token i (0-based) with this probability: draft i + 1?"""

    def alternates(
        self,
        confidences: Sequence[float],
        alternates: Sequence[tuple[int, int, float]],
        budget: int,
        max_leaves: int = MAX_TREE_LEAVES,
    ) -> tuple[int, ...]:
        """After a learned draft proposed a chain (its tokens' confidences) and offered
        runner-up candidates (Draft.alternates): which to verify beside the chain as one-token
        branches of a token tree (indices into alternates; empty: the chain alone), at most
        `budget` of them and max_leaves - 1."""

    def update(self, outcome: StepOutcome) -> None:
        """What the step's plan produced."""


def expected_tokens(alphas: Sequence[float]) -> float:
    """Tokens one step yields when drafting len(alphas) tokens, alphas[i] being P(token i is
    accepted | tokens < i were): E(k) = 1 + sum_j prod_{i <= j} alphas[i]. With a constant alpha
    this is (1 - alpha^(k+1)) / (1 - alpha)."""
    total, reach = 1.0, 1.0
    for alpha in alphas:
        reach *= alpha
        total += reach
    return total


DEFAULT_TREE_NODES = 8  # the cost policy's cap on a token tree's branch tokens
# The adaptive policies' cap on k (GenerationConfig.k_max, the CLI's --k-max). The profile
# measures t(n) up to n = 16; longer batches are extrapolated from its last two points and
# corrected online once chosen. Long copies (an agent re-emitting a file) pay up to 32:
# replayed on the agentic sessions 2.44x -> 2.56x (scripts/replay_ngram.py FOLDER --k-max 32,
# in git history),
# neutral on the 48-prompt benches.
DEFAULT_K_MAX = 32
