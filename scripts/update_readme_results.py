#!/usr/bin/env python3
"""Rewrite the README's result tables from committed bench results (never typed by hand).

Each block in README.md between `<!-- bench: FOLDER T=TEMP -->` and `<!-- /bench -->` is
replaced by a table built from FOLDER/results.json: one row per category, one column per
strategy (speed over the target alone, 95% interval), and the tokens/s of every entry overall.
`<!-- bench: FOLDER T=TEMP only=auto,none -->` keeps the listed strategies (a run whose other
entries a later run superseded).

    python3 scripts/update_readme_results.py          # rewrite README.md in place
    python3 scripts/update_readme_results.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"(?P<head><!-- bench: (?P<folder>\S+) T=(?P<temp>[0-9.]+)(?: only=(?P<only>[\w,.-]+))? -->\n)"
    r"(?P<body>.*?)(?P<end><!-- /bench -->)",
    re.DOTALL,
)


def table(folder: Path, temperature: float, only: str | None = None) -> str:
    record = json.loads((folder / "results.json").read_text())
    rows = [s for s in record["summaries"] if s["temperature"] == temperature]
    if not rows:
        raise SystemExit(f"{folder}: no results at T={temperature:g}")
    strategies = list(dict.fromkeys(s["strategy"] for s in rows if s["strategy"] != "target"))
    if only:
        keep = only.split(",")
        strategies = [s for s in strategies if s in keep]
    categories = list(dict.fromkeys(s["category"] for s in rows))
    cell = {(s["category"], s["strategy"]): s for s in rows}
    aggregates = {"all"} | {run["kind"] for run in record["runs"]}  # rows over many categories
    lines = [
        "| category | " + " | ".join(strategies) + " |",
        "|---|" + "---|" * len(strategies),
    ]
    for category in categories:
        cells = []
        for strategy in strategies:
            s = cell.get((category, strategy))
            cells.append(
                "–"
                if s is None
                else f"{s['speedup']:.2f}× ({s['speedup_ci95'][0]:.2f}–{s['speedup_ci95'][1]:.2f})"
            )
        name = f"**{category}**" if category in aggregates else category
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    overall = [cell[("all", s)] for s in ["target", *strategies] if ("all", s) in cell]
    speeds = ", ".join(f"{s['strategy']} {s['tokens_per_s']:.1f}" for s in overall)
    lines.append("")
    lines.append(f"Tokens/s overall: {speeds}. Command: `{record['command']}`")
    overheads = [
        f"{s['strategy']} {s['overhead_per_step_ms']:.2f} ms ({100 * s['overhead_fraction']:.1f} %)"
        for s in overall
        if s.get("overhead_fraction")
    ]
    if overheads:
        lines.append("")
        lines.append(
            "Orchestration overhead per step (wall time outside llama_decode, share of the "
            "decode wall time): " + ", ".join(overheads) + "."
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that README.md is current")
    args = ap.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text()

    def render(m: re.Match[str]) -> str:
        body = table(ROOT / m["folder"], float(m["temp"]), m["only"])
        return m["head"] + body + m["end"]

    new = BLOCK.sub(render, text)
    if args.check:
        if new != text:
            print("README.md result tables are out of date: run scripts/update_readme_results.py")
            return 1
        return 0
    readme.write_text(new)
    print(f"rewrote {len(BLOCK.findall(text))} table(s) in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
