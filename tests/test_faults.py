"""Failures injected at every stage of a step, on the real chat pair: a draft source that
fails is set aside for the request (the output is the target's all the same); a failure in the
target's own work fails that request only, and the next one matches a fresh engine's."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig
from edge_spec.decode.text import TextAssembler
from edge_spec.drafts import ModelDraft, NgramDraft
from edge_spec.drafts.base import Draft
from edge_spec.sampling.keys import SampleKeys

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = [pytest.mark.models, pytest.mark.xdist_group("faults")]

PROMPT = "Copy this list exactly: apples, pears, plums, cherries. Copy: apples, pears,"
TREE_PROMPT = "one two three, one two four, one two three, one two four, one two"  # branches
GREEDY = GenerationConfig(max_tokens=24, k=3, draft_mode="model")
AUTO = GenerationConfig(max_tokens=24)
# Sampled with n-gram drafts only: the failure is the target's own draw, not a draft's.
SAMPLED = GenerationConfig.from_kwargs(
    None, max_tokens=24, temperature=0.8, seed=3, draft_mode="ngram"
)
TREES = GenerationConfig(max_tokens=24, draft_mode="ngram", k=3, tree_nodes=4)


class Boom(RuntimeError):
    pass


def _chat_pair() -> tuple[Path, Path]:
    from edge_spec.models import default_pair, resolve

    target, draft = default_pair(chat=True)
    return resolve(target, progress=False), resolve(draft, progress=False)


@pytest.fixture(scope="session")
def fresh() -> dict[str, tuple[int, ...]]:
    """What a fresh engine answers for each config."""
    with EdgeSpec(*_chat_pair(), config=EngineConfig(n_ctx=512)) as spec:
        return {
            name: spec.generate(PROMPT, cfg).token_ids
            for name, cfg in (("greedy", GREEDY), ("auto", AUTO), ("sampled", SAMPLED))
        }


@pytest.fixture(scope="session")
def engine():
    with EdgeSpec(*_chat_pair(), config=EngineConfig(n_ctx=512)) as spec:
        yield spec


def _fail_on(call: int):
    """A replacement that raises on its call-th call and defers to the original otherwise."""

    def wrap(original):
        count = [0]

        def replacement(*args, **kwargs):
            count[0] += 1
            if count[0] == call:
                raise Boom(f"injected failure in {original.__name__}")
            return original(*args, **kwargs)

        return replacement

    return wrap


@pytest.mark.parametrize(
    ("owner", "method", "call"),
    [(ModelDraft, "begin", 1), (ModelDraft, "propose", 2), (NgramDraft, "candidate", 3)],
)
def test_a_failing_draft_source_is_set_aside_and_the_answer_is_the_targets(
    engine, fresh, monkeypatch: pytest.MonkeyPatch, owner, method: str, call: int
) -> None:
    monkeypatch.setattr(owner, method, _fail_on(call)(getattr(owner, method)))
    cfg = GREEDY if owner is ModelDraft else AUTO
    result = engine.generate(PROMPT, cfg)
    assert result.token_ids == fresh["greedy" if owner is ModelDraft else "auto"]
    slot = "model" if owner is ModelDraft else "ngram"
    assert "Boom" in result.stats.sources_set_aside[slot]
    assert slot in result.to_dict()["stats"]["sources_set_aside"]
    monkeypatch.undo()
    again = engine.generate(PROMPT, cfg)  # the source drafts again on the next request
    assert again.token_ids == result.token_ids and not again.stats.sources_set_aside


def test_draft_ids_outside_the_targets_vocabulary_are_dropped(
    engine, fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = ModelDraft.propose

    def too_large(self, *args, **kwargs):
        draft = original(self, *args, **kwargs)
        bad = engine.target.n_vocab + 7
        return Draft((*draft.tokens[:1], bad, *draft.tokens[1:]), draft.confidences)

    monkeypatch.setattr(ModelDraft, "propose", too_large)
    result = engine.generate(PROMPT, GREEDY)
    assert result.token_ids == fresh["greedy"] and not result.stats.sources_set_aside


@pytest.mark.parametrize(
    ("stage", "method", "call", "config"),
    [
        ("target", "decode", 4, "greedy"),
        ("target", "keep_tree", 1, "trees"),
        ("target", "truncate", 2, "greedy"),
        (SampleKeys, "draw", 5, "sampled"),
        (TextAssembler, "feed", 6, "greedy"),
    ],
)
def test_a_failure_in_the_targets_work_leaves_the_engine_clean(
    engine, fresh, monkeypatch: pytest.MonkeyPatch, stage, method: str, call: int, config: str
) -> None:
    """The failing request raises its own error; the next request answers as a fresh engine,
    whatever state the failure left half-written (a KV cache, a tree awaiting keep_tree)."""
    cfg = {"greedy": GREEDY, "trees": TREES, "sampled": SAMPLED}[config]
    owner = engine.target if stage == "target" else stage  # the target's own model only
    monkeypatch.setattr(owner, method, _fail_on(call)(getattr(owner, method)))
    with pytest.raises(Boom):
        engine.generate(TREE_PROMPT if config == "trees" else PROMPT, cfg)
    monkeypatch.undo()
    expected = fresh["sampled" if config == "sampled" else "greedy"]
    reference = GREEDY if config == "trees" else cfg
    assert engine.generate(PROMPT, reference).token_ids == expected
    assert engine.generate(PROMPT, AUTO).token_ids == fresh["auto"]


def test_a_draft_that_cannot_hold_the_prompt_steps_aside(gemma_path, smollm2_path) -> None:
    """Gemma-3 target, SmolLM2 draft (another vocabulary): CJK text that fits Gemma's context
    tokenizes far longer for SmolLM2. The draft steps aside; the answer is the target's."""
    text = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。" * 12 + "\n下一句是："
    with EdgeSpec(gemma_path, smollm2_path, config=EngineConfig(n_ctx=512)) as spec:
        n_target = len(spec.tokenize(text))
        n_draft = len(spec.draft.tokenize(text))
        assert n_target + 40 < 512 < n_draft  # the premise: only the draft overflows
        alone = spec.generate(text, max_tokens=24, draft_mode="none")
        got = spec.generate(text, max_tokens=24, k=3, draft_mode="model")
        assert got.token_ids == alone.token_ids
        assert "model" in got.stats.sources_set_aside
