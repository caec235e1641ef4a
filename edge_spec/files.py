"""Small file-system helpers shared by every cache edge_spec keeps: where the cache is, atomic
writes, an exclusive directory lock, and the one file hash (sha256, cached per size + mtime)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"
SIDECAR_NAME = ".sha256-cache.json"
LOCK_NAME = ".lock"
HASH_BLOCK_BYTES = 4 << 20
# Where the hashes of files outside edge_spec's own model cache are recorded (the device
# profiles' directory, where they always were).
HASHES_DIR = "profiles"


def cache_dir() -> Path:
    """`$EDGE_SPEC_CACHE`, else `$XDG_CACHE_HOME/edge_spec`, else `~/.cache/edge_spec`."""
    if os.environ.get("EDGE_SPEC_CACHE"):
        return Path(os.environ["EDGE_SPEC_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "edge_spec"
    return Path.home() / ".cache" / "edge_spec"


def hash_file(path: Path, on_block: Callable[[int], object] | None = None) -> str:
    """The sha256 of a file, read in blocks; on_block(n_bytes) after each (a progress bar)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK_BYTES):
            digest.update(block)
            if on_block is not None:
                on_block(len(block))
    return digest.hexdigest()


def file_identity(path: Path, st: os.stat_result | None = None) -> tuple[str, int, int, int]:
    """What tells a file apart from its earlier or later self without reading it: its resolved
    path, size, mtime and inode (st: its stat, where the caller has it). Raises OSError."""
    st = st if st is not None else path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


_sha256_seen: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """The file's sha256, hashed at most once per size + mtime: from the sidecar beside it
    (models prepared by edge_spec.models have one), else from the cache's own record of files
    found elsewhere (HASHES_DIR), else hashed now and recorded there. Kept in the process per
    file identity: a one-shot run's first request asks for twenty (the llama.cpp libraries'
    and the models', 10 ms of sidecar reads measured), later ones for the same again."""
    try:
        identity: tuple[str, int, int, int] | None = file_identity(path)
    except OSError:
        identity = None
    if identity is not None and identity in _sha256_seen:
        return _sha256_seen[identity]
    sha = _file_sha256(path)
    if identity is not None:
        _sha256_seen[identity] = sha
    return sha


def _file_sha256(path: Path) -> str:
    record = HashCache(path.parent).get(path)
    if record is None:
        directory = cache_dir() / HASHES_DIR
        record = HashCache(directory).get(path)
        if record is None:
            directory.mkdir(parents=True, exist_ok=True)
            with locked(directory):
                hashes = HashCache(directory)  # re-read: another process may have hashed it
                record = hashes.get(path)
                if record is None:
                    log.info("hashing %s (once per size + mtime)", path)
                    hashes.put(path, hash_file(path), "hashed")
                    record = hashes.get(path)
    assert record is not None
    return str(record["sha256"])


@contextlib.contextmanager
def atomic_output(dst: Path) -> Iterator[Path]:
    """Yield a temp path beside dst; on success fsync it and rename it over dst, else delete it."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not supported on every platform / filesystem
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Exclusive lock on a cache directory so that concurrent writers take turns."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, atomic renames still keep files whole
        yield
        return
    with open(directory / LOCK_NAME, "a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another edge_spec process holding %s", directory)
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


class HashCache:
    """sha256 per file name, valid only while the file keeps the size and mtime it was hashed at.

    Written atomically; only a holder of the directory lock writes it.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / SIDECAR_NAME
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.records: dict[str, dict[str, Any]] = data if isinstance(data, dict) else {}
        except FileNotFoundError:
            self.records = {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable hash cache %s: %s", self.path, exc)
            self.records = {}

    def get(self, path: Path) -> dict[str, Any] | None:
        record = self.records.get(path.name)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        if (
            isinstance(record, dict)
            and record.get("size_bytes") == st.st_size
            and record.get("mtime_ns") == st.st_mtime_ns
        ):
            return record
        return None

    def put(self, path: Path, sha256: str, origin: str) -> None:
        st = path.stat()
        self.records[path.name] = {
            "size_bytes": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": sha256,
            "origin": origin,  # "fetched", "built" (derived here) or "hashed" (found in place)
        }
        with atomic_output(self.path) as tmp:
            tmp.write_text(json.dumps(self.records, indent=1, sort_keys=True), encoding="utf-8")
