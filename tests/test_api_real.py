"""The public API on the real models: streaming, stop conditions, chat, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_spec import (
    ContextOverflowError,
    EdgeSpec,
    EngineConfig,
    GenerationConfig,
    InvalidRequestError,
    ModelFileError,
    SamplingParams,
    VocabMismatchError,
)
from edge_spec.backend import LlamaModel
from edge_spec.drafts.vocab import check_compatible

pytestmark = pytest.mark.models


def test_the_draft_model_loads_when_a_request_first_drafts_with_it(smollm2_path: Path) -> None:
    """A run that never drafts with the draft model never loads it; its vocabulary is told
    from the files meanwhile; the first model draft loads it, with the target's output."""
    from edge_spec.models.cache import resolve

    draft = resolve("smollm2-135m-q4_0", progress=False)
    with EdgeSpec(smollm2_path, draft, config=EngineConfig(n_ctx=512)) as spec:
        lazy = spec._sources["model"]
        alone = spec.generate("The three primary colors are", max_tokens=16, draft_mode="none")
        ngram = spec.generate("The three primary colors are", max_tokens=16, draft_mode="ngram")
        assert lazy.loaded is None and lazy.vocabulary == "shared"
        got = spec.generate("The three primary colors are", max_tokens=16, k=3, draft_mode="model")
        assert lazy.loaded is not None and got.stats.n_drafted > 0
        assert got.token_ids == alone.token_ids == ngram.token_ids and got.draft_vocab == "shared"


def test_prompt_logprobs_match_llama_cpp_pythons_logits_all(gemma_path: Path) -> None:
    """A prompt's logprobs are llama.cpp's own (llama-cpp-python with logits_all, one batch)
    up to batching noise, across the pieces of Gemma's 262k-token rows; the first token has
    none; the first streamed delta carries them; the answer is the one without them; and
    max_tokens 0 only scores."""
    import numpy as np
    from llama_cpp import Llama

    text = " ".join(["In 1969, Apollo 11 landed on the Moon, and two astronauts walked."] * 5)
    with EdgeSpec(gemma_path, config=EngineConfig(n_ctx=512, n_threads=1)) as spec:
        ids = spec.tokenize(text)
        assert len(ids) > 64  # more than two pieces of 32 rows
        plain = spec.generate(text, max_tokens=6, temperature=0)
        scored = spec.generate(text, max_tokens=6, temperature=0, prompt_logprobs=2)
        deltas = list(spec.stream(ids, max_tokens=0, prompt_logprobs=0))
    assert scored.token_ids == plain.token_ids and scored.stats.n_cached_tokens == 0
    rows = scored.prompt_logprobs
    assert rows is not None and [t.token_id for t in rows] == ids
    assert rows[0].logprob is None and all(len(t.top) == 2 for t in rows[1:])
    assert len(deltas) == 1 and deltas[0].result.token_ids == ()
    assert [t.logprob for t in deltas[0].prompt_logprobs] == [t.logprob for t in rows]
    llm = Llama(str(gemma_path), n_ctx=512, n_threads=1, logits_all=True, verbose=False)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    log_z = logits.max(1) + np.log(np.exp(logits - logits.max(1)[:, None]).sum(1))
    reference = [logits[i, ids[i + 1]] - log_z[i] for i in range(len(ids) - 1)]
    worst = max(abs(t.logprob - r) for t, r in zip(rows[1:], reference))
    assert worst < 0.05, worst


def test_stream_deltas_join_to_the_generated_text(spec: EdgeSpec) -> None:
    for mode in ("model", "ngram", "none"):
        cfg = GenerationConfig(max_tokens=40, draft_mode=mode)
        deltas = list(spec.stream("Once upon a time,", cfg))
        final = deltas[-1]
        assert final.result is not None and final.finish_reason == "length"
        assert all(d.result is None and d.finish_reason is None for d in deltas[:-1])
        assert "".join(d.text for d in deltas) == final.result.text
        ids = [t for d in deltas for t in d.token_ids]
        assert tuple(ids) == final.result.token_ids
        assert final.result.text == spec.generate("Once upon a time,", cfg).text


