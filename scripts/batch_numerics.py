#!/usr/bin/env python3
"""How much a build's logits depend on the batch shape: the floor under "exact at T = 0".

Speculative verification scores k + 1 tokens in one pass; the target alone scores one. Where the
backend's kernels reduce in a different order for different batch sizes, the same position gets
slightly different logits, and a greedy choice between two tokens whose gap is below that
deviation can flip. This measures it: each prompt's greedy continuation is decoded one token per
pass (twice, to see run-to-run determinism), then the same sequence is re-scored in batches of n
tokens, and every row is compared with its one-token row.

    .venv/bin/python scripts/batch_numerics.py -m MODEL.gguf [--gpu-layers N] [--out F.json]

Per batch size it reports the largest absolute logit change, the largest change of a logit
*difference* within a row (what can flip a choice), and how often the row's argmax moved.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import edge_spec  # noqa: F401  (llama.cpp's libraries before numpy)

# isort: split
import numpy as np

from edge_spec.backend import LlamaModel

PROMPTS = (
    "The three primary colors are",
    "def fibonacci(n):\n    ",
    "Q: What is the capital of France?\nA:",
    "Once upon a time, in a small village by the sea,",
)
BATCHES = (2, 3, 4, 5, 8, 16)


def single_rows(
    model: LlamaModel, prompt: list[int], n_tokens: int
) -> tuple[list[int], np.ndarray]:
    """Greedy continuation one token per pass; row i scores the token after prompt + tokens[:i]."""
    model.reset()
    row = model.decode(prompt, [len(prompt) - 1])[0].copy()
    tokens, rows = [], [row]
    for _ in range(n_tokens):
        tokens.append(int(np.argmax(rows[-1])))
        rows.append(model.decode([tokens[-1]], [0])[0].copy())
    return tokens, np.stack(rows[:-1])


def batched_rows(model: LlamaModel, prompt: list[int], tokens: list[int], n: int) -> np.ndarray:
    """The same rows with the continuation scored n tokens per pass."""
    model.reset()
    model.decode(prompt[:-1])
    sequence = [prompt[-1], *tokens[:-1]]
    rows = []
    for start in range(0, len(sequence), n):
        chunk = sequence[start : start + n]
        rows.append(model.decode(chunk, range(len(chunk))).copy())
    return np.concatenate(rows)


def measure(path: Path, n_gpu_layers: int, n_tokens: int) -> dict:
    with LlamaModel(path, n_ctx=512, n_gpu_layers=n_gpu_layers) as model:
        per_batch = {n: {"max_abs": 0.0, "max_gap_change": 0.0, "argmax_moved": 0} for n in BATCHES}
        rows_total = 0
        repeat_identical = True
        for text in PROMPTS:
            prompt = model.tokenize(text)
            tokens, single = single_rows(model, prompt, n_tokens)
            again_tokens, again = single_rows(model, prompt, n_tokens)
            repeat_identical &= again_tokens == tokens and bool(np.array_equal(again, single))
            rows_total += len(tokens)
            for n in BATCHES:
                delta = batched_rows(model, prompt, tokens, n) - single
                stats = per_batch[n]
                stats["max_abs"] = max(stats["max_abs"], float(np.abs(delta).max()))
                gap_change = float((delta.max(axis=1) - delta.min(axis=1)).max())
                stats["max_gap_change"] = max(stats["max_gap_change"], gap_change)
                moved = np.argmax(single + delta, axis=1) != np.argmax(single, axis=1)
                stats["argmax_moved"] += int(moved.sum())
    return {
        "model": str(path),
        "n_gpu_layers": n_gpu_layers,
        "rows": rows_total,
        "one_token_passes_repeat_bit_identical": repeat_identical,
        "by_batch_size": {str(n): s for n, s in per_batch.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--gpu-layers", type=int, default=-1, help="default: all (where offload works)")
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    ap.add_argument("--out", type=Path)
    opts = ap.parse_args()
    result = measure(opts.model, opts.gpu_layers, opts.tokens)
    text = json.dumps(result, indent=2)
    if opts.out:
        opts.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
