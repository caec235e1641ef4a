"""Tests for edge_spec.verify: greedy and rejection-sampling verifiers.

The central test simulates speculative decoding with a fake target and a fake draft and checks
that the first two output tokens follow the target's exact joint distribution; two deliberately
wrong verifiers must fail the same check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from fake_model import (
    N_VOCAB,
    FakeModel,
    in_parallel,
    make_draft,
    make_target,
    n_chunks,
    tv_bound_for,
)

from edge_spec.decode.verify import Verdict, verify_greedy, verify_keyed, verify_rejection
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import (
    LazyProbs,
    SamplingParams,
    argmax,
    make_rng,
    probs_from_logits,
    sample,
)

Verifier = Callable[[Sequence[int], np.ndarray | None, np.ndarray, np.random.Generator], Verdict]


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values


def _one_hot_rows(tokens: Sequence[int], n_vocab: int = N_VOCAB) -> np.ndarray:
    rows = np.full((len(tokens), n_vocab), 0.0)
    rows[np.arange(len(tokens)), list(tokens)] = 1.0
    return _read_only(rows)


class _Draws:
    """A stand-in Generator whose random() returns scripted values, in order."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


# ---------------------------------------------------------------- greedy


def test_greedy_all_match_accepts_k_and_appends_bonus() -> None:
    logits = _one_hot_rows([3, 1, 4, 2]).astype(np.float32)  # (k + 1, n_vocab), k = 3
    assert verify_greedy([3, 1, 4], logits) == Verdict((3, 1, 4, 2), 3)


@pytest.mark.parametrize("i", [0, 1, 2])
def test_greedy_mismatch_at_i_accepts_i_and_appends_target_argmax(i: int) -> None:
    target_tokens = [3, 1, 4, 2]
    draft_tokens = [3, 1, 4]
    draft_tokens[i] = (draft_tokens[i] + 1) % N_VOCAB
    logits = _one_hot_rows(target_tokens).astype(np.float32)
    verdict = verify_greedy(draft_tokens, logits)
    assert verdict == Verdict(tuple(target_tokens[: i + 1]), i)


def test_greedy_k_zero_returns_target_argmax() -> None:
    logits = np.array([[0.0, 0.5, 2.0, 2.0, -1.0]], dtype=np.float32)
    assert verify_greedy([], logits) == Verdict((2,), 0)  # ties go to the lower id


def test_greedy_rejects_bad_shapes_and_tokens() -> None:
    logits = np.zeros((3, N_VOCAB), dtype=np.float32)
    with pytest.raises(ValueError, match="shape"):
        verify_greedy([1, 2, 3], logits)
    with pytest.raises(ValueError, match="shape"):
        verify_greedy([1], logits[0])
    with pytest.raises(ValueError, match="vocabulary"):
        verify_greedy([1, N_VOCAB], logits)
    with pytest.raises(ValueError, match="vocabulary"):
        verify_greedy([-1, 0], logits)


# ---------------------------------------------------------------- rejection: unit cases


def test_rejection_k_zero_samples_bonus_from_target() -> None:
    p_target = _one_hot_rows([4])
    assert verify_rejection([], None, p_target, make_rng(0)) == Verdict((4,), 0)
    p_draft = _read_only(np.zeros((0, N_VOCAB)))
    assert verify_rejection([], p_draft, p_target, make_rng(0)) == Verdict((4,), 0)


def test_rejection_accepts_when_target_agrees() -> None:
    p_target = _one_hot_rows([1, 2, 0])
    p_draft = _one_hot_rows([1, 2])
    for seed in range(20):
        assert verify_rejection([1, 2], p_draft, p_target, make_rng(seed)) == Verdict((1, 2, 0), 2)
        assert verify_rejection([1, 2], None, p_target, make_rng(seed)) == Verdict((1, 2, 0), 2)


def test_rejection_never_accepts_a_token_the_target_excludes() -> None:
    p_target = _read_only(np.array([[0.0, 0.5, 0.5, 0.0, 0.0], [0.2] * 5]))
    p_draft = _read_only(np.array([[0.9, 0.1, 0.0, 0.0, 0.0]]))
    rng = make_rng(0)
    for _ in range(200):
        verdict = verify_rejection([0], p_draft, p_target, rng)
        assert verdict.n_accepted == 0
        assert verdict.tokens[0] in (1, 2)
        verdict = verify_rejection([0], None, p_target, rng)
        assert verdict.n_accepted == 0
        assert verdict.tokens[0] in (1, 2)


