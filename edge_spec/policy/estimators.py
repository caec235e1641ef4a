"""The cost policy's estimators: acceptance per draft position (shared across requests and per
request), calibration of a model draft's confidences, and the device cost curve corrected online
from measured step times."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_spec.policy.types import CostCurve, StepOutcome


class ForgetClock:
    """A policy's step count, shared by its estimates that fade lazily: an estimate not
    observed in a step fades by `rate` for that step, applied when it is next read. A step
    then touches only the estimates it reads or observes (a plain step ran a loop over all
    sixteen, ~13 us with the caches cold after a target pass on this CPU)."""

    __slots__ = ("now", "rate")

    def __init__(self, rate: float) -> None:
        self.now = 0
        self.rate = rate


class AcceptanceEstimate:
    """Per draft position i, alpha_i = P(token i accepted | tokens < i accepted), from
    exponentially decayed counts (each observation multiplies the old counts by `decay`).

    Shrinkage is hierarchical: position i leans on the pooled rate of all positions with
    `prior_weight` pseudo-counts, and the pooled rate leans on `prior` the same way, so the
    prior fades as evidence comes in and deep, rarely reached positions borrow from shallow ones.
    """

    __slots__ = (
        "prior",
        "decay",
        "prior_weight",
        "_accepted",
        "_reached",
        "_scale",
        "_alphas",
        "_pooled",
        "_clock",
        "_stamp",
    )

    def __init__(
        self,
        prior: float,
        n_positions: int,
        decay: float = 0.95,
        prior_weight: float = 2.0,
        clock: ForgetClock | None = None,
    ) -> None:
        """clock: the policy's steps, for an estimate that fades by clock.rate in every step
        that did not observe it (the policy calls seen() for those that did)."""
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
        self._clock = clock
        self._stamp = clock.now if clock is not None else 0  # faded up to this step

    def _catch_up(self) -> None:
        """Apply the fading of the steps since the last one this estimate caught up to."""
        clock = self._clock
        if clock is not None and self._stamp != clock.now:
            steps, self._stamp = clock.now - self._stamp, clock.now
            self.forget(clock.rate**steps)

    def seen(self) -> None:
        """The current step observed this estimate: it does not fade for it."""
        if self._clock is not None:
            self._stamp = self._clock.now + 1

    @property
    def accepted(self) -> list[float]:
        self._catch_up()
        return [a * self._scale for a in self._accepted]

    @property
    def reached(self) -> list[float]:
        self._catch_up()
        return [r * self._scale for r in self._reached]

    def pooled(self) -> float:
        self._catch_up()
        w, scale = self.prior_weight, self._scale
        return (sum(self._accepted) * scale + w * self.prior) / (sum(self._reached) * scale + w)

    def alphas(self, k: int) -> list[float]:
        """alpha_0 .. alpha_{k-1} (positions past the tracked range use the pooled rate)."""
        n = len(self._reached)
        self._catch_up()
        if self._alphas is None:
            self._alphas = []
            self._pooled = self.pooled()
        done = self._alphas
        if len(done) < min(k, n):  # computed as far as asked since the last change
            w, pooled, scale = self.prior_weight, self._pooled, self._scale
            done += [
                (a * scale + w * pooled) / (r * scale + w)
                for a, r in zip(self._accepted[len(done) : k], self._reached[len(done) : k])
            ]
        if k <= n:
            return done[:k]
        return done + [self._pooled] * (k - n)

    def forget(self, factor: float) -> None:
        """Let the evidence fade towards the prior without a new observation."""
        self._scale *= factor
        self._alphas = None
        if self._scale < 1e-200:  # fold the scale in before it underflows
            self._accepted = [a * self._scale for a in self._accepted]
            self._reached = [r * self._scale for r in self._reached]
            self._scale = 1.0

    def state(self) -> dict[str, list[float]]:
        """The decayed counts (edge_spec.policy.learned saves them between processes)."""
        return {"accepted": self.accepted, "reached": self.reached}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Counts saved by state(); raises ValueError for another shape or impossible counts."""
        accepted = _floats(state, "accepted", len(self._accepted))
        reached = _floats(state, "reached", len(self._reached))
        if any(a > r + 1e-9 for a, r in zip(accepted, reached)):
            raise ValueError("more acceptances than drafts reached")
        self._accepted, self._reached, self._scale = accepted, reached, 1.0
        self._alphas = None
        if self._clock is not None:
            self._stamp = self._clock.now

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """A step drafted n_drafted tokens and the first n_accepted of them were accepted."""
        if n_drafted <= 0:
            return
        self._catch_up()
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

    __slots__ = ("shared", "weight", "accepted", "reached")

    def __init__(self, shared: AcceptanceEstimate, weight: float = 3.0) -> None:
        self.shared = shared
        self.weight = weight
        n = len(shared._reached)
        self.accepted = [0.0] * n
        self.reached = [0.0] * n

    def alphas(self, k: int) -> list[float]:
        w, shared = self.weight, self.shared.alphas(k)
        own = [(a + w * g) / (r + w) for a, r, g in zip(self.accepted, self.reached, shared)]
        return own + shared[len(own) :] if len(own) < k else own

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.shared.observe(n_drafted, n_accepted)
        for i in range(min(n_drafted, n_accepted + 1, len(self.reached))):
            self.reached[i] += 1.0
            if i < n_accepted:
                self.accepted[i] += 1.0


