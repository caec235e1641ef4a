"""Tests for edge_spec.sampling: parameter validation, the llama.cpp-order transform, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_spec.errors import InvalidRequestError
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import (
    LazyProbs,
    SamplingParams,
    argmax,
    make_rng,
    probs_from_logits,
    sample,
    weights_from_logits,
)

# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1.0"),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", -0.5),
        ("top_p", math.nan),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("min_p", math.nan),
        ("seed", -1),
        ("seed", True),
        ("seed", 1.5),
    ],
)
def test_bad_value_raises_naming_field_and_value(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError) as excinfo:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert field in str(excinfo.value)
    assert repr(value) in str(excinfo.value)


def test_good_values_are_accepted() -> None:
    assert SamplingParams().greedy
    params = SamplingParams(temperature=0.8, top_k=40, top_p=1.0, min_p=1.0, seed=0)
    assert not params.greedy
    SamplingParams(temperature=2, top_p=0.01, min_p=0.0, seed=np.int64(3))  # type: ignore[arg-type]


def test_greedy_params_refuse_probabilities() -> None:
    with pytest.raises(ValueError, match="greedy"):
        probs_from_logits(np.zeros(4, dtype=np.float32), SamplingParams())


# ---------------------------------------------------------------- transforms

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0], dtype=np.float32)


def _softmax(values: np.ndarray) -> np.ndarray:
    e = np.exp(values - values.max())
    return np.asarray(e / e.sum())


def test_temperature_one_is_softmax() -> None:
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0))
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, _softmax(LOGITS.astype(np.float64)), rtol=1e-12)


def test_temperature_sharpens_below_one_and_flattens_above() -> None:
    base = probs_from_logits(LOGITS, SamplingParams(temperature=1.0))
    cold = probs_from_logits(LOGITS, SamplingParams(temperature=0.5))
    hot = probs_from_logits(LOGITS, SamplingParams(temperature=2.0))
    top = int(np.argmax(LOGITS))
    assert cold[top] > base[top] > hot[top]
    assert cold.max() - cold.min() > base.max() - base.min() > hot.max() - hot.min()
    np.testing.assert_allclose(cold, _softmax(LOGITS.astype(np.float64) / 0.5), rtol=1e-12)


def test_top_k_keeps_k_largest() -> None:
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(probs)) == {0, 3}
    np.testing.assert_allclose(probs[[0, 3]], _softmax(np.array([2.0, 3.0])), rtol=1e-12)
    everything = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_k=100))
    assert np.count_nonzero(everything) == LOGITS.size


def test_top_k_ties_keep_lowest_ids() -> None:
    logits = np.array([0.0, 5.0, 5.0, 5.0, 5.0], dtype=np.float32)
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert list(np.flatnonzero(probs)) == [1, 2]


def test_top_p_keeps_smallest_set_reaching_mass() -> None:
    logits = np.log(np.array([0.1, 0.4, 0.2, 0.3], dtype=np.float64)).astype(np.float32)
    # Sorted: 0.4, 0.3, 0.2, 0.1 -> cumulative 0.4, 0.7, 0.9, 1.0.
    cases = {0.3: {1}, 0.4: {1}, 0.5: {1, 3}, 0.7: {1, 3}, 0.8: {1, 2, 3}, 0.95: {0, 1, 2, 3}}
    for top_p, expected in cases.items():
        probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
        # 0.4 and 0.7 sit on float boundaries of the cumsum; allow the next set there.
        got = set(np.flatnonzero(probs))
        assert got == expected or (top_p in (0.4, 0.7) and len(got) == len(expected) + 1)


def test_top_p_always_keeps_one_token() -> None:
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_p=1e-9))
    assert list(np.flatnonzero(probs)) == [3]
    assert probs[3] == 1.0


def test_top_p_is_computed_on_unscaled_logits() -> None:
    # At T=1 the top two tokens hold ~0.91 of the mass; at T=10 they would hold far less. top-p
    # must use the unscaled softmax (llama.cpp applies temperature last), so 2 tokens survive.
    logits = np.array([3.0, 2.5, 0.0, 0.0, 0.0], dtype=np.float32)
    probs = probs_from_logits(logits, SamplingParams(temperature=10.0, top_p=0.9))
    assert set(np.flatnonzero(probs)) == {0, 1}


def test_top_p_applies_to_top_k_survivors() -> None:
    # After top-k=2: softmax([3, 2]) = [0.73, 0.27]; top_p=0.7 keeps only token 3.
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2, top_p=0.7))
    assert list(np.flatnonzero(probs)) == [3]


def test_min_p_drops_below_threshold() -> None:
    # Relative probabilities exp(logit - 3): token 0 -> 0.368, token 1 -> 0.135, token 2 -> 0.082.
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, min_p=0.1))
    assert set(np.flatnonzero(probs)) == {0, 1, 3}
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))
    assert set(np.flatnonzero(probs)) == {0, 3}
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, min_p=1.0))
    assert list(np.flatnonzero(probs)) == [3]


def test_temperature_applies_to_survivors_only() -> None:
    params = SamplingParams(temperature=0.5, top_k=3)
    probs = probs_from_logits(LOGITS, params)
    survivors = [0, 1, 3]
    expected = _softmax(LOGITS[survivors].astype(np.float64) / 0.5)
    np.testing.assert_allclose(probs[survivors], expected, rtol=1e-12)


def test_neg_inf_masks_and_nan_raises() -> None:
    logits = np.array([0.0, -np.inf, 1.0], dtype=np.float32)
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0))
    assert probs[1] == 0.0
    for bad in ([0.0, np.nan, 1.0], [0.0, np.inf], [-np.inf, -np.inf]):
        with pytest.raises(ValueError):
            probs_from_logits(np.array(bad, dtype=np.float32), SamplingParams(temperature=1.0))
    with pytest.raises(ValueError):
        probs_from_logits(np.zeros((2, 2, 2), dtype=np.float32), SamplingParams(temperature=1.0))


def _reference_probs(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Straightforward full-sort version of the llama.cpp chain, to check the fast one."""
    z = row.astype(np.float64)
    order = np.lexsort((np.arange(z.size), -z))  # descending logit, ascending id on ties
    if params.top_k > 0:
        order = order[: params.top_k]
    if params.top_p < 1:
        mass = _softmax(z[order])
        cut = int(np.searchsorted(np.cumsum(mass), params.top_p)) + 1
        order = order[: min(cut, order.size)]
    if params.min_p > 0:
        mass = _softmax(z[order])
        order = order[mass >= params.min_p * mass.max()]
    out = np.zeros(z.size)
    out[order] = _softmax(z[order] / params.temperature)
    return out


