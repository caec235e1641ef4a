"""The GGUF models people already keep: Ollama's, LM Studio's and the Hugging Face hub cache's
stores, llama.cpp's download cache, and the folders in $EDGE_SPEC_MODEL_PATH. Read only: no
store is ever written.

- Ollama (`$OLLAMA_MODELS`, else `~/.ollama/models`, and the Linux service's
  `/usr/share/ollama/.ollama/models`): `manifests/<registry>/<namespace>/<name>/<tag>` is a JSON
  manifest whose `application/vnd.ollama.image.model` layer names a blob by sha256, stored as
  `blobs/sha256-<hex>`. Named `ollama:NAME[:TAG]` as Ollama names it (`llama3.2`,
  `llama3.2:1b`, `user/model:tag`, `hf.co/org/repo:Q4_K_M`; the tag defaults to `latest`).
- LM Studio (`~/.lmstudio/models`, its settings' downloadsFolder, the older
  `~/.cache/lm-studio/models`): `<publisher>/<repo>/*.gguf`. Named
  `lmstudio:PUBLISHER/REPO[/FILE]`.
- Hugging Face (`$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`):
  `models--<org>--<repo>/snapshots/<revision>/...` (symlinks into `blobs/`), the revision in
  `refs/main`. Named `hf:ORG/REPO[/FILE]`.
- llama.cpp's cache (`$LLAMA_CACHE`, `~/.cache/llama.cpp`) and `$EDGE_SPEC_MODEL_PATH` (folders
  or files, os.pathsep-separated): any `*.gguf`, named by its path.

A name whose FILE is left out picks the repository's only model file, or refuses with the list.
Projector (mmproj) and adapter files, the later parts of split models and partial downloads are
not models and are not listed.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edge_spec.errors import ModelFileError
from edge_spec.gguf.validate import validate_gguf

log = logging.getLogger(__name__)

STORES = ("ollama", "lmstudio", "hf")
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
MAX_DEPTH = 6  # folders below a root searched for *.gguf (an LM Studio repo sits 2 deep)
# llama.cpp's file types (llama_ftype), what `general.file_type` holds.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}  # fmt: skip


@dataclass(frozen=True)
class Found:
    """A model file in a store: the name to use for it, the store, and where it lives."""

    name: str
    store: str  # ollama, lmstudio, hf, llama.cpp, path, registry
    path: Path


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF says about itself (read from its header, nothing loaded)."""

    architecture: str
    n_params: int
    size_bytes: int
    quantization: str
    n_ctx_train: int
    vocab_fingerprint: str  # sha256 of the token texts, first 12 hex digits ("" without one)
    n_vocab: int
    chat_template: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "architecture": self.architecture,
            "n_params": self.n_params,
            "size_bytes": self.size_bytes,
            "quantization": self.quantization,
            "n_ctx_train": self.n_ctx_train,
            "vocab": self.vocab_fingerprint,
            "n_vocab": self.n_vocab,
            "chat_template": self.chat_template,
        }


def model_facts(path: Path) -> ModelFacts:
    """Raises ModelFileError for a file that is not a valid GGUF (edge_spec.gguf.validate)."""
    summary = validate_gguf(path)
    meta = summary.metadata
    arch = str(meta.get("general.architecture", ""))
    n_params = sum(math.prod(layout.dims) for layout in summary.tensors.values())
    file_type = meta.get("general.file_type")
    quantization = FILE_TYPES.get(file_type, str(file_type)) if isinstance(file_type, int) else "?"
    n_ctx = meta.get(f"{arch}.context_length", 0)
    return ModelFacts(
        architecture=arch,
        n_params=n_params,
        size_bytes=summary.file_size_bytes,
        quantization=quantization,
        n_ctx_train=n_ctx if isinstance(n_ctx, int) else 0,
        vocab_fingerprint=summary.vocab_sha256[:12],
        n_vocab=summary.n_vocab,
        chat_template=bool(meta.get("tokenizer.chat_template")),
    )


def is_model_file(path: Path) -> bool:
    """A loadable model, not a projector, an adapter or a later part of a split model (by its
    header where the name does not tell)."""
    if not _by_name(path):
        return False
    try:
        meta = validate_gguf(path).metadata
    except ModelFileError:
        return True  # listed, refused with its reason when used
    kind, arch = meta.get("general.type", "model"), meta.get("general.architecture")
    return kind == "model" and arch != "clip"


def _by_name(path: Path) -> bool:
    name = path.name.lower()
    return "mmproj" not in name and (_split_part(name) or 1) == 1


def _split_part(name: str) -> int | None:
    """3 for `x-00003-of-00005.gguf`, None for a file that is not a split part."""
    stem = name[: -len(".gguf")] if name.endswith(".gguf") else name
    parts = stem.rsplit("-", 3)
    if len(parts) == 4 and parts[2] == "of" and parts[1].isdigit() and parts[3].isdigit():
        return int(parts[1])
    return None


