#!/usr/bin/env python3
"""What a decode step costs inside the engine, by how many tokens it verified.

Runs every third bench prompt (chat form, T = 0, 64 tokens) with the target alone and with the
n-gram mode, twice each and interleaved, and collects every step's time inside llama_decode
(`Step.decode_s`) by the number of drafted tokens. The device profile measures t(n) in
isolation; this is what the engine's own steps cost, where the cost policy's plans are paid.

    .venv/bin/python scripts/measure_step_costs.py      # the chat pair's target
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_spec import models  # noqa: E402
from edge_spec.api import EdgeSpec, EngineConfig, GenerationConfig  # noqa: E402
from edge_spec.api import spec as api  # noqa: E402
from edge_spec.prompts import load_prompts  # noqa: E402
from edge_spec.sampling.transform import SamplingParams  # noqa: E402


def main() -> int:
    by_drafted: dict[int, list[float]] = defaultdict(list)
    record = api.StatsCollector.step

    def step(self, event):  # every step the engine yields, as the stats see it
        by_drafted[event.n_drafted].append(event.decode_s)
        return record(self, event)

    api.StatsCollector.step = step
    target, draft = models.choose_pair(None, None, chat=True)
    with EdgeSpec(target, draft, config=EngineConfig(n_ctx=2048)) as spec:
        spec.generate("Hello", max_tokens=8, draft_mode="none")  # page the weights in
        for prompt in load_prompts()[::3]:
            text = spec.render_chat(prompt.messages)
            for mode in ("none", "ngram", "none", "ngram"):
                config = GenerationConfig(
                    max_tokens=64, draft_mode=mode, sampling=SamplingParams(), session=None
                )
                spec.generate(text, config)
    t1_s = statistics.median(by_drafted[0])
    print(f"{'tokens verified':>15} {'steps':>6} {'median ms':>10} {'/ t(1)':>7}")
    for n_drafted in sorted(by_drafted):
        times = by_drafted[n_drafted]
        if len(times) >= 5:
            median_s = statistics.median(times)
            print(
                f"{n_drafted + 1:>15} {len(times):>6} {median_s * 1e3:>10.1f} "
                f"{median_s / t1_s:>7.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
