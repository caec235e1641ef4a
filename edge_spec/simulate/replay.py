"""`edge-spec simulate`'s arithmetic: replay a k policy over a recorded trace as the engine
would run it, charging a device's cost curve, and the oracle it is compared with.

Replay charges a step draft cost + t(k + 1); the model draft's cost counts the tokens its cache
must re-decode (CostCurve.draft_s). The oracle is a dynamic program over (position, draft lag)
that knows agree[] and picks every step's (source, k) to minimise the total time of the N
tokens: a clairvoyant bound no causal policy can reach. "oracle-static" is the best single
(source, k) per prompt in hindsight.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edge_spec.decode.verify import check_tree
from edge_spec.drafts.candidates import NgramCandidate
from edge_spec.policy.cost import CostModelK
from edge_spec.policy.simple import FixedK, HeuristicK
from edge_spec.policy.trees import TokenTree, alternate_tree, token_tree
from edge_spec.policy.types import (
    DEFAULT_TREE_NODES,
    CostCurve,
    KPolicy,
    SourceName,
    StepOutcome,
    model_lag_after,
)
from edge_spec.simulate.curves import CurveProfile
from edge_spec.simulate.traces import PromptTrace, TraceSet

SOURCES: tuple[SourceName, ...] = ("model", "ngram", "none")


@dataclass
class ReplayResult:
    """Totals of one policy over one or more prompts."""

    policy: str
    n_tokens: int = 0
    time_s: float = 0.0
    n_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    steps_by_source: dict[str, int] = field(default_factory=dict)
    n_tree_steps: int = 0
    n_branch_accepted: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.time_s if self.time_s > 0 else 0.0

    def add(self, other: ReplayResult) -> None:
        self.n_tokens += other.n_tokens
        self.time_s += other.time_s
        self.n_steps += other.n_steps
        self.n_drafted += other.n_drafted
        self.n_accepted += other.n_accepted
        self.n_tree_steps += other.n_tree_steps
        self.n_branch_accepted += other.n_branch_accepted
        for source, n in other.steps_by_source.items():
            self.steps_by_source[source] = self.steps_by_source.get(source, 0) + n

    def step(self, source: str, n_drafted: int, n_accepted: int, time_s: float) -> None:
        self.n_tokens += n_accepted + 1
        self.time_s += time_s
        self.n_steps += 1
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        used = source if n_drafted else "none"
        self.steps_by_source[used] = self.steps_by_source.get(used, 0) + 1


def replay(
    trace: PromptTrace,
    costs: CostCurve,
    policy: KPolicy,
    k_max: int = 8,
    sources: Sequence[SourceName] = SOURCES,
    report_tokens: bool = True,
) -> ReplayResult:
    """Runs `policy` over one prompt as the engine would, charging `costs`; returns totals.

    Per step: k_cap = min(k_max, tokens left - 1); plan; a model draft proposes tokens one by
    one, asking keep_drafting with the recorded confidence; accepted = min(drafted, agree); a
    token tree accepts the path that follows the recorded tokens.
    report_tokens=False leaves StepOutcome.tokens empty (an engine that does not pass them).
    """
    policy.begin()
    result = ReplayResult(policy.name)
    n = trace.n_tokens
    n_fresh = 1  # tokens the model draft's next first decode covers (in sync after begin)
    pos = 0
    while pos < n:
        k_cap = min(k_max, n - pos - 1)
        candidate = None
        if "ngram" in sources:
            candidate = trace.ngram_candidate(pos, k_cap)
        plan = policy.plan(sources, k_cap, candidate)
        _check_plan(plan.source, plan.k + plan.tree_nodes, k_cap, candidate, sources)
        confidences: tuple[float, ...] = ()
        match_len = 0
        tree: TokenTree | None = None
        branch_accepted = 0
        if plan.source == "model" and plan.k > 0:
            row = trace.model_confidence[pos]
            drafted = 0
            for i in range(min(plan.k, len(row))):
                drafted = i + 1
                if i + 1 < plan.k and not policy.keep_drafting(i, row[i]):
                    break
            confidences = row[:drafted]
            accepted = min(drafted, trace.model_agree[pos])
            draft_s = costs.draft_s(drafted, n_fresh)
            if trace.model_alternates and policy.tree_nodes > 0:
                tree = _alternates_tree(trace, pos, confidences, policy, k_cap)
                # The walk: the chain's first rejected position may hold the target's token
                # as a branch (accepted, a leaf: the step ends there).
                hit = pos + accepted < n and any(
                    parent == accepted - 1 and token == trace.tokens[pos + accepted]
                    for token, parent in zip(
                        tree.tokens[tree.n_main :], tree.parents[tree.n_main :]
                    )
                )
                branch_accepted = int(hit and accepted < drafted)
                drafted, accepted = len(tree.tokens), accepted + branch_accepted
        elif plan.source == "ngram" and plan.k > 0:
            drafted = plan.k
            accepted = min(drafted, trace.ngram_agree[pos])
            match_len = trace.ngram_match_len[pos]
            draft_s = costs.ngram_s
            if plan.branches and candidate is not None:
                tree = token_tree(candidate, plan.k, plan.branches)
                path = _walk(tree, trace.tokens[pos:])
                drafted, accepted = len(tree.tokens), len(path)
                branch_accepted = sum(i >= tree.n_main for i in path)
        else:
            drafted = accepted = 0
            draft_s = 0.0
        verify_s = costs.t(drafted + 1)
        outcome = StepOutcome(
            plan.source if drafted else "none",
            drafted,
            accepted,
            confidences,
            match_len,
            draft_s,
            verify_s,
            trace.tokens[pos : pos + accepted + 1] if report_tokens else (),
            n_branch_nodes=len(tree.branch_weights) if tree else 0,
            n_branch_accepted=branch_accepted,
            branch_weight=sum(tree.branch_weights) if tree else 0.0,
        )
        policy.update(outcome)
        if tree is not None and tree.branch_weights:
            result.n_tree_steps += 1
            result.n_branch_accepted += branch_accepted
        n_fresh = model_lag_after(n_fresh, outcome)
        result.step(plan.source, drafted, accepted, draft_s + verify_s)
        pos += accepted + 1
    return result


def _alternates_tree(
    trace: PromptTrace, pos: int, confidences: Sequence[float], policy: KPolicy, k_cap: int
) -> TokenTree:
    """The model chain drafted at pos with the runner-ups the policy picks as branches. Only
    the shape and branch tokens matter to the replay: chain tokens are placeholders (-1)."""
    alternates = tuple(
        (i, token, weight)
        for i, (token, weight) in enumerate(trace.model_alternates[pos][: len(confidences)])
    )
    chosen = policy.alternates(confidences, alternates, k_cap - len(confidences))
    return alternate_tree((-1,) * len(confidences), alternates, chosen)


def _walk(tree: TokenTree, future: Sequence[int]) -> list[int]:
    """The tree's accepted path (token indices) when the target goes on with `future`."""
    children = check_tree(tree.tokens, tree.parents)
    path: list[int] = []
    node = -1
    while len(path) < len(future):
        node = children.get((node, future[len(path)]), -2)
        if node == -2:
            break
        path.append(node)
    return path


