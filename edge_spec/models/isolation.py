"""The first load of a model file this machine has not seen, in a short-lived child process.

Validation (gguf_validate) catches what llama.cpp's reader and vocabulary loader would trust;
llama.cpp can still abort deeper in an architecture's loader on a file that passes it. So a
file whose sha256 has no verdict yet is first loaded and decoded by a child process
(backend.smoke_test); if the child dies, the parent raises ModelFileError with llama.cpp's own
last line, and the process that asked survives. Verdicts are kept by sha256 in the cache
directory, so each file pays this once: the CLI and `serve` do it by default, the API when
`EngineConfig.verify_in_child` is set.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from edge_spec.errors import ModelFileError
from edge_spec.files import atomic_output, file_identity, hash_file
from edge_spec.gguf.validate import validate_gguf

log = logging.getLogger(__name__)

VERDICTS_NAME = "verified-models.json"
CHILD_TIMEOUT_S = 300.0
_CHILD = "import sys; from edge_spec.backend import smoke_test; smoke_test(sys.argv[1])"
_lock = threading.Lock()


def verify_in_child(path: str | os.PathLike[str], cache_dir: Path) -> float:
    """Requires nothing. Returns the seconds spent (0 when the verdict was known); raises
    ModelFileError when the file is invalid or its load killed the child. A file seen before
    (same path, size, mtime and inode) is not even hashed again."""
    t0 = time.perf_counter()
    path = Path(path)
    validate_gguf(path)  # in-process and safe: a plainly corrupt file needs no child
    store = cache_dir / VERDICTS_NAME
    with _lock:
        record = _read(store)
        by_sha, by_file = record.setdefault("by_sha", {}), record.setdefault("by_file", {})
        identity = _identity(path)
        digest = by_file.get(identity) or hash_file(path)
        verdict = by_sha.get(digest)
        if isinstance(verdict, dict) and "ok" in verdict:
            if by_file.get(identity) != digest:
                by_file[identity] = digest
                _write(store, record)
            if not verdict["ok"]:
                raise ModelFileError(f"{path}: {verdict.get('reason', 'failed to load')}")
            return 0.0
        ok, reason = _load_in_child(path)
        by_sha[digest] = {"ok": ok, "reason": reason, "file": path.name}
        by_file[identity] = digest
        _write(store, record)
    spent = time.perf_counter() - t0
    log.info("verified %s in a child process (%.1f s): %s", path.name, spent, reason or "ok")
    if not ok:
        raise ModelFileError(f"{path}: {reason}")
    return spent


def _identity(path: Path) -> str:
    return "|".join(map(str, file_identity(path)))


def _load_in_child(path: Path) -> tuple[bool, str]:
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHILD_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return False, f"llama.cpp did not finish loading it within {CHILD_TIMEOUT_S:.0f} s"
    if out.returncode == 0:
        return True, ""
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if "GGML_ASSERT" in line), None)
    last = last or (lines[-1] if lines else f"exit code {out.returncode}")
    if out.returncode < 0:
        return False, f"llama.cpp aborted loading it (signal {-out.returncode}): {last}"
    return False, f"llama.cpp could not load it: {last}"


def _read(store: Path) -> dict:
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(store: Path, verdicts: dict) -> None:
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(store) as tmp:
            tmp.write_text(json.dumps(verdicts, indent=1), encoding="utf-8")
    except OSError as exc:  # a read-only cache: verify again next time
        log.warning("could not record a model verdict in %s: %s", store, exc)
