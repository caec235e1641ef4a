"""`edge-spec simulate`: replay recorded acceptance traces against device cost curves and report
every k policy against the oracle.

A trace (scripts/record_traces.py, JSON) holds, per prompt, the target's greedy continuation
of N tokens and, for each position pos and each draft source, how many of the tokens the source
would propose there match the target's continuation (`agree[pos]`, at most K_MAX): for the
model draft also the draft's probability of each of its K_MAX greedy tokens, for the n-gram
lookup the proposal and its matched n-gram length. Greedy (T = 0) acceptance is a prefix match,
so one recording answers every k: drafting k tokens at pos accepts min(k, agree[pos]).

    {"schema": 1, "kind": "edge_spec.acceptance_trace", "temperature": 0.0,
     "target": "...", "draft": "...", "k_max": 16, "ngram": {"max_ngram": 3, "min_ngram": 1},
     "measured": {"target_token_ms", "draft_token_ms", "c"}, "recorded", "llama_cpp_python",
     "prompts": [{"id", "category", "prompt", "n_prompt",
                  "tokens": [N target token ids],
                  "model": {"agree": [N], "confidence": [N lists of min(16, N - pos)],
                            "alternates": [N lists of [token, p]]},
                  "ngram": {"agree": [N], "proposal": [N lists], "proposal_len": [N],
                            "match_len": [N], "n_occurrences": [N], "n_agreeing": [N],
                            "branches": [N lists of [depth, [tokens], [weights]]]}}]}

n_occurrences / n_agreeing (how the matched n-gram's recent occurrences went on, which the cost
policy keys its n-gram acceptance on) are absent from older traces: read as one occurrence.
"branches" (the other ways the occurrences went on: a token tree's branches) may be absent too:
then no tree is replayed. A tree step is replayed like the engine verifies it: the walk follows
the recorded greedy tokens down the tree, and the step costs t(1 + all the tree's tokens).
"alternates" (a draft head's runner-up at each chain position, absent from older traces) lets
the policy verify some of them beside the chain as one-token branches, as the engine does.

Only T = 0 is recorded. A T > 0 trace would need, per position, the acceptance probability
min(1, p_target / p_draft) of each sampled draft token; that variant is not recorded yet.

A device profile (edge_spec/profiles/*.json) is a verify-cost curve t(n) / t(1) for n = 1..16,
t(1) in ms and a draft cost ratio c, each with where it comes from. Replay charges a step
draft cost + t(k + 1); the model draft's cost counts the tokens its cache must re-decode
(CostCurve.draft_s). The oracle is a dynamic program over (position, draft lag) that knows
agree[] and picks every step's (source, k) to minimise the total time of the N tokens: a
clairvoyant bound no causal policy can reach. "oracle-static" is the best single (source, k)
per prompt in hindsight.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .cost_policy import CostModelK
from .policy import (
    DEFAULT_TREE_NODES,
    NO_MATCH,
    Branch,
    CostCurve,
    FixedK,
    HeuristicK,
    KPolicy,
    NgramCandidate,
    SourceName,
    StepOutcome,
    TokenTree,
    alternate_tree,
    model_lag_after,
    token_tree,
)
from .verify import check_tree

K_MAX = 16  # tokens recorded per position
TRACE_SCHEMA = 1
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_TRACES = Path(__file__).resolve().parent.parent / "bench" / "traces"
SOURCES: tuple[SourceName, ...] = ("model", "ngram", "none")


# ---- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTrace:
    """One prompt's recording; every per-position tuple has n_tokens entries."""

    id: str
    category: str
    tokens: tuple[int, ...]
    model_agree: tuple[int, ...]
    model_confidence: tuple[tuple[float, ...], ...]
    ngram_agree: tuple[int, ...]
    ngram_proposal: tuple[tuple[int, ...], ...]
    ngram_match_len: tuple[int, ...]
    ngram_occurrences: tuple[int, ...] = ()  # empty: not recorded (one occurrence each)
    ngram_agreeing: tuple[int, ...] = ()
    ngram_branches: tuple[tuple[Branch, ...], ...] = ()  # empty: not recorded (no trees)
    # Per position, the learned draft's runner-up (token, probability) at each chain
    # position: one-token branches of a token tree. Empty: not recorded (chains only).
    model_alternates: tuple[tuple[tuple[int, float], ...], ...] = ()

    def ngram_candidate(self, pos: int, k_cap: int) -> NgramCandidate:
        """What the n-gram lookup proposed at pos, cut to k_cap tokens."""
        if k_cap <= 0 or not self.ngram_proposal[pos]:
            return NO_MATCH
        occurrences = self.ngram_occurrences[pos] if self.ngram_occurrences else 1
        agreeing = self.ngram_agreeing[pos] if self.ngram_agreeing else 1
        branches = self.ngram_branches[pos] if self.ngram_branches else ()
        return NgramCandidate(
            self.ngram_proposal[pos][:k_cap],
            self.ngram_match_len[pos],
            occurrences,
            agreeing,
            branches,
        )

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TraceSet:
    path: str
    target: str
    draft: str
    meta: dict
    prompts: tuple[PromptTrace, ...]