# ---------------------------------------------------------------------------------------------
# Where each store lives
# ---------------------------------------------------------------------------------------------


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def ollama_roots() -> list[Path]:
    env = os.environ.get("OLLAMA_MODELS")
    roots = [Path(env).expanduser()] if env else [_home() / ".ollama" / "models"]
    roots.append(Path("/usr/share/ollama/.ollama/models"))  # the Linux service's own
    return _existing(roots)


def lmstudio_roots() -> list[Path]:
    home = _home()
    roots = [home / ".lmstudio" / "models"]
    settings = home / ".lmstudio" / "settings.json"
    try:
        folder = json.loads(settings.read_text(encoding="utf-8")).get("downloadsFolder")
        if isinstance(folder, str) and folder:
            roots.insert(0, Path(folder).expanduser())
    except (OSError, ValueError, AttributeError):
        pass
    roots.append(home / ".cache" / "lm-studio" / "models")
    return _existing(roots)


def hf_roots() -> list[Path]:
    if os.environ.get("HF_HUB_CACHE"):
        return _existing([Path(os.environ["HF_HUB_CACHE"]).expanduser()])
    if os.environ.get("HF_HOME"):
        return _existing([Path(os.environ["HF_HOME"]).expanduser() / "hub"])
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else _home() / ".cache"
    return _existing([base / "huggingface" / "hub"])


def llamacpp_roots() -> list[Path]:
    env = os.environ.get("LLAMA_CACHE")
    if env:
        return _existing([Path(env).expanduser()])
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else _home() / ".cache"
    return _existing([base / "llama.cpp", _home() / "Library" / "Caches" / "llama.cpp"])


def model_path_entries() -> list[Path]:
    raw = os.environ.get("EDGE_SPEC_MODEL_PATH", "")
    return _existing([Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()])


