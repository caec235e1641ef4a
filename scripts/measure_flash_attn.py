#!/usr/bin/env python3
"""Verify-batch cost with and without llama.cpp's flash attention, on this machine's CPU.

t(n), the time to decode a batch of n tokens with logits for every row after a context of C
tokens, median of 9, for flash attention on and off; prints t(1) and t(n) / t(1). This is why
LlamaModel turns flash attention off when no layer is offloaded (backend/model.py).

    .venv/bin/python scripts/measure_flash_attn.py --model smollm2-135m-f16 --context 128 3000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_spec.backend import LlamaModel  # noqa: E402
from edge_spec.models.manifest import model_path  # noqa: E402

SIZES = (1, 2, 5, 9, 17)


def curve(path: Path, flash_attn: bool, n_context: int, repeats: int) -> dict[int, float]:
    rng = np.random.default_rng(0)
    with LlamaModel(path, n_ctx=n_context + 64, n_gpu_layers=0, flash_attn=flash_attn) as model:
        vocab = model.n_vocab
        model.decode(rng.integers(100, vocab - 100, n_context).tolist())
        out = {}
        for n in SIZES:
            times = []
            for _ in range(repeats):
                tokens = rng.integers(100, vocab - 100, n).tolist()
                t0 = time.perf_counter()
                model.decode(tokens, list(range(n)))
                times.append(time.perf_counter() - t0)
                model.truncate(n_context)
            out[n] = statistics.median(times)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-f16", help="a manifest name or a GGUF path")
    ap.add_argument("--context", type=int, nargs="+", default=[128, 3000])
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    path = Path(args.model) if Path(args.model).exists() else model_path(args.model)
    print(f"{path.name}: t(n) / t(1) for n = {', '.join(map(str, SIZES))}")
    for n_context in args.context:
        for flash_attn in (False, True):
            t = curve(path, flash_attn, n_context, args.repeats)
            ratios = " ".join(f"{t[n] / t[1]:.2f}" for n in SIZES)
            state = "on " if flash_attn else "off"
            head = f"context {n_context:>5}, flash attention {state}"
            print(f"{head}: t(1) {t[1] * 1e3:.1f} ms, {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
