"""The engine end to end on the real registry GGUF models (no mocks)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import PROMPTS

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig, SamplingParams
from edge_spec.backend import LlamaModel
from edge_spec.decode.engine import Step, run_steps
from edge_spec.drafts import NgramDraft, NoDraft
from edge_spec.errors import InvalidRequestError
from edge_spec.policy.simple import FixedK

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = [pytest.mark.models, pytest.mark.xdist_group("engine_real")]
log = logging.getLogger(__name__)
N_TOKENS = 24
K = 4


def single_logits(model: LlamaModel, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Logits predicting each of `tokens`, decoded one token at a time as the target-alone
    baseline does (prompt[:-1] prefilled in one batch). Shape (len(tokens), n_vocab)."""
    model.reset()
    model.decode(prompt[:-1])
    rows = []
    for token in [prompt[-1], *tokens[:-1]]:
        rows.append(model.decode([token], [0])[0].copy())
    return np.stack(rows)


def batched_logits(model: LlamaModel, prompt: list[int], tokens: list[int], k: int) -> np.ndarray:
    """The same logits computed in batches of k + 1, as verification computes them."""
    model.reset()
    model.decode(prompt[:-1])
    seq = [prompt[-1], *tokens[:-1]]
    rows = []
    for start in range(0, len(seq), k + 1):
        chunk = seq[start : start + k + 1]
        rows.append(model.decode(chunk, range(len(chunk))).copy())
    return np.concatenate(rows)


@pytest.fixture(scope="session")
def reference(spec: EdgeSpec) -> tuple[dict[str, list[int]], float]:
    """Target-alone greedy outputs, one token per target pass, and from the same rows the
    largest change batching makes to any logit *difference* within a row (a greedy choice
    between two tokens can only flip where their gap is below this): each prompt's one-token
    rows are computed once, for both."""
    model = spec.target
    outputs: dict[str, list[int]] = {}
    worst = 0.0
    for prompt in PROMPTS:
        ids = spec.tokenize(prompt)
        model.reset()
        model.decode(ids[:-1])
        rows, tokens, token = [], [], ids[-1]
        while len(tokens) < N_TOKENS and not (tokens and model.is_eog(tokens[-1])):
            rows.append(model.decode([token], [0])[0].copy())
            token = int(rows[-1].argmax())
            tokens.append(token)
        # The engine's token_ids end before an end-of-generation token (finish_reason "eos").
        outputs[prompt] = tokens[:-1] if model.is_eog(tokens[-1]) else tokens
        delta = batched_logits(model, ids, tokens, K) - np.stack(rows)
        worst = max(worst, float((delta.max(axis=1) - delta.min(axis=1)).max()))
    model.reset()
    log.info("batch-vs-single logit-difference deviation: %.4f", worst)
    return outputs, worst


@pytest.fixture(scope="session")
def baseline(spec: EdgeSpec, reference) -> dict[str, list[int]]:
    outputs = reference[0]
    # The engine's own target-alone path gives the same tokens (checked on one prompt).
    cfg = GenerationConfig(max_tokens=N_TOKENS, k=0, draft_mode="none")
    assert list(spec.generate(PROMPTS[0], cfg).token_ids) == outputs[PROMPTS[0]]
    return outputs


@pytest.fixture(scope="session")
def batch_deviation(reference) -> float:
    return reference[1]


@pytest.fixture(scope="session")
def tree_deviation(spec: EdgeSpec, baseline: dict[str, list[int]]) -> float:
    """Like batch_deviation, for token trees: the largest change a tree decode makes to a logit
    difference within a row, against the same tokens decoded one at a time. Each prompt's tree
    is its greedy continuation as the trunk with two branches beside it (branch rows sum their
    attention in another order: docs/exactness.md)."""
    model = spec.target
    worst = 0.0
    for prompt, path in list(baseline.items())[:4]:  # a measured deviation: the fewer, the stricter
        ids = spec.tokenize(prompt)
        trunk, fork, leaf = path[:4], [path[1] + 1, path[2] + 1], [path[3] + 7]
        tokens = [ids[-1], *trunk, *fork, *leaf]
        parents = [-1, 0, 1, 2, 3, 0, 5, 2]  # fork hangs from the root, leaf from trunk[1]
        model.reset()
        model.decode(ids[:-1])
        rows = model.decode_tree(tokens, parents).copy()
        model.keep_tree([])
        chains = {
            0: single_logits(model, ids, trunk + [0]),  # rows 0-4: the trunk's
            5: single_logits(model, ids, fork + [0])[1:],  # rows 5, 6: after fork[0], fork[1]
            7: single_logits(model, ids, [*trunk[:2], *leaf, 0])[3:4],  # row 7: after leaf
        }
        expected = np.concatenate([chains[0], chains[5], chains[7]])
        delta = rows - expected
        worst = max(worst, float((delta.max(axis=1) - delta.min(axis=1)).max()))
    model.reset()
    log.info("tree-vs-single logit-difference deviation: %.4f", worst)
    return worst