def _check_plan(
    source: str, k: int, k_cap: int, candidate: NgramCandidate | None, sources: Sequence[str]
) -> None:
    if source not in sources or not 0 <= k <= k_cap:
        raise AssertionError(f"policy broke its contract: {source} k={k} (k_cap {k_cap})")
    if source == "ngram" and k > (len(candidate.tokens) if candidate else 0):
        raise AssertionError(f"policy planned n-gram k={k} beyond the proposal")


def oracle(
    trace: PromptTrace,
    costs: CostCurve,
    k_max: int = 8,
    sources: Sequence[SourceName] = SOURCES,
) -> ReplayResult:
    """The fastest schedule of (source, k) steps for this trace, knowing every agree[].

    Dynamic programming from the end: V[pos, lag] = least time to produce tokens pos..N-1 when
    the model draft's cache lags `lag` tokens (its next first decode covers lag tokens).
    """
    n = trace.n_tokens
    n_lag = n + 2  # lag is at most n + 1
    lags = np.arange(n_lag + 1)
    lags[0] = 1
    rel_draft = np.array([costs.draft_s(1, int(f)) for f in lags])  # (n_lag + 1,)
    per_token = costs.draft_s(2, 1) - costs.draft_s(1, 1)
    t_verify = np.array([costs.t(k + 1) for k in range(k_max + 1)])  # t_verify[k] = t(k + 1)
    ks = np.arange(1, k_max + 1)
    shifts = np.minimum(lags[None, :] + np.arange(k_max + 2)[:, None], n_lag)  # lags + j, capped
    ngram_fixed = costs.ngram_s + t_verify[1:]  # (k_max,)
    model_fixed = (ks - 1) * per_token
    value = np.zeros((n + 1, n_lag + 1))
    # Per position, every option for every lag at once: row 0 a plain step, rows 1..k_max
    # n-gram drafts of k = row, then model drafts of k = row - k_max (inf where not open).
    # Ties go to the first row: the plain step, then n-gram, then the shorter draft.
    rows = np.empty((1 + 2 * k_max, n_lag + 1))
    choice = np.zeros((n, n_lag + 1), dtype=np.int64)
    for pos in range(n - 1, -1, -1):
        k_cap = min(k_max, n - pos - 1)
        rows[1:] = np.inf
        rows[0] = t_verify[0] + value[pos + 1][shifts[1]]
        m = min(k_cap, len(trace.ngram_proposal[pos])) if "ngram" in sources else 0
        if m:
            a = np.minimum(ks[:m], trace.ngram_agree[pos])
            rows[1 : 1 + m] = ngram_fixed[:m, None] + value[(pos + a + 1)[:, None], shifts[a + 1]]
        if "model" in sources and k_cap:
            a = np.minimum(ks[:k_cap], trace.model_agree[pos])
            after = value[pos + a + 1, np.where(a == ks[:k_cap], 2, 1)]
            block = rel_draft[None, :] + model_fixed[:k_cap, None] + t_verify[1 : k_cap + 1, None]
            rows[1 + k_max : 1 + k_max + k_cap] = block + after[:, None]
        choice[pos] = rows.argmin(axis=0)
        value[pos] = rows.min(axis=0)

    def option(i: int) -> tuple[str, int]:
        return ("none", 0) if i == 0 else ("ngram", i) if i <= k_max else ("model", i - k_max)

    result = ReplayResult("oracle")
    pos, lag = 0, 1
    while pos < n:
        source, k = option(int(choice[pos][min(lag, n_lag)]))
        if source == "model":
            a = min(k, trace.model_agree[pos])
            step_s = costs.draft_s(k, lag) + costs.t(k + 1)
            lag = 2 if a == k else 1
        else:
            a = min(k, trace.ngram_agree[pos]) if source == "ngram" else 0
            step_s = (costs.ngram_s if source == "ngram" else 0.0) + costs.t(k + 1)
            lag += a + 1
        result.step(source, k, a, step_s)
        pos += a + 1
    assert math.isclose(result.time_s, value[0][1], rel_tol=1e-9), "oracle walk != DP value"
    return result


