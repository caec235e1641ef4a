"""k policies: per step, which draft source to use and how many tokens to draft (k, down to 0).

The engine asks `plan()` before each step, lets a model draft stop early through
`keep_drafting()`, and reports every step's outcome to `update()`. The same objects drive
`edge-spec simulate`, which replays recorded acceptance traces against device cost curves.

Policies: `FixedK` (one source, one k), `HeuristicK` (transformers' +2/-1 schedule) and
`CostModelK`, which picks (source, k) maximising expected tokens per second,
E(k) / (draft cost + t(k + 1)) (Sequoia's hardware-aware form of Leviathan's walltime factor),
from online acceptance estimates and an online-corrected device cost curve.
"""

from __future__ import annotations

import math
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
            batch = _curve(self.draft_verify_s, n_fresh)
            return batch + (k - 1) * self.draft_verify_s[0]
        return self.draft_token_s * (self.rel(n_fresh) + k - 1)


def _curve(points: tuple[float, ...], n: int) -> float:
    """points[n - 1], extrapolated linearly from the last two points past the end."""
    if n <= len(points):
        return points[n - 1]
    last, prev = points[-1], points[-2] if len(points) > 1 else 0.0
    return last + (n - len(points)) * max(last - prev, 0.0)


Consensus = Literal["one", "all", "split"]


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

    @property
    def consensus(self) -> Consensus:
        """ "one" (a single occurrence), "all" (several, all agreeing) or "split"."""
        if self.n_agreeing < self.n_occurrences:
            return "split"
        return "one" if self.n_occurrences <= 1 else "all"


NO_MATCH = NgramCandidate((), 0, 0, 0)  # the n-gram lookup found nothing


@dataclass(frozen=True)
class StepPlan:
    source: SourceName
    k: int  # draft at most k tokens (0: a plain target step)


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


def model_lag_after(n_fresh: int, outcome: StepOutcome) -> int:
    """How many tokens a model draft's first decode will cover after `outcome` (1: only the
    target's new token). After a model draft of d tokens the draft's cache holds all but the
    last drafted token; other steps add their tokens to what it lacks."""
    if outcome.source == "model" and outcome.n_drafted > 0:
        return 2 if outcome.n_accepted == outcome.n_drafted else 1
    return n_fresh + outcome.n_accepted + 1


class KPolicy(Protocol):
    name: str

    def wants_model(self) -> bool:
        """Asked before begin(): whether the model draft is likely to draft in the coming
        request. The engine prefills the draft model with the prompt only then; otherwise the
        draft's first proposal catches up, a cost the policy weighs (model_lag)."""

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


def _clamp_k(source: SourceName, k: int, k_cap: int, ngram: NgramCandidate | None) -> StepPlan:
    k = min(k, k_cap)
    if source == "ngram":
        k = min(k, len(ngram.tokens)) if ngram is not None else 0
    return StepPlan(source, k) if k > 0 and source != "none" else PLAIN


def _pick_source(preferred: SourceName | None, sources: Sequence[SourceName]) -> SourceName:
    if preferred is not None:
        return preferred if preferred in sources else "none"
    return next((s for s in DRAFT_SOURCES if s in sources), "none")


# ---- baselines -------------------------------------------------------------------------------


class FixedK:
    """Always the same source and k (capped by k_cap and the n-gram proposal's length).
    source None: the model draft if the engine has one, else the n-gram lookup."""

    def __init__(self, k: int, source: SourceName | None = None) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k = k
        self.source = source
        self.name = f"fixed-{source or 'auto'}-{k}" if source != "none" else "none"

    def wants_model(self) -> bool:
        return self.k > 0 and self.source in (None, "model")

    def begin(self, model_lag: int = 1) -> None:
        pass

    def plan(
        self, sources: Sequence[SourceName], k_cap: int, ngram: NgramCandidate | None
    ) -> StepPlan:
        return _clamp_k(_pick_source(self.source, sources), self.k, k_cap, ngram)

    def keep_drafting(self, i: int, confidence: float) -> bool:
        return True

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


# ---- the cost model's estimators -------------------------------------------------------------