@pytest.mark.parametrize("mode", ["model", "ngram"])
def test_greedy_speculative_equals_target_alone(
    spec: EdgeSpec,
    baseline: dict[str, list[int]],
    batch_deviation: float,
    mode: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    divergences = []
    n_drafted = n_accepted = 0
    for prompt in PROMPTS:
        result = spec.generate(prompt, GenerationConfig(max_tokens=N_TOKENS, k=K, draft_mode=mode))
        n_drafted += result.stats.n_drafted
        n_accepted += result.stats.n_accepted
        expected, got = baseline[prompt], list(result.token_ids)
        if got == expected:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(expected, got)) if a != b),
            min(len(expected), len(got)),
        )
        assert at < min(len(expected), len(got)), "same tokens but different lengths"
        ids = spec.tokenize(prompt)
        row = single_logits(spec.target, ids, expected[: at + 1])[at]
        gap = float(row[expected[at]] - row[got[at]])
        divergences.append({"prompt": prompt[:30], "position": at, "gap": gap})
        assert gap <= batch_deviation, (
            f"divergence at {at} where the target's choice leads by {gap:.3f} > batch deviation "
            f"{batch_deviation:.3f}: not explained by floating point"
        )
    spec.target.reset()
    report = {
        "mode": mode,
        "prompts": len(PROMPTS),
        "tokens": N_TOKENS,
        "diverged": len(divergences),
        "where": divergences,
        "batch_deviation": batch_deviation,
        "drafted": n_drafted,
        "accepted": n_accepted,
    }
    with capsys.disabled():  # the exactness statistics belong in the CI log
        print(f"\nexactness report: {json.dumps(report)}")
    assert n_drafted > 0, "the draft source never proposed anything: the test proves nothing"
    assert len(divergences) <= len(PROMPTS) // 4, report


def test_self_draft_accepts_everything(target_path) -> None:
    """Drafting with the target's own file: every drafted token must be accepted."""
    with EdgeSpec(target_path, target_path, config=EngineConfig(n_ctx=512)) as spec:
        for prompt in PROMPTS[:2]:
            result = spec.generate(prompt, max_tokens=40, k=K, draft_mode="model")
            assert result.stats.n_drafted > 0
            assert result.stats.n_accepted == result.stats.n_drafted, result.stats


def test_self_draft_accepts_nearly_everything_when_sampling(target_path) -> None:
    """At T > 0 a draft that is the target itself draws with the target's own keys, so it is
    accepted wherever its single-token rows give the same draw as the target's batched rows:
    all but the rare position where batch numerics move the draw (about 0.1 % measured)."""
    with EdgeSpec(target_path, target_path, config=EngineConfig(n_ctx=512)) as spec:
        drafted = accepted = 0
        for seed in range(3):
            result = spec.generate(
                PROMPTS[1], max_tokens=40, k=K, temperature=0.8, seed=seed, draft_mode="model"
            )
            drafted += result.stats.n_drafted
            accepted += result.stats.n_accepted
        assert drafted > 0
        assert accepted >= drafted - max(2, drafted // 20), (accepted, drafted)


def test_same_seed_same_output(spec: EdgeSpec) -> None:
    for mode in ("model", "ngram"):
        cfg = GenerationConfig(
            max_tokens=32,
            k=K,
            draft_mode=mode,
            sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=1234),
        )
        first, second = spec.generate(PROMPTS[1], cfg), spec.generate(PROMPTS[1], cfg)
        assert first.token_ids == second.token_ids
        other = spec.generate(PROMPTS[1], GenerationConfig.from_kwargs(cfg, seed=99))
        assert other.token_ids != first.token_ids  # the seed matters


