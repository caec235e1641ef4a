#!/usr/bin/env python3
"""Re-aggregate committed bench results with the current report code (no re-measurement).

Reads FOLDER/results.json, rebuilds its runs, and rewrites the summaries in it, results.md and
the plots; the runs themselves are left exactly as measured. Use it when the report gains a
row or a statistic, so that published tables need not be re-measured.

    .venv/bin/python scripts/resummarize_bench.py bench/results/issue4-peers-t0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge_spec.bench.plots import write_plots
from edge_spec.bench.report import markdown_table, summarize
from edge_spec.bench.runner import Run, timestamp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    for folder in args.folders:
        path = folder / "results.json"
        record = json.loads(path.read_text())
        summaries = summarize([Run.from_dict(raw) for raw in record["runs"]])
        record["summaries"] = [s.to_dict() for s in summaries]
        record["resummarized"] = timestamp()
        path.write_text(json.dumps(record, indent=1))
        temperatures = record["settings"]["temperatures"]
        tables = [markdown_table(summaries, t) for t in temperatures]
        (folder / "results.md").write_text("\n\n".join(tables) + "\n")
        if not args.no_plots:
            write_plots(summaries, folder)
        print(f"re-aggregated {len(record['runs'])} runs in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