class AcceptanceEstimate:
    """Per draft position i, alpha_i = P(token i accepted | tokens < i accepted), from
    exponentially decayed counts (each observation multiplies the old counts by `decay`).

    Shrinkage is hierarchical: position i leans on the pooled rate of all positions with
    `prior_weight` pseudo-counts, and the pooled rate leans on `prior` the same way, so the
    prior fades as evidence comes in and deep, rarely reached positions borrow from shallow ones.
    """

    def __init__(
        self, prior: float, n_positions: int, decay: float = 0.95, prior_weight: float = 2.0
    ) -> None:
        self.prior = min(max(prior, 0.0), 1.0)
        self.decay = decay
        self.prior_weight = prior_weight
        # The decayed counts are _accepted[i] * _scale: fading all of them is one multiply of
        # _scale (the policy forgets every unused estimate on every step).
        self._accepted = [0.0] * n_positions
        self._reached = [0.0] * n_positions
        self._scale = 1.0
        self._alphas: list[float] | None = None  # alphas(len) until the next change
        self._pooled = self.prior

    @property
    def accepted(self) -> list[float]:
        return [a * self._scale for a in self._accepted]

    @property
    def reached(self) -> list[float]:
        return [r * self._scale for r in self._reached]

    def pooled(self) -> float:
        w, scale = self.prior_weight, self._scale
        return (sum(self._accepted) * scale + w * self.prior) / (sum(self._reached) * scale + w)

    def alphas(self, k: int) -> list[float]:
        """alpha_0 .. alpha_{k-1} (positions past the tracked range use the pooled rate)."""
        n = len(self._reached)
        if self._alphas is None:
            w, pooled, scale = self.prior_weight, self.pooled(), self._scale
            self._alphas = [
                (a * scale + w * pooled) / (r * scale + w)
                for a, r in zip(self._accepted, self._reached)
            ]
            self._pooled = pooled
        if k <= n:
            return self._alphas[:k]
        return self._alphas + [self._pooled] * (k - n)

    def forget(self, factor: float) -> None:
        """Let the evidence fade towards the prior without a new observation."""
        self._scale *= factor
        self._alphas = None
        if self._scale < 1e-200:  # fold the scale in before it underflows
            self._accepted = self.accepted
            self._reached = self.reached
            self._scale = 1.0

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """A step drafted n_drafted tokens and the first n_accepted of them were accepted."""
        if n_drafted <= 0:
            return
        self.forget(self.decay)
        one = 1.0 / self._scale
        for i in range(min(n_drafted, n_accepted + 1, len(self._reached))):
            self._reached[i] += one
            if i < n_accepted:
                self._accepted[i] += one


class RequestEstimate:
    """A request's own acceptance, shrunk towards a shared estimate: the shared one carries what
    was learned across requests, this one follows the text at hand (code being copied, or prose
    that does not repeat) within a few steps. Evidence goes to both."""

    def __init__(self, shared: AcceptanceEstimate, weight: float = 3.0) -> None:
        self.shared = shared
        self.weight = weight
        n = len(shared.reached)
        self.accepted = [0.0] * n
        self.reached = [0.0] * n

    def alphas(self, k: int) -> list[float]:
        w, n = self.weight, len(self.reached)
        return [
            (self.accepted[i] + w * g) / (self.reached[i] + w) if i < n else g
            for i, g in enumerate(self.shared.alphas(k))
        ]

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.shared.observe(n_drafted, n_accepted)
        for i in range(min(n_drafted, n_accepted + 1, len(self.reached))):
            self.reached[i] += 1.0
            if i < n_accepted:
                self.accepted[i] += 1.0