def test_kv_rollback_matches_fresh_evaluation(target_path) -> None:
    """Random accept/reject sequences, then the next-token logits compared (1) bit for bit with a
    fresh context that saw other tokens in the rejected slots of the same batches: rejected
    drafts must leave no trace; and (2) with a one-shot evaluation of the kept tokens, within
    batching noise and with the same argmax."""
    rng = np.random.default_rng(7)
    with (
        LlamaModel(target_path, n_ctx=512) as spec_ctx,
        LlamaModel(target_path, n_ctx=512) as fresh,
    ):
        prompt = spec_ctx.tokenize(PROMPTS[1])
        spec_ctx.decode(prompt)
        fresh.decode(prompt)
        for _ in range(25):
            k = int(rng.integers(1, 8))
            batch = rng.integers(100, spec_ctx.n_vocab, size=k + 1).tolist()
            n_keep = int(rng.integers(1, k + 2))  # the target's token plus 0..k accepted
            other = (
                batch[:n_keep] + rng.integers(100, spec_ctx.n_vocab, size=k + 1 - n_keep).tolist()
            )
            for ctx, tokens in ((spec_ctx, batch), (fresh, other)):
                ctx.decode(tokens, range(k + 1))
                ctx.truncate(ctx.n_past - (k + 1) + n_keep)
        assert spec_ctx.tokens == fresh.tokens
        probe = [int(rng.integers(100, spec_ctx.n_vocab))]
        after_rollback = spec_ctx.decode(probe, [0])[0].copy()
        clean = fresh.decode(probe, [0])[0].copy()
        np.testing.assert_array_equal(after_rollback, clean)

        tokens = list(fresh.tokens)
        fresh.reset()
        one_shot = fresh.decode(tokens, [len(tokens) - 1])[0]
        assert int(np.argmax(one_shot)) == int(np.argmax(after_rollback))
        assert float(np.abs(one_shot - after_rollback).max()) < 1.0


def test_a_prefill_that_warms_the_output_rows_changes_no_logits(target_path) -> None:
    """warm_rows: a prefill outputs (and drops) its last rows until the context has output that
    many, so that the first verification does not fault llama.cpp's buffers in. The cache and
    every later logit are as without it, whatever the prompt's length against n_batch (rows
    may only be asked for in the last chunk)."""
    rng = np.random.default_rng(11)
    with (
        LlamaModel(target_path, n_ctx=512, n_batch=32, warm_rows=9) as warm,
        LlamaModel(target_path, n_ctx=512, n_batch=32) as cold,
    ):
        base = warm.tokenize(" ".join(PROMPTS))
        # 33 new tokens: a last chunk of one; then 3 new (fewer than 9); then 27 new.
        for prompt in (base[:33], base[:33] + [200, 300, 400], base[:60]):
            for model in (warm, cold):
                model.sync(prompt)
            assert warm.tokens == cold.tokens == prompt
            batch = rng.integers(100, 20000, size=5).tolist()
            np.testing.assert_array_equal(
                warm.decode(batch, range(5)), cold.decode(batch, range(5))
            )
            for model in (warm, cold):
                model.truncate(len(prompt))
        assert warm._rows_out == 9  # the warm-up happened (the last prefill's 9 rows)
        assert cold._rows_out == 5


@pytest.mark.parametrize("which", ["target_path", "smollm2_path"])
def test_small_verify_batches_give_the_one_token_logits_bit_for_bit(which, request) -> None:
    """The project's kernel for F16 weights times a few columns (scripts/patches/, in an x86
    build with tinyBLAS and AVX-512, or AVX2 with F16C and FMA) sums every dot product as a
    one-token step does: a batch of up to 12 tokens, i.e. a verification of up to 11 drafted
    tokens, gives each position exactly the logits plain decoding gives it, so no greedy
    choice or seeded draw can move at a near tie. Longer batches go to tinyBLAS, which sums in
    another order (batching noise)."""
    from edge_spec.backend import llama_build

    build = llama_build()
    x86 = "AVX512 = 1" in build or all(f"{f} = 1" in build for f in ("AVX2", "F16C", "FMA"))
    if not x86 or "LLAMAFILE = 1" not in build:
        pytest.skip("the small-batch F16 kernel is for x86 builds with tinyBLAS")
    path = request.getfixturevalue(which)
    with LlamaModel(path, n_ctx=512) as model:
        if "F16" not in model.info.description:
            pytest.skip(f"{path.name} is not an F16 model")
        prompt = model.tokenize(PROMPTS[1])
        tokens = [int(t) for t in np.random.default_rng(3).integers(100, 20000, size=24)]
        alone = single_logits(model, prompt, tokens)
        for n in (2, 5, 12):
            np.testing.assert_array_equal(batched_logits(model, prompt, tokens, n - 1), alone)
        longer = batched_logits(model, prompt, tokens, 23)  # one batch of 24: tinyBLAS
        assert not np.array_equal(longer, alone)  # the check tells the kernels apart
        assert float(np.abs(longer - alone).max()) < 0.25


