"""GGUF validation before llama.cpp, and the fuzz harness on the real registry models: every
mutant of their header region loads and generates, or is refused with the project's error --
never a dead process, never a traceback."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from edge_spec import fuzz
from edge_spec.errors import ModelFileError
from edge_spec.gguf.facts import read_metadata
from edge_spec.gguf.validate import validate_gguf

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = [pytest.mark.models, pytest.mark.xdist_group("gguf_validate")]


def _model(name: str) -> Path:
    from edge_spec.models.cache import resolve

    return resolve(name, progress=False)


@pytest.fixture(scope="session")
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


# A Gemma-3 mutant costs about 0.6 s (its 262,144-token vocabulary walked and loaded), a
# SmolLM2 one 0.2 s: SmolLM2 takes the larger share; both cover every kind of mutation (the
# fuzz runner, scripts/fuzz_gguf.py, runs thousands).
@pytest.mark.parametrize(("name", "n"), [("smollm2-135m-q4_0", 48), ("gemma3-270m-q4_0", 20)])
def test_fuzzed_models_load_or_are_refused_never_a_death(name: str, n: int, tmp_path: Path) -> None:
    """A fixed-seed subset of scripts/fuzz_gguf.py: n mutants per model, every kind."""
    outcomes = list(fuzz.run(_model(name), n, seed=2026, workdir=tmp_path))
    findings = [(o.mutant.description, o.verdict, o.detail) for o in outcomes if o.is_finding]
    assert not findings, findings
    assert {o.mutant.kind for o in outcomes} == set(fuzz.KINDS)
    verdicts = {o.verdict for o in outcomes}
    assert verdicts == {"ok", "refused"}  # some mutants still load: the harness can tell


# ---- isolation: the first load of an unknown file in a child process -------------------------


def _tensor_type_mutant(small: Path, tmp_path: Path) -> Path:
    """A file that passes validation but that llama.cpp refuses: one tensor's type changed,
    so the tensors' sizes no longer add up to their offsets."""
    lay = fuzz.layout(small)
    field = next(f for f in lay.fields if f.what == "tensor 85 type")
    old = struct.unpack("<I", small.read_bytes()[field.offset : field.offset + 4])[0]
    mutant = _copy_with(small, tmp_path, [(field.offset, struct.pack("<I", 3 if old != 3 else 2))])
    validate_gguf(mutant)
    return mutant


def test_a_file_llama_cpp_refuses_gets_a_cached_verdict(small: Path, tmp_path: Path) -> None:
    from edge_spec.models.isolation import VERDICTS_NAME, verify_in_child

    cache = tmp_path / "cache"
    assert verify_in_child(small, cache) > 0  # a child loaded it once
    assert verify_in_child(small, cache) == 0.0  # then the verdict is known
    mutant = _tensor_type_mutant(small, tmp_path)
    with pytest.raises(ModelFileError, match="llama.cpp could not load it"):
        verify_in_child(mutant, cache)
    verdicts = (cache / VERDICTS_NAME).read_text()
    assert '"ok": false' in verdicts and '"ok": true' in verdicts


def test_a_child_killed_by_an_abort_leaves_the_parent_with_one_error(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's side of an abort: a child that dies of SIGABRT (here one that aborts on
    purpose, standing in for a GGML_ASSERT) is one ModelFileError, remembered by sha256."""
    from edge_spec.models import isolation

    monkeypatch.setattr(
        isolation,
        "_CHILD",
        "import os, sys; print('GGML_ASSERT(x) failed', file=sys.stderr, flush=True); os.abort()",
    )
    cache = tmp_path / "cache"
    for _ in range(2):  # the second answer comes from the cache
        with pytest.raises(ModelFileError, match=r"aborted loading it \(signal 6\).*GGML_ASSERT"):
            isolation.verify_in_child(small, cache)


def test_the_cli_refuses_a_file_llama_cpp_refuses_with_one_line(
    small: Path, tmp_path: Path
) -> None:
    mutant = _tensor_type_mutant(small, tmp_path)
    env = dict(os.environ, EDGE_SPEC_CACHE=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "edge_spec.cli", "generate", "-m", str(mutant)]
        + ["--draft-mode", "none", "--max-tokens", "4", "Hello"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not load" in lines[0], out.stderr


def test_a_nul_byte_that_makes_two_tokens_equal_is_refused(small: Path, tmp_path: Path) -> None:
    """llama.cpp reads token texts as C strings: 'ab\\0...' is 'ab'. Found by the fuzzer (a
    random byte set to 0 inside a text made it equal to a shorter token: an abort)."""
    lay = fuzz.layout(small)
    data = small.read_bytes()
    texts = {data[at : at + n]: at for at, n in lay.tokens}
    at, n = next((at, n) for at, n in lay.tokens if n > 2 and data[at : at + n - 1] in texts)
    mutant = _copy_with(small, tmp_path, [(at + n - 1, b"\x00")])
    with pytest.raises(ModelFileError, match="repeats an earlier token"):
        validate_gguf(mutant)


def test_a_validated_file_is_recorded_and_a_rewritten_one_validated_again(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process reads the record instead of walking the file again, and gets the same
    summary; a file rewritten in place with its size and mtime kept (one clock tick) no longer
    matches its record's bytes, so it is validated again and its corruption refused."""
    from edge_spec.gguf import validate as v

    field = next(f for f in fuzz.layout(small).fields if f.what == "tokenizer.ggml.merges count")
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(small, copy)
    first = v.validate_gguf(copy)
    assert len(list((tmp_path / "cache" / "validated").glob("*.json"))) == 1
    walked: list[int] = []
    real = v._validate
    monkeypatch.setattr(v, "_validate", lambda r: walked.append(1) or real(r))
    v._cache.clear()  # as another process would start
    again = v.validate_gguf(copy)
    assert walked == []  # read from the record
    for name in ("tensors", "metadata", "vocab_sha256", "kv_spans"):
        assert getattr(again, name) == getattr(first, name), name
    assert again == first
    st = copy.stat()
    with copy.open("r+b") as f:
        f.seek(field.offset)
        f.write(struct.pack("<Q", 1 << 40))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    v._cache.clear()
    with pytest.raises(ModelFileError, match="tokenizer.ggml.merges"):
        v.validate_gguf(copy)
    assert walked == [1]