PARAM_GRID = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=40),
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=0.8, top_p=0.5),
    SamplingParams(temperature=1.3, top_p=0.999),
    SamplingParams(temperature=0.6, min_p=0.05),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=2000, top_p=0.9),
]


@pytest.mark.parametrize("params", PARAM_GRID)
def test_two_d_rows_match_reference(params: SamplingParams) -> None:
    rng = np.random.default_rng(0)
    # Row 1 has heavy ties (rounded logits) to exercise the tie rule; row 2 is nearly flat.
    logits = np.stack(
        [
            rng.normal(0.0, 3.0, 5000),
            np.round(rng.normal(0.0, 2.0, 5000)),
            rng.normal(0.0, 0.01, 5000),
        ]
    ).astype(np.float32)
    probs = probs_from_logits(logits, params)
    assert probs.shape == logits.shape
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
    for row, got in zip(logits, probs, strict=True):
        expected = _reference_probs(row, params)
        np.testing.assert_array_equal(got > 0, expected > 0)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-300)


@pytest.mark.parametrize("params", PARAM_GRID)
def test_full_vocab_rows_work(params: SamplingParams) -> None:
    n_vocab = 262_144
    logits = np.random.default_rng(1).normal(0.0, 2.0, (2, n_vocab)).astype(np.float32)
    probs = probs_from_logits(logits, params)
    assert probs.shape == (2, n_vocab)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
    expected = _reference_probs(logits[0], params)
    np.testing.assert_array_equal(probs[0] > 0, expected > 0)
    np.testing.assert_allclose(probs[0], expected, rtol=1e-9, atol=1e-300)