class ConfidenceCalibration:
    """P(a draft token is accepted | the draft's probability for it), per confidence bin, from
    decayed counts; each bin's prior is the confidence itself (a calibrated draft)."""

    EDGES = (0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.96, 0.985, 0.995)

    def __init__(self, decay: float = 0.99, prior_weight: float = 2.0) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self.accepted = [0.0] * (len(self.EDGES) + 1)
        self.seen = [0.0] * (len(self.EDGES) + 1)

    def _bin(self, confidence: float) -> int:
        for b, edge in enumerate(self.EDGES):
            if confidence < edge:
                return b
        return len(self.EDGES)

    def p_accept(self, confidence: float) -> float:
        confidence = min(max(confidence, 0.0), 1.0)
        b = self._bin(confidence)
        w = self.prior_weight
        return (self.accepted[b] + w * confidence) / (self.seen[b] + w)

    def observe(self, confidences: Sequence[float], n_accepted: int) -> None:
        """Tokens < n_accepted were accepted, token n_accepted rejected, later ones unseen."""
        d = self.decay
        for i, confidence in enumerate(confidences[: n_accepted + 1]):
            b = self._bin(min(max(confidence, 0.0), 1.0))
            self.accepted = [a * d for a in self.accepted]
            self.seen = [s * d for s in self.seen]
            self.seen[b] += 1.0
            if i < n_accepted:
                self.accepted[b] += 1.0


class _LogRatio:
    """A robust running estimate of measured / predicted: an EMA in log space whose inputs are
    clipped to within `clip` (a factor of 2) of the current estimate, bounded to 1/8 .. 8."""

    def __init__(self, weight: float = 0.1, clip: float = math.log(2.0)) -> None:
        self.weight = weight
        self.clip = clip
        self.value = 0.0
        self.n = 0

    def observe(self, measured: float, predicted: float, start: float = 0.0) -> None:
        """start: the log-ratio believed before the first sample (the first one moves it by
        at most `clip`)."""
        if not (measured > 0 and predicted > 0 and math.isfinite(measured)):
            return
        if self.n == 0:
            self.value = start
        x = math.log(measured / predicted)
        x = min(max(x, self.value - self.clip), self.value + self.clip)
        w = max(self.weight, 1.0 / (self.n + 1))
        self.value = min(max(self.value + w * (x - self.value), -_LOG8), _LOG8)
        self.n += 1


_LOG8 = math.log(8.0)


class OnlineCosts:
    """The profile's CostCurve, corrected online from measured step times so that a stale or
    foreign profile heals: one robust ratio per verify batch size (a size not yet measured
    borrows the nearest smaller measured size's), one for the model draft, and the per-step overhead
    that every option pays (the engine's lookup and planning, timed as draft time of plain
    steps)."""

    def __init__(self, profile: CostCurve, n_sizes: int) -> None:
        self.profile = profile
        self._verify = [_LogRatio() for _ in range(n_sizes + 1)]
        self._verify_all = _LogRatio()
        self._draft = _LogRatio()
        self.overhead_s = 0.0
        self._n_overhead = 0
        self._t: list[float] | None = None

    def _log_ratio(self, n: int) -> float:
        # A size never measured takes the ratio of the nearest smaller size that was (the
        # profile's shape may be off, not just its scale: a policy that never tries large
        # batches would otherwise never learn that they are cheaper than the profile says).
        for m in range(min(n, len(self._verify) - 1), 0, -1):
            if self._verify[m].n:
                return self._verify[m].value
        return self._verify_all.value

    def t(self, n: int) -> float:
        # Read for every k of every option on every step: the whole curve is computed once
        # after each measurement.
        if self._t is None:
            self._t = self._curve()
        if n < len(self._t):
            return self._t[n]
        return self.profile.t(n) * math.exp(self._log_ratio(n))

    def _curve(self) -> list[float]:
        """[0, t(1), t(2), ...] for the sizes with a ratio of their own or borrowed."""
        out = [0.0]
        ratio = self._verify_all.value
        seen = False
        for n in range(1, len(self._verify)):
            if self._verify[n].n:
                ratio, seen = self._verify[n].value, True
            out.append(self.profile.t(n) * math.exp(ratio if seen else self._verify_all.value))
        return out

    def draft_s(self, k: int, n_fresh: int) -> float:
        return self.profile.draft_s(k, n_fresh) * math.exp(self._draft.value)

    @property
    def ngram_s(self) -> float:
        return self.profile.ngram_s

    def observe(self, outcome: StepOutcome, n_fresh: int) -> None:
        self._t = None
        n = outcome.n_drafted + 1
        predicted = self.profile.t(n)
        if n < len(self._verify):
            self._verify[n].observe(outcome.verify_s, predicted, self._log_ratio(n))
        self._verify_all.observe(outcome.verify_s, predicted)
        if outcome.source == "none":
            # Bounded: at most a tenth of a plain step, so one slow call cannot poison plans.
            sample = min(max(outcome.draft_s, 0.0), 0.1 * self.t(1))
            self._n_overhead += 1
            w = max(0.1, 1.0 / self._n_overhead)
            self.overhead_s += w * (sample - self.overhead_s)
        elif outcome.source == "model" and outcome.n_drafted > 0:
            measured = outcome.draft_s - self.overhead_s
            self._draft.observe(measured, self.profile.draft_s(outcome.n_drafted, n_fresh))


