"""Memory planning: GGUF metadata, the budget check and its advice, the GPU layer split."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from edge_spec.errors import EdgeSpecError, InvalidRequestError, ModelFileError
from edge_spec.gguf.facts import read_facts, read_metadata
from edge_spec.models.placement import MIB, PlacementError, parse_size, plan_placement


def write_gguf(path: Path, kv: dict[str, int | str], pad_bytes: int = 0) -> Path:
    """A metadata-only GGUF v3 file (no tensors) with uint32 and string values."""
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, 0, len(kv))
    for key, value in kv.items():
        out += struct.pack("<Q", len(key)) + key.encode()
        if isinstance(value, str):
            out += struct.pack("<IQ", 8, len(value)) + value.encode()
        else:
            out += struct.pack("<II", 4, value)
    path.write_bytes(bytes(out) + b"\0" * pad_bytes)
    return path


def tiny_model(path: Path, n_layer: int, weights_mib: int) -> Path:
    return write_gguf(
        path,
        {
            "general.architecture": "llama",
            "llama.block_count": n_layer,
            "llama.embedding_length": 512,
            "llama.attention.head_count": 8,
            "llama.attention.head_count_kv": 2,
            "llama.context_length": 65536,
            "llama.vocab_size": 32000,
        },
        pad_bytes=weights_mib * MIB,
    )


def test_parse_size() -> None:
    assert parse_size("800M") == 800 * MIB
    assert parse_size("2G") == 2048 * MIB
    assert parse_size("1.5GiB") == int(1.5 * 1024) * MIB
    assert parse_size("4096") == 4096
    with pytest.raises(InvalidRequestError):
        parse_size("lots")


def test_gguf_facts_and_kv_size(tmp_path: Path) -> None:
    facts = read_facts(tiny_model(tmp_path / "m.gguf", n_layer=10, weights_mib=1))
    assert (facts.n_layer, facts.n_head_kv, facts.key_length, facts.n_vocab) == (10, 2, 64, 32000)
    # K and V, f16: layers * kv heads * (key + value length) * 2 bytes per position
    assert facts.kv_bytes(1000) == 1000 * 10 * 2 * (64 + 64) * 2


def test_corrupt_gguf_metadata_is_a_model_file_error(tmp_path: Path) -> None:
    path = tiny_model(tmp_path / "m.gguf", n_layer=4, weights_mib=0)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ModelFileError):
        read_metadata(path)


def test_plan_fits_and_refuses_with_advice(tmp_path: Path) -> None:
    target = tiny_model(tmp_path / "t.gguf", n_layer=24, weights_mib=600)
    draft = tiny_model(tmp_path / "d.gguf", n_layer=8, weights_mib=200)
    plan = plan_placement(target, draft, n_ctx=4096, ram_budget_bytes=8192 * MIB)
    assert plan.ram_needed_bytes >= (600 + 200) * MIB
    assert plan.target.n_gpu_layers == 0 and plan.draft is not None

    with pytest.raises(PlacementError) as err:  # weights alone exceed this: advice is the budget
        plan_placement(target, draft, n_ctx=4096, ram_budget_bytes=700 * MIB)
    assert "--mem-budget" in str(err.value) and isinstance(err.value, EdgeSpecError)

    # Fits only without the draft: the advice says so.
    with pytest.raises(PlacementError, match="--draft-mode ngram"):
        plan_placement(target, draft, n_ctx=4096, ram_budget_bytes=1000 * MIB)
    plan_placement(target, None, n_ctx=4096, ram_budget_bytes=1000 * MIB)

    # Fits only with a smaller context: the advice names a context size that does fit.
    big_kv = plan_placement(target, draft, n_ctx=32768, ram_budget_bytes=64 * 1024 * MIB)
    budget = big_kv.ram_needed_bytes  # no room left for headroom at 32k
    with pytest.raises(PlacementError, match="--ctx-size") as err:
        plan_placement(target, draft, n_ctx=32768, ram_budget_bytes=budget)
    suggested = int(str(err.value).split("--ctx-size ")[1].split(",")[0].split()[0])
    plan_placement(target, draft, n_ctx=suggested, ram_budget_bytes=budget)


def test_gpu_budget_puts_the_draft_first_then_target_layers(tmp_path: Path) -> None:
    target = tiny_model(tmp_path / "t.gguf", n_layer=24, weights_mib=600)
    draft = tiny_model(tmp_path / "d.gguf", n_layer=8, weights_mib=200)
    plan = plan_placement(
        target, draft, n_ctx=2048, ram_budget_bytes=8192 * MIB, vram_budget_bytes=600 * MIB
    )
    assert plan.draft is not None and plan.draft.n_gpu_layers == 8
    assert 0 < plan.target.n_gpu_layers < 24
    assert plan.vram_needed_bytes <= 600 * MIB
    everything = plan_placement(
        target, draft, n_ctx=2048, ram_budget_bytes=8192 * MIB, vram_budget_bytes=4096 * MIB
    )
    assert everything.target.n_gpu_layers == 24


@pytest.mark.models
def test_real_pair_refused_before_loading(target_path: Path, draft_path: Path) -> None:
    from edge_spec import EdgeSpec, EngineConfig

    with pytest.raises(PlacementError, match="do not fit"):
        EdgeSpec(target_path, draft_path, config=EngineConfig(mem_budget_bytes=300 * MIB))
    plan = plan_placement(target_path, draft_path, n_ctx=4096)
    weights = target_path.stat().st_size + draft_path.stat().st_size
    assert weights < plan.ram_needed_bytes < weights + 600 * MIB
