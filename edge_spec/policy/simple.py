"""The baseline k policies: FixedK (one source, one k) and HeuristicK (transformers' +2/-1
schedule). The cost model is edge_spec.policy.cost."""

from __future__ import annotations

from collections.abc import Sequence

from edge_spec.drafts.candidates import NgramCandidate
from edge_spec.policy.trees import MAX_TREE_LEAVES, branch_lengths, heaviest_alternates
from edge_spec.policy.types import DRAFT_SOURCES, PLAIN, SourceName, StepOutcome, StepPlan


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

    def wants_model(self, model_lag: int = 1, model_load_s: float = 0.0) -> bool:
        return self.k > 0 and self.source in (None, "model")

    def begin(self, model_lag: int = 1, model_load_s: float = 0.0) -> None:
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
