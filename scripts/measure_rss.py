#!/usr/bin/env python3
"""Peak resident memory of a target alone and with each draft, each in a fresh process that
loads the models and generates 32 tokens drafting with them (psutil's peak RSS where the OS
reports it, else RSS after the run).

    .venv/bin/python scripts/measure_rss.py --target smollm2-135m-f16 \\
        --drafts none smollm2-135m-q4_0 gemma3-270m-q4_0 self
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, resource, sys
import psutil
from edge_spec import EdgeSpec, EngineConfig
target, draft = sys.argv[1], sys.argv[2]
draft = None if draft == "none" else draft
with EdgeSpec(target, draft, config=EngineConfig(n_ctx=2048)) as spec:
    mode = "none" if draft is None else "model"
    spec.generate("The history of the bicycle begins", max_tokens=32, k=None if draft is None
                  else 2, draft_mode=mode)
    rss = psutil.Process().memory_info().rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"draft_file": spec.draft_path.name if spec.draft_path else None,
                      "rss_bytes": rss, "peak_rss_bytes": max(peak, rss)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafts", nargs="+", default=["none"])
    opts = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    rows = []
    for draft in opts.drafts:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, opts.target, draft],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
        ).stdout
        rows.append({"draft": draft, **json.loads(out.strip().splitlines()[-1])})
    alone = next((r["peak_rss_bytes"] for r in rows if r["draft"] == "none"), None)
    print(f"target {opts.target}, n_ctx 2048")
    print("| draft | file | peak RSS MiB | vs target alone |")
    print("|---|---|---|---|")
    for r in rows:
        extra = f"+{(r['peak_rss_bytes'] - alone) / 2**20:.0f} MiB" if alone else "-"
        print(
            f"| {r['draft']} | {r['draft_file'] or '-'} | {r['peak_rss_bytes'] / 2**20:.0f} | "
            f"{extra} |"
        )


if __name__ == "__main__":
    main()
