"""Measurements behind the device profile: host facts, a STREAM-like memory-bandwidth probe,
a model's verify-cost curve t(n), and the cost of one n-gram lookup.

`measure_host` and `measure_model` return the frozen records a DeviceProfile is made of;
edge_spec.device keys, caches and reuses them. llama.cpp is reached only through
edge_spec.backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_spec import backend
from edge_spec.errors import ModelFileError

log = logging.getLogger(__name__)

# Any real prose does: t(n) depends on the batch size and the context length, not on the words.
PROBE_TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in "
    "Germany and France built wooden machines that riders pushed along with their feet. Pedals "
    "fixed to the front wheel came in the 1860s, and the tall high-wheelers of the 1870s went "
    "faster but threw their riders over the handlebars. The safety bicycle, with two wheels of "
    "equal size and a chain driving the rear one, settled the shape that most bicycles still "
    "have. Pneumatic tyres, gears and lighter steel made cycling cheap and common, and by 1900 "
    "clubs, roads and whole industries had grown around it. "
)

_MIB = 1 << 20

N_VERIFY = 16  # t(n) is profiled for n = 1..N_VERIFY


@dataclass(frozen=True)
class ProfileSettings:
    """How hard to measure. Quick mode must stay under 15 s for the default pair on 2 cores."""

    n_ctx_probe: int  # context length the batches are decoded after
    ns: tuple[int, ...]  # batch sizes timed; the others are interpolated
    repeats: int  # timed decodes per n (medians are kept) ...
    min_repeats: int  # ... but only this many once the timing loop has used up budget_s
    budget_s: float  # keeps a quick profile quick on a busy machine
    bandwidth_mib: int  # probe array size
    bandwidth_repeats: int


# Quick mode times every n a CPU policy is likely to use (k <= 7) and a few beyond: t(n) is not
# smooth (kernels tile the batch; a Q4_0 model can decode 8 tokens faster than 5).
QUICK = ProfileSettings(
    n_ctx_probe=256,
    ns=(1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16),
    repeats=5,
    min_repeats=3,
    budget_s=5.0,
    bandwidth_mib=128,
    bandwidth_repeats=3,
)
FULL = ProfileSettings(
    n_ctx_probe=512,
    ns=tuple(range(1, N_VERIFY + 1)),
    repeats=21,
    min_repeats=7,
    budget_s=60.0,
    bandwidth_mib=256,
    bandwidth_repeats=5,
)


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    system: str  # platform.system(): Linux, Darwin, Windows
    machine: str  # platform.machine(): x86_64, arm64, aarch64
    cpu_model: str
    n_cpu_logical: int
    n_cpu_physical: int
    n_threads: int  # threads llama.cpp decodes with
    ram_total_bytes: int
    ram_available_bytes: int  # when the profile was measured, before the models were loaded
    gpu_offload: bool  # the llama.cpp build can offload layers to a GPU
    n_gpu_layers: int  # layers asked to be offloaded (0 where offload is unavailable)
    vram_total_bytes: int | None  # GPU memory summed over devices; None: no GPU or unknown
    vram_free_bytes: int | None
    unified_memory: bool  # CPU and GPU share RAM (Apple Silicon)
    bandwidth_gbps: float  # memory read bandwidth, numpy sum on one thread (GB/s = 1e9 B/s)
    copy_gbps: float  # numpy copy, bytes read + written
    llama_cpp_version: str
    llama_build: str = ""  # backend.llama_build(); "" in profiles saved before it was recorded


@dataclass(frozen=True)
class ModelCost:
    """One model's decode costs, in seconds, at context length n_ctx_probe."""

    file_name: str
    sha256: str
    file_size_bytes: int
    description: str  # llama.cpp's model description, e.g. "gemma3 270M F16"
    n_ctx_probe: int
    verify_s: tuple[float, ...]  # verify_s[n - 1]: median seconds for a batch of n tokens
    measured_ns: tuple[int, ...]  # the n actually timed; the rest interpolated linearly
    n_repeats: int  # timed decodes per measured n

    def t(self, n: int) -> float:
        return self.verify_s[n - 1]