PolicyFactory = Callable[[CostCurve], KPolicy]


def policy_factories(k_max: int = 8) -> dict[str, PolicyFactory]:
    """Every policy simulate compares, by name; each call makes a fresh policy."""
    sources: tuple[SourceName, ...] = ("model", "ngram")
    out: dict[str, PolicyFactory] = {"none": functools.partial(_fixed, 0, "none")}
    for source in sources:
        for k in range(1, k_max + 1):
            out[f"fixed-{source}-{k}"] = functools.partial(_fixed, k, source)
        out[f"heuristic-{source}"] = functools.partial(_heuristic, k_max, source)
    out["cost"] = functools.partial(_cost, k_max)
    out["cost-chains"] = functools.partial(_cost, k_max, tree_nodes=0)  # no token trees
    return out


def _fixed(k: int, source: SourceName, costs: CostCurve) -> KPolicy:
    return FixedK(k, source)


def _heuristic(k_max: int, source: SourceName, costs: CostCurve) -> KPolicy:
    return HeuristicK(min(4, k_max), k_max, source)


def _cost(k_max: int, costs: CostCurve, tree_nodes: int = DEFAULT_TREE_NODES) -> KPolicy:
    policy = CostModelK(costs, k_max=k_max, tree_nodes=tree_nodes)
    if tree_nodes == 0:
        policy.name = "cost-chains"
    return policy


@dataclass
class DeviceReport:
    profile: CurveProfile
    results: dict[str, ReplayResult]  # policy name -> totals over every prompt; has "oracle"
    by_category: dict[str, dict[str, ReplayResult]]  # category -> policy -> totals

    def tps(self, name: str) -> float:
        return self.results[name].tokens_per_s

    @property
    def best_fixed(self) -> str:
        fixed = [n for n in self.results if n.startswith("fixed-")]
        return max(fixed, key=self.tps)

    def ratio(self, name: str, reference: str) -> float:
        return self.tps(name) / self.tps(reference)


def simulate(
    traces: TraceSet,
    profiles: Iterable[CurveProfile],
    policies: Sequence[str] | None = None,
    k_max: int = 8,
) -> list[DeviceReport]:
    """Replays every prompt under every policy on every device. A policy object lives for the
    whole trace set (its estimates carry over prompts, as over requests in one process)."""
    factories = policy_factories(k_max)
    names = list(factories) if not policies else _select(policies, factories)
    # Ratios need the baselines whatever was asked for.
    names = list(dict.fromkeys([*names, "none", *[n for n in factories if n.startswith("fixed")]]))
    reports = []
    for profile in profiles:
        costs = profile.costs()
        results = {name: ReplayResult(name) for name in [*names, "oracle-static", "oracle"]}
        by_category: dict[str, dict[str, ReplayResult]] = {}
        live = {name: factories[name](costs) for name in names}
        for trace in traces.prompts:
            cat = by_category.setdefault(trace.category, {})
            runs = {name: replay(trace, costs, live[name], k_max) for name in names}
            runs["oracle"] = oracle(trace, costs, k_max)
            # The best single (source, k) for this prompt in hindsight: what choosing k per
            # request (not per step) could reach at most.
            runs["oracle-static"] = max(
                (runs[n] for n in names if n.startswith("fixed-") or n == "none"),
                key=lambda r: r.tokens_per_s,
            )
            for name, run in runs.items():
                results[name].add(run)
                cat.setdefault(name, ReplayResult(name)).add(run)
        reports.append(DeviceReport(profile, results, by_category))
    return reports


def _select(wanted: Sequence[str], factories: dict[str, PolicyFactory]) -> list[str]:
    """Names or prefixes ("fixed", "fixed-ngram", "heuristic") -> policy names."""
    out: list[str] = []
    for item in wanted:
        hits = [n for n in factories if n == item or n.startswith(item + "-")]
        if not hits:
            raise ValueError(f"unknown policy {item!r}; known: {', '.join(factories)}")
        out += hits
    return list(dict.fromkeys(out))
