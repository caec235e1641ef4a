"""The cost-model policy: per step, the (source, k) maximising expected tokens per second,
E(k) / (draft cost + t(k + 1)), from online acceptance estimates and an online-corrected device
cost curve, within the request's risk ledger."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edge_spec.drafts.candidates import Consensus, NgramCandidate
from edge_spec.policy.estimators import (
    AcceptanceEstimate,
    ConfidenceCalibration,
    ForgetClock,
    OnlineCosts,
    RatioEstimate,
    RequestEstimate,
)
from edge_spec.policy.trees import MAX_TREE_LEAVES
from edge_spec.policy.types import (
    DRAFT_SOURCES,
    PLAIN,
    CostCurve,
    SourceName,
    StepOutcome,
    StepPlan,
    model_lag_after,
)

# The n-gram source's acceptance is estimated per match length (1, 2, 3-5, 6-11, 12+ tokens)
# and per consensus of the matched n-gram's occurrences, with graded priors.
NGRAM_BUCKETS = (1, 2, 3, 6, 12)
NGRAM_MATCH_PRIOR = (0.6, 1.0, 1.4, 1.6, 1.8)
NGRAM_CONSENSUS_PRIOR: dict[Consensus, float] = {"one": 1.0, "all": 1.2, "split": 0.6}
# _BUCKET_OF[m]: the bucket of a match of m tokens (m <= the last bucket's).
_BUCKET_OF = [0] + [
    max(b for b in NGRAM_BUCKETS if b <= m) for m in range(1, NGRAM_BUCKETS[-1] + 1)
]


# The risk ledger of the draft-free mode a user picks explicitly (--draft-mode ngram), whose
# promise is per request (at least 0.95x the target alone on every prompt): no floor, so at
# any point of a request at most 4 % of its plain time so far is at risk, however short the
# answer (auto keeps CostModelK's defaults, half a plain step + 4 %: a rejected first draft
# cost 5-11-token answers 4-8 % in a default-pair bench). Replayed on the recorded T = 0 runs
# (scripts/replay_ngram.py FOLDER --strategy ngram --fitted charge --risk-floor F --risk-rate R;
# the script is in git history, removed after commit 10e36c0)
# this keeps 1.42x of 1.48x overall on the default pair and 1.27x of 1.30x on the chat pair.
DRAFT_FREE_RISK = {"risk_floor": 0.0, "risk_rate": 0.04}

# Prefilling the draft model with a prompt is an investment that only the steps it then drafts
# pay back. It is made when the seconds the model's own steps saved, averaged over this many
# recent requests, exceed what the prefill would cost. On the agentic bench (chat pair, this
# CPU) auto prefilled the draft with a 1,160-token history (2.3 s, more than the answer's
# decode) for one model step; on GPU curves, where the model drafts most steps, its gains
# dwarf the prefill and nothing changes.
MODEL_GAIN_REQUESTS = 4
# While none of those requests gained anything from the model's own steps, its probes get this
# share of their budget: on the agentic bench (this CPU) auto's two probes a run caught the
# draft up over ~1,000-token histories, 0.55 s of decode (0.9 %), and never found it paying.
IDLE_PROBE_SHARE = 0.25


@dataclass(slots=True)
class _Probe:
    """Exponential backoff for re-checking a source that lost: probe after `interval` steps
    without it, double the interval when the probe says it still loses, reset when it pays."""

    interval: int
    since: int = 0
    pending: bool = False


class CostModelK:
    """Chooses (source, k) per step maximising expected tokens per second.

    E(k) = 1 + sum_{j <= k} prod_{i <= j} alpha_i, with alpha_i online per source (and, for
    the n-gram source, per match length 1, 2, 3-5, 6-11, 12+ and per consensus of the matched
    n-gram's occurrences); cost = per-step overhead + draft cost + t(k + 1), where the model
    draft's cost includes re-decoding the tokens its cache lacks. The plain step (k = 0, E = 1,
    cost t(1)) is always an option.

    For the model source the plan's k is a cap: keep_drafting() stops the draft once the next
    tokens' expected tokens per second, with acceptance calibrated on the draft's own
    confidences, fall below the rate the plan expects.

    Every plan is also bounded by what it may lose (the request's risk ledger): a draft whose
    every token is rejected costs its extra verification (and the model's draft decodes) for
    nothing, so a source drafts k tokens only while that worst case stays within `risk_floor`
    plain steps plus `risk_rate` of the plain time so far, plus whatever drafting has gained in
    this request (risk_floor=None turns the ledger off). A request therefore starts with short
    drafts (k = 1 on a CPU, where a second verified token costs ~40 % of a step; longer on flat
    GPU curves) and lengthens them as they pay, and one whose drafts keep failing stays within
    a few per cent of the target alone however wrong the acceptance estimates or the cost curve
    are: the ledger is kept in measured seconds.

    An n-gram draft whose matched n-gram went on in several ways may become a token tree:
    main and branch tokens compete for the batch by the expected tokens each adds (a branch
    token's weight, the share of occurrences that went that way, times a learned yield), and
    the tree with the best expected tokens per second is kept (see _tree). On a CPU, where an
    extra verified token costs a tenth to a half of a step, a branch rarely pays; on flat GPU
    curves, more often. A learned draft that offers runner-up candidates (a draft head) may
    have some verified beside its chain as one-token branches the same way (alternates()).

    Evidence stays fresh three ways. When outcomes carry the produced tokens, every step
    scores the n-gram candidate against them, whichever source drafted (free evidence). A
    model that stops being chosen is probed with k = 1 after 8, 16, ... 128 steps without it
    (reset when a probe shows it pays), unless re-decoding the tokens its cache lacks would
    cost more than `probe_budget` of the time since it last drafted (a quarter of that while
    the model's steps gained nothing in the last few requests): on a CPU that means probes
    happen where the lag is short, e.g. at the start of a request. And evidence about
    an unused source fades towards its prior (`forget_rate` per step).
    """

    name = "cost"

    def __init__(
        self,
        costs: CostCurve,
        k_max: int = 8,
        prior_alpha: Mapping[str, float] | None = None,
        decay: float = 0.95,
        probe_min: int = 8,
        probe_max: int = 128,
        probe_budget: float = 0.02,
        forget_rate: float = 0.99,
        margin: float = 0.05,
        risk_floor: float | None = 0.5,
        risk_rate: float = 0.04,
        tree_nodes: int = 8,  # policy.DEFAULT_TREE_NODES
    ) -> None:
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        prior = {"model": 0.7, "ngram": 0.5, **(prior_alpha or {})}
        self.k_max = k_max
        self.costs = OnlineCosts(costs, k_max + 1)
        self.probe_min, self.probe_max, self.probe_budget = probe_min, probe_max, probe_budget
        self.forget_rate = forget_rate
        # Drafting must beat a plain step by this much: acceptance estimates are noisy and a
        # wrong guess costs a whole batch, while skipping a marginal draft costs little.
        self.margin = margin
        self.risk_floor, self.risk_rate = risk_floor, risk_rate
        n = max(k_max, 1)
        # An estimate that goes unobserved fades (forget_rate per step), lazily.
        self._clock = ForgetClock(forget_rate)
        self.model = AcceptanceEstimate(prior["model"], n, decay, clock=self._clock)
        # Longer and unanimous matches predict acceptance better: separate estimates.
        self.ngram = {
            (m, kind): AcceptanceEstimate(
                min(prior["ngram"] * f * g, 0.95), n, decay, clock=self._clock
            )
            for m, f in zip(NGRAM_BUCKETS, NGRAM_MATCH_PRIOR)
            for kind, g in NGRAM_CONSENSUS_PRIOR.items()
        }
        self.calibration = ConfidenceCalibration()
        self.tree_nodes = tree_nodes  # the most branch tokens one tree adds (0: chains only)
        self.branch_yield = RatioEstimate(prior=0.3)  # branch tokens accepted per unit weight
        # A learned draft's runner-up candidates: accepted per unit of expected (their
        # probability times the chance the chain reaches them).
        self.alternate_yield = RatioEstimate(prior=0.8)
        self._alternates_expected = 0.0
        self._model_cap = 0  # the risk ledger's cap on the model plan's whole batch
        self._ngram_branches: tuple[int, ...] = ()  # the n-gram option's tree (per branch)
        self.probes = {s: _Probe(probe_min) for s in DRAFT_SOURCES}
        self._since_model_s = 0.0  # target time since the model last drafted (probe budget)
        self._scored_ngram = False  # whether outcomes carry tokens to score n-gram candidates
        self._candidate: NgramCandidate | None = None
        # Seconds the model's chosen (not probing) steps saved against plain steps, with its
        # cache in sync, per recent request (the last: the current one).
        self._model_gains: deque[float] = deque(maxlen=MODEL_GAIN_REQUESTS)
        self._reset_request()

    # ---- what carries over between processes (edge_spec.policy.learned) ----

    def state(self) -> dict[str, Any]:
        """What the policy learned across requests, as numbers only: acceptance per source,
        match length and consensus, confidence calibration, branch yields, the online cost
        ratios, the probes' backoff and the model draft's recent gains (the verdict on
        prefilling it). Nothing of any request's text."""
        return {
            "model": self.model.state(),
            "ngram": {f"{m}/{kind}": est.state() for (m, kind), est in self.ngram.items()},
            "calibration": self.calibration.state(),
            "branch_yield": self.branch_yield.state(),
            "alternate_yield": self.alternate_yield.state(),
            "costs": self.costs.state(),
            "probe_intervals": {name: probe.interval for name, probe in self.probes.items()},
            "model_gains": list(self._model_gains),
            "since_model_s": self._since_model_s,
            "scored_ngram": self._scored_ngram,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take up a state() saved by an earlier process with the same settings; raises
        ValueError (and keeps what it had) when the state does not fit this policy."""
        before = self.state()
        try:
            self._restore(state)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._restore(before)
            raise ValueError(f"learned state does not fit: {exc}") from exc

    def _restore(self, state: Mapping[str, Any]) -> None:
        self.model.restore(state["model"])
        ngram = state["ngram"]
        if set(ngram) != {f"{m}/{kind}" for m, kind in self.ngram}:
            raise ValueError("n-gram buckets differ")
        for (m, kind), est in self.ngram.items():
            est.restore(ngram[f"{m}/{kind}"])
        self.calibration.restore(state["calibration"])
        self.branch_yield.restore(state["branch_yield"])
        self.alternate_yield.restore(state["alternate_yield"])
        self.costs.restore(state["costs"])
        intervals = state["probe_intervals"]
        for name, probe in self.probes.items():
            interval = int(intervals[name])
            if not self.probe_min <= interval <= self.probe_max:
                raise ValueError(f"probe interval {interval} out of range")
            probe.interval, probe.since, probe.pending = interval, 0, False
        gains = [float(g) for g in state["model_gains"]][-MODEL_GAIN_REQUESTS:]
        if not all(math.isfinite(g) for g in gains):
            raise ValueError("model gains must be finite")
        self._model_gains = deque(gains, maxlen=MODEL_GAIN_REQUESTS)
        since = float(state["since_model_s"])
        if not (math.isfinite(since) and since >= 0):
            raise ValueError("since_model_s out of range")
        self._since_model_s = since
        self._scored_ngram = bool(state["scored_ngram"])
        self._reset_request()

    # ---- per request / per step state ----

    def wants_model(self, model_lag: int = 1, model_load_s: float = 0.0) -> bool:
        """Whether to prefill the draft model with the coming request's prompt (model_lag
        tokens it lacks): its best plan with its cache in sync beats a plain step, and, once
        requests have shown what its steps save, they saved more than the prefill costs (and
        the load, model_load_s, where the model is not loaded yet)."""
        c = self.costs
        per_token = c.draft_s(2, 1) - c.draft_s(1, 1)
        fixed = c.overhead_s + c.draft_s(1, 1) - per_token
        _, rate = self._best_k(self.model.alphas(self.k_max), self.k_max, fixed, per_token)
        if self.k_max <= 0 or rate <= 1.0 / (c.overhead_s + c.t(1)):
            return False
        if not self._model_gains:
            return True
        prefill_s = c.draft_s(1, model_lag) - c.draft_s(1, 1) + model_load_s
        return sum(self._model_gains) / len(self._model_gains) >= prefill_s

    def begin(self, model_lag: int = 1, model_load_s: float = 0.0) -> None:
        self._reset_request(model_lag, model_load_s)
        self._model_gains.append(0.0)

    def _reset_request(self, model_lag: int = 1, model_load_s: float = 0.0) -> None:
        # Tokens the model draft's next first decode covers: 1 when the engine prefilled it.
        self.n_fresh = max(model_lag, 1)
        # What loading the draft model would cost before its first draft (0 once loaded): a
        # draft with it risks that too, so the ledger allows it only when it covers the load.
        self._model_load_s = max(model_load_s, 0.0)
        self._rate = 0.0  # tokens/s the current plan expects
        self._k_plan = 0
        self._alphas: list[float] = []
        self._reach = 1.0  # P(every model token so far this step is accepted)
        self._ngram_request = {m: RequestEstimate(shared) for m, shared in self.ngram.items()}
        self._lost_s = 0.0  # measured seconds drafting lost (negative: gained) this request
        self._plain_s = 0.0  # what the tokens produced so far take as plain steps

    def _allowance(self) -> float:
        """Seconds the next step may lose, every drafted token rejected (inf: ledger off)."""
        if self.risk_floor is None:
            return float("inf")
        t1 = self.costs.t(1)
        return self.risk_floor * t1 + self.risk_rate * self._plain_s - self._lost_s

    def _risk_caps(self, k_cap: int) -> dict[SourceName, int]:
        """Per draft source, the largest k whose total loss (every token rejected) stays within
        the request's allowance (k_cap for every source when the ledger is off)."""
        if self.risk_floor is None:
            return dict.fromkeys(DRAFT_SOURCES, k_cap)
        c = self.costs
        curve = c.curve()  # k_cap <= k_max: t(k + 2) is on it
        t1 = curve[1]
        allowance = self._allowance()
        caps: dict[SourceName, int] = {}
        for source in DRAFT_SOURCES:
            k = 0
            while k < k_cap:
                extra = curve[k + 2] - t1
                if source == "model":
                    extra += c.draft_s(k + 1, self.n_fresh) + self._model_load_s
                if extra > allowance:
                    break
                k += 1
            caps[source] = k
        return caps

    def _bucket(self, match_len: int, consensus: Consensus = "one") -> RequestEstimate:
        m = _BUCKET_OF[min(max(match_len, 1), NGRAM_BUCKETS[-1])]
        return self._ngram_request[m, consensus]

    def _best_k(
        self, alphas: Sequence[float], k_cap: int, fixed_s: float, per_token_s: float
    ) -> tuple[int, float]:
        """(k, tokens/s) maximising E(k) / (fixed_s + k * per_token_s + t(k + 1)), k in 1..k_cap."""
        best_k, best_rate = 0, 0.0
        total, reach = 1.0, 1.0
        curve = self.costs.curve()  # k_cap <= k_max: t(k + 1) is on it
        for k in range(1, k_cap + 1):
            reach *= alphas[k - 1]
            total += reach
            rate = total / (fixed_s + k * per_token_s + curve[k + 1])
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def options(
        self,
        sources: Sequence[SourceName],
        k_cap: int,
        ngram: NgramCandidate | None,
        caps: Mapping[SourceName, int] | None = None,
    ) -> dict[SourceName, tuple[int, float]]:
        """Each available source's best (k, expected tokens/s) now, k within `caps` where given
        (plan() passes the risk ledger's); "none" is (0, 1 / t(1))."""
        c = self.costs
        out: dict[SourceName, tuple[int, float]] = {"none": (0, 1.0 / (c.overhead_s + c.t(1)))}
        k_cap = min(k_cap, self.k_max)
        caps = caps or {}
        model_cap = min(k_cap, caps.get("model", k_cap))
        if "model" in sources and model_cap > 0:
            # draft_s(k) = fixed part (the re-decode batch) + (k - 1) single decodes.
            per_token = c.draft_s(2, 1) - c.draft_s(1, 1)
            fixed = c.overhead_s + c.draft_s(1, self.n_fresh) - per_token
            alphas = self.model.alphas(model_cap)
            out["model"] = self._best_k(alphas, model_cap, fixed, per_token)
        ngram_cap = min(k_cap, caps.get("ngram", k_cap))
        self._ngram_branches: tuple[int, ...] = ()
        if "ngram" in sources and ngram is not None and ngram.tokens and ngram_cap > 0:
            cap = min(ngram_cap, len(ngram.tokens))
            alphas = self._bucket(ngram.match_len, ngram.consensus).alphas(cap)
            if ngram.branches and self.tree_nodes > 0:
                k, self._ngram_branches, rate = self._tree(ngram, alphas, ngram_cap)
                out["ngram"] = (k, rate)
            else:
                out["ngram"] = self._best_k(alphas, cap, c.overhead_s + c.ngram_s, 0.0)
        return out

    def _tree(
        self, ngram: NgramCandidate, alphas: Sequence[float], budget: int
    ) -> tuple[int, tuple[int, ...], float]:
        """The n-gram draft as a token tree: (main tokens k, tokens per branch, expected
        tokens/s). Nodes are added one at a time, whichever adds the most expected tokens --
        main token j its reach, prod_{i <= j} alpha_i; a branch token its weight times the
        learned branch yield (a branch may start once the main token it forks after is in)
        -- and the tree kept is the prefix of that order with the best rate, E / (fixed +
        t(1 + its tokens)), within `budget` tokens, self.tree_nodes branch tokens and
        MAX_TREE_LEAVES leaves. Without branch tokens this is the best chain."""
        c = self.costs
        curve = c.curve()  # budget <= k_max: t(n + 1) is on it
        fixed = c.overhead_s + c.ngram_s
        branches = ngram.branches
        value = self.branch_yield.value
        taken = [0] * len(branches)
        k = n_branch = opened = 0
        reach, expected = 1.0, 1.0
        best: tuple[int, tuple[int, ...], float] = (0, (), 0.0)
        for n in range(1, budget + 1):
            gain, pick = (reach * alphas[k], -1) if k < len(alphas) else (0.0, -1)
            if n_branch < self.tree_nodes:
                for i, branch in enumerate(branches):
                    j = taken[i]
                    if branch.depth > k or j >= len(branch.tokens):
                        continue
                    if j == 0 and opened >= MAX_TREE_LEAVES - 1:
                        continue
                    if value * branch.weights[j] > gain:
                        gain, pick = value * branch.weights[j], i
            if gain <= 0.0:
                break
            if pick < 0:
                reach *= alphas[k]
                k += 1
            else:
                opened += taken[pick] == 0
                taken[pick] += 1
                n_branch += 1
            expected += gain
            rate = expected / (fixed + curve[n + 1])
            if k > 0 and rate > best[2]:
                best = (k, tuple(taken) if n_branch else (), rate)
        return best

    def plan(
        self, sources: Sequence[SourceName], k_cap: int, ngram: NgramCandidate | None
    ) -> StepPlan:
        caps = self._risk_caps(min(k_cap, self.k_max))
        options = self.options(sources, k_cap, ngram, caps)
        source: SourceName = max(
            options, key=lambda s: options[s][1] / (1.0 if s == "none" else 1.0 + self.margin)
        )
        k, rate = options[source]
        self._candidate = ngram
        for name in DRAFT_SOURCES:
            self.probes[name].pending = False
        tree = self._ngram_branches if source == "ngram" else ()
        if source != "model":
            probe = self._probe(sources, k_cap, ngram, source, rate)
            if probe is not None and caps[probe] < 1:
                probe = None
            if probe is not None:
                source, k, tree = probe, 1, ()
                self.probes[probe].pending = True
        self._rate = rate
        self._reach = 1.0
        self._k_plan = k if source != "none" else 0
        if source == "model" and not self.probes["model"].pending:
            # The cap: keep_drafting() decides where the draft really stops.
            self._k_plan = min(k_cap, self.k_max, caps["model"])
        self._alphas = self.model.alphas(self._k_plan) if source == "model" else []
        self._model_cap = min(k_cap, self.k_max, caps["model"])
        return StepPlan(source, self._k_plan, tree) if self._k_plan > 0 else PLAIN

    def _probe(
        self,
        sources: Sequence[SourceName],
        k_cap: int,
        ngram: NgramCandidate | None,
        chosen: SourceName,
        chosen_rate: float,
    ) -> SourceName | None:
        """A draft source due for a k = 1 probe instead of the chosen plan, or None."""
        if k_cap < 1:
            return None
        c = self.costs
        ng = self.probes["ngram"]
        # Without produced tokens to score candidates on, the n-gram needs probes too: they
        # cost only the extra verified token, so try one when a long match shows.
        if (
            not self._scored_ngram
            and chosen != "ngram"
            and "ngram" in sources
            and ngram is not None
            and ngram.tokens
            and ngram.match_len >= 3
            and ng.since >= ng.interval
        ):
            return "ngram"
        mp = self.probes["model"]
        if "model" in sources and mp.since >= mp.interval:
            # Net of what the probe's tokens would have taken under the chosen plan; the
            # re-decode of the draft's lag dominates mid-request on a CPU.
            expected = 1.0 + self.model.alphas(1)[0]
            cost = c.draft_s(1, self.n_fresh) + c.t(2) - expected / chosen_rate
            if cost <= self._probe_budget() * self._since_model_s:
                return "model"
        return None

    def _probe_budget(self) -> float:
        """The share of the time since the model last drafted that a probe may cost: less
        while the last MODEL_GAIN_REQUESTS requests gained nothing from the model's steps."""
        gains = self._model_gains
        if len(gains) == gains.maxlen and max(gains) <= 0.0:
            return self.probe_budget * IDLE_PROBE_SHARE
        return self.probe_budget

    def keep_drafting(self, i: int, confidence: float) -> bool:
        """Continue while some further stretch of m tokens adds expected tokens faster than the
        plan's rate: reach * sum_{j<=m} prod alpha > rate * (m draft decodes + extra verify)."""
        self._reach *= self.calibration.p_accept(confidence)
        if i + 1 >= self._k_plan or i + 1 >= len(self._alphas):
            return False
        c = self.costs
        per_token = c.draft_s(2, 1) - c.draft_s(1, 1)
        verify_now = c.t(i + 2)
        gain, reach = 0.0, self._reach
        for m in range(1, self._k_plan - i):
            reach *= self._alphas[i + m]
            gain += reach
            extra = m * per_token + c.t(i + 2 + m) - verify_now
            if gain > self._rate * extra:
                return True
        return False

    def alternates(
        self,
        confidences: Sequence[float],
        alternates: Sequence[tuple[int, int, float]],
        budget: int,
        max_leaves: int = MAX_TREE_LEAVES,
    ) -> tuple[int, ...]:
        """The runner-ups worth verifying beside the chain. Each adds, in expected tokens, its
        weight times the learned alternate yield times the chance the chain reaches it (the
        calibrated acceptance of the chain tokens before it), and costs the verify curve's next
        row; the heaviest are added while the step's expected tokens per second improve, within
        the budget, tree_nodes, max_leaves - 1 and the risk ledger's cap on the batch."""
        n = len(confidences)
        room = min(budget, self.tree_nodes, max_leaves - 1, self._model_cap - n)
        self._alternates_expected = 0.0
        if room <= 0 or not alternates:
            return ()
        c = self.costs
        reach = [1.0]  # reach[i]: P(the chain's tokens before i are all accepted)
        for confidence in confidences:
            reach.append(reach[-1] * self.calibration.p_accept(confidence))
        value = self.alternate_yield.value
        gains = sorted(
            (
                (reach[i] * value * weight, j)
                for j, (i, _, weight) in enumerate(alternates)
                if i < n
            ),
            reverse=True,
        )[:room]
        fixed = c.overhead_s + c.draft_s(n, 1)
        expected = sum(reach)
        best_m, best_rate = 0, expected / (fixed + c.t(n + 1))
        for m, (gain, _) in enumerate(gains, start=1):
            expected += gain
            rate = expected / (fixed + c.t(n + 1 + m))
            if rate > best_rate:
                best_m, best_rate = m, rate
        self._alternates_expected = sum(g for g, _ in gains[:best_m]) / value if best_m else 0.0
        return tuple(j for _, j in gains[:best_m])

    def update(self, outcome: StepOutcome) -> None:
        self._keep_ledger(outcome)
        self.costs.observe(outcome, self.n_fresh)
        self.n_fresh = model_lag_after(self.n_fresh, outcome)
        used = outcome.source if outcome.n_drafted > 0 else "none"
        observed: list[AcceptanceEstimate | RequestEstimate] = []
        if outcome.n_branch_nodes > 0:
            if outcome.source == "model":
                expected = self._alternates_expected or outcome.branch_weight
                self.alternate_yield.observe(expected, outcome.n_branch_accepted)
            else:
                self.branch_yield.observe(outcome.branch_weight, outcome.n_branch_accepted)
        self._alternates_expected = 0.0
        if used == "model":
            # The chain's own tokens (a token tree's alternates are scored above).
            n_chain = outcome.n_drafted - outcome.n_branch_nodes
            accepted = outcome.n_accepted - outcome.n_branch_accepted
            observed.append(self.model)
            self.model.observe(n_chain, accepted)
            if outcome.confidences:
                self.calibration.observe(outcome.confidences, accepted)
            self._since_model_s = 0.0
            if self._model_gains and not self.probes["model"].pending:
                in_sync_s = self.costs.draft_s(max(n_chain, 1), 1) + outcome.verify_s
                self._model_gains[-1] += (outcome.n_accepted + 1) * self.costs.t(1) - in_sync_s
        else:
            self._since_model_s += outcome.draft_s + outcome.verify_s
        candidate = self._candidate
        consensus = candidate.consensus if candidate is not None else "one"
        if candidate is not None and candidate.tokens and outcome.tokens:
            # Score the n-gram candidate on what the target produced, whatever drafted: as if
            # it had drafted min(len, produced) tokens.
            n = min(len(candidate.tokens), len(outcome.tokens))
            agree = 0
            while agree < n and candidate.tokens[agree] == outcome.tokens[agree]:
                agree += 1
            observed.append(self._bucket(candidate.match_len, candidate.consensus))
            observed[-1].observe(n, agree)
            self._scored_ngram = True
        elif used == "ngram":
            observed.append(self._bucket(outcome.match_len, consensus))
            observed[-1].observe(outcome.n_drafted, outcome.n_accepted)
        self._candidate = None
        # Evidence about a source that goes unused fades slowly, so that a source written off
        # long ago is tried again at its prior (besides the probes).
        for estimate in observed:
            (estimate.shared if isinstance(estimate, RequestEstimate) else estimate).seen()
        self._clock.now += 1
        for name, probe in self.probes.items():
            if name == used:
                probe.since = 0
                if probe.pending:
                    probe.interval = self._next_interval(name, probe.interval, outcome, consensus)
            else:
                probe.since += 1
            probe.pending = False

    def _keep_ledger(self, outcome: StepOutcome) -> None:
        """What the step's drafting lost against plain steps, in measured seconds (the lookup
        every step pays, drafting or not, is not the draft's; loading the draft model is)."""
        if outcome.load_s > 0.0:
            self._lost_s += outcome.load_s
            self._model_load_s = 0.0
        t1 = self.costs.t(1)
        produced = outcome.n_accepted + 1
        self._plain_s += produced * t1
        if outcome.n_drafted > 0:
            spent = outcome.verify_s
            if outcome.source == "model":
                spent += max(outcome.draft_s - self.costs.overhead_s, 0.0)
            self._lost_s += spent - produced * t1

    def _next_interval(
        self, source: SourceName, interval: int, outcome: StepOutcome, consensus: Consensus
    ) -> int:
        """Reset the backoff when the probe shows the source now beats a plain step."""
        c = self.costs
        if source == "model":
            alphas = self.model.alphas(self.k_max)
            per_token = c.draft_s(2, 1) - c.draft_s(1, 1)
            _, rate = self._best_k(alphas, self.k_max, c.draft_s(1, 1) - per_token, per_token)
        else:
            alphas = self._bucket(outcome.match_len, consensus).alphas(self.k_max)
            _, rate = self._best_k(alphas, self.k_max, c.ngram_s, 0.0)
        if rate > 1.0 / c.t(1):
            return self.probe_min
        return min(interval * 2, self.probe_max)
