"""Small file-system helpers shared by the model cache and the device-profile cache: atomic
writes, an exclusive directory lock, and a sha256 cache keyed on size + mtime."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"
SIDECAR_NAME = ".sha256-cache.json"
LOCK_NAME = ".lock"


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