# ---- measuring a host and a model ------------------------------------------------------------


def measure_host(n_threads: int, n_gpu_layers: int, settings: ProfileSettings) -> HostInfo:
    logical, physical = cpu_counts()
    ram_total, ram_available = ram_bytes()
    vram_total, vram_free = _vram_bytes()
    array_bytes = probe_array_bytes(settings.bandwidth_mib, ram_available)
    read_gbps, copy_gbps = bandwidth_gbps(array_bytes, settings.bandwidth_repeats)
    return HostInfo(
        hostname=hostname(),
        system=platform.system(),
        machine=platform.machine(),
        cpu_model=cpu_model(),
        n_cpu_logical=logical,
        n_cpu_physical=physical,
        n_threads=n_threads,
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_available,
        gpu_offload=backend.supports_gpu_offload(),
        n_gpu_layers=n_gpu_layers,
        vram_total_bytes=vram_total,
        vram_free_bytes=vram_free,
        unified_memory=unified_memory(),
        bandwidth_gbps=read_gbps,
        copy_gbps=copy_gbps,
        llama_cpp_version=backend.llama_cpp_version(),
        llama_build=backend.llama_build(),
    )


def _vram_bytes() -> tuple[int | None, int | None]:
    """(total, free) over the GPU devices llama.cpp sees, where the backend can say.

    llama-cpp-python 0.3.36 has no public binding for ggml_backend_dev_memory; a backend that
    provides `device_memory() -> [(name, free_bytes, total_bytes)]` for its GPU devices is used.
    """
    device_memory = getattr(backend, "device_memory", None)
    if device_memory is None or not backend.supports_gpu_offload():
        return None, None
    try:
        devices = list(device_memory())
    except Exception as exc:  # a probe must never fail the profile
        log.warning("could not read GPU memory: %s", exc)
        return None, None
    if not devices:
        return None, None
    return sum(int(d[2]) for d in devices), sum(int(d[1]) for d in devices)


def measure_models(
    models: Sequence[tuple[Path, str]],
    settings: ProfileSettings,
    n_threads: int,
    n_gpu_layers: int,
    rpc_servers: Sequence[str] = (),
) -> list[ModelCost]:
    """Load every (path, sha256) at once and time batches of n tokens on each after
    settings.n_ctx_probe tokens, interleaved so that load from other processes and clock
    drift hit the target and the draft alike (their ratio c matters most). rpc_servers: the
    first model (the target) on those servers, timed through the network; the others local."""
    n_max = max(settings.ns)
    devices: list[list[int] | None] = [None] * len(models)
    if rpc_servers:
        from edge_spec.backend import rpc

        local = rpc.local_devices()
        remote = rpc.rpc_devices(rpc.parse_endpoints(",".join(rpc_servers)))
        devices = [remote + local] + [local] * (len(models) - 1)
    with contextlib.ExitStack() as stack:
        loaded = [
            stack.enter_context(
                backend.LlamaModel(
                    path,
                    n_ctx=settings.n_ctx_probe + n_max,
                    n_batch=min(512, settings.n_ctx_probe + n_max),
                    n_threads=n_threads,
                    n_gpu_layers=n_gpu_layers,
                    devices=model_devices,
                )
            )
            for (path, _), model_devices in zip(models, devices)
        ]
        n_ctx = min(model.n_ctx for model in loaded)  # a model may have a short n_ctx_train
        n_ctx_probe = min(settings.n_ctx_probe, n_ctx - n_max)
        if n_ctx_probe < 1:
            raise ModelFileError(f"a context of {n_ctx} tokens is too short to profile")
        times = time_batches(
            loaded,
            n_ctx_probe,
            settings.ns,
            settings.repeats,
            min_repeats=settings.min_repeats,
            budget_s=settings.budget_s,
        )
        costs = []
        for (path, sha256), model, model_times in zip(models, loaded, times):
            medians = {n: statistics.median(ts) for n, ts in model_times.items()}
            costs.append(
                ModelCost(
                    file_name=path.name,
                    sha256=sha256,
                    file_size_bytes=model.info.file_size_bytes,
                    description=model.info.description,
                    n_ctx_probe=n_ctx_probe,
                    verify_s=curve_from_medians(medians, N_VERIFY),
                    measured_ns=tuple(sorted(medians)),
                    n_repeats=len(model_times[settings.ns[0]]),
                )
            )
        return costs


