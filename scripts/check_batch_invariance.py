#!/usr/bin/env python3
"""Are llama.cpp's logits for a position the same whether it is decoded alone (a plain step)
or inside a batch (a verification)? Where they are, greedy and keyed sampled output is the same
bit for bit whatever was drafted; where not, a draw can move at a near tie.

Walks a text with the installed llama.cpp build: each position decoded alone (twice, to see
whether one-token passes repeat bit for bit), then again in batches of 2..16, and reports per
batch size the largest logit change, the largest change of a logit *difference* within a row
(what can flip a choice), how many greedy choices moved, and how many positions' keyed draws at
T = 0.8 (over 64 seeds) moved.

    .venv/bin/python scripts/check_batch_invariance.py -m smollm2-135m-f16 [--gpu-layers N]
        [--out F.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import edge_spec  # noqa: F401  (llama.cpp's libraries before numpy: see edge_spec/__init__.py)

# isort: split
import numpy as np

from edge_spec.backend import LlamaModel, llama_build
from edge_spec.models.cache import resolve
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import SamplingParams, weights_from_logits

TEXT = (
    "The water cycle, explained for a school textbook. Water evaporates from the oceans, rises "
    "as vapour, cools into clouds and falls again as rain or snow. Rivers carry it back to the "
    "sea, and the cycle begins again. Plants return water to the air through their leaves."
)
BATCHES = (2, 3, 5, 8, 16)
PREFIX = 8
N_SEEDS = 64


def alone_rows(model: LlamaModel, ids: list[int]) -> np.ndarray:
    model.truncate(PREFIX)
    return np.stack([model.decode([t], [0])[0].copy() for t in ids[PREFIX:]])


def batched_rows(model: LlamaModel, ids: list[int], n: int) -> np.ndarray:
    model.truncate(PREFIX)
    rows = []
    for start in range(PREFIX, len(ids), n):
        chunk = ids[start : start + n]
        rows.append(model.decode(chunk, range(len(chunk))).copy())
    return np.concatenate(rows)


def keyed_draws_moved(alone: np.ndarray, batched: np.ndarray) -> int:
    params = SamplingParams(temperature=0.8)
    moved = 0
    for j in range(len(alone)):
        w_alone = weights_from_logits(alone[j], params)
        w_batch = weights_from_logits(batched[j], params)
        moved += sum(
            SampleKeys(seed).sample(w_alone, j) != SampleKeys(seed).sample(w_batch, j)
            for seed in range(N_SEEDS)
        )
    return moved


def measure(model: LlamaModel) -> dict:
    ids = model.tokenize(TEXT)
    model.decode(ids[:PREFIX])
    alone = alone_rows(model, ids)
    repeat_identical = bool(np.array_equal(alone, alone_rows(model, ids)))
    by_batch = {}
    for n in BATCHES:
        delta = batched_rows(model, ids, n) - alone
        by_batch[str(n)] = {
            "max_abs_logit_change": float(np.abs(delta).max()),
            "max_gap_change": float((delta.max(axis=1) - delta.min(axis=1)).max()),
            "greedy_moved": int(((alone + delta).argmax(axis=1) != alone.argmax(axis=1)).sum()),
            "keyed_draws_moved": keyed_draws_moved(alone, alone + delta),
        }
    return {
        "llama_build": llama_build(),
        "positions": len(alone),
        "keyed_seeds": N_SEEDS,
        "alone_repeats_bit_identical": repeat_identical,
        "by_batch_size": by_batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", "-m", default="smollm2-135m-f16", help="name or GGUF path")
    parser.add_argument("--threads", "-t", type=int, default=None)
    parser.add_argument("--gpu-layers", type=int, default=-1, help="default: all (-1)")
    parser.add_argument("--out", type=Path, help="also write the result as JSON")
    args = parser.parse_args()
    with LlamaModel(
        resolve(args.target), n_ctx=512, n_threads=args.threads, n_gpu_layers=args.gpu_layers
    ) as model:
        result = {"model": str(args.target), "n_gpu_layers": args.gpu_layers, **measure(model)}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"llama.cpp build: {result['llama_build']}")
    print(f"one-token passes repeat bit for bit: {result['alone_repeats_bit_identical']}")
    n_pos, n_draws = result["positions"], result["positions"] * N_SEEDS
    for n, row in result["by_batch_size"].items():
        print(
            f"batch {n}: max |logit change| {row['max_abs_logit_change']:.5f}, max gap change "
            f"{row['max_gap_change']:.5f}, greedy flips {row['greedy_moved']}/{n_pos}, keyed "
            f"draws moved {row['keyed_draws_moved']}/{n_draws} "
            f"({row['keyed_draws_moved'] / n_draws:.3%})"
        )


if __name__ == "__main__":
    main()
