#!/usr/bin/env python3
"""Speculation on and off through `edge-spec serve`, side by side, with the official openai
client: the server's end-to-end tokens/s (wall clock at the client) per setting.

    .venv/bin/python scripts/measure_server.py [--threads 2] [--max-tokens 64]

Starts its own server on a free 127.0.0.1 port with the default pair (draft mode auto).
Every prompt runs with speculation on and off, the order alternating from prompt to prompt,
in two passes (the server keeps no session cache by default: the second pass is a repeat, not
a warm cache).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

PROMPTS = [
    "The history of the bicycle begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "List the days of the week: Monday, Tuesday,",
    "Q: What is the capital of France?\nA:",
    "Photosynthesis is the process by which plants",
    "The recipe: 1. Boil water. 2. Add pasta. 3. Stir. Repeat the recipe: 1. Boil water.",
    "Once upon a time, in a small village by the sea,",
    "import numpy as np\n\ndef normalize(x):\n    return (x - x.mean()) / x.std()\n\n"
    "def standardize(x):\n    return",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    options: Sequence[str], quiet: bool = False
) -> Iterator[tuple[str, openai.OpenAI, str]]:
    """`edge-spec serve` with these options on a free 127.0.0.1 port, once /health answers:
    (its URL, an openai client for it, the model it serves). Stopped on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "edge_spec.cli", "serve", "--port", str(port), *options]
    output = subprocess.DEVNULL if quiet else None
    server = subprocess.Popen(
        cmd, cwd=Path(__file__).resolve().parents[1], stdout=output, stderr=output
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"the server ({' '.join(options)}) exited")
            time.sleep(0.3)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        yield url, client, client.models.list().data[0].id
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    with running_server(["--threads", str(args.threads), "--ctx-size", "2048"]) as (
        _,
        client,
        model,
    ):
        client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0)
        for label in ("pass 1", "pass 2"):
            totals = {True: [0, 0.0, 0, 0], False: [0, 0.0, 0, 0]}
            for i, prompt in enumerate(PROMPTS):
                for spec in (True, False) if i % 2 == 0 else (False, True):
                    t0 = time.perf_counter()
                    done = client.completions.create(
                        model=model,
                        prompt=prompt,
                        max_tokens=args.max_tokens,
                        temperature=0,
                        extra_body={"speculative": spec},
                    )
                    wall = time.perf_counter() - t0
                    stats = done.model_extra["edge_spec"]
                    row = totals[spec]
                    row[0] += done.usage.completion_tokens
                    row[1] += wall
                    row[2] += stats["n_drafted"]
                    row[3] += stats["n_accepted"]
            on, off = (t[0] / t[1] for t in (totals[True], totals[False]))
            print(
                f"{label}: speculation on {on:.1f} tok/s (drafted {totals[True][2]}, "
                f"accepted {totals[True][3]}), off {off:.1f} tok/s: {on / off:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
