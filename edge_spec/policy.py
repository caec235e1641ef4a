"""k policies: per step, which draft source to use and how many tokens to draft (k, down to 0).

The engine asks `plan()` before each step, lets a model draft stop early through
`keep_drafting()`, and reports every step's outcome to `update()`. The same objects drive
`edge-spec simulate`, which replays recorded acceptance traces against device cost curves.

Policies: `FixedK` (one source, one k), `HeuristicK` (transformers' +2/-1 schedule) and
`CostModelK` (edge_spec.cost_policy; its estimators are in edge_spec.estimators), which picks
(source, k) maximising expected tokens per second, E(k) / (draft cost + t(k + 1)) (Sequoia's
hardware-aware form of Leviathan's walltime factor), from online acceptance estimates and an
online-corrected device cost curve. This module holds the types they share and the baselines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

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


Consensus = Literal["one", "all", "split"]


@dataclass(frozen=True)
class Branch:
    """Another way the matched n-gram's occurrences went on: tokens that replace the main
    proposal from position `depth` on (depth 0: an alternative first token). weights[j] is the
    share of the occurrences that went on with tokens[: j + 1] there -- the empirical chance
    of reaching node j, which a token tree (SuffixDecoding's score) sums."""

    depth: int
    tokens: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class NgramCandidate:
    """What the n-gram lookup could propose this step (computed before planning: it is cheap)."""

    tokens: tuple[int, ...]
    match_len: int  # length of the suffix n-gram that matched (0: no match)
    # The matched n-gram's recent occurrences, and how many of them were followed by tokens[0]:
    # an n-gram whose occurrences all went on the same way predicts its next token far better
    # than one whose occurrences went different ways.
    n_occurrences: int = 1
    n_agreeing: int = 1
    # Where the other occurrences went different ways, heaviest first: a token tree's
    # branches (only when asked for, see NgramDraft.candidate).
    branches: tuple[Branch, ...] = ()

    @property
    def consensus(self) -> Consensus:
        """ "one" (a single occurrence), "all" (several, all agreeing) or "split"."""
        if self.n_agreeing < self.n_occurrences:
            return "split"
        return "one" if self.n_occurrences <= 1 else "all"


NO_MATCH = NgramCandidate((), 0, 0, 0)  # the n-gram lookup found nothing
MAX_TREE_LEAVES = 4  # branches per token tree (the target's context keeps one sequence each)


@dataclass(frozen=True)
class TokenTree:
    """An n-gram draft as a token tree: the first k proposal tokens as a chain, then branch
    tokens (Draft.parents' layout), with each branch token's weight."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    branch_weights: tuple[float, ...]

    @property
    def n_main(self) -> int:
        return len(self.tokens) - len(self.branch_weights)


def token_tree(
    candidate: NgramCandidate,
    k: int,
    lengths: Sequence[int],
    max_leaves: int = MAX_TREE_LEAVES,
) -> TokenTree:
    """The candidate's first k tokens as a chain, then lengths[i] tokens of its branch i: a
    branch forking at depth d hangs from main token d - 1 (from the context's last token when
    d = 0; it needs d <= k). Each branch adds a leaf; branches past max_leaves - 1 are left
    out."""
    tokens = list(candidate.tokens[:k])
    parents = list(range(-1, len(tokens) - 1))
    weights: list[float] = []
    leaves = 1
    for branch, n in zip(candidate.branches, lengths):
        if n <= 0 or branch.depth > len(tokens) or leaves >= max_leaves:
            continue
        parent = branch.depth - 1
        for token, weight in zip(branch.tokens[:n], branch.weights):
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
            weights.append(weight)
        leaves += 1
    return TokenTree(tuple(tokens), tuple(parents), tuple(weights))


def alternate_tree(
    tokens: Sequence[int], alternates: Sequence[tuple[int, int, float]], chosen: Sequence[int]
) -> TokenTree:
    """A draft chain with some of its runner-up candidates as one-token branches: alternate
    (i, token, weight) hangs from chain token i - 1 (from the context's last token when i = 0),
    beside tokens[i]. chosen: indices into alternates; one that does not fit the chain (i past
    its end, or the chain's own token) is left out."""
    out = list(tokens)
    parents = list(range(-1, len(out) - 1))
    weights: list[float] = []
    for j in chosen:
        i, token, weight = alternates[j]
        if i < len(tokens) and token != tokens[i]:
            out.append(token)
            parents.append(i - 1)
            weights.append(weight)
    return TokenTree(tuple(out), tuple(parents), tuple(weights))


def heaviest_alternates(alternates: Sequence[tuple[int, int, float]], n: int) -> tuple[int, ...]:
    """The indices of the n alternates with the highest weights, heaviest first."""
    order = sorted(range(len(alternates)), key=lambda j: -alternates[j][2])
    return tuple(order[: max(n, 0)])


def branch_lengths(
    candidate: NgramCandidate, k: int, n_nodes: int, max_leaves: int = MAX_TREE_LEAVES
) -> tuple[int, ...]:
    """Whole branches, heaviest first, up to n_nodes tokens (the fixed policy's tree): per
    branch of the candidate, how many of its tokens a tree over its first k tokens takes."""
    lengths, left, leaves = [], n_nodes, 1
    for branch in candidate.branches:
        n = 0
        if left > 0 and leaves < max_leaves and branch.depth < k:
            n = min(len(branch.tokens), left)
            left -= n
            leaves += 1
        lengths.append(n)
    return tuple(lengths)


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

    def wants_model(self, model_lag: int = 1) -> bool:
        """Asked before begin(): whether the model draft is likely to draft enough in the
        coming request to pay for prefilling the model_lag tokens of the prompt it lacks. The
        engine prefills the draft model only then; otherwise the draft's first proposal
        catches up, a cost the policy weighs (begin's model_lag)."""

    def begin(self, model_lag: int = 1) -> None:
        """A new request starts (estimates may carry over; per-request state resets).
        model_lag: how many tokens the model draft's first decode would cover (1 when its
        cache holds the prompt)."""

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


def _clamp_k(
    source: SourceName, k: int, k_cap: int, ngram: NgramCandidate | None, tree_nodes: int = 0
) -> StepPlan:
    k = min(k, k_cap)
    branches: tuple[int, ...] = ()
    if source == "ngram":
        k = min(k, len(ngram.tokens)) if ngram is not None else 0
        if ngram is not None and tree_nodes > 0:
            branches = branch_lengths(ngram, k, min(tree_nodes, k_cap - k))
            branches = branches if any(branches) else ()
    return StepPlan(source, k, branches) if k > 0 and source != "none" else PLAIN


def _pick_source(preferred: SourceName | None, sources: Sequence[SourceName]) -> SourceName:
    if preferred is not None:
        return preferred if preferred in sources else "none"
    return next((s for s in DRAFT_SOURCES if s in sources), "none")


# ---- baselines -------------------------------------------------------------------------------


class FixedK:
    """Always the same source and k (capped by k_cap and the n-gram proposal's length).
    source None: the model draft if the engine has one, else the n-gram lookup. tree_nodes:
    n-gram steps also verify up to that many branch tokens as a token tree (k_cap bounds the
    whole tree)."""

    def __init__(self, k: int, source: SourceName | None = None, tree_nodes: int = 0) -> None:
        if k < 0 or tree_nodes < 0:
            raise ValueError(f"k and tree_nodes must be >= 0, got {k}, {tree_nodes}")
        self.k = k
        self.source = source
        self.tree_nodes = tree_nodes
        self.name = f"fixed-{source or 'auto'}-{k}" if source != "none" else "none"

    def wants_model(self, model_lag: int = 1) -> bool:
        return self.k > 0 and self.source in (None, "model")

    def begin(self, model_lag: int = 1) -> None:
        pass

    def plan(
        self, sources: Sequence[SourceName], k_cap: int, ngram: NgramCandidate | None
    ) -> StepPlan:
        source = _pick_source(self.source, sources)
        return _clamp_k(source, self.k, k_cap, ngram, self.tree_nodes)

    def keep_drafting(self, i: int, confidence: float) -> bool:
        return True

    def alternates(
        self,
        confidences: Sequence[float],
        alternates: Sequence[tuple[int, int, float]],
        budget: int,
        max_leaves: int = MAX_TREE_LEAVES,
    ) -> tuple[int, ...]:
        """The heaviest alternates, up to tree_nodes of them (none for chains only)."""
        return heaviest_alternates(alternates, min(self.tree_nodes, budget, max_leaves - 1))

    def update(self, outcome: StepOutcome) -> None:
        pass


class HeuristicK(FixedK):
    """transformers' "heuristic" schedule: after a step whose drafted tokens were all accepted
    k += 2, otherwise k = max(1, k - 1); k stays within [1, k_max] and carries over requests.
    Plans like FixedK with the current k."""

    def __init__(self, k_start: int = 4, k_max: int = 8, source: SourceName | None = None) -> None:
        if not 1 <= k_start <= k_max:
            raise ValueError(f"need 1 <= k_start <= k_max, got {k_start}, {k_max}")
        super().__init__(k_start, source)
        self.k_max = k_max
        self.name = f"heuristic-{source or 'auto'}"

    def update(self, outcome: StepOutcome) -> None:
        if outcome.source == "none" or outcome.n_drafted == 0:
            return
        if outcome.n_accepted == outcome.n_drafted:
            self.k = min(self.k + 2, self.k_max)
        else:
            self.k = max(1, self.k - 1)


POLICY_NAMES = ("fixed", "heuristic", "cost")


DEFAULT_TREE_NODES = 8  # the cost policy's cap on a token tree's branch tokens
# The adaptive policies' cap on k (GenerationConfig.k_max, the CLI's --k-max). The profile
# measures t(n) up to n = 16; longer batches are extrapolated from its last two points and
# corrected online once chosen. Long copies (an agent re-emitting a file) pay up to 32:
# replayed on the agentic sessions 2.44x -> 2.56x (scripts/replay_ngram.py FOLDER --k-max 32),
# neutral on the 48-prompt benches.
DEFAULT_K_MAX = 32


def make_policy(
    name: str,
    costs: CostCurve | None,
    k: int,
    k_max: int,
    tree_nodes: int | None = None,
    model_prior: float | None = None,
    risk: Mapping[str, float] | None = None,
) -> KPolicy:
    """ "fixed": always k tokens from the model draft (else the n-gram lookup), drafts with up
    to tree_nodes branch tokens (default none); "heuristic": +2/-1 from k_start = k (chains
    only); "cost": CostModelK on `costs` (required), branch tokens while they pay, at most
    tree_nodes (default DEFAULT_TREE_NODES), the learned draft's acceptance starting from
    model_prior where one was measured (a head's held-out acceptance), its risk ledger's
    risk_floor / risk_rate from `risk` where given (else CostModelK's). Raises ValueError."""
    if name == "fixed":
        return FixedK(min(k, k_max), tree_nodes=tree_nodes or 0)
    if name == "heuristic":
        return HeuristicK(k_start=max(1, min(k, k_max)), k_max=max(k_max, 1))
    if name == "cost":
        if costs is None:
            raise ValueError("the cost policy needs a device cost curve")
        from .cost_policy import CostModelK  # it builds on this module's types

        tree = DEFAULT_TREE_NODES if tree_nodes is None else tree_nodes
        prior = {"model": model_prior} if model_prior is not None else None
        return CostModelK(costs, k_max=k_max, prior_alpha=prior, tree_nodes=tree, **(risk or {}))
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
