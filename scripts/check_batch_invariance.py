#!/usr/bin/env python3
"""Are llama.cpp's logits for a position the same whether it is decoded alone (a plain step)
or inside a batch (a verification)? Where they are, greedy and keyed sampled output is the same
bit for bit whatever was drafted; where not, a draw can move at a near tie.

Walks a text with the installed llama.cpp build: each position decoded alone, then again in
batches of 2..8, and reports the largest logit difference, and how many positions' keyed draws
at T = 0.8 (over 64 seeds) and greedy choices differ.

    .venv/bin/python scripts/check_batch_invariance.py -m smollm2-135m-f16
"""

from __future__ import annotations

import argparse

import numpy as np

from edge_spec.backend import LlamaModel, llama_build
from edge_spec.keys import SampleKeys
from edge_spec.models import resolve
from edge_spec.sampling import SamplingParams, weights_from_logits

TEXT = (
    "The water cycle, explained for a school textbook. Water evaporates from the oceans, rises "
    "as vapour, cools into clouds and falls again as rain or snow. Rivers carry it back to the "
    "sea, and the cycle begins again. Plants return water to the air through their leaves."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", "-m", default="smollm2-135m-f16")
    parser.add_argument("--threads", "-t", type=int, default=None)
    args = parser.parse_args()
    model = LlamaModel(resolve(args.target), n_ctx=512, n_threads=args.threads)
    ids = model.tokenize(TEXT)
    prefix = 8
    model.decode(ids[:prefix])
    alone = np.stack([model.decode([t], [0])[0].copy() for t in ids[prefix:]])
    params = SamplingParams(temperature=0.8)
    print(f"llama.cpp build: {llama_build()}")
    for n in (2, 3, 5, 8):
        model.truncate(prefix)
        rows = []
        for start in range(prefix, len(ids), n):
            chunk = ids[start : start + n]
            rows.append(model.decode(chunk, range(len(chunk))).copy())
        batched = np.concatenate(rows)
        diff = float(np.abs(batched - alone).max())
        greedy = int((batched.argmax(axis=1) != alone.argmax(axis=1)).sum())
        moved = 0
        for j in range(len(alone)):
            w_alone = weights_from_logits(alone[j], params)
            w_batch = weights_from_logits(batched[j], params)
            moved += sum(
                SampleKeys(seed).sample(w_alone, j) != SampleKeys(seed).sample(w_batch, j)
                for seed in range(64)
            )
        print(
            f"batch {n}: max |logit difference| {diff:.5f}, greedy flips {greedy}/{len(alone)}, "
            f"keyed draws moved {moved}/{64 * len(alone)} ({moved / (64 * len(alone)):.3%})"
        )


if __name__ == "__main__":
    main()
