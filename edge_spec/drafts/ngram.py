"""Prompt-lookup drafting: no model, just the context repeating itself.

Finds the longest suffix n-gram (max_ngram down to min_ngram tokens) that occurred earlier in
the context and proposes the tokens that followed its most recent occurrence. Deterministic,
so it carries no p_draft; verification treats each token as a point mass.

It runs on every step of the auto mode, so it keeps an index of the context's n-grams that
grows with the context instead of scanning it each step; `lookup` is the plain scan, the
reference the index is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..policy import NgramCandidate
from ..sampling import SamplingParams
from .base import NO_DRAFT, Draft, KeepDrafting


class NgramDraft:
    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

        self._index = NgramIndex(max_ngram)

    def begin(self, prompt: Sequence[int]) -> None:
        self._index = NgramIndex(self.max_ngram)

    def candidate(self, context: Sequence[int], k: int) -> NgramCandidate:
        """What a proposal of up to k tokens would be, with the length of the n-gram matched."""
        tokens, match_len = self._index.lookup(context, k, self.min_ngram)
        return NgramCandidate(tokens, match_len)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        return Draft(tokens=self.candidate(context, k).tokens)


class NgramIndex:
    """For each n-gram (n <= max_ngram) of a growing context, where its most recent occurrence
    ended. Updating costs max_ngram dict writes per new token; a lookup, max_ngram reads."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self._seen: list[int] = []  # the indexed context (all but its last token)
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its last use

    def lookup(self, context: Sequence[int], k: int, min_ngram: int) -> tuple[tuple[int, ...], int]:
        """The same answer as `lookup(context, k, max_ngram, min_ngram)`."""
        n_ctx, n_seen = len(context), len(self._seen)
        if n_ctx <= n_seen or list(context[:n_seen]) != self._seen:
            n_seen = 0  # not an extension of what was indexed: start over
            self._seen, self._ends = [], {}
        # Index every n-gram ending before the last position: the suffix itself must not match.
        for end in range(n_seen + 1, n_ctx):
            for n in range(1, min(self.max_ngram, end) + 1):
                self._ends[tuple(context[end - n : end])] = end
        self._seen.extend(context[n_seen : n_ctx - 1])
        if k <= 0:
            return NO_DRAFT.tokens, 0
        for n in range(min(self.max_ngram, n_ctx - 1), min_ngram - 1, -1):
            start = self._ends.get(tuple(context[n_ctx - n :]))
            if start is not None:
                return tuple(int(t) for t in context[start : start + k]), n
        return NO_DRAFT.tokens, 0


def lookup(
    context: Sequence[int], k: int, max_ngram: int, min_ngram: int
) -> tuple[tuple[int, ...], int]:
    """Returns up to k tokens that followed the most recent earlier occurrence of the longest
    matching suffix n-gram of `context`, and that n-gram's length; ((), 0) when nothing matches."""
    n_ctx = len(context)
    if k <= 0 or n_ctx < min_ngram + 1:
        return NO_DRAFT.tokens, 0
    ids = np.asarray(context, dtype=np.int64)
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        pattern = ids[-n:]
        # Windows starting at 0..n_ctx-n-1: every occurrence except the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tuple(int(t) for t in ids[start : start + k]), n
    return NO_DRAFT.tokens, 0
