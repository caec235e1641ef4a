"""Device profile: what this machine is, and what a target/draft pair costs on it, cached on disk.

A profile holds the host's facts (cores, memory, bandwidth, GPU offload) and, per model, the
verify-cost curve t(n): the seconds of one decode of a batch of n = 1..16 tokens with logits on
every row, at a realistic context length. `DeviceProfile.cost_curve()` turns it into the
`policy.CostCurve` the k policies plan with.

Profiles live in `<cache_dir()>/profiles/<key>.json`; the key hashes everything that changes the
numbers (host, CPU, both models' sha256, threads, GPU offload, llama.cpp version and the
features its build was compiled with, schema), so a profile is reused until one of them changes;
llama-cpp-python rebuilt with other flags is measured again. `load_or_profile` is the one entry
point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edge_spec import backend
from edge_spec.device import probes
from edge_spec.device.probes import FULL, N_VERIFY, QUICK, HostInfo, ModelCost
from edge_spec.errors import EdgeSpecError
from edge_spec.files import atomic_output, cache_dir, file_sha256, locked
from edge_spec.gguf.facts import check_gguf_file
from edge_spec.policy.types import CostCurve

log = logging.getLogger(__name__)

# 2: flash attention off on a CPU (backend/model.py); 3: the small-batch F16 kernel
# (scripts/patches/), which llama.cpp's build string does not show (keys now also hash the
# native libraries themselves: profile_key's llama_libraries, libraries_sha256).
SCHEMA_VERSION = 3
BUSY_WARN_CORES = 0.25  # other processes' load while measuring above which we warn


@dataclass(frozen=True)
class HeadCost:
    """The target's draft head (edge-spec head train) on this host: one step in onnxruntime,
    embedding row included, on the execution provider it ran on."""

    directory: str
    provider: str
    token_s: float


@dataclass(frozen=True)
class DeviceProfile:
    """What a target (and draft) cost on this host, as measured once and cached."""

    host: HostInfo
    target: ModelCost
    draft: ModelCost | None
    ngram_s: float  # one n-gram lookup over a 1k-token context
    other_cores_busy: float  # CPU cores other processes kept busy while measuring (mean)
    quick: bool
    created: str  # ISO 8601, UTC
    profile_s: float  # wall time the measurement took
    key: str
    schema: int = SCHEMA_VERSION
    head: HeadCost | None = None  # the target's draft head, where one was trained

    def cost_curve(self) -> CostCurve:
        """The pair's costs for the k policies: the target's t(n), the draft's t(1) per draft
        token and its own t(n) (0.0 and () without a draft model), and the n-gram lookup."""
        return CostCurve(
            verify_s=self.target.verify_s,
            draft_token_s=self.draft.verify_s[0] if self.draft else 0.0,
            ngram_s=self.ngram_s,
            draft_verify_s=self.draft.verify_s if self.draft else (),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceProfile:
        """Raises EdgeSpecError for another schema version or a malformed profile."""
        try:
            if data.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
            fields = dict(data)
            fields["host"] = HostInfo(**data["host"])
            fields["target"] = _model_cost(data["target"])
            fields["draft"] = _model_cost(data["draft"]) if data["draft"] is not None else None
            fields["head"] = HeadCost(**data["head"]) if data.get("head") else None
            return cls(**fields)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EdgeSpecError(f"invalid device profile: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> DeviceProfile:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise EdgeSpecError(f"invalid device profile: {exc}") from exc
        if not isinstance(data, dict):
            raise EdgeSpecError("invalid device profile: not a JSON object")
        return cls.from_dict(data)


def _model_cost(data: dict[str, Any]) -> ModelCost:
    fields = dict(data)
    fields["verify_s"] = tuple(float(v) for v in data["verify_s"])
    fields["measured_ns"] = tuple(int(n) for n in data["measured_ns"])
    if len(fields["verify_s"]) != N_VERIFY or min(fields["verify_s"]) <= 0:
        raise ValueError(f"verify_s must hold {N_VERIFY} positive values")
    return ModelCost(**fields)


# ---- keys and files --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileRequest:
    """A profile request resolved: files hashed, threads and offload settled, key computed."""

    target_path: Path
    draft_path: Path | None
    target_sha256: str
    draft_sha256: str | None
    n_threads: int
    n_gpu_layers: int  # effective: 0 where the build cannot offload
    key: str
    rpc_servers: tuple[str, ...] = ()  # the target on these llama.cpp rpc-servers


def profiles_dir() -> Path:
    return cache_dir() / "profiles"


def profile_key(
    *,
    hostname: str,
    cpu_model: str,
    target_sha256: str,
    draft_sha256: str | None,
    n_threads: int,
    gpu_offload: bool,
    n_gpu_layers: int,
    llama_cpp_version: str,
    llama_build: str,
    llama_libraries: str = "",
    rpc_servers: Sequence[str] = (),
    cuda_batch_invariant: int | None = None,
) -> str:
    """24 hex digits of the sha256 of everything that changes the measured costs (the RPC
    servers, and how a patched CUDA build verifies batch-invariantly (GGML_CUDA_BATCH_INVARIANT
    0, 1 or 2), only where they apply, so that other keys stay what they were)."""
    parts: list = [
        hostname,
        cpu_model,
        target_sha256,
        draft_sha256 or "none",
        n_threads,
        gpu_offload,
        n_gpu_layers,
        llama_cpp_version,
        llama_build,
        llama_libraries,
        SCHEMA_VERSION,
    ]
    if rpc_servers:
        parts.append(sorted(rpc_servers))
    if cuda_batch_invariant is not None:
        parts.append({"cuda_batch_invariant": cuda_batch_invariant})
    return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()[:24]


def libraries_sha256(paths: Sequence[Path]) -> str:
    """One digest of the native libraries' names and contents, each file hashed once per size
    + mtime (file_sha256): a GPU build's libraries run to hundreds of MB."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{path.name}\0{file_sha256(path)}\0".encode())
    return digest.hexdigest()