def load_traces(path: str | Path) -> TraceSet:
    """A trace file, or every *.json trace in a folder merged. Raises ValueError if malformed."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no trace files in {path}")
    sets = [_load_trace_file(f) for f in files]
    first = sets[0]
    return TraceSet(
        str(path),
        first.target,
        first.draft,
        first.meta,
        tuple(p for s in sets for p in s.prompts),
    )


def _load_trace_file(path: Path) -> TraceSet:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != TRACE_SCHEMA or data.get("kind") != "edge_spec.acceptance_trace":
        raise ValueError(f"{path}: not an edge_spec acceptance trace (schema {TRACE_SCHEMA})")
    prompts = []
    for raw in data["prompts"]:
        n = len(raw["tokens"])
        model, ngram = raw["model"], raw["ngram"]
        trace = PromptTrace(
            id=raw["id"],
            category=raw["category"],
            tokens=tuple(raw["tokens"]),
            model_agree=tuple(model["agree"]),
            model_confidence=tuple(tuple(c) for c in model["confidence"]),
            ngram_agree=tuple(ngram["agree"]),
            ngram_proposal=tuple(tuple(p) for p in ngram["proposal"]),
            ngram_match_len=tuple(ngram["match_len"]),
            ngram_occurrences=tuple(ngram.get("n_occurrences", ())),
            ngram_agreeing=tuple(ngram.get("n_agreeing", ())),
            ngram_branches=tuple(
                tuple(Branch(int(d), tuple(t), tuple(w)) for d, t, w in at)
                for at in ngram.get("branches", ())
            ),
            model_alternates=tuple(
                tuple((int(t), float(w)) for t, w in at) for at in model.get("alternates", ())
            ),
        )
        lengths = {
            len(trace.model_agree),
            len(trace.model_confidence),
            len(trace.ngram_agree),
            len(trace.ngram_proposal),
            len(trace.ngram_match_len),
            *(
                len(c)
                for c in (
                    trace.ngram_occurrences,
                    trace.ngram_agreeing,
                    trace.ngram_branches,
                    trace.model_alternates,
                )
                if c
            ),
        }
        if lengths != {n}:
            raise ValueError(f"{path}: prompt {trace.id}: per-position lists differ in length")
        prompts.append(trace)
    meta = {k: v for k, v in data.items() if k != "prompts"}
    return TraceSet(str(path), data["target"], data["draft"], meta, tuple(prompts))


@dataclass(frozen=True)
class CurveProfile:
    name: str
    description: str
    source: str
    t1_ms: float
    t_rel: tuple[float, ...]  # t(n) / t(1), n = 1..len
    c: float
    ngram_s: float
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    def costs(self) -> CostCurve:
        t1_s = self.t1_ms / 1e3
        return CostCurve(
            verify_s=tuple(t1_s * r for r in self.t_rel),
            draft_token_s=self.c * t1_s,
            ngram_s=self.ngram_s,
        )


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> CurveProfile:
    """A bundled profile by name, or a JSON file. Raises ValueError for an unknown name."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
        if not path.is_file():
            known = ", ".join(list_profiles())
            raise ValueError(f"unknown device profile {str(name_or_path)!r}; known: {known}")
    data = json.loads(path.read_text(encoding="utf-8"))
    if "host" in data and "target" in data:  # a profile measured by `edge-spec profile`
        return _measured_curve(path, data)
    t_rel = tuple(float(x) for x in data["t_rel"])
    if not t_rel or abs(t_rel[0] - 1.0) > 1e-9 or min(t_rel) <= 0:
        raise ValueError(f"{path}: t_rel must start at 1.0 and be positive")
    return CurveProfile(
        name=data["name"],
        description=data.get("description", ""),
        source=data.get("source", ""),
        t1_ms=float(data["t1_ms"]),
        t_rel=t_rel,
        c=float(data["c"]),
        ngram_s=float(data.get("ngram_s", 2e-5)),
        raw=data,
    )