def test_logprobs_are_the_targets_own_with_drafts_and_come_per_token(spec: EdgeSpec) -> None:
    """Asked for, every token has its logprob and its row's top alternatives: with drafts the
    same as the target alone's up to batching noise (measured here: 0 at k = 3, up to 5e-3
    with the cost policy's longer batches), the chosen
    token first at T = 0, and one per token id in each streamed delta; not asked for, none."""
    prompt = "Repeat: one two three four five. Repeat: one two three four five. Repeat:"
    alone = spec.generate(prompt, max_tokens=24, draft_mode="none", logprobs=2)
    assert alone.logprobs is not None
    for mode in ("ngram", "model"):
        got = spec.generate(prompt, max_tokens=24, draft_mode=mode, k=3, logprobs=2)
        assert got.token_ids == alone.token_ids and got.stats.n_accepted > 0
        assert got.logprobs is not None
        assert [t.token_id for t in got.logprobs] == list(got.token_ids)
        assert all(len(t.top) == 2 and t.top[0].token_id == t.token_id for t in got.logprobs)
        assert all(t.logprob <= 0 and t.token_bytes for t in got.logprobs)
        worst = max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, alone.logprobs))
        assert worst < 0.05, worst
    deltas = list(spec.stream(prompt, max_tokens=24, k=3, draft_mode="ngram", logprobs=0))
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    assert [t.token_id for d in deltas for t in d.logprobs] == list(deltas[-1].result.token_ids)
    assert spec.generate(prompt, max_tokens=4).logprobs is None
    with pytest.raises(InvalidRequestError, match="logprobs"):
        spec.generate(prompt, max_tokens=4, logprobs=21)


def test_penalized_output_is_the_same_with_drafts_and_changed_by_the_penalty(
    spec: EdgeSpec,
) -> None:
    """llama.cpp's repeat, presence and frequency penalties: the drafted answer is the
    penalized target alone's, greedy and sampled, and the penalty changes what it writes."""
    prompt = "Repeat: one two three four five. Repeat: one two three four five. Repeat:"
    plain = spec.generate(prompt, max_tokens=24, draft_mode="none")
    for options in (
        {"repeat_penalty": 1.1},
        {"repeat_penalty": 1.3, "presence_penalty": 0.3, "frequency_penalty": 0.2},
        {"repeat_penalty": 1.1, "temperature": 0.8, "seed": 2},
    ):
        alone = spec.generate(prompt, max_tokens=24, draft_mode="none", **options)
        got = spec.generate(prompt, max_tokens=24, draft_mode="ngram", k=3, **options)
        assert got.token_ids == alone.token_ids, options
        got = spec.generate(prompt, max_tokens=24, draft_mode="model", k=3, **options)
        assert got.token_ids == alone.token_ids and got.stats.n_accepted > 0, options
    assert alone.token_ids != plain.token_ids
    banned = plain.token_ids[0]  # a logit bias of -100 keeps a token out, drafted or not
    for mode in ("none", "ngram"):
        got = spec.generate(prompt, max_tokens=24, draft_mode=mode, logit_bias=((banned, -100.0),))
        assert banned not in got.token_ids
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        spec.generate(prompt, max_tokens=2, logit_bias=((10**7, 1.0),))


def test_a_prompt_of_token_ids_is_the_same_prompt(spec: EdgeSpec) -> None:
    """Token ids (the prompt as the target tokenizes it, BOS included) give the text's answer;
    ids outside the vocabulary are one clear error."""
    text = "The three primary colors are"
    ids = spec.tokenize(text)
    got = spec.generate(ids, max_tokens=12, draft_mode="none")
    assert got.token_ids == spec.generate(text, max_tokens=12, draft_mode="none").token_ids
    assert got.prompt_token_ids == tuple(ids)
    for bad in ([spec.target.n_vocab], [], [1.5], [True]):
        with pytest.raises(InvalidRequestError):
            spec.generate(bad, max_tokens=2)
    assert spec.generate(text, max_tokens=2).token_ids


def test_stop_string_ends_generation(spec: EdgeSpec) -> None:
    free = spec.generate("List the days of the week: Monday, Tuesday,", max_tokens=40)
    word = free.text.split(",")[2]  # something the model is known to produce
    assert word.strip()
    stopped = spec.generate(
        "List the days of the week: Monday, Tuesday,", max_tokens=40, stop=[word]
    )
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(word)]
    assert word not in stopped.text


