"""Logprobs read from verification batches against the target alone's (one token a step), on
the default pair at T = 0, three prompts, 48 tokens: the largest difference per mode, and the
cost of computing them.

    .venv/bin/python bench/results/logprobs/deviation.py
"""

import time

import numpy as np

from edge_spec import EdgeSpec, EngineConfig
from edge_spec.decode.logprobs import token_logprobs
from edge_spec.models.cache import resolve

PROMPTS = [
    "Repeat: one two three four five. Repeat: one two three four five. Repeat:",
    "The history of the bicycle begins",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fib(n):",
]
target, draft = resolve("gemma3-270m-f16"), resolve("gemma3-270m-q4_0")
with EdgeSpec(target, draft, config=EngineConfig(n_ctx=1024)) as spec:
    for prompt in PROMPTS:
        alone = spec.generate(prompt, max_tokens=48, draft_mode="none", logprobs=2)
        for mode, k in (("ngram", 3), ("model", 3), ("auto", None)):
            got = spec.generate(prompt, max_tokens=48, draft_mode=mode, k=k, logprobs=2)
            same = got.token_ids == alone.token_ids
            worst = max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, alone.logprobs))
            print(f"{prompt[:24]!r:28} {mode:5} k={k} same text {same}, "
                  f"{got.stats.n_accepted:2d} accepted, largest difference {worst:.2e}")
rows = np.random.default_rng(0).standard_normal((4, 262_144)).astype(np.float32) * 3
for top in (0, 5, 20):
    start = time.perf_counter()
    for _ in range(50):
        token_logprobs(rows, [1, 2, 3, 4], top)
    print(f"4 rows of 262,144 logits, top {top:2d}: {(time.perf_counter() - start) / 50e-3:.2f} ms")