def _measured_curve(path: Path, data: dict) -> CurveProfile:
    """A device profile measured here (edge_spec.device), seen as a curve: the target's t(n)
    relative to t(1), and c = the draft's t(1) over the target's."""
    from .device import DeviceProfile

    profile = DeviceProfile.from_dict(data)
    costs = profile.cost_curve()
    t1_s = costs.verify_s[0]
    host = profile.host
    return CurveProfile(
        name=f"measured-{path.stem[:8]}",
        description=f"measured by edge-spec profile on {host.hostname} ({host.cpu_model}), "
        f"target {profile.target.file_name}",
        source=str(path),
        t1_ms=t1_s * 1e3,
        t_rel=tuple(t / t1_s for t in costs.verify_s),
        c=costs.c,
        ngram_s=costs.ngram_s,
        raw=data,
    )


# ---- replay ----------------------------------------------------------------------------------


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
    value = np.zeros((n + 1, n_lag + 1))
    choice: list[list[tuple[str, int]]] = [[] for _ in range(n)]

    def shifted(row: np.ndarray, by: int) -> np.ndarray:
        idx = np.minimum(lags + by, n_lag)
        return row[idx]

    for pos in range(n - 1, -1, -1):
        k_cap = min(k_max, n - pos - 1)
        best = costs.t(1) + shifted(value[pos + 1], 1)
        arg = np.zeros(n_lag + 1, dtype=np.int64)  # 0: plain step
        options: list[tuple[str, int]] = [("none", 0)]
        if "ngram" in sources:
            for k in range(1, min(k_cap, len(trace.ngram_proposal[pos])) + 1):
                a = min(k, trace.ngram_agree[pos])
                cand = costs.ngram_s + costs.t(k + 1) + shifted(value[pos + a + 1], a + 1)
                options.append(("ngram", k))
                better = cand < best
                best = np.where(better, cand, best)
                arg = np.where(better, len(options) - 1, arg)
        if "model" in sources:
            for k in range(1, k_cap + 1):
                a = min(k, trace.model_agree[pos])
                lag_after = 2 if a == k else 1
                cand = rel_draft + (k - 1) * per_token + costs.t(k + 1)
                cand = cand + value[pos + a + 1][lag_after]
                options.append(("model", k))
                better = cand < best
                best = np.where(better, cand, best)
                arg = np.where(better, len(options) - 1, arg)
        value[pos] = best
        choice[pos] = [options[i] for i in arg]

    result = ReplayResult("oracle")
    pos, lag = 0, 1
    while pos < n:
        source, k = choice[pos][min(lag, n_lag)]
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


# ---- policies and the report -----------------------------------------------------------------

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


def report_dict(reports: Sequence[DeviceReport], traces: TraceSet) -> dict:
    out: dict = {
        "traces": traces.path,
        "target": traces.target,
        "draft": traces.draft,
        "n_prompts": len(traces.prompts),
        "devices": [],
    }
    for rep in reports:
        oracle_tps, none_tps = rep.tps("oracle"), rep.tps("none")
        best_fixed = rep.best_fixed
        fixed_tps = rep.tps(best_fixed)
        policies = {}
        k_max = max(
            (int(n.rsplit("-", 1)[1]) for n in rep.results if n.startswith("fixed-")), default=8
        )
        order = [*policy_factories(k_max), "oracle-static", "oracle"]
        for name in sorted(rep.results, key=order.index):
            res = rep.results[name]
            policies[name] = {
                "tokens_per_s": round(res.tokens_per_s, 3),
                "vs_oracle": round(res.tokens_per_s / oracle_tps, 4),
                "vs_best_fixed": round(res.tokens_per_s / fixed_tps, 4),
                "vs_target_alone": round(res.tokens_per_s / none_tps, 4),
                "tokens_per_step": round(res.n_tokens / max(res.n_steps, 1), 3),
                "acceptance": round(res.n_accepted / res.n_drafted, 3) if res.n_drafted else None,
                "steps_by_source": res.steps_by_source,
                "tree_steps": res.n_tree_steps,
                "branch_tokens_accepted": res.n_branch_accepted,
            }
        categories = {
            cat: {
                name: round(r.tokens_per_s / runs["none"].tokens_per_s, 4)
                for name, r in runs.items()
                if name in ("cost", "oracle", "oracle-static", best_fixed)
            }
            for cat, runs in rep.by_category.items()
        }
        out["devices"].append(
            {
                "profile": rep.profile.name,
                "source": rep.profile.source,
                "c": rep.profile.c,
                "best_fixed": best_fixed,
                "policies": policies,
                "vs_target_alone_by_category": categories,
            }
        )
    return out