def _request(
    target_path: str | Path,
    draft_path: str | Path | None,
    n_threads: int | None,
    n_gpu_layers: int,
    rpc_servers: Sequence[str] = (),
) -> ProfileRequest:
    target = Path(target_path)
    draft = Path(draft_path) if draft_path is not None else None
    for path in (target, draft):
        if path is not None:
            check_gguf_file(path)  # a clear ModelFileError before hashing anything
    threads = n_threads or backend.default_threads()
    offload = backend.supports_gpu_offload()
    layers = n_gpu_layers if offload else 0
    target_sha = file_sha256(target)
    draft_sha = file_sha256(draft) if draft else None
    key = profile_key(
        hostname=probes.hostname(),
        cpu_model=probes.cpu_model(),
        target_sha256=target_sha,
        draft_sha256=draft_sha,
        n_threads=threads,
        gpu_offload=offload,
        n_gpu_layers=layers,
        llama_cpp_version=backend.llama_cpp_version(),
        llama_build=backend.llama_build(),
        llama_libraries=libraries_sha256(backend.llama_library_paths()),
        rpc_servers=rpc_servers,
        cuda_batch_invariant=backend.cuda_batch_invariant() if offload else None,
    )
    return ProfileRequest(
        target, draft, target_sha, draft_sha, threads, layers, key, tuple(rpc_servers)
    )


def profile_path(
    target_path: str | Path,
    draft_path: str | Path | None = None,
    *,
    n_threads: int | None = None,
    n_gpu_layers: int = -1,
) -> Path:
    """Where the profile of this pair with these settings is (or would be) cached."""
    request = _request(target_path, draft_path, n_threads, n_gpu_layers)
    return profiles_dir() / f"{request.key}.json"