def test_a_verify_batch_across_the_kv_views_256_cell_step_moves_no_logit(target_path) -> None:
    """llama.cpp pads the KV view a batch attends over to a multiple of 256 cells, so a batch
    whose last token lands past such a step gives its earlier rows a longer (masked) attention
    row than their one-token passes had. A build that sums a batch of 8 as it sums one token
    (this CPU build; CUDA with scripts/patches/cuda/, whose vector and softmax kernels then keep
    one block size whatever the row length) gives those rows the one-token logits bit for bit
    there too, as it does away from the step."""
    n = 8
    with LlamaModel(target_path, n_ctx=512) as model:
        ids = model.tokenize(" ".join(PROMPTS))
        text = ids * (300 // len(ids) + 2)
        moved = {}
        for start in (100, 256 - n // 2):  # the batch covers positions start .. start + n - 1
            prompt, tokens = text[: start + 1], text[start + 1 : start + 1 + n]
            alone = single_logits(model, prompt, tokens)
            moved[start] = batched_logits(model, prompt, tokens, n - 1) - alone
        if np.any(moved[100]):
            pytest.skip("batches of 8 move this build's logits anywhere: batching noise")
        assert not np.any(moved[256 - n // 2])


def test_token_tree_rows_equal_each_branch_decoded_as_a_chain(target_path) -> None:
    """One decode_tree: every row is what its branch gives decoded alone (each branch sees the
    cache and its own ancestors, never a sibling); keep_tree leaves the cache as if the kept
    branch had been decoded as a chain."""
    with LlamaModel(target_path, n_ctx=512) as model:
        prompt = model.tokenize(PROMPTS[1])
        a, b, c = [1000, 1001, 1002], [1000, 2000, 2001], [3000, 3001]
        tokens = [prompt[-1], *a, 2000, 2001, 3000, 3001]
        parents = [-1, 0, 1, 2, 1, 4, 0, 6]
        branch_of_row = [(a, 0), (a, 1), (a, 2), (a, 3), (b, 2), (b, 3), (c, 1), (c, 2)]

        def chain(branch: list[int]) -> np.ndarray:
            model.reset()
            model.decode(prompt[:-1])
            return model.decode([prompt[-1], *branch], range(len(branch) + 1)).copy()

        chains = {tuple(x): chain(x) for x in (a, b, c)}
        model.reset()
        model.decode(prompt[:-1])
        rows = model.decode_tree(tokens, parents).copy()
        # Without flash attention (off on a CPU, backend/model.py) a branch whose ancestors are
        # not the cells just before it sums its attention in another order: its rows move by
        # batching noise (up to 0.11 seen on Gemma F16); the trunk's rows are bit-identical.
        for row, (branch, i) in enumerate(branch_of_row):
            expected = chains[tuple(branch)][i]
            assert int(np.argmax(rows[row])) == int(np.argmax(expected)), row
            assert float(np.abs(rows[row] - expected).max()) < 0.25, row
        # A sibling's row is far from it: the comparison can tell branches apart.
        assert float(np.abs(rows[4] - chains[tuple(a)][2]).max()) > 1.0

        model.keep_tree([1, 4, 5])  # the branch b
        assert model.tokens == [*prompt, *b]
        after_tree = model.decode([4000], [0])[0].copy()
        reference = chain([*b, 4000])[-1]
        assert int(np.argmax(after_tree)) == int(np.argmax(reference))
        assert float(np.abs(after_tree - reference).max()) < 1.0
        # Bad trees get one clear error before llama.cpp sees them; the cache stays usable.
        for bad_tokens, bad_parents in (
            ([1, 2, 3, 4, 5, 6], [-1, 0, 0, 0, 0, 0]),  # 5 leaves: more than the context holds
            ([1, 2, 3], [-1, 2, 0]),  # a parent after its child
            ([1, model.n_vocab], [-1, 0]),  # a token outside the vocabulary
        ):
            with pytest.raises(InvalidRequestError):
                model.decode_tree(bad_tokens, bad_parents)
        with pytest.raises(InvalidRequestError):
            model.keep_tree([1])  # no tree was decoded
        model.decode_tree([5, 6, 7], [-1, 0, 0])
        with pytest.raises(InvalidRequestError):
            model.keep_tree([2, 1])  # not a path
        model.reset()


def test_greedy_with_token_trees_equals_target_alone(
    spec: EdgeSpec,
    baseline: dict[str, list[int]],
    tree_deviation: float,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """N-gram drafts verified as token trees (up to 4 branch tokens besides 4 main ones):
    the target's own greedy tokens, prompt by prompt, except where the target alone chose
    between two tokens closer than a tree decode moves them (measured: tree_deviation)."""
    n_trees = n_drafted = n_accepted = 0
    divergences = []
    for prompt in PROMPTS:
        ids = spec.tokenize(prompt)
        sources = {"ngram": NgramDraft(), "none": NoDraft()}
        policy = FixedK(K, "ngram", tree_nodes=4)
        got: list[int] = []
        events = run_steps(
            spec.target,
            sources,
            policy,
            ids,
            k_max=2 * K,
            max_tokens=N_TOKENS,
            sampling=SamplingParams(),
        )
        for event in events:
            if isinstance(event, Step):
                got.extend(event.tokens)
                n_trees += event.n_branch_nodes > 0
                n_drafted += event.n_drafted
                n_accepted += event.n_accepted
        expected = baseline[prompt]
        if got[: len(expected)] == expected:
            continue
        at = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
        row = single_logits(spec.target, ids, expected[: at + 1])[at]
        gap = float(row[expected[at]] - row[got[at]])
        divergences.append({"prompt": prompt[:30], "position": at, "gap": gap})
        assert gap <= tree_deviation, (
            f"divergence at {at} where the target's choice leads by {gap:.4f} > tree deviation "
            f"{tree_deviation:.4f}: not explained by floating point"
        )
    spec.target.reset()
    with capsys.disabled():
        report = {
            "mode": "ngram-tree",
            "prompts": len(PROMPTS),
            "tokens": N_TOKENS,
            "diverged": len(divergences),
            "where": divergences,
            "batch_deviation": tree_deviation,
            "drafted": n_drafted,
            "accepted": n_accepted,
            "trees": n_trees,
        }
        print(f"\nexactness report: {json.dumps(report)}")
    assert n_trees > 0, "no token tree was verified: the test proves nothing"
    assert len(divergences) <= len(PROMPTS) // 4, divergences


def test_stats_are_consistent(spec: EdgeSpec) -> None:
    result = spec.generate(PROMPTS[0], max_tokens=48, k=K, draft_mode="model")
    s = result.stats
    assert s.n_generated == len(result.token_ids) <= 48
    assert s.n_accepted <= s.n_drafted <= s.n_steps * K
    assert sum(s.drafted_per_position) == s.n_drafted
    assert sum(s.accepted_per_position) == s.n_accepted
    assert all(a <= d for a, d in zip(s.accepted_per_position, s.drafted_per_position))
    # the per-position counts are monotone: position i+1 is only drafted/accepted after i
    assert list(s.accepted_per_position) == sorted(s.accepted_per_position, reverse=True)
    assert s.tokens_per_s > 0 and s.verify_s > 0 and s.draft_s > 0
    assert s.prefill_s + s.draft_s + s.verify_s + s.other_s == pytest.approx(s.total_s, rel=1e-6)
    # The decode wall time splits into llama_decode (both models) and the runtime's own work.
    assert 0 < s.decode_s < s.draft_s + s.verify_s
    assert s.decode_s + s.overhead_s == pytest.approx(s.total_s - s.prefill_s, rel=1e-6)
    assert 0 < s.overhead_fraction < 1
    assert s.overhead_per_step_s == pytest.approx(s.overhead_s / s.n_steps)
    assert s.k_chosen[0] <= s.n_plain_steps <= s.n_steps  # k = 0 planned: nothing drafted
    assert 0 <= s.plain_overhead_s <= s.plain_s <= s.draft_s + s.verify_s
    assert sum(s.drafted_by_source.values()) == s.n_drafted
    assert sum(s.accepted_by_source.values()) == s.n_accepted
    assert result.text == spec.target.detokenize(result.token_ids)


def test_flash_attention_is_off_when_every_layer_is_on_the_cpu() -> None:
    """llama.cpp's CPU flash attention makes a verify batch of n tokens read the KV cache n
    times (scripts/measure_flash_attn.py, in git history): off without offload (but on the
    batch-invariant build), llama.cpp's auto with it, and an explicit choice wins."""
    import llama_cpp

    from edge_spec.backend import llama_build
    from edge_spec.backend.model import _flash_attn_type

    tinyblas = "LLAMAFILE = 1" in llama_build()  # else the batch-invariant build: as measured
    assert _flash_attn_type(None, 0) == (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if tinyblas
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    )
    assert _flash_attn_type(None, -1) == llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    assert _flash_attn_type(True, 0) == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert _flash_attn_type(False, -1) == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