def test_one_d_input_gives_one_d_output() -> None:
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=0.9, top_k=3))
    assert probs.shape == LOGITS.shape
    two_d = probs_from_logits(LOGITS[None, :], SamplingParams(temperature=0.9, top_k=3))
    np.testing.assert_array_equal(two_d[0], probs)


def test_lazy_probs_equal_the_eager_rows_and_compute_only_what_is_read() -> None:
    logits = np.stack([LOGITS, LOGITS[::-1], LOGITS * 0.5])
    params = SamplingParams(temperature=0.7, top_p=0.9)
    eager = probs_from_logits(logits, params)
    lazy = LazyProbs(logits, params)
    assert lazy.shape == eager.shape and lazy.n_computed == 0
    np.testing.assert_array_equal(lazy[1], eager[1])
    assert lazy.n_computed == 1
    np.testing.assert_array_equal(lazy[1], eager[1])  # cached, not recomputed
    assert lazy.n_computed == 1
    np.testing.assert_array_equal(lazy[0], eager[0])
    assert lazy.n_computed == 2
    with pytest.raises(ValueError, match="greedy"):
        LazyProbs(logits, SamplingParams())
    with pytest.raises(TypeError):
        lazy[0, 1]  # type: ignore[index]


# ---------------------------------------------------------------- sample / argmax / rng


def test_same_seed_same_samples() -> None:
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0))
    rng_a, rng_b = make_rng(42), make_rng(42)
    first = [sample(probs, rng_a.random()) for _ in range(200)]
    second = [sample(probs, rng_b.random()) for _ in range(200)]
    assert first == second
    rng = make_rng(43)
    assert [sample(probs, rng.random()) for _ in range(200)] != first


def test_sample_frequencies_follow_probs() -> None:
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    rng = make_rng(0)
    n = 20_000
    counts = np.bincount([sample(probs, rng.random()) for _ in range(n)], minlength=4)
    assert counts[1] == 0
    # 5 standard deviations of a binomial proportion with p <= 0.6.
    np.testing.assert_allclose(counts / n, probs, atol=5 * math.sqrt(0.25 / n))


def test_sample_never_returns_zero_weight_token_under_rounding() -> None:
    probs = np.array([0.3, 0.7, 0.0, 0.0])
    last = float(np.nextafter(1.0, 0.0))  # the largest value rng.random() can return
    assert sample(probs, last) == 1
    assert sample(probs, 0.0) == 0
    assert sample(np.array([0.0, 0.0, 2.0]), 0.0) == 2
    # Unnormalized rows (residuals) are scaled by their sum.
    assert sample(np.array([1.0, 3.0]), 0.5) == 1


def test_sample_rejects_bad_rows() -> None:
    rng = make_rng(0)
    for bad in (np.zeros(3), np.array([np.nan, 1.0]), np.ones((2, 2))):
        with pytest.raises(ValueError):
            sample(bad, rng.random())


def test_argmax_ties_take_lowest_id() -> None:
    assert argmax(np.array([0.0, 2.0, 2.0, 1.0], dtype=np.float32)) == 1
    assert argmax(LOGITS) == 3


# ---------------------------------------------------------------- keyed draws (SampleKeys)


def test_blocked_inverse_cdf_follows_long_rows() -> None:
    # Rows longer than 4 blocks are searched block by block; weight spread over several blocks,
    # zero blocks in between, and a last token with weight at the very end.
    n_vocab = 10_000
    row = np.zeros(n_vocab)
    row[[3, 1500, 1501, 7000, 9999]] = [0.2, 0.1, 0.3, 0.25, 0.15]
    rng = make_rng(4)
    n = 40_000
    counts = np.bincount([sample(row, rng.random()) for _ in range(n)], minlength=n_vocab)
    assert counts.sum() == counts[[3, 1500, 1501, 7000, 9999]].sum()
    np.testing.assert_allclose(counts / n, row, atol=5 * math.sqrt(0.25 / n))
    assert sample(row, 1.0) == 9999 and sample(row, 0.0) == 3


