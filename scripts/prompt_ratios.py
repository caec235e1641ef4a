#!/usr/bin/env python3
"""Per-prompt speed of each strategy over the target alone in a bench run: the geometric mean
over prompts, the slowest prompts, and how many fall below a bar. A prompt's ratio pools its
repeats (tokens over seconds, summed), as the bench's own summaries do.

A run with the `none` entry (the target alone again, interleaved like the others) shows the
run's own noise floor in the same lines: what an entry exactly as fast as the target measures.

    python3 scripts/prompt_ratios.py bench/results/issue12-chat-pair-noise --bar 0.95
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def pooled_ratios(
    runs: list[dict], strategy: str, temperature: float, sessions: bool = False
) -> dict[str, float]:
    """Each prompt's decode rate under `strategy` over the target alone's at `temperature`,
    tokens over seconds summed over its repeats; sessions=True pools an agentic run's turns by
    session (ids 'session/turn')."""
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for run in runs:
        if run["temperature"] != temperature or run["strategy"] not in (strategy, "target"):
            continue
        prompt_id = run["prompt_id"].split("/")[0] if sessions else run["prompt_id"]
        totals[(run["strategy"], prompt_id)][0] += run["n_generated"]
        totals[(run["strategy"], prompt_id)][1] += run["decode_s"]
    ratios = {}
    for (name, prompt), (tokens, seconds) in totals.items():
        base = totals.get(("target", prompt))
        if name == strategy and base:
            ratios[prompt] = (tokens / seconds) / (base[0] / base[1])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--bar", type=float, default=0.95, help="report prompts below this")
    parser.add_argument("--worst", type=int, default=3, help="how many slowest prompts to list")
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="pool an agentic run's turns by session (ids 'session/turn')",
    )
    args = parser.parse_args()
    runs = json.loads((args.folder / "results.json").read_text())["runs"]
    for temperature in sorted({run["temperature"] for run in runs}):
        strategies = sorted(
            {r["strategy"] for r in runs if r["temperature"] == temperature} - {"target"}
        )
        for strategy in strategies:
            ratios = pooled_ratios(runs, strategy, temperature, args.sessions)
            gmean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
            worst = sorted(ratios.items(), key=lambda item: item[1])[: args.worst]
            below = sum(r < args.bar for r in ratios.values())
            print(
                f"T={temperature:g} {strategy}: {len(ratios)} prompts, geometric mean "
                f"{gmean:.3f}x, below {args.bar:g}x: {below}; slowest: "
                + ", ".join(f"{p} {r:.3f}x" for p, r in worst)
            )


if __name__ == "__main__":
    main()
