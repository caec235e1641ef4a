"""Draft heads: the hand-written backward pass, the ONNX export against the numpy head, the
acceptance measure, and (on the real models) a head trained here drafting through the engine
without changing a token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_spec.headtrain.train import Params, _acceptance, forward, init_params, loss_and_grads

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = pytest.mark.xdist_group("head")


def _tiny_params(rng: np.random.Generator, d: int = 4, hidden: int = 6, vocab: int = 5) -> Params:
    p = init_params(d, hidden, rng.standard_normal((vocab, d)), 0.7, 1.3, seed=1)
    for name, value in p.arrays().items():  # float64 and non-zero everywhere, for differences
        setattr(p, name, (value + 0.1 * rng.standard_normal(value.shape)).astype(np.float64))
    return p


def test_head_gradients_match_finite_differences() -> None:
    """Both unrolled steps (the second reading the first's predicted hidden state), the
    regression term, and a row whose label is outside the reduced vocabulary."""
    rng = np.random.default_rng(0)
    p = _tiny_params(rng)
    n, d = 7, 4
    h = rng.standard_normal((n, d))
    embeds = [rng.standard_normal((n, d)) for _ in range(2)]
    labels = [rng.integers(0, 5, n), rng.integers(0, 5, n)]
    labels[0][3] = -1
    nexts = [rng.standard_normal((n, d)) for _ in range(2)]
    args = (h, embeds, labels, nexts, (1.0, 0.6), 0.8)
    _, grads = loss_and_grads(p, *args)
    for name, value in p.arrays().items():
        for index in list(np.ndindex(value.shape))[:: max(1, value.size // 6)]:
            old = value[index]
            value[index] = old + 1e-6
            up, _ = loss_and_grads(p, *args)
            value[index] = old - 1e-6
            down, _ = loss_and_grads(p, *args)
            value[index] = old
            numeric = (up - down) / 2e-6
            assert grads[name][index] == pytest.approx(numeric, rel=1e-4, abs=1e-7), name


def test_exported_onnx_is_the_numpy_head(tmp_path: Path) -> None:
    import onnxruntime as ort

    from edge_spec.headtrain.export import export_onnx

    rng = np.random.default_rng(1)
    d = 8
    p = init_params(d, 16, rng.standard_normal((32, d)).astype(np.float32), 0.5, 2.0, seed=2)
    p.W2 = rng.standard_normal(p.W2.shape).astype(np.float32)
    p.bout = rng.standard_normal(p.bout.shape).astype(np.float32)
    export_onnx(p, tmp_path / "head.onnx")
    session = ort.InferenceSession(str(tmp_path / "head.onnx"), providers=["CPUExecutionProvider"])
    h = rng.standard_normal((3, d)).astype(np.float32)
    e = rng.standard_normal((3, d)).astype(np.float32)
    logits, feature = session.run(None, {"hidden": h, "embed": e})
    want_logits, want_feature, _ = forward(p, h, e)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(feature, want_feature, rtol=1e-4, atol=1e-4)


def test_acceptance_per_position_is_conditional_on_the_earlier_positions() -> None:
    correct = np.array(
        [[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]],
        dtype=bool,
    )
    got = _acceptance(correct, np.array([1, 1, 0, 1], dtype=bool))
    assert got.conditional == pytest.approx((0.75, 2 / 3, 0.5))
    assert got.cumulative == pytest.approx((0.75, 0.5, 0.25))
    assert got.top3_first == 0.75 and got.n_rows == 4
    assert got.expected_tokens(2) == pytest.approx(2.25)


# ---- the real models -------------------------------------------------------------------------

HELD_OUT = [
    "Explain why the sky looks blue during the day.",
    "Describe how a bicycle gear system works.",
]


@pytest.fixture(scope="session")
def trained_head(smollm2_path: Path):
    """A small head trained here, into the tests' own heads directory (conftest): about a
    thousand rows of data, so its acceptance is low but real. The row cap, not the time
    budget (generous, never reached), decides how much it trains on, however loaded the
    machine; answers of at most 48 tokens, 16 prompts at a time, keep the collection short
    (20 s of 27 here)."""
    from edge_spec.headtrain import data as data_mod
    from edge_spec.headtrain.run import train_head

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data_mod, "MAX_NEW_TOKENS", 48)
        patch.setattr(data_mod, "N_PARALLEL", 16)
        return train_head(smollm2_path, minutes=60.0, max_rows=600, eval_prompts=4, seed=3)


@pytest.mark.models
def test_a_trained_head_drafts_without_changing_the_output(
    smollm2_path: Path, trained_head
) -> None:
    from edge_spec import EdgeSpec, EngineConfig
    from edge_spec.models.heads import find_head, load_info

    report = trained_head
    directory = find_head(smollm2_path)
    assert directory == report.head_dir
    info = load_info(directory)
    assert info.kind == "eagle" and info.n_embd == 576 and len(info.vocab_ids) > 100
    assert info.trained["n_train_rows"] >= 600
    assert 0.0 < report.eagle.conditional[0] <= 1.0 and report.eagle.n_rows > 120

    config = EngineConfig(n_ctx=1024)
    n_accepted = 0
    with EdgeSpec(smollm2_path, draft_mode="head", config=config) as spec:
        import onnxruntime as ort

        head = spec._sources["head"]
        assert head.provider in ort.get_available_providers() and head.token_s > 0
        for prompt in HELD_OUT:
            text = spec.render_chat([{"role": "user", "content": prompt}])
            alone = spec.generate(text, max_tokens=48, draft_mode="none")
            for options in ({"k": 2}, {}):  # a fixed k, and the default cost policy
                got = spec.generate(text, max_tokens=48, **options)
                assert got.token_ids == alone.token_ids
                assert got.draft == str(directory) and got.draft_mode == "head"
                n_accepted += got.stats.n_accepted
            # Sampled with a seed: the keyed draws make drafts irrelevant to the text.
            sampled = {
                mode: spec.generate(
                    text, max_tokens=32, temperature=0.8, seed=7, k=2, draft_mode=mode
                ).token_ids
                for mode in ("head", "none")
            }
            assert sampled["head"] == sampled["none"]
    assert n_accepted > 0
    # auto drafts with the head (in the learned-draft slot) when the target has one.
    with EdgeSpec(smollm2_path, config=config) as spec:
        result = spec.generate("The three primary colors are", max_tokens=24, k=2)
        assert result.draft == str(directory) and result.draft_mode == "auto"


@pytest.mark.models
def test_head_mode_without_a_head_is_one_clear_error(gemma_path: Path) -> None:
    from edge_spec import EdgeSpec
    from edge_spec.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="edge-spec head train"):
        EdgeSpec(gemma_path, draft_mode="head")
    cli = [sys.executable, "-m", "edge_spec.cli"]
    run = subprocess.run(
        [*cli, "generate", "-m", str(gemma_path), "--draft-mode", "head", "hi", "-n", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "edge-spec head train" in run.stderr


@pytest.mark.models
def test_head_show_prints_what_it_was_trained_on(smollm2_path: Path, trained_head) -> None:
    cli = [sys.executable, "-m", "edge_spec.cli"]
    run = subprocess.run(
        [*cli, "head", "show", "-m", str(smollm2_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert shown["n_train_rows"] == trained_head.n_train_rows
    assert len(shown["eagle"]["conditional"]) == 4


@pytest.mark.models
def test_the_held_out_set_is_collected_whole_whatever_the_budget(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget already spent still collects every held-out prompt (the evaluation must not
    depend on how loaded the machine was), and stops taking training prompts."""
    from edge_spec.headtrain import data as data_mod

    monkeypatch.setattr(data_mod, "MAX_NEW_TOKENS", 8)
    monkeypatch.setattr(data_mod, "N_PARALLEL", 4)
    data_mod.collect(
        smollm2_path, tmp_path, max_rows=10**6, deadline=lambda n_rows: 0.0, eval_prompts=3
    )
    train, held = data_mod.load(tmp_path)
    assert len(held.starts) - 1 == 3
    # Only what ran beside the held-out prompts (a slot freed early by an end token takes one
    # more), not the hundreds of training prompts.
    assert 0 < len(train.starts) - 1 <= 8