def format_report(data: dict) -> str:
    lines = [
        f"traces: {data['traces']} ({data['n_prompts']} prompts; target {data['target']}, "
        f"draft {data['draft']})"
    ]
    for dev in data["devices"]:
        lines += [
            "",
            f"== {dev['profile']} (c={dev['c']}; best fixed: {dev['best_fixed']})",
            f"{'policy':<18} {'tokens/s':>9} {'x oracle':>9} {'x best fixed':>13} "
            f"{'x target':>9} {'tok/step':>9} {'trees':>6}",
        ]
        for name, p in dev["policies"].items():
            lines.append(
                f"{name:<18} {p['tokens_per_s']:>9.2f} {p['vs_oracle']:>9.3f} "
                f"{p['vs_best_fixed']:>13.3f} {p['vs_target_alone']:>9.3f} "
                f"{p['tokens_per_step']:>9.2f} {p.get('tree_steps', 0):>6}"
            )
        cats = dev["vs_target_alone_by_category"]
        lines.append(
            "x target alone by category: "
            + "; ".join(
                f"{cat} " + " ".join(f"{n}={v:.2f}" for n, v in vals.items())
                for cat, vals in cats.items()
            )
        )
    return "\n".join(lines)


# ---- command line ----------------------------------------------------------------------------


def add_simulate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `simulate` to a subparsers object; run it with run_simulate(args)."""
    sim = sub.add_parser(
        "simulate", help="replay acceptance traces against device profiles, every policy"
    )
    sim.add_argument(
        "traces",
        nargs="*",
        help=f"trace files or folders (default: {DEFAULT_TRACES})",
    )
    sim.add_argument(
        "--profiles",
        nargs="+",
        default=None,
        help="device profile names or JSON files (default: all bundled: "
        + ", ".join(list_profiles())
        + ")",
    )
    sim.add_argument(
        "--policies",
        nargs="+",
        default=None,
        help="policy names or prefixes, e.g. cost heuristic fixed-ngram (default: all)",
    )
    sim.add_argument("--k-max", type=int, default=8)
    sim.add_argument(
        "--draft-c",
        default="profile",
        help="the model draft's cost ratio c on every device: 'profile' (each profile's own, "
        "the default; for draft-head traces the recorded one), 'trace' (the one measured when "
        "the traces were recorded) or a number",
    )
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    return sim


def run_simulate(args: argparse.Namespace) -> int:
    """Prints the report; returns 0. Bad inputs raise InvalidRequestError (exit 2 in the CLI)."""
    from .errors import InvalidRequestError

    paths = args.traces or [str(DEFAULT_TRACES)]
    try:
        sets = [load_traces(p) for p in paths]
        profiles = [load_profile(p) for p in (args.profiles or list_profiles())]
        if args.k_max < 1 or args.k_max > K_MAX:
            raise ValueError(f"--k-max must be in 1..{K_MAX}, got {args.k_max}")
        traces = TraceSet(
            ", ".join(paths),
            sets[0].target,
            sets[0].draft,
            sets[0].meta,
            tuple(p for s in sets for p in s.prompts),
        )
        draft_c = args.draft_c
        if draft_c == "profile" and traces.draft == "head":
            # A draft head has no per-device profile: its cost ratio measured when the traces
            # were recorded stands for every device (its weights are a few per cent of the
            # target's, so its cost scales with the target's wherever the pass is bound by
            # memory traffic).
            draft_c = "trace"
        if draft_c != "profile":
            c = float(traces.meta["measured"]["c"] if draft_c == "trace" else draft_c)
            if not 0 <= c < 100:
                raise ValueError(f"--draft-c must be in [0, 100), got {c}")
            profiles = [replace(p, c=c) for p in profiles]
        reports = simulate(traces, profiles, args.policies, args.k_max)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidRequestError(f"simulate: {exc}") from exc
    data = report_dict(reports, traces)
    print(json.dumps(data, indent=1) if args.json else format_report(data))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (python -m edge_spec.simulate) until the CLI wires the subcommand."""
    parser = argparse.ArgumentParser(prog="edge-spec")
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    return run_simulate(parser.parse_args(["simulate", *(argv or [])]))


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