class RatioEstimate:
    """observed / expected over exponentially decayed sums, leaning on `prior` with
    `prior_weight` pseudo-counts of expectation: how far a token tree's branch weights (the
    share of occurrences that went each way) over- or under-state the tokens its branches
    really yield."""

    __slots__ = ("prior", "decay", "prior_weight", "_expected", "_observed")

    def __init__(self, prior: float, decay: float = 0.95, prior_weight: float = 2.0) -> None:
        self.prior, self.decay, self.prior_weight = prior, decay, prior_weight
        self._expected = 0.0
        self._observed = 0.0

    @property
    def value(self) -> float:
        w = self.prior_weight
        return (self._observed + w * self.prior) / (self._expected + w)

    def state(self) -> dict[str, float]:
        return {"expected": self._expected, "observed": self._observed}

    def restore(self, state: Mapping[str, Any]) -> None:
        self._expected = _float(state, "expected")
        self._observed = _float(state, "observed")

    def observe(self, expected: float, observed: float) -> None:
        self._expected = self.decay * self._expected + expected
        self._observed = self.decay * self._observed + observed


class ConfidenceCalibration:
    """P(a draft token is accepted | the draft's probability for it), per confidence bin, from
    decayed counts; each bin's prior is the confidence itself (a calibrated draft)."""

    __slots__ = ("decay", "prior_weight", "accepted", "seen")

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

    def state(self) -> dict[str, list[float]]:
        return {"accepted": list(self.accepted), "seen": list(self.seen)}

    def restore(self, state: Mapping[str, Any]) -> None:
        accepted = _floats(state, "accepted", len(self.accepted))
        seen = _floats(state, "seen", len(self.seen))
        if any(a > s + 1e-9 for a, s in zip(accepted, seen)):
            raise ValueError("more acceptances than tokens seen")
        self.accepted, self.seen = accepted, seen

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

    __slots__ = ("weight", "clip", "value", "n")

    def __init__(self, weight: float = 0.1, clip: float = math.log(2.0)) -> None:
        self.weight = weight
        self.clip = clip
        self.value = 0.0
        self.n = 0

    def state(self) -> list[float]:
        return [self.value, float(self.n)]

    def restore(self, state: Any) -> None:
        if not isinstance(state, list) or len(state) != 2:
            raise ValueError("a log ratio is [value, n]")
        value, n = (_finite(x) for x in state)
        if abs(value) > _LOG8 + 1e-9 or n < 0:
            raise ValueError("log ratio out of range")
        self.value, self.n = value, int(n)

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


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def _float(state: Mapping[str, Any], name: str) -> float:
    """A saved count or sum: finite and not negative."""
    if not isinstance(state, Mapping):
        raise ValueError("not a mapping")
    value = _finite(state.get(name))
    if value < 0:
        raise ValueError(f"{name} is negative")
    return value


def _floats(state: Mapping[str, Any], name: str, n: int) -> list[float]:
    if not isinstance(state, Mapping):
        raise ValueError("not a mapping")
    values = state.get(name)
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"{name}: expected {n} values")
    out = [_finite(v) for v in values]
    if min(out, default=0.0) < 0:
        raise ValueError(f"{name}: negative count")
    return out


# Per measured step, how far every other batch size's own ratio moves toward the pooled one.
# The policy measures a size only by choosing it, so without this one step slowed by another
# process (the first sample of a size sets its ratio) could write that size off for good.
_FADE = 0.02