def test_chat_uses_the_gguf_template_and_ends_at_eos(smollm2_path: Path) -> None:
    messages = [{"role": "user", "content": "Say hello in one word."}]
    with EdgeSpec(smollm2_path, draft_mode="ngram", config=EngineConfig(n_ctx=512)) as chat:
        prompt = chat.render_chat(messages)
        assert prompt.startswith("<|im_start|>system")
        assert prompt.endswith("<|im_start|>assistant\n")
        result = chat.chat(messages, max_tokens=64)
        assert result.finish_reason == "eos"
        assert result.text.strip()
        assert "<|im_end|>" not in result.text
        streamed = "".join(d.text for d in chat.stream_chat(messages, max_tokens=64))
        assert streamed == result.text


def test_max_tokens_zero_and_exact_length(spec: EdgeSpec) -> None:
    assert spec.generate("Hello", max_tokens=0).token_ids == ()
    result = spec.generate("Once upon a time,", max_tokens=7, k=4)
    assert len(result.token_ids) == 7 and result.finish_reason == "length"


def test_context_limit_ends_generation(target_path: Path, draft_path: Path) -> None:
    with EdgeSpec(target_path, draft_path, config=EngineConfig(n_ctx=48)) as small:
        prompt = "Once upon a time, in a small village by the sea, there lived"
        n_prompt = len(small.tokenize(prompt))
        result = small.generate(prompt, max_tokens=500, k=4)
        assert result.finish_reason == "context"
        assert n_prompt + len(result.token_ids) == 48 + 1  # the last token is never decoded
        with pytest.raises(ContextOverflowError):
            small.generate(prompt * 10, max_tokens=5)
        # The engine is still usable after the refusal.
        assert small.generate(prompt, max_tokens=3).finish_reason == "length"


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": -0.5},
        {"top_p": 1.5},
        {"top_p": 0.0},
        {"top_k": -1},
        {"min_p": 2.0},
        {"k": -1},
        {"max_tokens": -1},
        {"draft_mode": "telepathy"},
        {"stop": [""]},
        {"bogus_option": 1},
    ],
)
def test_invalid_requests_raise_and_leave_the_engine_working(spec: EdgeSpec, options) -> None:
    with pytest.raises(InvalidRequestError):
        spec.generate("Hello", **options)
    assert spec.generate("Hello", max_tokens=2).token_ids


def test_invalid_sampling_params_rejected_at_construction() -> None:
    with pytest.raises(InvalidRequestError, match="temperature"):
        SamplingParams(temperature=-1)