class OtherLoad:
    """How many CPU cores other processes (and the hypervisor's steal) kept busy between
    construction and `cores()`: profiles measured on a busy machine are inflated."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        import psutil

        times = psutil.cpu_times()._asdict()
        idle_s = times.get("idle", 0.0) + times.get("iowait", 0.0)
        # guest time is already counted in user time on Linux
        total_s = sum(v for k, v in times.items() if not k.startswith("guest"))
        own = psutil.Process().cpu_times()
        own_s = own.user + own.system
        return time.monotonic(), total_s - idle_s, own_s

    def cores(self) -> float:
        wall0, busy0, own0 = self._start
        wall1, busy1, own1 = self._sample()
        if wall1 <= wall0:
            return 0.0
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0)


# ---- host facts ------------------------------------------------------------------------------


def hostname() -> str:
    return socket.gethostname() or platform.node() or "unknown"


def cpu_model() -> str:
    """The CPU's marketing name where the OS tells it, else the architecture."""
    system = platform.system()
    if system == "Linux":
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                fields = dict(
                    (key.strip().lower(), value.strip())
                    for key, _, value in (line.partition(":") for line in f)
                    if value.strip()
                )
        except OSError:
            fields = {}
        # x86 says "model name"; many ARM boards only "hardware" or "model" (e.g. Raspberry Pi).
        for key in ("model name", "hardware", "model", "cpu model"):
            if key in fields:
                return fields[key]
    elif system == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_counts() -> tuple[int, int]:
    """(logical, physical) CPU counts; physical falls back to logical when unknown."""
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    return int(logical), int(physical)


def ram_bytes() -> tuple[int, int]:
    """(total, available) system memory in bytes."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.total), int(memory.available)


def unified_memory() -> bool:
    """True where CPU and GPU share one memory (Apple Silicon)."""
    return platform.system() == "Darwin" and platform.machine() == "arm64"


# ---- memory bandwidth ------------------------------------------------------------------------


def bandwidth_gbps(array_bytes: int, repeats: int) -> tuple[float, float]:
    """STREAM-like numpy probe: returns (read, copy) in GB/s (1e9 bytes), best of `repeats`.

    read sums one array (bytes read); copy copies it into another (bytes read + written).
    Numpy runs on one thread, so on a many-core machine this is a floor, not the peak. Arrays
    should be well above the last-level cache, or the probe measures the cache.
    """
    n = max(array_bytes // 8, 1 << 16)
    src = np.ones(n, dtype=np.float64)  # ones, not empty: every page is touched before timing
    dst = np.zeros_like(src)
    best_read_s = best_copy_s = float("inf")
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        src.sum()
        best_read_s = min(best_read_s, time.perf_counter() - start)
        start = time.perf_counter()
        np.copyto(dst, src)
        best_copy_s = min(best_copy_s, time.perf_counter() - start)
    return src.nbytes / best_read_s / 1e9, 2 * src.nbytes / best_copy_s / 1e9


def probe_array_bytes(wanted_mib: int, ram_available_bytes: int) -> int:
    """The probe's array size: wanted_mib, but at most 1/8 of free RAM (two arrays live at
    once) and at least 16 MiB."""
    return max(16 * _MIB, min(wanted_mib * _MIB, ram_available_bytes // 8))


# ---- model timing ----------------------------------------------------------------------------


def probe_tokens(model: backend.LlamaModel, n_tokens: int) -> list[int]:
    """At least n_tokens ids of real text for this model's vocabulary (BOS first if it has one)."""
    text = PROBE_TEXT
    while True:
        ids = model.tokenize(text)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        text += PROBE_TEXT


