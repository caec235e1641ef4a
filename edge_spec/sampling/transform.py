"""Sampling parameters and the pure-numpy transforms that turn logits into probabilities.

The transform is llama.cpp's default sampler chain, in its order: top-k, top-p, min-p, then
temperature. Rejection sampling is lossless only when the target and the draft rows go through
the same transform, so both callers use `probs_from_logits` with the same `SamplingParams`.
Ties are broken towards the lower token id everywhere (top-k, top-p, argmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edge_spec.errors import InvalidRequestError

__all__ = [
    "LazyProbs",
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
MAX_LOGIT_BIAS = 1024


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
    # llama.cpp's penalties, applied to the logits before everything above (penalties.py):
    # over the last repeat_last_n tokens of the context (prompt and answer), a token's logit is
    # divided by repeat_penalty (multiplied, if negative), then lowered by frequency_penalty
    # per occurrence and presence_penalty once. The defaults are off.
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    # OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs (or a {token id: bias} dict)
    # added to the logits first.
    logit_bias: tuple[tuple[int, float], ...] = ()

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
        r = self.repeat_penalty
        if not _is_real(r) or not 0 < r <= 10:  # NaN fails the comparison
            raise InvalidRequestError(f"repeat_penalty must be in (0, 10], got {r!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2 <= value <= 2:  # OpenAI's range
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {value!r}")
        n = self.repeat_last_n
        if not _is_int(n) or not 0 <= n <= 1 << 20:
            raise InvalidRequestError(f"repeat_last_n must be an integer >= 0, got {n!r}")
        bias = self.logit_bias
        if isinstance(bias, dict):  # {token id: bias}, as OpenAI sends it (keys may be text)
            try:
                bias = tuple(sorted((int(t), b) for t, b in bias.items()))
            except (TypeError, ValueError):
                raise InvalidRequestError("logit_bias keys must be token ids") from None
        elif isinstance(bias, list):
            bias = tuple(tuple(pair) if isinstance(pair, list) else pair for pair in bias)
        object.__setattr__(self, "logit_bias", bias)
        if not isinstance(bias, tuple) or len(bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(
                f"logit_bias must be a tuple of at most {MAX_LOGIT_BIAS} (token, bias) pairs"
            )
        for pair in bias:
            ok = isinstance(pair, tuple) and len(pair) == 2 and _is_int(pair[0]) and pair[0] >= 0
            if not ok or not _is_real(pair[1]) or not -100 <= pair[1] <= 100:
                raise InvalidRequestError(
                    f"logit_bias holds (token id >= 0, bias in [-100, 100]) pairs, got {pair!r}"
                )

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax over logits (temperature 0)."""
        return self.temperature == 0

    @property
    def repeats_penalized(self) -> bool:
        """True when a repetition penalty is on and its window is not empty."""
        on = self.repeat_penalty != 1 or self.presence_penalty or self.frequency_penalty
        return bool(on) and self.repeat_last_n > 0

    @property
    def penalized(self) -> bool:
        """True when a logit bias or a penalty changes the logits (penalties.py)."""
        return bool(self.logit_bias) or self.repeats_penalized


def make_rng(seed: int | None) -> np.random.Generator:
    """Return a Generator seeded from `seed` (fresh entropy for None)."""
    return np.random.default_rng(seed)


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