def test_keyed_draws_follow_the_weights_tail_included() -> None:
    # Tokens far below the top (the tail) race as one competitor and are picked by inverse
    # CDF; frequencies over many positions match the normalized weights, tail included.
    weights = np.array([1.0, 0.5, 0.25, 3e-3, 0.0, 2e-3] + [5e-8] * 20_000, dtype=np.float32)
    p = weights.astype(np.float64) / weights.sum(dtype=np.float64)
    keys = SampleKeys(5)
    n = 60_000
    counts = np.bincount([keys.sample(weights, j) for j in range(n)], minlength=weights.size)
    assert counts[4] == 0
    np.testing.assert_allclose(counts[:6] / n, p[:6], atol=5 * math.sqrt(0.25 / n))
    tail = counts[6:].sum() / n  # the 20,000 tokens below SampleKeys.HEAD of the top
    assert abs(tail - p[6:].sum()) <= 5 * math.sqrt(p[6:].sum() / n)


def test_keyed_draws_depend_on_seed_and_position_only() -> None:
    weights = np.exp(np.random.default_rng(0).normal(0, 2, 500))
    first = [SampleKeys(42).sample(weights, j) for j in range(300)]
    assert first == [SampleKeys(42).sample(weights, j) for j in range(300)]
    keys = SampleKeys(42)
    assert [keys.sample(weights, j) for j in reversed(range(300))] == first[::-1]
    assert first != [SampleKeys(43).sample(weights, j) for j in range(300)]
    assert SampleKeys(None).seed != SampleKeys(None).seed


def test_keyed_draws_of_similar_rows_agree_like_a_coupling() -> None:
    # A draft racing with the target's keys picks the same token at least as often as the
    # Gumbel-coupling bound (1 - TV) / (1 + TV), and at most 1 - TV (a maximal coupling).
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, 2000)
    p_target = np.exp(logits) / np.exp(logits).sum()
    p_draft = np.exp(logits + rng.normal(0, 0.3, 2000))
    p_draft /= p_draft.sum()
    tv = 0.5 * np.abs(p_target - p_draft).sum()
    keys = SampleKeys(9)
    n = 20_000
    same = np.mean([keys.sample(p_target, j) == keys.sample(p_draft, j) for j in range(n)])
    slack = 5 * math.sqrt(0.25 / n)
    assert (1 - tv) / (1 + tv) - slack <= same <= 1 - tv + slack, (same, tv)


def test_draw_from_logits_is_the_race_on_their_weights() -> None:
    # draw() works on the logit row (a comparison pass, the tail weighed only when it could
    # win); it gives the race on the transformed weights, filters included.
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 3, 3000).astype(np.float32)
    logits[:1500] -= 40  # a long tail far below the head
    for params in (
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
    ):
        keys = SampleKeys(3)
        weights = weights_from_logits(logits, params)
        p = weights.astype(np.float64) / weights.sum(dtype=np.float64)
        for j in range(300):
            token, prob = keys.draw(logits, params, j)
            assert token == keys.sample(weights, j)
            assert prob == pytest.approx(p[token], rel=1e-4)


def test_draw_weighs_the_tail_when_it_can_win() -> None:
    # A flat row over a big vocabulary: the tail holds most of the mass and wins often; the
    # frequencies over positions still follow the softmax.
    logits = np.zeros(5000, dtype=np.float32)
    logits[0] = 8.0  # exp(8) = 2981 against 4999 others: p(0) = 0.374
    params = SamplingParams(temperature=1.0)
    keys = SampleKeys(8)
    n = 20_000
    first = np.mean([keys.draw(logits, params, j)[0] == 0 for j in range(n)])
    assert abs(first - math.exp(8) / (math.exp(8) + 4999)) < 5 * math.sqrt(0.25 / n)
