"""Acceptance of the default pair's model draft (k = 4) under llama.cpp's penalties, on four
completion prompts: run before and after the draft penalizes its own rows as the target's are
(edge_spec/drafts/model.py). The output is the penalized target's either way.

    .venv/bin/python bench/results/penalties/draft_acceptance.py
"""

from edge_spec import EdgeSpec, EngineConfig
from edge_spec.models.cache import resolve
prompts = ["The history of the bicycle begins", "The water cycle, explained for a school textbook. Water evaporates from the oceans,", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n# The same function, with a docstring:\ndef fib(n):", "Once upon a time, in a small village by the sea,"]
with EdgeSpec(resolve("gemma3-270m-f16",progress=False), resolve("gemma3-270m-q4_0",progress=False), config=EngineConfig(n_ctx=1024)) as spec:
    for opts in ({"repeat_penalty": 1.1}, {"repeat_penalty": 1.3, "presence_penalty": 0.3}):
        d = a = 0
        for p in prompts:
            r = spec.generate(p, max_tokens=64, draft_mode="model", k=4, **opts)
            d += r.stats.n_drafted; a += r.stats.n_accepted
        print(opts, "accepted", a, "of", d, round(a / d, 3))
