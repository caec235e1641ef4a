#!/usr/bin/env python3
"""Per-prompt speed of each strategy over the target alone in a bench run: the geometric mean
over prompts, the slowest prompts, and how many fall below a bar. A prompt's ratio pools its
repeats (tokens over seconds, summed), as the bench's own summaries do.

It also prints the run's noise floor: the run-to-run spread of the target alone's own speed on
each prompt, and how many prompts a strategy exactly as fast as the target would show below
the bar from that noise alone (pooled repeats on both sides, normal approximation).

    python3 scripts/prompt_ratios.py bench/results/issue12-chat-pair-ledger --bar 0.95
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


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
    totals: dict[tuple[float, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for run in runs:
        prompt_id = run["prompt_id"].split("/")[0] if args.sessions else run["prompt_id"]
        key = (run["temperature"], run["strategy"], prompt_id)
        totals[key][0] += run["n_generated"]
        totals[key][1] += run["decode_s"]
    for temperature in sorted({t for t, _, _ in totals}):
        noise_floor(runs, temperature, args.bar)
        strategies = sorted({s for t, s, _ in totals if t == temperature and s != "target"})
        for strategy in strategies:
            ratios = {}
            for (t, s, prompt), (tokens, seconds) in totals.items():
                if t != temperature or s != strategy:
                    continue
                base_tokens, base_seconds = totals[(t, "target", prompt)]
                ratios[prompt] = (tokens / seconds) / (base_tokens / base_seconds)
            gmean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
            worst = sorted(ratios.items(), key=lambda item: item[1])[: args.worst]
            below = sum(r < args.bar for r in ratios.values())
            print(
                f"T={temperature:g} {strategy}: {len(ratios)} prompts, geometric mean "
                f"{gmean:.3f}x, below {args.bar:g}x: {below}; slowest: "
                + ", ".join(f"{p} {r:.3f}x" for p, r in worst)
            )


def noise_floor(runs: list[dict], temperature: float, bar: float) -> None:
    speeds: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        if run["temperature"] == temperature and run["strategy"] == "target":
            speeds[run["prompt_id"]].append(math.log(run["n_generated"] / run["decode_s"]))
    deviations = [
        (x - sum(xs) / len(xs)) ** 2 / (len(xs) - 1) * len(xs)
        for xs in speeds.values()
        if len(xs) > 1
        for x in xs
    ]
    if not deviations:
        return
    n_repeats = max(len(xs) for xs in speeds.values())
    sd = math.sqrt(sum(deviations) / len(deviations))  # one run's sd of log tokens/s
    sd_ratio = sd * math.sqrt(2 / n_repeats)  # of a ratio of two pools of n_repeats runs
    expected = len(speeds) * 0.5 * math.erfc(-math.log(bar) / sd_ratio / math.sqrt(2))
    print(
        f"T={temperature:g} noise: the target alone's run-to-run sd {sd * 100:.1f} %; an "
        f"entry exactly as fast would show {expected:.1f} of {len(speeds)} prompts below {bar:g}x"
    )


if __name__ == "__main__":
    main()
