"""A scripted fake language model over a tiny vocabulary, for tests of the pure parts.

`FakeModel.logits(context)` is a pure function of (seed, context): the context seeds a small
Generator that draws normal logits. A draft model mixes the target's logits with its own, so it
agrees with the target often but not always (per-token acceptance about 40-80%).
Results are memoized and returned read-only, so a verifier that writes into its inputs fails.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from edge_spec.drafts.head import HeadDraft
from edge_spec.sampling.transform import SamplingParams, argmax, probs_from_logits

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


def tv_bound(n: int, m: int, false_failure_prob: float = 1e-5) -> float:
    """A total-variation level that the empirical distribution of n i.i.d. samples over m cells
    exceeds with probability < false_failure_prob.

    Mean: E[TV] = 0.5 * sum_j E|f_j - p_j| <= 0.5 * sum_j sqrt(p_j (1 - p_j) / n) (Jensen)
          <= 0.5 * sqrt(m / n) (Cauchy-Schwarz: sum_j sqrt(p_j) <= sqrt(m)).
    Deviation: replacing one of the n runs moves 1/n of mass between two cells, so TV changes by
    at most 1/n; McDiarmid gives P(TV >= E[TV] + t) <= exp(-2 n t^2), which equals
    false_failure_prob at t = sqrt(ln(1 / false_failure_prob) / (2 n)).
    """
    mean_bound = 0.5 * math.sqrt(m / n)
    deviation = math.sqrt(math.log(1.0 / false_failure_prob) / (2.0 * n))
    return mean_bound + deviation


def tv_bound_for(n: int, p_exact: np.ndarray, false_failure_prob: float = 1e-5) -> float:
    """tv_bound with the mean term from the exact distribution the samples should follow,
    0.5 * sum_j sqrt(p_j (1 - p_j) / n) (Jensen, without Cauchy-Schwarz's worst case)."""
    p = np.asarray(p_exact, dtype=np.float64)
    mean_bound = 0.5 * float(np.sqrt(p * (1.0 - p)).sum()) / math.sqrt(n)
    deviation = math.sqrt(math.log(1.0 / false_failure_prob) / (2.0 * n))
    return mean_bound + deviation


def runs_for(p_exact: np.ndarray, bound: float, n_max: int) -> int:
    """The fewest runs (at most n_max) whose tv_bound_for is at most `bound`: a distribution
    test as strict as the worst-case bound at n_max, in fewer runs where the distribution is
    concentrated."""
    n = 1000
    while n < n_max and tv_bound_for(n, p_exact) > bound:
        n = int(n * 1.05) + 1
    return min(n, n_max)


def in_parallel(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
    """fn(*args) for each args in calls, in worker processes, one per core: the statistics
    tests run tens of thousands of pure-Python generations, which parallelise where the models'
    tests cannot (llama.cpp already uses every core). fn must be a module-level function."""
    n_workers = min(len(calls), os.cpu_count() or 1)
    if n_workers <= 1:
        return [fn(*args) for args in calls]
    context = multiprocessing.get_context("spawn")  # a clean interpreter: nothing forked
    with ProcessPoolExecutor(n_workers, mp_context=context) as pool:
        return list(pool.map(fn, *zip(*calls)))


def n_chunks() -> int:
    """How many pieces a statistics test splits its runs into: one per core, or one under
    pytest-xdist, whose workers already take a core each."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return 1
    return max(os.cpu_count() or 1, 1)


class FakeLlama:
    """A FakeModel behind the same surface the engine and ModelDraft use on a LlamaModel
    (tokens, n_past, n_ctx, n_vocab, decode, truncate, sync), so the real decode loop and the real
    ModelDraft run on it. There is no batching noise: decode's rows equal one-at-a-time logits."""

    def __init__(self, model: FakeModel, n_ctx: int = 256) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.n_batch = n_ctx
        self.n_vocab = model.n_vocab
        self.tokens: list[int] = []
        self.n_decoded = 0  # tokens ever decoded: shows the KV cache is reused, not recomputed
        self.decode_s = 0.0  # the engine reads it as LlamaModel's time inside llama_decode
        # A "hidden state" per row of the last decode: the whole context through that row, so
        # a fake head (make_head) can compute from it what a real head learns to approximate.
        self.hidden_states = True
        self._contexts: list[list[int]] = []

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def decode(self, tokens: Sequence[int], logit_rows: Sequence[int] = ()) -> np.ndarray:
        assert self.n_past + len(tokens) <= self.n_ctx, "engine overran the context"
        rows = [self.model.logits(self.tokens + list(tokens[: r + 1])) for r in logit_rows]
        self._contexts = [self.tokens + [int(t) for t in tokens[: r + 1]] for r in logit_rows]
        self.tokens.extend(int(t) for t in tokens)
        self.n_decoded += len(tokens)
        return np.stack(rows) if rows else np.empty((0, self.n_vocab), dtype=np.float32)

    def hidden(self, row: int) -> np.ndarray:
        """Row `row` of the last decode's "hidden states": its context, as floats."""
        return np.array(self._contexts[row], dtype=np.float64)

    def truncate(self, n_keep: int) -> None:
        assert 0 <= n_keep <= self.n_past
        del self.tokens[n_keep:]

    max_tree_leaves = 4

    def decode_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Row i: the logits after the cache and token i's branch (its ancestors, then it)."""
        assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
        branches: list[list[int]] = []
        for i, token in enumerate(tokens):
            branches.append([*(branches[parents[i]] if i else []), int(token)])
        assert self.n_past + max(map(len, branches)) <= self.n_ctx, "engine overran the context"
        self.n_decoded += len(tokens)
        self._tree = branches
        self._contexts = [self.tokens + branch for branch in branches]
        return np.stack([self.model.logits(self.tokens + branch) for branch in branches])

    def keep_tree(self, path: Sequence[int]) -> None:
        branches = self._tree
        kept = branches[path[-1]] if path else branches[0]
        assert len(kept) == len(path) + 1
        self.tokens.extend(kept)
        self._tree = None

    def sync(self, tokens: Sequence[int]) -> int:
        common = 0
        while common < min(len(tokens), self.n_past) and self.tokens[common] == tokens[common]:
            common += 1
        self.truncate(common)
        self.decode(tokens[common:])
        return common


def make_target(n_vocab: int = N_VOCAB) -> FakeModel:
    """The fake target model."""
    return FakeModel(seed=1234, n_vocab=n_vocab)


def make_draft(target: FakeModel) -> FakeModel:
    """A fake draft that is correlated with target but deliberately different."""
    return FakeModel(seed=5678, n_vocab=target.n_vocab, base=target, base_weight=0.6)


def make_head(draft: FakeModel, reduced: Sequence[int] = (0, 1, 2, 3)) -> HeadDraft:
    """The real HeadDraft with a scripted step: from a FakeLlama "hidden state" (the context)
    and the newest token, the fake draft's logits over a reduced vocabulary (p_draft is zero
    for the tokens left out), and the extended context as the predicted next hidden state."""

    def step(hidden: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        context = [int(x) for x in hidden] + [int(token)]
        logits = draft.logits(context)[list(reduced)]
        return logits, np.array(context, dtype=np.float64)

    return _CheckedHead(step, reduced, draft.n_vocab)


class _CheckedHead(HeadDraft):
    """A HeadDraft that checks the engine's hand-over: the hidden state it was given (a fake
    one: the context through that row) plus the newest token is exactly the context it is asked
    to continue -- the row that chose the newest token, no other."""

    def propose(self, context, k, params, keys, keep_drafting=None):  # type: ignore[override]
        if self._hidden is not None and self._n_context == len(context):
            assert [int(x) for x in self._hidden] + [int(context[-1])] == list(context)
        return super().propose(context, k, params, keys, keep_drafting)


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values


class ScriptedConstraint:
    """A grammar over the fake vocabulary, for the decode loop's constraint seam
    (decode.constraint.StepConstraint): after any token t the next may only be one of
    RULES[t]; token 1 is always followed by 2, then 0 (forced text, two tokens long)."""

    RULES = {0: {0, 1, 2, 3}, 1: {2}, 2: {0}, 3: {1, 3, 4}, 4: {0, 3}}

    def __init__(self, last: int) -> None:
        self.tokens = [last]
        self.mask_s = 0.0

    def allowed(self) -> set[int]:
        return self.RULES[self.tokens[-1]]

    def forced(self, limit: int) -> list[int]:
        out: list[int] = []
        state = self.tokens[-1]
        while len(out) < limit and len(self.RULES[state]) == 1:
            (state,) = self.RULES[state]
            out.append(state)
        return out

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        state, n = self.tokens[-1], 0
        for token in tokens:
            if token not in self.RULES[state]:
                break
            state, n = token, n + 1
        return n

    def allows(self, token: int) -> bool:
        return token in self.allowed()

    def mask(self, row: np.ndarray) -> None:
        for token in range(row.shape[-1]):
            if token not in self.allowed():
                row[token] = -np.inf

    def advance(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            assert token in self.allowed(), (self.tokens, token)
            self.tokens.append(int(token))

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n :]

    def masked_probs(self, model: FakeModel, context: Sequence[int], params) -> np.ndarray:
        """The constrained target's next-token distribution after context (context's last
        token decides what is allowed)."""
        logits = np.array(model.logits(context), dtype=np.float64)
        for token in range(model.n_vocab):
            if token not in self.RULES[int(context[-1])]:
                logits[token] = -np.inf
        return probs_from_logits(logits.astype(np.float32), params)
