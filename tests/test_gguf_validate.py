"""GGUF validation before llama.cpp, and the fuzz harness on the real registry models: every
mutant of their header region loads and generates, or is refused with the project's error --
never a dead process, never a traceback."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from edge_spec import fuzz
from edge_spec.errors import ModelFileError
from edge_spec.gguf import read_metadata
from edge_spec.gguf_validate import validate_gguf

pytestmark = pytest.mark.models


def _model(name: str) -> Path:
    from edge_spec.models import resolve

    return resolve(name, progress=False)


@pytest.fixture(scope="module")
def small() -> Path:
    return _model("smollm2-135m-q4_0")


def _copy_with(original: Path, tmp_path: Path, patches: list[tuple[int, bytes]]) -> Path:
    dst = tmp_path / "mutant.gguf"
    shutil.copyfile(original, dst)
    with dst.open("r+b") as f:
        for offset, raw in patches:
            f.seek(offset)
            f.write(raw)
    return dst


def test_the_registry_models_are_valid(small: Path) -> None:
    summary = validate_gguf(small)
    assert summary.n_vocab == 49152 and summary.n_tensors > 100
    gemma = validate_gguf(_model("gemma3-270m-q4_0"))
    assert gemma.n_vocab == 262144


def test_two_identical_vocabulary_entries_are_refused_before_llama_cpp(
    small: Path, tmp_path: Path
) -> None:
    """llama.cpp asserts (and kills the process) on a vocabulary with a repeated text."""
    lay = fuzz.layout(small)
    by_length: dict[int, list[int]] = {}
    for at, length in lay.tokens:
        by_length.setdefault(length, []).append(at)
    length, (src, dst) = next(
        (n, ats[:2]) for n, ats in by_length.items() if n > 3 and len(ats) > 1
    )
    text = small.read_bytes()[src : src + length]
    mutant = _copy_with(small, tmp_path, [(dst, text)])
    with pytest.raises(ModelFileError, match=r"tokenizer\.ggml\.tokens\[\d+\] repeats"):
        validate_gguf(mutant)


@pytest.mark.parametrize("value", [1 << 63, (1 << 64) - 1, 1 << 40])
def test_a_corrupted_length_is_a_model_file_error_naming_the_field(
    small: Path, tmp_path: Path, value: int
) -> None:
    """A string or array length past any sane offset once reached f.seek() as a ValueError."""
    lay = fuzz.layout(small)
    field = next(f for f in lay.fields if f.what == "tokenizer.ggml.merges count")
    mutant = _copy_with(small, tmp_path, [(field.offset, struct.pack("<Q", value))])
    for check in (validate_gguf, read_metadata):
        with pytest.raises(ModelFileError, match="tokenizer.ggml.merges"):
            check(mutant)


def test_tensor_infos_are_checked(small: Path, tmp_path: Path) -> None:
    lay = fuzz.layout(small)

    def field(what: str) -> fuzz.Field:
        return next(f for f in lay.fields if f.what == what)

    cases = [
        (field("tensor 3 dimension count"), struct.pack("<I", 7), "dimensions"),
        (field("tensor 3 type"), struct.pack("<I", 31), "unknown type"),
        (field("tensor 3 offset"), struct.pack("<Q", 1 << 40), "run past the file"),
        (field("tensor 3 offset"), struct.pack("<Q", 3), "not a multiple"),
        (field("tensor 3 dimension 0"), struct.pack("<Q", 0), "out of range"),
    ]
    for f, raw, needle in cases:
        mutant = _copy_with(small, tmp_path, [(f.offset, raw)])
        with pytest.raises(ModelFileError, match=needle):
            validate_gguf(mutant)


def test_the_cli_refuses_a_corrupt_model_with_one_line(small: Path, tmp_path: Path) -> None:
    lay = fuzz.layout(small)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small.read_bytes()[: lay.header_end // 2])
    out = subprocess.run(
        [sys.executable, "-m", "edge_spec.cli", "generate", "-m", str(cut), "--draft-mode", "none"]
        + ["--max-tokens", "4", "Hello"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid GGUF" in lines[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["smollm2-135m-q4_0", "gemma3-270m-q4_0"])
def test_fuzzed_models_load_or_are_refused_never_a_death(name: str, tmp_path: Path) -> None:
    """A fixed-seed subset of scripts/fuzz_gguf.py: 80 mutants per model, every kind."""
    outcomes = list(fuzz.run(_model(name), 80, seed=2026, workdir=tmp_path))
    findings = [(o.mutant.description, o.verdict, o.detail) for o in outcomes if o.is_finding]
    assert not findings, findings
    assert {o.mutant.kind for o in outcomes} == set(fuzz.KINDS)
    verdicts = {o.verdict for o in outcomes}
    assert verdicts == {"ok", "refused"}  # some mutants still load: the harness can tell