def _existing(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        try:
            if path.exists() and path not in out:
                out.append(path)
        except OSError:  # unreadable: not ours to report
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Listing each store
# ---------------------------------------------------------------------------------------------


def ollama_models() -> Iterator[Found]:
    for root in ollama_roots():
        manifests = root / "manifests"
        for manifest in sorted(_files(manifests, depth=4)):
            parts = manifest.relative_to(manifests).parts
            if len(parts) != 4:
                continue
            blob = _ollama_blob(root, manifest)
            if blob is not None:
                yield Found("ollama:" + _ollama_name(*parts), "ollama", blob)


def _ollama_name(registry: str, namespace: str, name: str, tag: str) -> str:
    if registry == OLLAMA_REGISTRY:
        base = name if namespace == "library" else f"{namespace}/{name}"
    else:
        base = f"{registry}/{namespace}/{name}"
    return f"{base}:{tag}"


def _ollama_blob(root: Path, manifest: Path) -> Path | None:
    """The model layer's blob of an Ollama manifest (None: not a model's manifest)."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(
            layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER
        )
    except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
        log.debug("not a model manifest: %s", manifest)
        return None
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        return None
    blobs = root / "blobs"
    for candidate in (blobs / digest.replace(":", "-"), blobs / digest):  # older: sha256:<hex>
        if candidate.exists():
            return candidate
    return blobs / digest.replace(":", "-")  # missing: refused with its name when used


def lmstudio_models() -> Iterator[Found]:
    for root in lmstudio_roots():
        for path in sorted(_ggufs(root)):
            parts = path.relative_to(root).parts
            if len(parts) >= 3:
                yield Found("lmstudio:" + "/".join(parts), "lmstudio", path)


def hf_models() -> Iterator[Found]:
    for root in hf_roots():
        for repo_dir in sorted(root.glob("models--*")):
            repo = repo_dir.name[len("models--") :].replace("--", "/", 1)
            snapshot = _hf_snapshot(repo_dir)
            if snapshot is None:
                continue
            for path in sorted(_ggufs(snapshot)):
                yield Found(f"hf:{repo}/{path.relative_to(snapshot).as_posix()}", "hf", path)


def _hf_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot refs/main names, else the newest one."""
    snapshots = repo_dir / "snapshots"
    try:
        revision = (repo_dir / "refs" / "main").read_text(encoding="utf-8").strip()
        if revision and (snapshots / revision).is_dir():
            return snapshots / revision
    except OSError:
        pass
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def path_models() -> Iterator[Found]:
    for root in llamacpp_roots():
        for path in sorted(_ggufs(root)):
            yield Found(str(path), "llama.cpp", path)
    for entry in model_path_entries():
        paths = [entry] if entry.is_file() else sorted(_ggufs(entry))
        for path in paths:
            yield Found(str(path), "path", path)


def scan(read_headers: bool = True) -> list[Found]:
    """Every model file in the stores (each real file once, under its first name).
    read_headers=False: told apart from projectors and adapters by name alone (no file read)."""
    out: list[Found] = []
    seen: set[Path] = set()
    for found in (*ollama_models(), *lmstudio_models(), *hf_models(), *path_models()):
        resolved = real(found.path)
        if resolved in seen or not _by_name(found.path):
            continue
        if read_headers and not is_model_file(found.path):
            continue
        seen.add(resolved)
        out.append(found)
    return out


def real(path: Path) -> Path:
    """The path with its links resolved (as it is where it cannot be)."""
    try:
        return path.resolve()
    except OSError:
        return path


def _files(root: Path, depth: int) -> Iterator[Path]:
    """Regular files (or links to them) under root, at most `depth` folders down."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir():
                if depth > 1:
                    yield from _files(Path(entry.path), depth - 1)
            elif entry.is_file():
                yield Path(entry.path)
        except OSError:
            continue


def _ggufs(root: Path) -> Iterator[Path]:
    for path in _files(root, MAX_DEPTH):
        name = path.name.lower()
        if name.endswith(".gguf") and not name.endswith((".part", ".incomplete")):
            yield path


# ---------------------------------------------------------------------------------------------
# Names -> files
# ---------------------------------------------------------------------------------------------


def is_store_name(name: str) -> bool:
    return name.split(":", 1)[0] in STORES and ":" in name


def resolve_store_name(name: str) -> Path:
    """`ollama:`, `lmstudio:` or `hf:` name -> its file, validated (a partial or corrupt blob
    is refused here, naming the store's name). Raises ModelFileError naming the closest
    matches when the store has no such model; an `hf:` name missing from the local cache is
    fetched with huggingface_hub when it is installed and the network allows."""
    store, _, rest = name.partition(":")
    rest = rest.strip().strip("/")
    if not rest:
        raise ModelFileError(f"{name!r}: give a model after '{store}:'")
    listing = {
        "ollama": ollama_models,
        "lmstudio": lmstudio_models,
        "hf": hf_models,
    }[store]
    # Told apart by name here; only the file the name picks is read (validated below), not
    # every model in the store.
    found = [f for f in listing() if _by_name(f.path)]
    path = _match(store, rest, found)
    if path is None and store == "hf":
        path = _hf_fetch(rest)
    if path is None:
        names = [f.name for f in found]
        close = difflib.get_close_matches(f"{store}:{rest}", names, n=3, cutoff=0.4)
        where = {"ollama": ollama_roots, "lmstudio": lmstudio_roots, "hf": hf_roots}[store]()
        hint = f"; closest: {', '.join(close)}" if close else ""
        searched = ", ".join(str(r) for r in where) or "no store folder found"
        raise ModelFileError(f"no model {name!r} in the local {store} store ({searched}){hint}")
    try:
        validate_gguf(path)
    except ModelFileError as exc:
        raise ModelFileError(f"{name} ({store} store): {exc}") from None
    return path


def _match(store: str, rest: str, found: list[Found]) -> Path | None:
    if store == "ollama":
        wanted = rest if ":" in rest.rsplit("/", 1)[-1] else f"{rest}:latest"
        for f in found:
            if f.name[len("ollama:") :] in (wanted, f"{OLLAMA_REGISTRY}/library/{wanted}"):
                return f.path
        return None
    prefix = f"{store}:"
    exact = [f for f in found if f.name[len(prefix) :] == rest]
    if exact:
        return exact[0].path
    # ORG/REPO without the file: the repository's only model file (adapters told apart by
    # their headers).
    in_repo = [
        f for f in found if f.name[len(prefix) :].startswith(rest + "/") and is_model_file(f.path)
    ]
    if rest.count("/") == 1 and len(in_repo) == 1:
        return in_repo[0].path
    if len(in_repo) > 1 and rest.count("/") == 1:
        files = ", ".join(f.name for f in in_repo)
        raise ModelFileError(f"{prefix}{rest} holds several models, name one: {files}")
    return None


def _hf_fetch(rest: str) -> Path | None:
    """hf:ORG/REPO/FILE fetched into the hub cache with huggingface_hub, where it is installed
    and the network allows; None otherwise (never required)."""
    parts = rest.split("/")
    if len(parts) < 3 or os.environ.get("HF_HUB_OFFLINE"):
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    try:
        return Path(hf_hub_download("/".join(parts[:2]), "/".join(parts[2:])))
    except Exception as exc:  # noqa: BLE001 - no network, no such file: a clear miss instead
        log.info("hf:%s not fetched: %s", rest, exc)
        return None
