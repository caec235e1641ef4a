#!/usr/bin/env python3
"""The default mode against the target alone with the target on two rpc-servers, at added
round-trip latencies: side by side, prompt by prompt, in one process.

Two `edge-spec rpc-server`s run on loopback (one thread each); for each latency a delay proxy
(edge_spec.bench.delay_proxy: this kernel has no sch_netem for `tc netem`) holds every answer
from each server that long. For every bench prompt the target alone (draft_mode none) and the
default mode (auto) run back to back, greedy, over the same servers; the ratio of their total
tokens per second is the speedup, and the outputs are compared token for token.

    .venv/bin/python scripts/measure_rpc.py --delays-ms 0 1 5 --out bench/results/issue17-rpc
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig  # noqa: E402
from edge_spec.backend.rpc import parse_endpoints, wait_for_server  # noqa: E402
from edge_spec.bench.delay_proxy import DelayProxy  # noqa: E402
from edge_spec.models.manifest import choose_pair  # noqa: E402
from edge_spec.prompts import load_prompts  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_servers(n: int, threads: int) -> tuple[list[subprocess.Popen], list[int]]:
    ports = [free_port() for _ in range(n)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edge_spec.cli",
                "rpc-server",
                "--port",
                str(p),
                "-t",
                str(threads),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    for p in ports:
        wait_for_server(parse_endpoints(f"127.0.0.1:{p}")[0])
    return procs, ports


def run_delay(target, draft, ports, delay_ms, prompts, max_tokens) -> dict:
    with ExitStack() as stack:
        endpoints = [f"127.0.0.1:{p}" for p in ports]
        if delay_ms > 0:
            proxies = [
                stack.enter_context(DelayProxy(("127.0.0.1", p), delay_ms / 1000)) for p in ports
            ]
            endpoints = [proxy.endpoint for proxy in proxies]
        config = EngineConfig(n_ctx=1024, rpc_servers=tuple(endpoints))
        spec = stack.enter_context(EdgeSpec(target, draft, config=config))
        gen = GenerationConfig(max_tokens=max_tokens)
        spec.generate("Warm up.", gen, draft_mode="none")
        rows = []
        for prompt in prompts:
            alone = spec.generate(prompt.completion, gen, draft_mode="none")
            auto = spec.generate(prompt.completion, gen, draft_mode="auto")
            rows.append(
                {
                    "category": prompt.category,
                    "alone_tokens": len(alone.token_ids),
                    "alone_s": alone.stats.total_s,
                    "auto_tokens": len(auto.token_ids),
                    "auto_s": auto.stats.total_s,
                    "same": list(alone.token_ids) == list(auto.token_ids),
                    "drafted": auto.stats.n_drafted,
                    "accepted": auto.stats.n_accepted,
                }
            )
        tps_alone = sum(r["alone_tokens"] for r in rows) / sum(r["alone_s"] for r in rows)
        tps_auto = sum(r["auto_tokens"] for r in rows) / sum(r["auto_s"] for r in rows)
        return {
            "delay_ms": delay_ms,
            "placement": spec.placement.describe(),
            "target_alone_tps": tps_alone,
            "auto_tps": tps_auto,
            "speedup": tps_auto / tps_alone,
            "same_output": sum(r["same"] for r in rows),
            "prompts": len(rows),
            "rows": rows,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", "-m")
    ap.add_argument("--draft", "-md")
    ap.add_argument("--delays-ms", type=float, nargs="+", default=[0, 1, 5])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    target, draft = choose_pair(opts.target, opts.draft)
    prompts = load_prompts(quick=True)
    procs, ports = start_servers(2, opts.server_threads)
    results = []
    try:
        for delay in opts.delays_ms:
            result = run_delay(target, draft, ports, delay, prompts, opts.max_tokens)
            results.append(result)
            print(
                f"+{delay:g} ms: target alone {result['target_alone_tps']:.1f} tok/s, auto "
                f"{result['auto_tps']:.1f} tok/s, {result['speedup']:.2f}x; same output "
                f"{result['same_output']}/{result['prompts']}",
                flush=True,
            )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    if opts.out:
        opts.out.mkdir(parents=True, exist_ok=True)
        record = {
            "command": " ".join(sys.argv),
            "target": str(target),
            "draft": str(draft),
            "results": results,
        }
        (opts.out / "results.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