def test_rejection_residual_excludes_over_drafted_tokens() -> None:
    # Residual max(0, p_target - p_draft) = [0, 0, 0.3, 0, 0]: a rejection must give token 2.
    p_target = _read_only(np.array([[0.3, 0.4, 0.3, 0.0, 0.0], [0.2] * 5]))
    p_draft = _read_only(np.array([[0.6, 0.4, 0.0, 0.0, 0.0]]))
    verdict = verify_rejection([0], p_draft, p_target, _Draws(0.99, 0.0))  # type: ignore[arg-type]
    assert verdict == Verdict((2,), 0)
    # A point-mass draft: the residual is p_target with the draft token zeroed.
    verdict = verify_rejection([1], None, p_target, _Draws(0.99, 0.0))  # type: ignore[arg-type]
    assert verdict == Verdict((0,), 0)


def test_rejection_degenerate_residual_falls_back_to_target() -> None:
    # p_draft >= p_target everywhere (p_draft not exactly normalized): the residual is all zero.
    p_target = _read_only(np.array([[0.5, 0.3, 0.2, 0.0, 0.0], [0.2] * 5]))
    p_draft = _read_only(np.array([[0.6, 0.3, 0.2, 0.0, 0.0]]))
    verdict = verify_rejection([0], p_draft, p_target, _Draws(0.99, 0.9))  # type: ignore[arg-type]
    assert verdict == Verdict((2,), 0)  # 0.9 falls in token 2's share of p_target[0]


def test_rejection_with_lazy_rows_stops_computing_at_the_first_rejection() -> None:
    # Row 0 gives token 0 no mass: a point-mass draft of it is rejected there, and rows 1..3
    # (the later positions and the bonus) are never computed; same verdict as the eager rows.
    logits = np.zeros((4, N_VOCAB), dtype=np.float32)
    logits[0, 0] = -np.inf
    params = SamplingParams(temperature=0.8)
    lazy = LazyProbs(logits, params)
    verdict = verify_rejection([0, 1, 2], None, lazy, make_rng(5))
    assert verdict.n_accepted == 0 and lazy.n_computed == 1
    eager = _read_only(probs_from_logits(logits, params))
    assert verify_rejection([0, 1, 2], None, eager, make_rng(5)) == verdict


def test_rejection_rejects_bad_shapes_and_tokens() -> None:
    p_target = _read_only(np.full((3, N_VOCAB), 0.2))
    p_draft = _read_only(np.full((2, N_VOCAB), 0.2))
    rng = make_rng(0)
    with pytest.raises(ValueError, match="p_target"):
        verify_rejection([1], p_draft[:1], p_target, rng)
    with pytest.raises(ValueError, match="p_draft"):
        verify_rejection([1, 2], p_draft[:1], p_target, rng)
    with pytest.raises(ValueError, match="p_draft"):
        verify_rejection([1, 2], p_draft[:, :3], p_target, rng)
    with pytest.raises(ValueError, match="vocabulary"):
        verify_rejection([1, 7], p_draft, p_target, rng)


def test_rejection_same_seed_same_verdicts() -> None:
    target = make_target()
    draft = make_draft(target)
    params = SamplingParams(temperature=0.9, top_k=4)

    def run(seed: int) -> list[Verdict]:
        rng = make_rng(seed)
        verdicts = []
        for _ in range(300):
            verdicts.append(_speculative_step(verify_rejection, target, draft, params, (), 3, rng))
        return verdicts

    assert run(7) == run(7)
    assert run(7) != run(8)


# ---------------------------------------------------------------- the distribution test

PREFIX = (1, 2, 3)
# The bound each case is held to: tv_bound_for (the exact joint's own McDiarmid bound), 0.022
# to 0.025 at 30,000 runs (the worst-case tv_bound at 50,000 runs was 0.022).
N_RUNS = 30_000


