"""A scripted fake language model over a tiny vocabulary, for tests of the pure parts.

`FakeModel.logits(context)` is a pure function of (seed, context): the context seeds a small
Generator that draws normal logits. A draft model mixes the target's logits with its own, so it
agrees with the target often but not always (per-token acceptance about 40-80%).
Results are memoized and returned read-only, so a verifier that writes into its inputs fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge_spec.sampling import SamplingParams, argmax, probs_from_logits

N_VOCAB = 5


class FakeModel:
    """Deterministic conditional distributions p(next | context) over n_vocab tokens.

    logits(context) = own_weight * N(0, logit_scale^2) draws seeded by (seed, context)
                      + base_weight * base.logits(context)   (if a base model is given)
    """

    def __init__(
        self,
        seed: int,
        n_vocab: int = N_VOCAB,
        logit_scale: float = 1.5,
        base: FakeModel | None = None,
        base_weight: float = 0.0,
    ) -> None:
        self.seed = seed
        self.n_vocab = n_vocab
        self.logit_scale = logit_scale
        self.base = base
        self.base_weight = base_weight
        self._logits: dict[tuple[int, ...], np.ndarray] = {}
        self._probs: dict[tuple[tuple[int, ...], SamplingParams], np.ndarray] = {}
        self._rows: dict[tuple[tuple[int, ...], tuple[int, ...], SamplingParams], np.ndarray] = {}

    def logits(self, context: Sequence[int]) -> np.ndarray:
        """float32 (n_vocab,) logits for the token after context; read-only, memoized."""
        key = tuple(map(int, context))
        cached = self._logits.get(key)
        if cached is None:
            rng = np.random.default_rng([self.seed, len(key), *key])
            values = self.logit_scale * rng.standard_normal(self.n_vocab)
            if self.base is not None:
                values = values + self.base_weight * self.base.logits(key)
            cached = _read_only(values.astype(np.float32))
            self._logits[key] = cached
        return cached

    def probs(self, context: Sequence[int], params: SamplingParams) -> np.ndarray:
        """float64 (n_vocab,) next-token distribution after the sampling transform.

        Greedy params give a point mass on the argmax. Read-only, memoized.
        """
        key = (tuple(map(int, context)), params)
        cached = self._probs.get(key)
        if cached is None:
            logits = self.logits(key[0])
            if params.greedy:
                values = np.zeros(self.n_vocab)
                values[argmax(logits)] = 1.0
            else:
                values = probs_from_logits(logits, params)
            cached = _read_only(values)
            self._probs[key] = cached
        return cached

    def probs_rows(
        self, context: Sequence[int], tokens: Sequence[int], params: SamplingParams
    ) -> np.ndarray:
        """(len(tokens) + 1, n_vocab) rows: row i is probs(context + tokens[:i]); memoized.

        This is what one batched forward pass over `tokens` gives: the target's k + 1 rows for k
        draft tokens, or (with tokens[:-1]) the draft's k rows.
        """
        ctx = tuple(map(int, context))
        toks = tuple(map(int, tokens))
        key = (ctx, toks, params)
        cached = self._rows.get(key)
        if cached is None:
            cached = _read_only(
                np.stack([self.probs(ctx + toks[:i], params) for i in range(len(toks) + 1)])
            )
            self._rows[key] = cached
        return cached


def make_target(n_vocab: int = N_VOCAB) -> FakeModel:
    """The fake target model."""
    return FakeModel(seed=1234, n_vocab=n_vocab)


def make_draft(target: FakeModel) -> FakeModel:
    """A fake draft that is correlated with target but deliberately different."""
    return FakeModel(seed=5678, n_vocab=target.n_vocab, base=target, base_weight=0.6)


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values
