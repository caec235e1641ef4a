"""What the cost policy learned, kept between processes beside the device profile, so that a
one-shot `edge-spec generate` starts where the last process stopped instead of at the priors.

One file per (device profile, policy settings): `<cache_dir()>/learned/<key>.json`, the key a
hash of the profile's key (host, both models' sha256, threads, offload, llama.cpp build) and the
policy's settings (mode, learned-draft slot, k, k_max, tree nodes, greedy or sampled, free or
structured text) plus the head's directory where a head drafts. The file holds numbers only
(CostModelK.state(): decayed counts, ratios, intervals), never a request's text.

A file is ignored, and learning starts from the priors, when it is of another format version or
another edge_spec version, when the profile it was learned against was measured again, when it
is older than MAX_AGE_S, or when it does not parse; `--fresh` (EngineConfig.fresh) ignores it
too. At most MAX_FILES files are kept (the least recently written go first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edge_spec import __version__
from edge_spec.files import TMP_SUFFIX, atomic_output, cache_dir

log = logging.getLogger(__name__)

STATE_VERSION = 1
MAX_AGE_S = 30 * 86400.0  # a month: the models, the machine's load or llama.cpp may have moved
MAX_FILES = 64
DIRECTORY = "learned"

_write_lock = threading.Lock()  # engines in one process share temp names (atomic_output: pid)


@dataclass(frozen=True)
class LearnedKey:
    """Which learned state: the device profile it was learned against and the policy's settings."""

    profile_key: str
    profile_created: str  # a profile measured again starts learning afresh
    settings: tuple[Any, ...]

    @property
    def name(self) -> str:
        text = json.dumps([STATE_VERSION, self.profile_key, [str(s) for s in self.settings]])
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def learned_dir() -> Path:
    """`$EDGE_SPEC_LEARNED_DIR` (the tests keep theirs apart), else `<cache_dir()>/learned`."""
    override = os.environ.get("EDGE_SPEC_LEARNED_DIR")
    return Path(override).expanduser() if override else cache_dir() / DIRECTORY


def learned_path(key: LearnedKey) -> Path:
    return learned_dir() / f"{key.name}.json"


def load_learned(key: LearnedKey, now_s: float | None = None) -> dict[str, Any] | None:
    """The saved state for `key`, or None (none saved, stale, or from another build)."""
    path = learned_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.info("ignoring learned state %s: %s", path, exc)
        return None
    reason = _stale(data, key, time.time() if now_s is None else now_s)
    if reason is not None:
        log.info("ignoring learned state %s: %s", path, reason)
        return None
    state: dict[str, Any] = data["state"]
    return state


def _stale(data: Any, key: LearnedKey, now_s: float) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("state"), dict):
        return "not a learned-state file"
    if data.get("version") != STATE_VERSION:
        return f"format {data.get('version')!r}, expected {STATE_VERSION}"
    if data.get("edge_spec") != __version__:
        return f"saved by edge_spec {data.get('edge_spec')!r}"
    if data.get("profile_key") != key.profile_key:
        return "another device profile"
    if data.get("profile_created") != key.profile_created:
        return "the device profile was measured again"
    saved_s = data.get("saved_s")
    if not isinstance(saved_s, int | float) or not 0 <= now_s - saved_s <= MAX_AGE_S:
        return "too old"
    return None


def save_learned(key: LearnedKey, state: Mapping[str, Any]) -> Path | None:
    """Write the state atomically (and prune old files); None when the cache is not writable,
    which costs the next process its head start, nothing else."""
    directory = learned_dir()
    path = learned_path(key)
    data = {
        "version": STATE_VERSION,
        "edge_spec": __version__,
        "profile_key": key.profile_key,
        "profile_created": key.profile_created,
        "settings": [str(s) for s in key.settings],
        "saved_s": time.time(),
        "state": dict(state),
    }
    try:
        text = json.dumps(data, allow_nan=False)
        with _write_lock:
            directory.mkdir(parents=True, exist_ok=True)
            with atomic_output(path) as tmp:
                tmp.write_text(text + "\n", encoding="utf-8")
            _prune(directory, keep=path)
    except (OSError, ValueError) as exc:
        log.warning("could not save what the policy learned to %s: %s", path, exc)
        return None
    return path


def _prune(directory: Path, keep: Path) -> None:
    files = [p for p in directory.glob("*.json") if p != keep and not p.name.endswith(TMP_SUFFIX)]
    if len(files) < MAX_FILES:
        return
    by_age = sorted(files, key=lambda p: p.stat().st_mtime)
    for old in by_age[: len(files) - MAX_FILES + 1]:
        old.unlink(missing_ok=True)


class Learns(Protocol):
    """A policy whose learning carries over (CostModelK)."""

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


SAVE_EVERY_S = 10.0  # a busy server saves at most this often (and at close)


class LearnedStore:
    """An engine's learning policies: each restored when it is made (unless `fresh`), all saved
    after a request at most every SAVE_EVERY_S, and at close or interpreter exit."""

    def __init__(self, fresh: bool = False) -> None:
        self.fresh = fresh
        self._policies: dict[LearnedKey, Learns] = {}
        self._dirty = False
        self._saved_s = -SAVE_EVERY_S
        self._lock = threading.Lock()

    def attach(self, key: LearnedKey, policy: Learns) -> bool:
        """Track `policy` under `key`; True when it took up a saved state."""
        with self._lock:
            self._policies[key] = policy
        state = None if self.fresh else load_learned(key)
        if state is None:
            return False
        try:
            policy.restore(state)
        except ValueError as exc:
            log.info("ignoring learned state %s: %s", learned_path(key), exc)
            return False
        log.info("policy: took up what earlier processes learned (%s)", learned_path(key))
        return True

    def request_done(self) -> None:
        self._dirty = True
        if time.monotonic() - self._saved_s >= SAVE_EVERY_S:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            self._saved_s = time.monotonic()
            for key, policy in self._policies.items():
                save_learned(key, policy.state())
