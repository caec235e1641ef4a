"""Measure (or show the cached) device profile of a model pair: this machine's facts and what
one target pass over n = 1..16 tokens costs, the numbers the cost policy plans with. Measured once
per pair, settings and llama.cpp build, then read from the cache.

    edge-spec profile                     # the default pair, quick (seconds)
    edge-spec profile --full --refresh    # about a minute, measured again
    edge-spec profile -m smollm2-135m-f16 --no-draft --json
    edge-spec profile --deviation         # also: how far batched logits move (exactness)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from edge_spec.cli.args import add_rpc_argument, add_subcommand, rpc_servers
from edge_spec.errors import InvalidRequestError
from edge_spec.modes import SELF

if TYPE_CHECKING:
    from edge_spec.device.numerics import Numerics
    from edge_spec.device.profile import DeviceProfile

NAME = "profile"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_subcommand(
        sub, NAME, "measure (or show the cached) device profile of a model pair", __doc__
    )
    parser.add_argument("--target", "-m", help="target model: manifest name or GGUF path")
    parser.add_argument(
        "--draft", "-md", help="draft model: manifest name, GGUF path, or self (derived)"
    )
    parser.add_argument("--no-draft", action="store_true", help="profile the target alone")
    parser.add_argument("--threads", "-t", type=int, default=None)
    parser.add_argument(
        "--n-gpu-layers", "-ngl", type=int, default=-1, help="layers to offload (-1: all)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", dest="full", action="store_false", help="a few seconds (the default)"
    )
    mode.add_argument("--full", dest="full", action="store_true", help="about a minute")
    parser.set_defaults(full=False)
    parser.add_argument("--refresh", action="store_true", help="measure even if cached")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--deviation",
        action="store_true",
        help="also measure how far the target's batched logits move from one-token logits "
        "per batch size on this build and device (what bounds greedy exactness)",
    )
    add_rpc_argument(parser)


def run(args: argparse.Namespace) -> int:
    from edge_spec.device.profile import lookup_or_profile
    from edge_spec.models import default_pair, resolve

    if args.threads is not None and args.threads < 1:
        raise InvalidRequestError(f"--threads must be >= 1, got {args.threads}")
    if args.no_draft and args.draft:
        raise InvalidRequestError("give --draft or --no-draft, not both")
    if args.deviation and args.rpc:
        raise InvalidRequestError("--deviation measures this machine's own build: drop --rpc")
    default_target, default_draft = default_pair()
    target = resolve(args.target or default_target)
    if args.no_draft:
        draft = None
    elif args.draft == SELF:  # the target less some blocks (edge_spec.self_draft)
        from edge_spec.device.self_draft import self_draft_path

        draft = self_draft_path(target, n_threads=args.threads)
    else:
        draft = resolve(args.draft or default_draft)
    if args.rpc:
        from edge_spec.backend.rpc import set_call_timeout

        set_call_timeout(args.rpc_timeout)
    profile, path, cached = lookup_or_profile(
        target,
        draft,
        n_threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        quick=not args.full,
        refresh=args.refresh,
        rpc_servers=rpc_servers(args),
    )
    numerics = batch_deviation(target, args) if args.deviation else None
    if args.json:
        out = {
            "path": str(path),
            "cached": cached,
            "cost_curve": dataclasses.asdict(profile.cost_curve()),
            "profile": profile.to_dict(),
        }
        if numerics is not None:
            out["deviation"] = numerics.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(format_profile(profile, path, cached))
        if numerics is not None:
            from edge_spec.device.numerics import format_numerics

            print("\n" + format_numerics(numerics))
    return 0


def batch_deviation(target: Path, args: argparse.Namespace) -> Numerics:
    """The target's batch deviation, loaded as the profile loads it (local devices only)."""
    from edge_spec.backend import LlamaModel
    from edge_spec.device import numerics

    # 512 cells: room for a batch across the KV view's first 256-cell step (numerics)
    layers = args.n_gpu_layers
    with LlamaModel(target, n_ctx=512, n_threads=args.threads, n_gpu_layers=layers) as m:
        return numerics.measure(m, layers)