def test_bad_model_files(tmp_path: Path, target_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        EdgeSpec(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelFileError, match="not a GGUF"):
        EdgeSpec(not_gguf)
    truncated = tmp_path / "truncated.gguf"
    with target_path.open("rb") as src:
        truncated.write_bytes(src.read(5_000_000))  # inside the metadata (the vocabulary)
    with pytest.raises(ModelFileError, match=r"invalid GGUF.*tokenizer\.ggml"):
        EdgeSpec(truncated)
    with target_path.open("rb") as src:
        truncated.write_bytes(src.read(100_000_000))  # inside the tensor data
    with pytest.raises(ModelFileError, match="invalid GGUF.*tensor.*run past the file"):
        EdgeSpec(truncated)
    with pytest.raises(ModelFileError):
        EdgeSpec("no-such-model-name")


def test_vocabulary_mismatch_names_the_first_difference(smollm2_path, gemma_path) -> None:
    with LlamaModel(smollm2_path, n_ctx=64) as smollm2, LlamaModel(gemma_path, n_ctx=64) as gemma:
        for target, draft in ((smollm2, gemma), (gemma, smollm2)):
            with pytest.raises(VocabMismatchError) as err:
                check_compatible(target, draft)
            assert target.info.path.name in str(err.value)
            assert draft.info.path.name in str(err.value)


def test_one_token_text_changed_in_a_copy_of_the_draft_is_found(
    smollm2_path, tmp_path: Path
) -> None:
    """check_compatible skips its per-token loop when both files store the same token texts
    (the vocabularies' digests equal, as for one model's two quantizations); a copy of the
    draft with one text changed must still be refused, naming that token."""
    import shutil

    from edge_spec import fuzz
    from edge_spec.gguf.validate import validate_gguf
    from edge_spec.models.cache import resolve

    draft_path = resolve("smollm2-135m-q4_0", progress=False)
    assert validate_gguf(draft_path).vocab_sha256 == validate_gguf(smollm2_path).vocab_sha256
    at, length = fuzz.layout(draft_path).tokens[1000]
    mutant = tmp_path / "draft.gguf"
    shutil.copyfile(draft_path, mutant)
    with mutant.open("r+b") as f:
        f.seek(at)
        f.write(b"\x01" * length)  # a text no other token has
    assert validate_gguf(mutant).vocab_sha256 != validate_gguf(draft_path).vocab_sha256
    with LlamaModel(smollm2_path, n_ctx=64) as target, LlamaModel(mutant, n_ctx=64) as draft:
        with pytest.raises(VocabMismatchError, match="token 1000 differs"):
            check_compatible(target, draft)
        with LlamaModel(draft_path, n_ctx=64) as same:
            check_compatible(target, same)


CROSS_PROMPTS = (
    "The history of the Roman Empire begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Résumé: naïve café owners in Zürich",  # multi-byte characters across token boundaries
)


def test_a_draft_with_another_vocabulary_drafts_across_it(
    smollm2_path, gemma_path, target_path
) -> None:
    """SmolLM2 drafts for Gemma-3 and Gemma-3 for SmolLM2: greedy output is the target's (a
    divergence only at a near-tie that batching moves), drafts are accepted, the result says
    "translated". The targets are F16: a Q4_K_M target's batched logits move by up to 0.8
    here, with any draft (n-gram drafts diverge at the same place)."""
    assert "gemma" in target_path.name.lower()  # the default pair's target: Gemma-3 F16
    for target, draft in ((smollm2_path, gemma_path), (target_path, smollm2_path)):
        with EdgeSpec(target, draft, config=EngineConfig(n_ctx=512)) as spec:
            n_drafted = n_accepted = n_diverged = 0
            for prompt in CROSS_PROMPTS:
                alone = spec.generate(prompt, max_tokens=32, draft_mode="none")
                got = spec.generate(prompt, max_tokens=32, k=3, draft_mode="model")
                assert got.draft_vocab == "translated" and got.to_dict()["draft_vocab"]
                n_drafted += got.stats.n_drafted
                n_accepted += got.stats.n_accepted
                if got.token_ids != alone.token_ids:
                    n_diverged += 1
                    at = next(
                        i for i, (a, b) in enumerate(zip(alone.token_ids, got.token_ids)) if a != b
                    )
                    ids = spec.tokenize(prompt)
                    spec.target.reset()
                    spec.target.decode(ids[:-1])
                    row = spec.target.decode([ids[-1], *alone.token_ids[:at]], [at])[0]
                    gap = float(row[alone.token_ids[at]] - row[got.token_ids[at]])
                    assert gap < 0.2, f"{target.name}: diverged at {at}, gap {gap:.3f}"
                    spec.target.reset()
            assert n_diverged <= 1
            assert n_drafted > 30 and n_accepted > n_drafted // 5, (n_drafted, n_accepted)


def test_model_mode_without_a_draft_is_refused(target_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="draft"):
        EdgeSpec(target_path, draft_mode="model")
    with EdgeSpec(target_path, config=EngineConfig(n_ctx=256)) as alone:
        assert alone.default_draft_mode == "auto"  # over the n-gram lookup and none
        with pytest.raises(InvalidRequestError, match="draft"):
            alone.generate("Hello", draft_mode="model")


def test_a_base_model_chats_through_a_builtin_template(gemma_path: Path, tmp_path: Path) -> None:
    # Gemma-3-270M base has no template: like llama.cpp, fall back -- to Gemma's own turn
    # format for its architecture. --chat-template overrides; a broken one names the fix.
    messages = [{"role": "user", "content": "hi"}]
    with EdgeSpec(gemma_path, config=EngineConfig(n_ctx=256)) as gemma:
        assert (gemma.chat_template.source, gemma.chat_template.name) == ("fallback", "gemma")
        assert gemma.render_chat(messages) == "<start_of_turn>user\nhi<end_of_turn>\n" + (
            "<start_of_turn>model\n"
        )
        assert gemma.chat(messages, max_tokens=4).token_ids
    with EdgeSpec(gemma_path, config=EngineConfig(n_ctx=256, chat_template="chatml")) as chatml:
        assert chatml.render_chat(messages).startswith("<|im_start|>user\nhi<|im_end|>")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}{{ message.content }")
    with EdgeSpec(gemma_path, config=EngineConfig(n_ctx=256, chat_template=str(broken))) as bad:
        with pytest.raises(InvalidRequestError, match="--chat-template"):
            bad.chat(messages)
        assert bad.generate("The capital of France is", max_tokens=4).token_ids
    with pytest.raises(InvalidRequestError, match="chatml, gemma or a readable"):
        EdgeSpec(gemma_path, config=EngineConfig(n_ctx=256, chat_template=str(tmp_path / "no")))


CHAT_PROMPTS = [
    "Write a short poem about the sea.",
    "Give me three tips for learning to cook.",
    "Explain what a compiler does, in two sentences.",
    "Describe a walk through a forest in autumn.",
]


# llama.cpp's logits for one position differ between a plain step (one token) and a batch (a
# verification) by up to ~0.04 on this F16 target, and the KV cache carries such differences
# on: a bound of 0.1 on the logit noise a draw may meet.
LOGIT_NOISE = 0.1


def _near_tie(spec: EdgeSpec, prompt: list[int], emitted: tuple[int, ...], cfg) -> bool:
    """Whether the keyed draw of the token after prompt + emitted was within reach of batching
    noise: replays the target alone (one token per decode) up to it and asks the draw's
    margin."""
    from edge_spec.sampling.keys import SampleKeys
    from edge_spec.sampling.transform import weights_from_logits

    target = spec.target
    target.reset()
    target.decode(prompt[:-1])
    row = target.decode([prompt[-1]], [0])[0]
    for token in emitted:
        row = target.decode([token], [0])[0]
    weights = weights_from_logits(row, cfg.sampling)
    target.reset()
    margin = SampleKeys(cfg.sampling.seed).margin(weights, len(prompt) + len(emitted))
    return margin < 2 * LOGIT_NOISE / cfg.sampling.temperature


def test_same_seed_same_text_with_the_session_on_off_and_after_other_requests(
    smollm2_path: Path,
) -> None:
    """Sampled tokens are keyed by (seed, position), so the drafts -- the session's, none, the
    model's, after unrelated requests -- never change the text. llama.cpp's batched logits
    differ a little from single-token ones (up to ~0.04 here), which can move a draw: a
    divergence is accepted only where the target alone's draw there was within reach of such
    noise (its race margin, checked), and at least half the runs must agree outright."""
    from edge_spec.models.cache import resolve

    draft = resolve("smollm2-135m-q4_0", progress=False)
    seed = 7
    cfg = GenerationConfig(max_tokens=32, sampling=SamplingParams(temperature=0.8, seed=seed))
    with (
        EdgeSpec(smollm2_path, draft, config=EngineConfig(n_ctx=1024)) as spec,
        EdgeSpec(
            smollm2_path, draft, config=EngineConfig(n_ctx=1024, ngram_session_tokens=0)
        ) as no_session,
    ):
        ids = {
            p: spec.tokenize(spec.render_chat([{"role": "user", "content": p}]))
            for p in CHAT_PROMPTS
        }
        reference = {
            p: spec.chat([{"role": "user", "content": p}], cfg, draft_mode="none").token_ids
            for p in CHAT_PROMPTS
        }
        for unrelated in ("Count to ten.", "Repeat: the quick brown fox jumps over the lazy dog."):
            spec.chat([{"role": "user", "content": unrelated}], max_tokens=32, temperature=1.0)
        runs = []
        for p in CHAT_PROMPTS:
            messages = [{"role": "user", "content": p}]
            runs.append((p, "session", spec.chat(messages, cfg).token_ids))
            runs.append(
                (p, "session-again", spec.chat(messages, cfg, draft_mode="ngram").token_ids)
            )
            runs.append((p, "no-session", no_session.chat(messages, cfg).token_ids))
            runs.append(
                (p, "model-k3", no_session.chat(messages, cfg, draft_mode="model", k=3).token_ids)
            )
        identical = 0
        for p, name, tokens in runs:
            ref = reference[p]
            if tokens == ref:
                identical += 1
                continue
            # The first position where they differ (one may have ended there: an EOS drawn).
            j = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)
            j = min(len(tokens), len(ref)) if j is None else j
            assert _near_tie(spec, ids[p], ref[:j], cfg), (p, name, j)
        # Measured here: 10 of 16 identical, the 6 others at two draws whose margins were 0.003
        # and 0.007.
        assert identical >= len(runs) // 2, identical
        from edge_spec.backend import llama_build

        if "LLAMAFILE = 1" not in llama_build():  # a batch-invariant build: no near ties move
            assert identical == len(runs), identical