def load_profile(path: Path) -> DeviceProfile:
    """Raises EdgeSpecError when the file is missing, unreadable or of another schema."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise EdgeSpecError(f"cannot read device profile {path}: {exc}") from exc
    return DeviceProfile.from_json(text)


def save_profile(profile: DeviceProfile, path: Path) -> None:
    """Atomic write; the caller holds files.locked(path.parent)."""
    with atomic_output(path) as tmp:
        tmp.write_text(profile.to_json() + "\n", encoding="utf-8")


# ---- measuring -------------------------------------------------------------------------------


def measure_profile(request: ProfileRequest, quick: bool) -> DeviceProfile:
    """Measure everything (seconds in quick mode, about a minute in full mode)."""
    start_s = time.perf_counter()
    settings = QUICK if quick else FULL
    other_load = probes.OtherLoad()
    host = probes.measure_host(request.n_threads, request.n_gpu_layers, settings)
    models = [(request.target_path, request.target_sha256)]
    if request.draft_path is not None:
        assert request.draft_sha256 is not None
        models.append((request.draft_path, request.draft_sha256))
    costs = probes.measure_models(
        models, settings, request.n_threads, request.n_gpu_layers, request.rpc_servers
    )
    return DeviceProfile(
        host=host,
        target=costs[0],
        draft=costs[1] if len(costs) > 1 else None,
        ngram_s=probes.ngram_lookup_s(),
        other_cores_busy=other_load.cores(),
        quick=quick,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        profile_s=time.perf_counter() - start_s,
        key=request.key,
    )


# ---- the cache -------------------------------------------------------------------------------


def load_or_profile(
    target_path: str | Path,
    draft_path: str | Path | None = None,
    *,
    n_threads: int | None = None,
    n_gpu_layers: int = -1,
    quick: bool = True,
    refresh: bool = False,
    rpc_servers: Sequence[str] = (),
) -> DeviceProfile:
    """The cached profile of this pair and settings, else a fresh measurement (saved).

    A full profile satisfies a quick request; a quick one does not satisfy a full request.
    refresh=True always measures. Raises ModelFileError for a file that is not a GGUF.
    """
    profile, _, _ = lookup_or_profile(
        target_path,
        draft_path,
        n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
        quick=quick,
        refresh=refresh,
        rpc_servers=rpc_servers,
    )
    return profile


def cached_profile(
    target_path: str | Path,
    draft_path: str | Path | None = None,
    *,
    n_threads: int | None = None,
    n_gpu_layers: int = -1,
    rpc_servers: Sequence[str] = (),
) -> DeviceProfile | None:
    """The cached (quick or full) profile of this pair and settings, or None: measures
    nothing."""
    request = _request(target_path, draft_path, n_threads, n_gpu_layers, rpc_servers)
    path = profiles_dir() / f"{request.key}.json"
    cached = _usable(path, request.key, quick=True)
    return _with_head(cached, request.target_path, path) if cached is not None else None


def lookup_or_profile(
    target_path: str | Path,
    draft_path: str | Path | None = None,
    *,
    n_threads: int | None = None,
    n_gpu_layers: int = -1,
    quick: bool = True,
    refresh: bool = False,
    rpc_servers: Sequence[str] = (),
) -> tuple[DeviceProfile, Path, bool]:
    """load_or_profile, also returning the profile's path and whether it came from the cache."""
    request = _request(target_path, draft_path, n_threads, n_gpu_layers, rpc_servers)
    directory = profiles_dir()
    path = directory / f"{request.key}.json"
    cached = None if refresh else _usable(path, request.key, quick)
    if cached is not None:
        log.info("device profile: reusing %s", path)
        return _with_head(cached, request.target_path, path), path, True
    directory.mkdir(parents=True, exist_ok=True)
    # Measure under the lock: a second process waits, then reuses, instead of measuring while
    # this one does (two measurements at once would each time the other's load).
    with locked(directory):
        cached = None if refresh else _usable(path, request.key, quick)
        if cached is not None:
            log.info("device profile: reusing %s (measured by another process)", path)
            return _with_head(cached, request.target_path, path), path, True
        log.info(
            "device profile: measuring %s%s (%s mode)",
            request.target_path.name,
            f" + {request.draft_path.name}" if request.draft_path else "",
            "quick" if quick else "full",
        )
        profile = measure_profile(request, quick)
        save_profile(profile, path)
    profile = _with_head(profile, request.target_path, path)
    log.info("device profile: measured in %.1f s, saved %s", profile.profile_s, path)
    if profile.other_cores_busy > BUSY_WARN_CORES:
        log.warning(
            "other processes kept %.1f CPU cores busy while profiling: the costs may be "
            "inflated; measure again when the machine is quieter (edge-spec profile --refresh)",
            profile.other_cores_busy,
        )
    return profile, path, False


def _with_head(profile: DeviceProfile, target_path: Path, path: Path) -> DeviceProfile:
    """The profile with the target's draft head measured in it (a few milliseconds), when the
    target has a head the profile does not hold yet; saved."""
    from edge_spec.models.heads import find_head

    directory = find_head(target_path)
    if directory is None or (profile.head and profile.head.directory == str(directory)):
        return profile
    from edge_spec.drafts.head import HeadDraft
    from edge_spec.gguf.validate import validate_gguf

    try:
        head = HeadDraft.load(directory, target_path, validate_gguf(target_path).n_vocab)
    except EdgeSpecError as exc:
        log.warning("the draft head in %s is not profiled: %s", directory, exc)
        return profile
    profile = dataclasses.replace(
        profile, head=HeadCost(str(directory), head.provider, head.token_s)
    )
    save_profile(profile, path)
    return profile


def _usable(path: Path, key: str, quick: bool) -> DeviceProfile | None:
    if not path.is_file():
        return None
    try:
        profile = load_profile(path)
    except EdgeSpecError as exc:
        log.warning("measuring again: %s", exc)
        return None
    if profile.key != key:
        log.warning("measuring again: %s holds the profile of key %s", path, profile.key)
        return None
    if profile.quick and not quick:
        log.debug("device profile: %s is a quick profile; a full one was asked for", path)
        return None
    return profile
