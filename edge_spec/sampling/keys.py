"""Keyed randomness for sampled tokens: each draw is a pure function of (seed, position, token
id) and the target's row, so the text never depends on what was drafted."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable

import numpy as np

from edge_spec.sampling.transform import SamplingParams, sample, weights_from_logits

__all__ = ["SampleKeys"]


class SampleKeys:
    """A request's randomness, keyed by the position of the token it decides.

    A sampled token is chosen by an exponential race (the Gumbel-max trick): token x finishes
    at E_x / w_x, where w_x is its weight and E_x ~ Exp(1) is keyed by (seed, position, x);
    the first to finish is drawn with probability w_x / sum(w). Because the keys do not depend
    on anything else, the text depends on the seed and the target's rows alone -- not on what
    a draft proposed, how many tokens a step verified, or what earlier requests left in a
    session. A draft that races with the same keys picks the target's token wherever their
    distributions agree (Gumbel coupling): measured on the real pairs, this keeps 96-97 % of
    rejection sampling's acceptance (scripts/measure_keyed.py, in git history), where an
    inverse CDF with one shared uniform kept 88 %.

    Keyed noise for a whole vocabulary costs 0.3-2 ms a token here, so only the tokens within
    HEAD of the top weight race on keys of their own. The rest race as two groups, each
    finishing at E_group / (its total weight) and, if it wins, giving a token by inverse CDF
    at a keyed uniform (the minimum of independent exponentials is exponential with the summed
    rate, and which one it was is distributed by weight): the middle, down to TAIL of the top,
    and the tail below it. Every tail weight is below TAIL, so the tail finishes no earlier
    than E_tail / (n_tail * TAIL): its exact total -- a pass over the whole vocabulary -- is
    computed only when even that could win. Exact; most draws cost one comparison pass over
    the row. seed None draws fresh entropy once.
    """

    HEAD = 1e-4
    TAIL = 1e-7

    def __init__(self, seed: int | None) -> None:
        # 128 bits of fresh entropy, as numpy's SeedSequence() draws them (without importing
        # numpy.random on a process's first request: 10 ms measured).
        self.seed = secrets.randbits(128) if seed is None else int(seed)
        self._key = _mix64((self.seed & _MASK64) ^ _mix64(self.seed >> 64))

    def draw(self, logits: np.ndarray, params: SamplingParams, position: int) -> tuple[int, float]:
        """The token at `position` from a 1-D logit row under the sampling transform, and its
        probability (exact unless the tail was never weighed: then over the head and middle
        only, too high by at most n_tail * TAIL). Requires params.temperature > 0 and a finite
        row maximum."""
        if params.greedy:
            raise ValueError("temperature 0 is greedy: take argmax(logits)")
        if 0 < params.top_k < logits.size or params.top_p < 1 or params.min_p > 0:
            weights = weights_from_logits(logits, params)  # the filters need the whole row
            token = self.sample(weights, position)
            return token, float(weights[token]) / float(weights.sum(dtype=np.float64))
        z_max = float(logits.max())
        if not math.isfinite(z_max):
            raise ValueError(f"a logit row has a non-finite maximum ({z_max})")
        scale = 1.0 / params.temperature
        known = np.flatnonzero(logits >= z_max + params.temperature * _LOG_TAIL)
        w_known = np.exp((logits[known].astype(np.float64) - z_max) * scale)

        def tail() -> np.ndarray:
            rest = np.exp((logits.astype(np.float64) - z_max) * scale)
            rest[known] = 0.0
            return rest

        return self._race(known, w_known, logits.size - known.size, tail, position)

    def sample(self, weights: np.ndarray, position: int) -> int:
        """The token at `position` from a 1-D row of non-negative weights (any scale) with at
        least one positive weight: the same race as draw() on that row."""
        w_max = float(weights.max())
        if not (w_max > 0 and math.isfinite(w_max)):
            raise ValueError(f"weights must have a positive finite maximum, got {w_max}")
        known = np.flatnonzero(weights >= w_max * self.TAIL)  # ascending ids
        w_known = weights[known].astype(np.float64) / w_max

        def tail() -> np.ndarray:
            rest = weights.astype(np.float64) / w_max
            rest[known] = 0.0
            return rest

        return self._race(known, w_known, weights.size - known.size, tail, position)[0]

    def _race(
        self,
        known: np.ndarray,
        w_known: np.ndarray,
        n_tail: int,
        tail: Callable[[], np.ndarray],
        position: int,
    ) -> tuple[int, float]:
        """The race between the head tokens, the middle and the tail; `known` are the ids of
        the head and middle tokens with their weights (the top's is 1)."""
        in_head = w_known >= self.HEAD
        head, w_head = known[in_head], w_known[in_head]
        e_mid, u_mid, e_tail, u_tail = self._group_keys(position)
        times = -np.log(self._uniforms(position, head)) / w_head
        best = int(times.argmin())
        t_best = float(times[best])
        total = float(w_known.sum())
        w_mid = total - float(w_head.sum())
        middle_wins = w_mid > 0 and e_mid < t_best * w_mid
        if middle_wins:
            t_best = e_mid / w_mid
        if n_tail and e_tail < t_best * n_tail * self.TAIL:  # the tail might win: weigh it
            rest = tail()
            w_tail = float(rest.sum())
            total += w_tail
            if w_tail > 0 and e_tail < t_best * w_tail:
                token = sample(rest, u_tail)
                return token, float(rest[token]) / total
        if middle_wins:
            i = sample(np.where(in_head, 0.0, w_known), u_mid)
            return int(known[i]), float(w_known[i]) / total
        return int(head[best]), float(w_head[best]) / total

    def margin(self, weights: np.ndarray, position: int) -> float:
        """How far the draw at `position` is from going another way: the log of the runner-up's
        finish time over the winner's (the middle and the tail each counting as one runner).
        Noise of d in the logits moves each log-weight by at most d / temperature, so it can
        change the draw only where the margin is below 2 d / temperature."""
        w = weights.astype(np.float64) / float(weights.max())
        head = np.flatnonzero(w >= self.HEAD)
        e_mid, _, e_tail, _ = self._group_keys(position)
        times = list(-np.log(self._uniforms(position, head)) / w[head])
        w_mid = float(w[(w < self.HEAD) & (w >= self.TAIL)].sum())
        w_tail = float(w[w < self.TAIL].sum())
        times += [e / g for e, g in ((e_mid, w_mid), (e_tail, w_tail)) if g > 0]
        times.sort()
        return math.log(times[1] / times[0]) if len(times) > 1 else math.inf

    def _group_keys(self, position: int) -> tuple[float, float, float, float]:
        """The middle's and the tail's race times (Exp(1)) and pick uniforms: _uniforms for
        four keys past any vocabulary, in plain integers (numpy costs more for four)."""
        base = _mix64((self._key + (position + 1) * _GOLDEN) & _MASK64)
        u = [((_mix64(base + key * _GOLDEN) >> 11) + 1.0) * 2.0**-53 for key in _GROUP_KEYS]
        return -math.log(u[0]), u[1], -math.log(u[2]), u[3]

    def _uniforms(self, position: int, ids: np.ndarray) -> np.ndarray:
        """Uniforms in (0, 1], one per id, from (seed, position, id) alone."""
        base = np.uint64(_mix64((self._key + (position + 1) * _GOLDEN) & _MASK64))
        x = ids.astype(np.uint64)
        x *= _GOLDEN64  # uint64 arithmetic wraps modulo 2**64, as the hash wants
        x += base
        x ^= x >> _S30
        x *= _MIX1_64
        x ^= x >> _S27
        x *= _MIX2_64
        x ^= x >> _S31
        x >>= _S11
        return (x.astype(np.float64) + 1.0) * 2.0**-53


_LOG_TAIL = math.log(SampleKeys.TAIL)

# SplitMix64's constants and finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom
# number generators", OOPSLA 2014): a keyed hash with good avalanche, vectorized above. numpy
# has no random-access keyed generator, and drawing the whole vocabulary's noise per token
# costs 0.3-2 ms on this CPU.
_MASK64 = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN64, _MIX1_64, _MIX2_64 = np.uint64(_GOLDEN), np.uint64(_MIX1), np.uint64(_MIX2)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)
# Keys past any vocabulary: the middle's and the tail's places in the race, and their picks.
_GROUP_KEYS = tuple(range(1 << 62, (1 << 62) + 4))


def _mix64(x: int) -> int:
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    return x ^ (x >> 31)
