"""Sampling parameters and the pure-numpy transforms that turn logits into probabilities.

The transform is llama.cpp's default sampler chain, in its order: top-k, top-p, min-p, then
temperature. Rejection sampling is lossless only when the target and the draft rows go through
the same transform, so both callers use `probs_from_logits` with the same `SamplingParams`.
Ties are broken towards the lower token id everywhere (top-k, top-p, argmax).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edge_spec.errors import InvalidRequestError

__all__ = [
    "LazyProbs",
    "SampleKeys",
    "SamplingParams",
    "argmax",
    "make_rng",
    "probs_from_logits",
    "sample",
    "weights_from_logits",
]

# Candidate-set sizes top-p tries before a full sort: the nucleus is usually small, and each try
# costs O(n_vocab) where a full sort of a 262,144-token row costs O(n_vocab log n_vocab).
_TOP_P_TRIES = (64, 1024, 16384)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return _is_int(value) or isinstance(value, (float, np.floating))


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens; every field's "off" value is its default.

    Raises InvalidRequestError on construction if a field is out of range (naming field and value).
    """

    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None  # None = fresh entropy

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:  # NaN fails the comparison
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise InvalidRequestError(f"seed must be None or an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax over logits (temperature 0)."""
        return self.temperature == 0


def make_rng(seed: int | None) -> np.random.Generator:
    """Return a Generator seeded from `seed` (fresh entropy for None)."""
    return np.random.default_rng(seed)


class SampleKeys:
    """A request's randomness, keyed by the position of the token it decides.

    A sampled token is chosen by an exponential race (the Gumbel-max trick): token x finishes
    at E_x / w_x, where w_x is its weight and E_x ~ Exp(1) is keyed by (seed, position, x);
    the first to finish is drawn with probability w_x / sum(w). Because the keys do not depend
    on anything else, the text depends on the seed and the target's rows alone -- not on what
    a draft proposed, how many tokens a step verified, or what earlier requests left in a
    session. A draft that races with the same keys picks the target's token wherever their
    distributions agree (Gumbel coupling): measured on the real pairs, this keeps 96-97 % of
    rejection sampling's acceptance (scripts/measure_keyed.py), where an inverse CDF with one
    shared uniform kept 88 %.

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
        self.seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)
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


def weights_from_logits(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Unnormalized float32 weights of one logit row after the sampling transform: proportional
    to probs_from_logits(row, params), 1.0 for the top token, exactly 0 for filtered tokens.

    float32 exp is 4x faster than float64 on this CPU, and every sampled token pays it over the
    whole vocabulary; its relative error (~1e-7) is far below the logits' own batch noise.
    Requires params.temperature > 0 and a finite row maximum; raises ValueError otherwise.
    """
    if params.greedy:
        raise ValueError("temperature 0 is greedy: take argmax(logits), not weights")
    z = np.array(row, dtype=np.float32)  # the one working copy
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"a logit row must be 1-D and non-empty, got shape {z.shape}")
    z_max = z.max()
    if not np.isfinite(z_max):
        raise ValueError(f"a logit row has a non-finite maximum ({z_max}): NaN, +inf or all -inf")
    z -= z_max
    keep = _survivors(z, params)
    if keep is None:
        z *= np.float32(1.0 / params.temperature)
        return np.exp(z, out=z)
    weights = np.zeros_like(z)
    weights[keep] = np.exp(z[keep] * np.float32(1.0 / params.temperature))
    return weights


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Apply top-k, top-p, min-p, then temperature (llama.cpp's order) to each row of logits.

    Requires: params.temperature > 0 (greedy callers use `argmax`); logits of shape (n_vocab,) or
    (n, n_vocab), with a finite maximum in every row (-inf masks a token; NaN and +inf raise).
    Returns: float64 probabilities of the same shape, each row summing to 1, with exactly 0 for
    every token a filter dropped. top-p and min-p act on the unscaled logits, as in llama.cpp.
    Raises: ValueError on temperature 0, a bad shape or a non-finite row maximum.
    """
    if params.greedy:
        raise ValueError("temperature 0 is greedy: take argmax(logits), not probabilities")
    values = np.asarray(logits)
    if values.ndim not in (1, 2) or values.shape[-1] == 0:
        raise ValueError(f"logits must have shape (n_vocab,) or (n, n_vocab), got {values.shape}")
    rows = values.reshape(-1, values.shape[-1])
    out = np.empty(rows.shape, dtype=np.float64)
    # At most k + 1 rows; the vocabulary itself is never looped over in Python.
    for row, out_row in zip(rows, out, strict=True):
        _fill_probs(row, params, out_row)
    return out.reshape(values.shape)


class LazyProbs:
    """probs_from_logits(logits, params) row by row, each row computed when first indexed.

    Verification reads rows only up to the first rejection; at temperature > 0 one row over a
    262,144-token vocabulary costs a sizeable part of a decode on a CPU, so a rejected draft
    must not pay for the rows after it. Requires what probs_from_logits requires of a 2-D array.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        if params.greedy:
            raise ValueError("temperature 0 is greedy: take argmax(logits), not probabilities")
        if logits.ndim != 2 or logits.shape[1] == 0:
            raise ValueError(f"logits must have shape (n, n_vocab), got {logits.shape}")
        self._logits = logits
        self._params = params
        self._rows: dict[int, np.ndarray] = {}
        self.shape: tuple[int, int] = logits.shape
        self.ndim = 2

    @property
    def n_computed(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> np.ndarray:
        """Row i (float64, sums to 1)."""
        if not isinstance(i, (int, np.integer)):
            raise TypeError("LazyProbs is indexed by one row number")
        if i not in self._rows:
            row = np.empty(self.shape[1], dtype=np.float64)
            _fill_probs(self._logits[i], self._params, row)
            self._rows[i] = row
        return self._rows[i]


def _fill_probs(row: np.ndarray, params: SamplingParams, out_row: np.ndarray) -> None:
    """Write the transformed probabilities of one logit row into out_row (float64, same size)."""
    z = row.astype(np.float64)  # the one working copy; float64 keeps exp and sums accurate
    z_max = z.max()
    if not np.isfinite(z_max):
        raise ValueError(f"a logit row has a non-finite maximum ({z_max}): NaN, +inf or all -inf")
    z -= z_max  # the top token is at 0 and always survives, so exp below cannot overflow
    keep = _survivors(z, params)
    if keep is None:
        z /= params.temperature
        np.exp(z, out=out_row)
        out_row /= out_row.sum()
        return
    weights = np.exp(z[keep] / params.temperature)
    out_row.fill(0.0)
    out_row[keep] = weights / weights.sum()


def _survivors(z: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """Token ids that pass top-k, top-p and min-p on max-shifted logits z; None means all."""
    keep: np.ndarray | None = None
    if 0 < params.top_k < z.size:
        keep = _top_k(z, params.top_k)
    if params.top_p < 1:
        keep = _top_p(z, keep, params.top_p)
    if params.min_p > 0:
        floor = math.log(params.min_p)  # prob >= min_p * max prob  <=>  z - z_max >= log(min_p)
        keep = np.flatnonzero(z >= floor) if keep is None else keep[z[keep] >= floor]
    return keep


def _top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the k largest values; among values tied at the cut, the lowest ids.

    Requires 0 < k <= values.size. O(n) via introselect (the same algorithm as np.argpartition).
    """
    kth = np.partition(values, values.size - k)[values.size - k]  # the k-th largest value
    above = np.flatnonzero(values > kth)
    tied = np.flatnonzero(values == kth)[: k - above.size]
    return np.sort(np.concatenate((above, tied)))


def _top_p(z: np.ndarray, keep: np.ndarray | None, top_p: float) -> np.ndarray:
    """The smallest set of top candidates, by descending z, whose softmax mass is >= top_p.

    Candidates are `keep` (ascending ids) or the whole row; the mass is the softmax over the
    candidates of the unscaled logits. Always keeps at least one token.
    """
    values = z if keep is None else z[keep]
    weights = np.exp(values)
    total = weights.sum()
    for size in (*[s for s in _TOP_P_TRIES if s < values.size], values.size):
        # The cumulative mass depends only on the sorted weights, not on which of several tied
        # tokens comes first, so sort weights alone and pick the token ids with _top_k after.
        head = weights if size == values.size else np.partition(weights, values.size - size)
        cum = np.cumsum(np.sort(head[values.size - size :])[::-1]) / total
        if size == values.size or cum[-1] >= top_p:
            n_keep = min(int(np.searchsorted(cum, top_p, side="left")) + 1, size)
            chosen = _top_k(values, n_keep)
            return chosen if keep is None else keep[chosen]
    raise AssertionError("unreachable: the last try covers every candidate")


def sample(probs_row: np.ndarray, u: float) -> int:
    """The token id at quantile u in [0, 1] of a 1-D row of non-negative weights (inverse CDF
    in token-id order).

    The row need not sum to exactly 1 (it is scaled by its sum), so a residual can be passed
    unnormalized. A token with weight 0 is never returned, even under rounding. Long rows are
    searched block by block: block sums, then a cumulative sum inside one block only.
    Raises: ValueError if the row is not 1-D or its sum is not a positive finite number.
    """
    if probs_row.ndim != 1:
        raise ValueError(f"probs_row must be 1-D, got shape {probs_row.shape}")
    n = probs_row.size
    if n <= 4 * _BLOCK:
        return _inverse_cdf(probs_row, u)
    pad = (-n) % _BLOCK
    rows = np.concatenate((probs_row, np.zeros(pad, probs_row.dtype))) if pad else probs_row
    block_cdf = rows.reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64).cumsum()  # (n_blocks,)
    total = float(block_cdf[-1])
    if not (total > 0 and math.isfinite(total)):
        raise ValueError(f"probs_row must have a positive finite sum, got {total}")
    at = u * total
    b = int(block_cdf.searchsorted(at, side="right"))
    if b >= block_cdf.size:  # u * total rounded up to total: the last block with weight
        b = int(np.flatnonzero(np.diff(block_cdf, prepend=0.0) > 0)[-1])
    start = b * _BLOCK
    before = float(block_cdf[b - 1]) if b else 0.0
    block = rows[start : start + _BLOCK]
    return start + _inverse_cdf(block, (at - before) / (float(block_cdf[b]) - before))


_BLOCK = 1024


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    cdf = weights.cumsum(dtype=np.float64)  # methods, not np.* wrappers: once per token
    total = float(cdf[-1])
    if not (total > 0 and math.isfinite(total)):
        raise ValueError(f"probs_row must have a positive finite sum, got {total}")
    token = int(cdf.searchsorted(u * total, side="right"))
    if token >= cdf.size:  # u * total rounded up to total: take the last token with weight
        token = int(np.flatnonzero(weights)[-1])
    return token


def argmax(logits_row: np.ndarray) -> int:
    """The greedy token: index of the largest logit, the lowest id among ties."""
    if logits_row.ndim != 1:
        raise ValueError(f"logits_row must be 1-D, got shape {logits_row.shape}")
    return int(np.argmax(logits_row))