def _speculative_step(
    verifier: Verifier,
    target: FakeModel,
    draft: FakeModel,
    params: SamplingParams,
    context: tuple[int, ...],
    k: int,
    rng: np.random.Generator,
    greedy_draft: bool = False,
) -> Verdict:
    """Draft k tokens after context, then verify them against the target's k + 1 rows."""
    drafted: tuple[int, ...] = ()
    for _ in range(k):
        if greedy_draft:  # deterministic draft: its argmax, passed to the verifier as None
            drafted += (argmax(draft.logits(context + drafted)),)
        else:
            drafted += (sample(draft.probs(context + drafted, params), rng.random()),)
    p_draft = None if greedy_draft else draft.probs_rows(context, drafted[:-1], params)
    p_target = target.probs_rows(context, drafted, params)  # (k + 1, n_vocab)
    return verifier(drafted, p_draft, p_target, rng)


def _empirical_joint(
    verifier: Verifier, params: SamplingParams, k: int, greedy_draft: bool = False
) -> np.ndarray:
    """(V, V) frequencies of the first two output tokens after PREFIX over N_RUNS runs, in
    one chunk of runs per core, each with its own random stream."""
    n = n_chunks()
    calls = [
        (verifier, params, k, greedy_draft, 20_231_118 + i, len(part))
        for i, part in enumerate(np.array_split(np.arange(N_RUNS), n))
    ]
    cells = np.concatenate(in_parallel(_joint_cells, calls))
    counts = np.bincount(cells, minlength=N_VOCAB * N_VOCAB)
    return (counts / N_RUNS).reshape(N_VOCAB, N_VOCAB)


def _joint_cells(
    verifier: Verifier, params: SamplingParams, k: int, greedy_draft: bool, seed: int, n: int
) -> np.ndarray:
    """The first two output tokens of n runs as cell ids (module level: runs in a worker)."""
    target = make_target()
    draft = make_draft(target)
    rng = make_rng(seed)
    cells = np.empty(n, dtype=np.int64)
    for run in range(n):
        out: tuple[int, ...] = ()
        while len(out) < 2:  # one step may yield a single token: continue from the new context
            step = _speculative_step(
                verifier, target, draft, params, PREFIX + out, k, rng, greedy_draft
            )
            out += step.tokens
        cells[run] = out[0] * N_VOCAB + out[1]
    return cells


def _target_joint(params: SamplingParams) -> np.ndarray:
    """(V, V) exact p_target(x1 | PREFIX) * p_target(x2 | PREFIX + x1)."""
    target = make_target()
    p_first = target.probs(PREFIX, params)
    return np.stack([p_first[x1] * target.probs(PREFIX + (x1,), params) for x1 in range(N_VOCAB)])


def _tv(params: SamplingParams, verifier: Verifier, k: int, greedy_draft: bool = False) -> float:
    empirical = _empirical_joint(verifier, params, k, greedy_draft)
    return 0.5 * float(np.abs(empirical - _target_joint(params)).sum())


# Not the identity in the k = 2 and k = 3 cases: top-k / top-p / min-p cut tokens and T != 1.
CASES = [
    pytest.param(1, SamplingParams(temperature=1.0), False, id="k1-plain"),
    pytest.param(2, SamplingParams(temperature=0.7, top_k=4, top_p=0.9), False, id="k2-topk-topp"),
    pytest.param(3, SamplingParams(temperature=1.3, top_p=0.95, min_p=0.05), False, id="k3-minp"),
    pytest.param(2, SamplingParams(temperature=0.8, top_k=4), True, id="k2-greedy-draft"),
]
WRONG_CASE_PARAMS = SamplingParams(temperature=0.7, top_k=4, top_p=0.9)


def test_fake_draft_is_partially_accepted() -> None:
    # Mean acceptance sum_x min(p_target, p_draft) over the contexts the simulation visits most.
    target = make_target()
    draft = make_draft(target)
    params = SamplingParams(temperature=1.0)
    contexts = [PREFIX] + [PREFIX + (x,) for x in range(N_VOCAB)]
    acceptance = [
        np.minimum(target.probs(c, params), draft.probs(c, params)).sum() for c in contexts
    ]
    assert 0.4 <= float(np.mean(acceptance)) <= 0.8


@pytest.mark.parametrize(("k", "params", "greedy_draft"), CASES)
def test_rejection_output_follows_target_distribution(
    k: int, params: SamplingParams, greedy_draft: bool
) -> None:
    bound = tv_bound_for(N_RUNS, _target_joint(params).ravel())
    assert _tv(params, verify_rejection, k, greedy_draft) < bound