def time_batches(
    models: Sequence[backend.LlamaModel],
    n_ctx_probe: int,
    ns: Sequence[int],
    repeats: int,
    *,
    min_repeats: int | None = None,
    budget_s: float | None = None,
) -> list[dict[int, list[float]]]:
    """Per model, {n: seconds of each timed decode of a batch of n tokens with logits on all n
    rows} (what a verification pass asks for), after an n_ctx_probe-token context.

    Requires max(ns) <= n_batch and n_ctx_probe + max(ns) <= n_ctx for every model. Rounds go
    through the n values ascending, then descending, ..., every model at each n in turn, so
    noise and drift hit all alike; every (model, n) is decoded once untimed first (the first
    decode of a batch shape allocates). Once the timed rounds have taken budget_s, no round
    starts after the first min_repeats. Each model's cache is left holding its context.
    """
    n_max = max(ns)
    batches = []
    for model in models:
        if n_max > model.n_batch or n_ctx_probe + n_max > model.n_ctx:
            raise ValueError(
                f"batches up to {n_max} after {n_ctx_probe} tokens need n_batch >= {n_max} "
                f"and n_ctx >= {n_ctx_probe + n_max}; {model.path.name} has {model.n_batch} "
                f"and {model.n_ctx}"
            )
        ids = probe_tokens(model, n_ctx_probe + n_max)
        model.reset()
        model.decode(ids[:n_ctx_probe])
        batches.append(ids[n_ctx_probe:])

    def once(i: int, n: int) -> float:
        start = time.perf_counter()
        models[i].decode(batches[i][:n], range(n))
        elapsed_s = time.perf_counter() - start
        models[i].truncate(n_ctx_probe)
        return elapsed_s

    for n in ns:
        for i in range(len(models)):
            once(i, n)
    times: list[dict[int, list[float]]] = [{n: [] for n in ns} for _ in models]
    start_s = time.perf_counter()
    for r in range(repeats):
        for n in ns if r % 2 == 0 else reversed(ns):
            for i in range(len(models)):
                times[i][n].append(once(i, n))
        over_budget = budget_s is not None and time.perf_counter() - start_s > budget_s
        if over_budget and r + 1 >= (min_repeats or repeats):
            log.info("timing budget of %.0f s used up after %d rounds", budget_s, r + 1)
            break
    return times


def curve_from_medians(medians: dict[int, float], n_max: int) -> tuple[float, ...]:
    """t(1..n_max) from medians at some n (which must include 1 and n_max), filling the gaps
    by linear interpolation."""
    ns = sorted(medians)
    if ns[0] != 1 or ns[-1] != n_max:
        raise ValueError(f"measured n must include 1 and {n_max}, got {ns}")
    values = np.interp(np.arange(1, n_max + 1), ns, [medians[n] for n in ns])
    return tuple(float(v) for v in values)


# ---- n-gram lookup ---------------------------------------------------------------------------


def ngram_lookup_s(
    n_context: int = 1024, k: int = 8, max_ngram: int = 3, min_ngram: int = 1, repeats: int = 25
) -> float:
    """Median seconds of one edge_spec.drafts.ngram.lookup over an n_context-token context
    with no repeated token (the slowest case: every n-gram length is scanned in vain)."""
    from edge_spec.drafts.ngram import lookup

    context = list(range(n_context))
    lookup(context, k, max_ngram, min_ngram)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        lookup(context, k, max_ngram, min_ngram)
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))
