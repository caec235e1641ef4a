"""The self-draft: layer subsets written with the gguf package load in llama.cpp and compute
what the kept blocks compute; the chosen self-draft drafts for its target with exact output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_spec import EdgeSpec, EngineConfig, InvalidRequestError, ModelFileError
from edge_spec.backend import LlamaModel
from edge_spec.gguf.facts import read_facts
from edge_spec.models.layer_subset import (
    LAYER_PERIOD,
    check_subset,
    valid_subsets,
    write_layer_subset,
)
from edge_spec.models.manifest import choose_pair

PROMPTS = (
    "The history of the Roman Empire begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "List the days of the week: Monday, Tuesday,",
    "Photosynthesis is the process by which plants",
)


@pytest.mark.parametrize(("n_layer", "arch"), [(30, "llama"), (18, "gemma3"), (26, "gemma3")])
def test_candidate_subsets_keep_each_blocks_kind(n_layer: int, arch: str) -> None:
    subsets = valid_subsets(n_layer, arch)
    assert len(subsets) >= 3 and len(set(subsets)) == len(subsets)
    for layers in subsets:
        check_subset(layers, n_layer, arch)  # raises if a block would change kind
        assert 0 in layers and n_layer // 2 <= len(layers) < n_layer


def test_bad_subsets_are_refused_before_anything_is_written() -> None:
    for layers in ((), (1, 0), (0, 30), (0, 0, 1)):
        with pytest.raises(InvalidRequestError):
            check_subset(layers, 30, "llama")
    period = LAYER_PERIOD["gemma3"]
    with pytest.raises(InvalidRequestError, match="period"):
        check_subset(tuple(i for i in range(18) if i != 3), 18, "gemma3")
    check_subset(tuple(i for i in range(18) if not 3 <= i < 3 + period), 18, "gemma3")
    with pytest.raises(InvalidRequestError, match="draft"):
        choose_pair("smollm2-135m-f16", "gemma3-270m-q4_0", draft_mode="self")


def test_a_bad_target_file_is_one_clear_error_in_self_mode(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 4000)
    with pytest.raises(ModelFileError):
        EdgeSpec(junk, draft_mode="self")


@pytest.mark.models
def test_a_layer_subset_computes_what_its_blocks_compute(smollm2_path: Path, tmp_path) -> None:
    """Every block kept: the same logits as the source, bit for bit. Blocks dropped: a model
    with that many blocks that loads and still mostly agrees on an easy continuation."""
    full, part = tmp_path / "all.gguf", tmp_path / "part.gguf"
    n_layer = read_facts(smollm2_path).n_layer
    write_layer_subset(smollm2_path, full, tuple(range(n_layer)))
    kept = tuple(i for i in range(n_layer) if not 4 <= i < 8)
    write_layer_subset(smollm2_path, part, kept)
    assert read_facts(part).n_layer == len(kept)
    rows = {}
    for path in (smollm2_path, full, part):
        with LlamaModel(path, n_ctx=128) as model:
            ids = model.tokenize("Monday, Tuesday, Wednesday, Thursday, Friday,")
            rows[path] = model.decode(ids, range(len(ids))).copy()
    assert np.array_equal(rows[smollm2_path], rows[full])
    assert not np.array_equal(rows[smollm2_path], rows[part])
    agree = (rows[smollm2_path].argmax(1) == rows[part].argmax(1)).mean()
    assert agree > 0.5, agree


@pytest.mark.models
def test_the_chosen_self_draft_output_is_the_targets_and_drafts_are_accepted(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole self-draft path on SmolLM2-135M F16: candidate subsets derived and measured,
    the best one chosen and cached, and drafting with it gives the target's own output.
    Measured here every time (a temporary record and output folder), on the first two
    candidates and two probe prompts of 16 tokens instead of every candidate and six of 32."""
    from edge_spec.device import self_draft

    monkeypatch.setattr(self_draft, "valid_subsets", lambda *a: valid_subsets(*a)[:2])
    monkeypatch.setattr(self_draft, "PROBE_PROMPTS", 2)
    monkeypatch.setattr(self_draft, "PROBE_TOKENS", 16)
    monkeypatch.setattr(self_draft, "_record_path", lambda sha: tmp_path / f"{sha[:24]}.json")
    monkeypatch.setattr(self_draft, "models_dir", lambda: tmp_path)
    with EdgeSpec(smollm2_path, draft_mode="self", config=EngineConfig(n_ctx=512)) as spec:
        assert spec.draft_is_self and spec.draft_path is not None
        assert ".self-" in spec.draft_path.name  # derived, cached beside the other models
        n_drafted, n_accepted = _drafts_with_exact_output(spec, PROMPTS[:5])
        assert n_drafted > 40 and n_accepted > n_drafted * 0.2, (n_drafted, n_accepted)
        with pytest.raises(InvalidRequestError, match="self"):
            EdgeSpec(smollm2_path, smollm2_path, draft_mode="self")


@pytest.mark.models
def test_a_gemma3_layer_subset_drafts_for_its_target(draft_path: Path, tmp_path: Path) -> None:
    """Gemma-3's blocks alternate sliding-window and global attention: a subset that keeps the
    period (its first candidate, what the self-draft would measure) loads and drafts for its
    source, here the default pair's Gemma-3-270M Q4_0 (the F16's self-draft measured the same
    way, more slowly), with the target's own output. Gemma-3's subsets agree far less than
    SmolLM2's (the F16's best measured 0.47 top-1 on the probe prompts, 0.1-0.5 per prompt),
    so only acceptance is asked."""
    target = draft_path
    assert "gemma3" in target.name
    n_layer = read_facts(target).n_layer
    layers = valid_subsets(n_layer, "gemma3")[0]
    subset = tmp_path / "gemma3-subset.gguf"
    write_layer_subset(target, subset, layers)
    with EdgeSpec(target, subset, config=EngineConfig(n_ctx=512)) as spec:
        n_drafted, n_accepted = _drafts_with_exact_output(spec, PROMPTS[:2])
        assert n_drafted > 20 and n_accepted > n_drafted * 0.02, (n_drafted, n_accepted)


def _drafts_with_exact_output(spec: EdgeSpec, prompts=PROMPTS) -> tuple[int, int]:
    """Each prompt with a fixed k = 3 against the target alone: the same tokens (a batching
    near-tie may flip one prompt at most); (tokens drafted, accepted)."""
    n_drafted = n_accepted = n_diverged = 0
    for prompt in prompts:
        alone = spec.generate(prompt, max_tokens=32, draft_mode="none")
        got = spec.generate(prompt, max_tokens=32, k=3)  # the engine's own mode: self, auto
        assert got.draft_vocab == "shared" and got.draft_mode == spec.default_draft_mode
        n_diverged += got.token_ids != alone.token_ids
        n_drafted += got.stats.n_drafted
        n_accepted += got.stats.n_accepted
    assert n_diverged <= 1
    return n_drafted, n_accepted