# ---- the cost-model policy -------------------------------------------------------------------

# The n-gram source's acceptance is estimated per match length (1, 2, 3-5, 6-11, 12+ tokens)
# and per consensus of the matched n-gram's occurrences, with graded priors.
NGRAM_BUCKETS = (1, 2, 3, 6, 12)
NGRAM_MATCH_PRIOR = (0.6, 1.0, 1.4, 1.6, 1.8)
NGRAM_CONSENSUS_PRIOR: dict[Consensus, float] = {"one": 1.0, "all": 1.2, "split": 0.6}


@dataclass
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

    Evidence stays fresh three ways. When outcomes carry the produced tokens, every step
    scores the n-gram candidate against them, whichever source drafted (free evidence). A
    model that stops being chosen is probed with k = 1 after 8, 16, ... 128 steps without it
    (reset when a probe shows it pays), unless re-decoding the tokens its cache lacks would
    cost more than `probe_budget` of the time since it last drafted: on a CPU that means
    probes happen where the lag is short, e.g. at the start of a request. And evidence about
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
        self.model = AcceptanceEstimate(prior["model"], n, decay)
        # Longer and unanimous matches predict acceptance better: separate estimates.
        self.ngram = {
            (m, kind): AcceptanceEstimate(min(prior["ngram"] * f * g, 0.95), n, decay)
            for m, f in zip(NGRAM_BUCKETS, NGRAM_MATCH_PRIOR)
            for kind, g in NGRAM_CONSENSUS_PRIOR.items()
        }
        self.calibration = ConfidenceCalibration()
        self.probes = {s: _Probe(probe_min) for s in DRAFT_SOURCES}
        self._since_model_s = 0.0  # target time since the model last drafted (probe budget)
        self._scored_ngram = False  # whether outcomes carry tokens to score n-gram candidates
        self._candidate: NgramCandidate | None = None
        self.begin()

    # ---- per request / per step state ----

    def wants_model(self) -> bool:
        """Whether the model's best plan with its cache in sync beats a plain step now."""
        c = self.costs
        per_token = c.draft_s(2, 1) - c.draft_s(1, 1)
        fixed = c.overhead_s + c.draft_s(1, 1) - per_token
        _, rate = self._best_k(self.model.alphas(self.k_max), self.k_max, fixed, per_token)
        return self.k_max > 0 and rate > 1.0 / (c.overhead_s + c.t(1))

    def begin(self, model_lag: int = 1) -> None:
        # Tokens the model draft's next first decode covers: 1 when the engine prefilled it.
        self.n_fresh = max(model_lag, 1)
        self._rate = 0.0  # tokens/s the current plan expects
        self._k_plan = 0
        self._alphas: list[float] = []
        self._reach = 1.0  # P(every model token so far this step is accepted)
        self._ngram_request = {m: RequestEstimate(shared) for m, shared in self.ngram.items()}
        self._lost_s = 0.0  # measured seconds drafting lost (negative: gained) this request
        self._plain_s = 0.0  # what the tokens produced so far take as plain steps

    def _risk_caps(self, k_cap: int) -> dict[SourceName, int]:
        """Per draft source, the largest k whose total loss (every token rejected) stays within
        the request's allowance (k_cap for every source when the ledger is off)."""
        if self.risk_floor is None:
            return dict.fromkeys(DRAFT_SOURCES, k_cap)
        c = self.costs
        t1 = c.t(1)
        allowance = self.risk_floor * t1 + self.risk_rate * self._plain_s - self._lost_s
        caps: dict[SourceName, int] = {}
        for source in DRAFT_SOURCES:
            k = 0
            while k < k_cap:
                extra = c.t(k + 2) - t1
                if source == "model":
                    extra += c.draft_s(k + 1, self.n_fresh)
                if extra > allowance:
                    break
                k += 1
            caps[source] = k
        return caps

    def _bucket(self, match_len: int, consensus: Consensus = "one") -> RequestEstimate:
        m = max(b for b in NGRAM_BUCKETS if b <= max(match_len, 1))
        return self._ngram_request[m, consensus]

    def _best_k(
        self, alphas: Sequence[float], k_cap: int, fixed_s: float, per_token_s: float
    ) -> tuple[int, float]:
        """(k, tokens/s) maximising E(k) / (fixed_s + k * per_token_s + t(k + 1)), k in 1..k_cap."""
        best_k, best_rate = 0, 0.0
        total, reach = 1.0, 1.0
        for k in range(1, k_cap + 1):
            reach *= alphas[k - 1]
            total += reach
            rate = total / (fixed_s + k * per_token_s + self.costs.t(k + 1))
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
        if "ngram" in sources and ngram is not None and ngram.tokens and ngram_cap > 0:
            cap = min(ngram_cap, len(ngram.tokens))
            alphas = self._bucket(ngram.match_len, ngram.consensus).alphas(cap)
            out["ngram"] = self._best_k(alphas, cap, c.overhead_s + c.ngram_s, 0.0)
        return out

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
        if source != "model":
            probe = self._probe(sources, k_cap, ngram, source, rate)
            if probe is not None and caps[probe] < 1:
                probe = None
            if probe is not None:
                source, k = probe, 1
                self.probes[probe].pending = True
        self._rate = rate
        self._reach = 1.0
        self._k_plan = k if source != "none" else 0
        if source == "model" and not self.probes["model"].pending:
            # The cap: keep_drafting() decides where the draft really stops.
            self._k_plan = min(k_cap, self.k_max, caps["model"])
        self._alphas = self.model.alphas(self._k_plan) if source == "model" else []
        return StepPlan(source, self._k_plan) if self._k_plan > 0 else PLAIN

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
            if cost <= self.probe_budget * self._since_model_s:
                return "model"
        return None

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

    def update(self, outcome: StepOutcome) -> None:
        self._keep_ledger(outcome)
        self.costs.observe(outcome, self.n_fresh)
        self.n_fresh = model_lag_after(self.n_fresh, outcome)
        used = outcome.source if outcome.n_drafted > 0 else "none"
        observed: list[AcceptanceEstimate | RequestEstimate] = []
        if used == "model":
            observed.append(self.model)
            self.model.observe(outcome.n_drafted, outcome.n_accepted)
            if outcome.confidences:
                self.calibration.observe(outcome.confidences, outcome.n_accepted)
            self._since_model_s = 0.0
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
        seen_shared = [getattr(seen, "shared", seen) for seen in observed]
        for estimate in (self.model, *self.ngram.values()):
            if all(estimate is not seen for seen in seen_shared):
                estimate.forget(self.forget_rate)
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
        every step pays, drafting or not, is not the draft's)."""
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


POLICY_NAMES = ("fixed", "heuristic", "cost")


def make_policy(name: str, costs: CostCurve | None, k: int, k_max: int) -> KPolicy:
    """ "fixed": always k tokens from the model draft (else the n-gram lookup); "heuristic":
    +2/-1 from k_start = k; "cost": CostModelK on `costs` (required). Raises ValueError."""
    if name == "fixed":
        return FixedK(min(k, k_max))
    if name == "heuristic":
        return HeuristicK(k_start=max(1, min(k, k_max)), k_max=max(k_max, 1))
    if name == "cost":
        if costs is None:
            raise ValueError("the cost policy needs a device cost curve")
        return CostModelK(costs, k_max=k_max)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
