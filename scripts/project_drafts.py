#!/usr/bin/env python3
"""Project model drafts onto every bundled device profile from their recorded traces: per
trace (one target/draft pair), the model draft's best fixed k and its speedup over the target
alone, and the cost policy over all sources (model draft, n-gram, none; with the number of
token-tree steps and the same policy on chains alone where it verified trees). A projection from
acceptance measured here and each device's t(n), never a measurement on that device.

    .venv/bin/python scripts/project_drafts.py bench/traces/pairs bench/traces/*.json
    .venv/bin/python scripts/project_drafts.py bench/traces/pairs --draft-c trace
    .venv/bin/python scripts/project_drafts.py bench/traces/heads   # draft heads: their own c
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_spec.simulate.curves import list_profiles, load_profile  # noqa: E402
from edge_spec.simulate.replay import simulate  # noqa: E402
from edge_spec.simulate.traces import load_traces  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="trace files or folders of them")
    ap.add_argument("--draft-c", default="profile", help="profile, trace, or a number")
    opts = ap.parse_args()
    files = [f for p in opts.paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    names = list_profiles()
    print(
        "| target | draft | c used | "
        + " | ".join(names)
        + " |\n|---|---|---|"
        + "---|" * len(names)
    )
    for path in files:
        traces = load_traces(path)
        profiles = [load_profile(n) for n in names]
        # A draft head has no per-device profile: its recorded c stands (as in simulate).
        draft_c = "trace" if opts.draft_c == "profile" and traces.draft == "head" else opts.draft_c
        if draft_c != "profile":
            measured = traces.meta["measured"]["c"]
            c = float(measured if draft_c == "trace" else draft_c)
            profiles = [replace(p, c=c) for p in profiles]
        reports = simulate(traces, profiles, ["cost", "cost-chains", "fixed-model"], k_max=8)
        cells = []
        for report in reports:
            fixed = {
                name: r.tokens_per_s for name, r in report.results.items() if "fixed-model" in name
            }
            best = max(fixed, key=fixed.__getitem__)
            alone = report.results["none"].tokens_per_s
            cost = report.results["cost"].tokens_per_s / alone
            cell = f"k={best.rsplit('-', 1)[1]} {fixed[best] / alone:.2f}x, cost {cost:.2f}x"
            if report.results["cost"].n_tree_steps:  # what token trees add: chains alone
                chains = report.results["cost-chains"].tokens_per_s / alone
                cell += f" ({report.results['cost'].n_tree_steps} trees; chains {chains:.2f}x)"
            cells.append(cell)
        c_used = "profiles'" if draft_c == "profile" else f"{profiles[0].c:.3f}"
        draft = Path(str(traces.draft)).name.removesuffix(".gguf")
        print(f"| {traces.target} | {draft} | {c_used} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