def build_features(build: str) -> str:
    """llama.cpp's system info, shortened to what is on: "CPU : SSE3 = 1 | AVX = 0 | ..." ->
    "CPU: SSE3 ..."; valued entries keep their value ("CUDA: ARCHS=890")."""
    words = []
    for item in build.split("|"):
        section, colon, item = item.rpartition(":")  # "CPU : SSE3 = 1" opens the CPU section
        if colon:
            words.append(section.strip() + ":")
        name, _, value = (part.strip() for part in item.partition("="))
        if name and value not in ("0", ""):
            words.append(name if value == "1" else f"{name}={value}")
    return " ".join(words)


def format_profile(profile: DeviceProfile, path: Path, cached: bool) -> str:
    """The human table `edge-spec profile` prints."""
    from edge_spec.device.probes import N_VERIFY
    from edge_spec.device.profile import BUSY_WARN_CORES

    h = profile.host
    gib = 1 << 30
    vram = "unknown" if h.gpu_offload else "-"
    if h.vram_total_bytes is not None and h.vram_free_bytes is not None:
        vram = f"{h.vram_free_bytes / gib:.1f} of {h.vram_total_bytes / gib:.1f} GiB free"
    origin = f"from the cache, measured {profile.created}" if cached else "measured now"
    lines = [
        f"host       {h.hostname}: {h.cpu_model} ({h.system} {h.machine})",
        f"cpu        {h.n_cpu_logical} logical / {h.n_cpu_physical} physical cores, "
        f"{h.n_threads} threads used",
        f"memory     RAM {h.ram_total_bytes / gib:.1f} GiB ({h.ram_available_bytes / gib:.1f} "
        f"free){', unified' if h.unified_memory else ''}; GPU offload "
        f"{'yes, ' + str(h.n_gpu_layers) + ' layers' if h.gpu_offload else 'no'}; VRAM {vram}",
        f"bandwidth  read {h.bandwidth_gbps:.1f} GB/s, copy {h.copy_gbps:.1f} GB/s "
        "(numpy, one thread)",
        f"llama.cpp  {h.llama_cpp_version}; built with {build_features(h.llama_build) or '?'}",
        f"profile    {'quick' if profile.quick else 'full'}, {origin} "
        f"(took {profile.profile_s:.1f} s; other processes used "
        f"{profile.other_cores_busy:.1f} cores meanwhile"
        f"{', costs may be inflated' if profile.other_cores_busy > BUSY_WARN_CORES else ''})",
        f"file       {path}",
        "",
    ]
    models = [("target", profile.target)] + ([("draft", profile.draft)] if profile.draft else [])
    for role, cost in models:
        lines.append(f"{role:<7}    {cost.file_name} ({cost.description}), {cost.sha256[:12]}")
    first = profile.target
    lines.append(
        f"\nt(n): one decode of n tokens, logits on all rows, after {first.n_ctx_probe} tokens "
        f"of context; median of {first.n_repeats}; ~ interpolated"
    )
    lines.append(" n  " + "".join(f"{role + ' ms':>12} {'× t(1)':>7}" for role, _ in models))
    for n in range(1, N_VERIFY + 1):
        row = f"{n:>2}  "
        for _, cost in models:
            mark = " " if n in cost.measured_ns else "~"
            row += f"{cost.t(n) * 1e3:>11.2f}{mark} {cost.t(n) / cost.t(1):>6.2f}"
        lines.append(row)
    curve = profile.cost_curve()
    if profile.draft:
        lines.append(f"\nc = draft t(1) / target t(1) = {curve.c:.2f}")
    if profile.head:
        head = profile.head
        lines.append(
            f"draft head ({head.provider}): {head.token_s * 1e3:.3f} ms per token, "
            f"c = {head.token_s / first.t(1):.3f}; {head.directory}"
        )
    lines.append(f"n-gram lookup (1k-token context): {profile.ngram_s * 1e3:.3f} ms")
    return "\n".join(lines)