def _verify_resample_target(
    draft_tokens: Sequence[int],
    p_draft: np.ndarray | None,
    p_target: np.ndarray,
    rng: np.random.Generator,
) -> Verdict:
    """WRONG: on rejection samples p_target instead of the residual (over-weights draft tokens)."""
    assert p_draft is not None
    k = len(draft_tokens)
    for i, token in enumerate(draft_tokens):
        if rng.random() * p_draft[i, token] >= p_target[i, token]:
            return Verdict(tuple(draft_tokens[:i]) + (sample(p_target[i], rng.random()),), i)
    return Verdict(tuple(draft_tokens) + (sample(p_target[k], rng.random()),), k)


def _verify_always_accept(
    draft_tokens: Sequence[int],
    p_draft: np.ndarray | None,
    p_target: np.ndarray,
    rng: np.random.Generator,
) -> Verdict:
    """WRONG: keeps every draft token, so the output follows the draft's distribution."""
    k = len(draft_tokens)
    return Verdict(tuple(draft_tokens) + (sample(p_target[k], rng.random()),), k)


@pytest.mark.parametrize("verifier", [_verify_resample_target, _verify_always_accept])
def test_wrong_verifiers_fail_the_bound(verifier: Verifier) -> None:
    bound = tv_bound_for(N_RUNS, _target_joint(WRONG_CASE_PARAMS).ravel())
    assert _tv(WRONG_CASE_PARAMS, verifier, 2) > bound


# ---------------------------------------------------------------- keyed (T > 0, draft-free output)


def _logits(p: np.ndarray) -> np.ndarray:
    """Logits whose softmax at temperature 1 is p (zero probabilities: -inf)."""
    with np.errstate(divide="ignore"):
        return np.log(p).astype(np.float32)


T1 = SamplingParams(temperature=1.0)


def test_keyed_verdict_is_the_targets_own_draw_whatever_was_drafted() -> None:
    # Whatever the draft, the tokens produced are the target's keyed draws for their positions:
    # a right draft only lets more of them come out of one pass.
    target = make_target()
    rng = make_rng(3)
    for trial in range(300):
        keys = SampleKeys(trial)
        k = int(rng.integers(0, 5))
        drafted = tuple(int(t) for t in rng.integers(0, N_VOCAB, size=k))
        p_target = target.probs_rows(PREFIX, drafted, SamplingParams(temperature=0.9))
        logits = _logits(p_target)  # (k + 1, n_vocab)
        verdict = verify_keyed(drafted, logits, T1, keys, 17)
        own = [keys.draw(logits[i], T1, 17 + i)[0] for i in range(verdict.n_accepted + 1)]
        assert list(verdict.tokens) == own
        assert verdict.tokens[: verdict.n_accepted] == drafted[: verdict.n_accepted]
        if verdict.n_accepted < k:
            assert own[-1] != drafted[verdict.n_accepted]


def test_keyed_accepts_a_point_mass_draft_with_the_targets_probability() -> None:
    # Over many positions (fresh keys each), x is kept at rate p_target(x): the acceptance
    # rejection sampling gives a deterministic draft. 5 binomial standard deviations.
    p_target = np.array([[0.1, 0.0, 0.6, 0.3, 2e-5], [0.2] * 5])
    logits = _logits(p_target)
    keys = SampleKeys(11)
    n = 20_000
    for x in range(N_VOCAB):
        kept = np.mean([verify_keyed([x], logits, T1, keys, j).n_accepted for j in range(n)])
        assert abs(kept - p_target[0, x]) <= 5 * math.sqrt(0.25 / n) + 1e-12


def _keyed_verifier(
    draft_tokens: Sequence[int],
    p_draft: np.ndarray | None,
    p_target: np.ndarray,
    rng: np.random.Generator,
) -> Verdict:
    """verify_keyed with fresh keys per step (the draft drew its tokens from rng, not coupled
    with the keys: the output must follow p_target all the same)."""
    keys = SampleKeys(int(rng.integers(2**62)))
    return verify_keyed(draft_tokens, _logits(p_target), T1, keys, 0)


@pytest.mark.parametrize(("k", "params", "greedy_draft"), CASES)
def test_keyed_output_follows_target_distribution(
    k: int, params: SamplingParams, greedy_draft: bool
) -> None:
    bound = tv_bound_for(N_RUNS, _target_joint(params).ravel())
    assert _tv(params, _keyed_verifier, k, greedy_draft) < bound
