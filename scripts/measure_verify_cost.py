#!/usr/bin/env python3
"""What a target pass over a batch of n tokens costs with the installed llama.cpp build: t(n)
in ms (median over rounds, `probes.time_batches`: the sizes interleaved so that machine noise
hits them alike) and t(n) / t(1), at a given context length. Run it in two environments to compare
builds, e.g. this project's (with scripts/patches/) and one set up with
`EDGE_SPEC_VENV=/tmp/stock python3 scripts/bootstrap.py --no-patches`:

    .venv/bin/python scripts/measure_verify_cost.py -m smollm2-135m-f16 [--ctx 256] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics

import edge_spec  # noqa: F401  (llama.cpp's libraries before numpy: see edge_spec/__init__.py)

# isort: split
from edge_spec.backend import LlamaModel, llama_build
from edge_spec.device.probes import time_batches
from edge_spec.models.cache import resolve

SIZES = (1, 2, 3, 4, 6, 8, 12, 13, 16, 24, 33)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", "-m", default="smollm2-135m-f16", help="name or GGUF path")
    parser.add_argument("--ctx", type=int, default=256, help="tokens in the cache before each pass")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", "-t", type=int, default=None)
    args = parser.parse_args()
    path = resolve(args.target, progress=False)
    print(llama_build())
    with LlamaModel(path, n_ctx=args.ctx + max(SIZES) + 8, n_threads=args.threads) as model:
        (times,) = time_batches([model], args.ctx, SIZES, args.rounds)
    t1 = statistics.median(times[1])
    print(f"{path.name}, {args.ctx}-token context, median of {args.rounds}")
    print(" n   t(n) ms   t(n)/t(1)")
    for n in SIZES:
        t = statistics.median(times[n])
        print(f"{n:>2}   {t * 1e3:7.2f}   {t / t1:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
