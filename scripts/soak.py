#!/usr/bin/env python3
"""A long run of `edge-spec serve` under load, as users bring it: 8 concurrent clients sending a
mix of requests -- plain and streamed chats, streams dropped mid-answer, malformed bodies,
prompts longer than the context, structured answers, and conversations of three turns under a
fresh prompt_cache_key each (so sessions churn through the server's bound) -- after a warm-up.

It reports, as JSON and a summary: the server's RSS after the warm-up and after the run, latency
p50 / p99 per kind over the first and the last hundred requests, and every request whose answer
was not the expected one (a 5xx, a timeout, a refused good request, an accepted bad one).

    .venv/bin/python scripts/soak.py [--clients 8] [--requests 64] [--out soak.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_spec.bench.outside import (  # noqa: E402
    SERVER_START_TIMEOUT_S,
    free_port,
    wait_until_healthy,
)

TOPICS = ["rain", "bicycles", "the moon", "tea", "volcanoes", "chess", "bread", "owls", "maps"]
SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "fact": {"type": "string"}},
    "required": ["topic", "fact"],
    "additionalProperties": False,
}
MALFORMED = [b"{not json", b'{"model": "m"}', b'{"model": "m", "messages": 5}']
KINDS = ("chat", "stream", "dropped", "malformed", "overlong", "structured", "conversation")


class Soak:
    def __init__(self, url: str, max_tokens: int) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.records: list[dict] = []
        self.lock = threading.Lock()

    def record(self, kind: str, t0: float, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.records.append(
                {
                    "kind": kind,
                    "start": t0,
                    "latency_s": time.perf_counter() - t0,
                    "ok": ok,
                    "detail": detail[:200],
                }  # fmt: skip
            )

    def body(self, content: str, **extra) -> dict:
        messages = [{"role": "user", "content": content}]
        return {"model": "m", "messages": messages, "max_tokens": self.max_tokens,
                "temperature": 0, **extra}  # fmt: skip

    def one(self, client: httpx.Client, kind: str, rng: random.Random) -> None:
        topic = rng.choice(TOPICS)
        chat = f"{self.url}/v1/chat/completions"
        t0 = time.perf_counter()
        try:
            if kind in ("chat", "structured"):
                extra = {}
                if kind == "structured":
                    fmt = {"name": "fact", "schema": SCHEMA}
                    extra = {"response_format": {"type": "json_schema", "json_schema": fmt}}
                r = client.post(chat, json=self.body(f"One fact about {topic}.", **extra))
                ok = r.status_code == 200 and r.json()["choices"][0]["message"] is not None
                self.record(kind, t0, ok, "" if ok else f"{r.status_code} {r.text}")
            elif kind in ("stream", "dropped"):
                body = self.body(f"Tell me about {topic}.", stream=True)
                chunks = 0
                with client.stream("POST", chat, json=body) as r:
                    ok = r.status_code == 200
                    for line in r.iter_lines():
                        chunks += line.startswith("data: {")
                        if kind == "dropped" and chunks >= 3:
                            break  # the client goes away mid-answer
                self.record(kind, t0, ok and chunks > 0, f"{r.status_code}")
            elif kind == "malformed":
                bad = rng.choice(
                    [b"{not json", b'{"model": "m"}', b'{"model": "m", "messages": 5}']
                )
                r = client.post(chat, content=bad, headers={"content-type": "application/json"})
                self.record(kind, t0, r.status_code == 400, f"{r.status_code}")
            elif kind == "overlong":
                r = client.post(chat, json=self.body("word " * 3000))
                # 413 context_length_exceeded: the server's answer to a prompt over the context
                self.record(kind, t0, r.status_code in (400, 413), f"{r.status_code}")
            else:  # a conversation of three turns under a fresh prompt_cache_key
                key = uuid.uuid4().hex
                messages = [{"role": "user", "content": f"Name three facts about {topic}."}]
                ok = True
                for _ in range(3):
                    body = {"model": "m", "messages": messages, "max_tokens": self.max_tokens,
                            "temperature": 0, "prompt_cache_key": key}  # fmt: skip
                    r = client.post(chat, json=body)
                    ok = ok and r.status_code == 200
                    if not ok:
                        break
                    answer = r.json()["choices"][0]["message"]["content"] or ""
                    again = {"role": "user", "content": "Repeat them, then add one."}
                    messages += [{"role": "assistant", "content": answer}, again]
                self.record(kind, t0, ok, "" if ok else f"{r.status_code} {r.text}")
        except httpx.HTTPError as exc:
            self.record(kind, t0, False, f"{type(exc).__name__}: {exc}")


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    values = sorted(values)
    return {"n": len(values), "p50_s": round(statistics.median(values), 3),
            "p99_s": round(values[min(len(values) - 1, int(0.99 * len(values)))], 3)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64, help="per client, after the warm-up")
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-sessions", type=int, default=16)
    ap.add_argument("--out", default="soak.json")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    port = free_port()
    log_path = Path(args.out).with_suffix(".log")
    command = [sys.executable, "-m", "edge_spec.cli", "serve", "--port", str(port),
               "--ctx-size", "2048", "--max-queue", "64", "--queue-timeout", "600",
               "--max-sessions", str(args.max_sessions), "--model-alias", "m"]  # fmt: skip
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_healthy(url, server, SERVER_START_TIMEOUT_S):
            raise SystemExit(f"the server did not start: see {log_path}")
        process = psutil.Process(server.pid)
        soak = Soak(url, args.max_tokens)
        rng = random.Random(args.seed)
        with httpx.Client(timeout=900) as client:
            for i in range(args.warmup):
                soak.one(client, KINDS[i % len(KINDS)], rng)
        warm_rss = process.memory_info().rss
        warm_records = list(soak.records)
        soak.records.clear()
        t_start = time.perf_counter()

        def client_loop(c: int) -> None:
            local = random.Random(args.seed * 1000 + c)
            with httpx.Client(timeout=900) as client:
                for _ in range(args.requests):
                    soak.one(client, local.choice(KINDS), local)

        threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - t_start
        end_rss = process.memory_info().rss
        health = httpx.get(url + "/health", timeout=30).status_code
    finally:
        server.terminate()
        server.wait(60)
    records = sorted(soak.records, key=lambda r: r["start"])
    first, last = records[:100], records[-100:]
    failures = [r for r in records if not r["ok"]]
    report = {
        "clients": args.clients,
        "requests": len(records),
        "warmup_requests": len(warm_records),
        "seconds": round(elapsed, 1),
        "rss_after_warmup_bytes": warm_rss,
        "rss_after_run_bytes": end_rss,
        "rss_change": round(end_rss / warm_rss - 1, 4),
        "health_after": health,
        "failures": failures,
        "by_kind": {
            kind: {
                "count": sum(r["kind"] == kind for r in records),
                "first_100": percentiles([r["latency_s"] for r in first if r["kind"] == kind]),
                "last_100": percentiles([r["latency_s"] for r in last if r["kind"] == kind]),
                "all": percentiles([r["latency_s"] for r in records if r["kind"] == kind]),
            }
            for kind in KINDS
        },
        "server_log_tracebacks": log_path.read_text().count("Traceback"),
        "command": "scripts/soak.py " + " ".join(sys.argv[1:]),
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(
        f"{len(records)} requests from {args.clients} clients in {elapsed:.0f} s; "
        f"{len(failures)} not as expected; RSS {warm_rss >> 20} MiB after the warm-up, "
        f"{end_rss >> 20} MiB after ({100 * report['rss_change']:+.1f} %); "
        f"tracebacks in the log: {report['server_log_tracebacks']}"
    )
    for kind, row in report["by_kind"].items():
        f, last100 = row["first_100"], row["last_100"]
        print(
            f"  {kind:<12} {row['count']:>4}  first 100: p50 {f.get('p50_s', '-')} s "
            f"p99 {f.get('p99_s', '-')} s;  last 100: p50 {last100.get('p50_s', '-')} s "
            f"p99 {last100.get('p99_s', '-')} s"
        )
    ok = not failures and report["server_log_tracebacks"] == 0 and abs(report["rss_change"]) < 0.05
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