class OnlineCosts:
    """The profile's CostCurve, corrected online from measured step times so that a stale or
    foreign profile heals: one robust ratio per verify batch size (a size not yet measured
    borrows the nearest smaller measured size's), one for the model draft, and the per-step overhead
    that every option pays (the engine's lookup and planning, timed as draft time of plain
    steps). A size's own ratio fades toward the pooled one while other sizes are measured, so a
    size misjudged once (a step slowed by another process) is chosen and measured again."""

    __slots__ = (
        "profile", "_verify", "_verify_all", "_draft", "overhead_s", "_n_overhead",
        "_profile_t", "_t", "_profile_draft", "_draft_exp", "_measured",
        "_ratio_of",
    )  # fmt: skip

    def __init__(self, profile: CostCurve, n_sizes: int) -> None:
        self.profile = profile
        self._verify = [_LogRatio() for _ in range(n_sizes + 1)]
        self._verify_all = _LogRatio()
        self._draft = _LogRatio()
        self.overhead_s = 0.0
        self._n_overhead = 0
        # The policy reads t(n) for every k of every option on every step, and a measurement
        # moves every measured size's ratio: the profile's own curve is read once here, the
        # corrected one built once per measurement, and the sizes measured so far kept apart.
        self._profile_t = [0.0] + [profile.t(n) for n in range(1, n_sizes + 1)]
        self._t: list[float] | None = None
        self._profile_draft: dict[tuple[int, int], float] = {}  # profile.draft_s(k, n_fresh)
        self._draft_exp = (0.0, 1.0)  # (the draft's log ratio, its exp)
        self._measured: list[int] = []  # the sizes with a ratio of their own, ascending
        self._ratio_of: list[int] = []
        self._set_measured([])

    def state(self) -> dict[str, Any]:
        return {
            "verify": [ratio.state() for ratio in self._verify],
            "verify_all": self._verify_all.state(),
            "draft": self._draft.state(),
            "overhead_s": self.overhead_s,
            "n_overhead": self._n_overhead,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        verify = state.get("verify")
        if not isinstance(verify, list) or len(verify) != len(self._verify):
            raise ValueError(f"verify ratios: expected {len(self._verify)}")
        for ratio, saved in zip(self._verify, verify):
            ratio.restore(saved)
        self._set_measured([m for m, ratio in enumerate(self._verify) if ratio.n and m > 0])
        self._verify_all.restore(state.get("verify_all"))
        self._draft.restore(state.get("draft"))
        overhead_s = _float(state, "overhead_s")
        if overhead_s > 0.1 * self.profile.t(1):  # never more than observe() lets in
            raise ValueError("per-step overhead out of range")
        self.overhead_s, self._n_overhead = overhead_s, int(_float(state, "n_overhead"))
        self._t = None

    def _log_ratio(self, n: int) -> float:
        # A size never measured takes the ratio of the nearest smaller size that was (the
        # profile's shape may be off, not just its scale: a policy that never tries large
        # batches would otherwise never learn that they are cheaper than the profile says).
        i = self._ratio_of[min(n, len(self._ratio_of) - 1)]
        return self._verify[self._measured[i - 1]].value if i else self._verify_all.value

    def _set_measured(self, measured: list[int]) -> None:
        """The sizes with a ratio of their own, and for each size which ratio it takes: its
        own, else the nearest smaller measured size's, else the pooled one (0)."""
        self._measured = measured
        self._ratio_of = [bisect.bisect_right(measured, n) for n in range(len(self._profile_t))]
        self._t = None

    def t(self, n: int) -> float:
        if n < len(self._profile_t):
            return self.curve()[n]
        return self.profile.t(n) * math.exp(self._log_ratio(n))

    def curve(self) -> list[float]:
        """[0, t(1), t(2), ...] up to the largest batch the policy plans (read-only): the
        sizes with a ratio of their own, and the larger ones borrowing the nearest smaller
        measured size's, the smaller ones the pooled ratio's."""
        if self._t is None:
            # _ratio_of[n]: which ratio size n takes (0: the pooled one, i: _measured[i - 1]).
            exps = [math.exp(self._verify_all.value)]
            exps += [math.exp(self._verify[m].value) for m in self._measured]
            self._t = [p * exps[i] for p, i in zip(self._profile_t, self._ratio_of)]
        return self._t

    def draft_s(self, k: int, n_fresh: int) -> float:
        key = (k, n_fresh)
        profile_s = self._profile_draft.get(key)
        if profile_s is None:
            if len(self._profile_draft) >= 4096:
                self._profile_draft.clear()
            profile_s = self._profile_draft[key] = self.profile.draft_s(k, n_fresh)
        if self._draft_exp[0] != self._draft.value:
            self._draft_exp = (self._draft.value, math.exp(self._draft.value))
        return profile_s * self._draft_exp[1]

    @property
    def ngram_s(self) -> float:
        return self.profile.ngram_s

    def observe(self, outcome: StepOutcome, n_fresh: int) -> None:
        self._t = None
        n = outcome.n_drafted + 1
        predicted = self._profile_t[n] if n < len(self._profile_t) else self.profile.t(n)
        if n < len(self._verify):
            ratio = self._verify[n]
            ratio.observe(outcome.verify_s, predicted, self._log_ratio(n))
            if ratio.n and n not in self._measured:
                self._set_measured(sorted([*self._measured, n]))
        self._verify_all.observe(outcome.verify_s, predicted)
        pooled = self._verify_all.value
        for m in self._measured:
            if m != n:
                ratio = self._verify[m]
                ratio.value += _FADE * (pooled - ratio.value)
        if outcome.source == "none":
            # Bounded: at most a tenth of a plain step, so one slow call cannot poison plans.
            sample = min(max(outcome.draft_s, 0.0), 0.1 * self.t(1))
            self._n_overhead += 1
            w = max(0.1, 1.0 / self._n_overhead)
            self.overhead_s += w * (sample - self.overhead_s)
        elif outcome.source == "model" and outcome.n_drafted > 0:
            measured = outcome.draft_s - self.overhead_s
            n_chain = outcome.n_drafted - outcome.n_branch_nodes  # what the draft decoded
            self._draft.observe(measured, self.profile.draft_s(n_chain, n_fresh))
