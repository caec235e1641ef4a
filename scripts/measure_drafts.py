#!/usr/bin/env python3
"""Measure several drafts for one target side by side in one process: the target alone, each
draft at fixed k and under auto, on the same prompts, interleaved prompt by prompt so machine
noise hits every variant alike. Reports acceptance per position, c (the draft's one-token cost
over the target's, from the device profile), tokens/s and the speedup over the target alone.

    .venv/bin/python scripts/measure_drafts.py --target gemma3-270m-f16 \\
        --drafts gemma3-270m-q4_0 smollm2-135m-q4_0 self --k 1 2 3
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig  # noqa: E402
from edge_spec.prompts import load_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafts", nargs="+", required=True, help="manifest names, paths or self")
    ap.add_argument("--k", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="the bench's quick prompts (2 each)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here too")
    opts = ap.parse_args()
    prompts = load_prompts(quick=opts.quick)
    config = EngineConfig(n_ctx=2048)
    specs = {name: EdgeSpec(opts.target, name, config=config) for name in opts.drafts}
    first = specs[opts.drafts[0]]
    variants = [("-", "none", None)]
    for name in opts.drafts:
        variants += [(name, "model", k) for k in opts.k] + [(name, "auto", None)]
    totals: dict = defaultdict(lambda: defaultdict(float))
    vocabulary: dict = {}  # "shared", "translated", or None without a model draft
    per_position: dict = defaultdict(lambda: [[0, 0] for _ in range(64)])
    for spec in specs.values():
        spec.generate(prompts[0].completion, max_tokens=8)  # page in, profile if needed
    for i, prompt in enumerate(prompts):
        for name, mode, k in variants:
            spec = first if mode == "none" else specs[name]
            cfg = GenerationConfig(max_tokens=opts.max_tokens, k=k, draft_mode=mode)
            result = spec.generate(prompt.completion, cfg)
            vocabulary[(name, mode, k)] = result.draft_vocab
            s = result.stats
            t = totals[(name, mode, k)]
            t["tokens"] += s.n_generated
            t["decode_s"] += s.total_s - s.prefill_s
            t["drafted"] += s.n_drafted
            t["accepted"] += s.n_accepted
            for pos, (d, a) in enumerate(zip(s.drafted_per_position, s.accepted_per_position)):
                per_position[(name, mode, k)][pos][0] += d
                per_position[(name, mode, k)][pos][1] += a
        print(f"{i + 1}/{len(prompts)} {prompt.id}", file=sys.stderr, flush=True)
    base = totals[("-", "none", None)]
    base_tps = base["tokens"] / base["decode_s"]
    rows = []
    for (name, mode, k), t in totals.items():
        spec = first if mode == "none" else specs[name]
        tps = t["tokens"] / t["decode_s"]
        positions = per_position[(name, mode, k)]
        rows.append(
            {
                "draft": name,
                "draft_file": spec.draft_path.name if spec.draft_path and mode != "none" else None,
                "vocabulary": vocabulary[(name, mode, k)],
                "mode": mode,
                "k": k,
                "c": round(spec.cost_curve().c, 3) if mode != "none" else None,
                "acceptance": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
                "acceptance_per_position": [round(a / d, 2) for d, a in positions[:4] if d],
                "tokens_per_s": round(tps, 1),
                "speedup": round(tps / base_tps, 3),
            }
        )
    for spec in specs.values():
        spec.close()
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps({"target": opts.target, "rows": rows}, indent=1) + "\n")
    print(f"target {opts.target}, {len(prompts)} bench prompts x {opts.max_tokens} tokens, T = 0")
    print("| draft | vocabulary | mode | k | c | acceptance | per position | tok/s | vs alone |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        per_pos = " ".join(f"{a:.2f}" for a in r["acceptance_per_position"]) or "-"
        print(
            f"| {r['draft_file'] or '-'} | {r['vocabulary'] or '-'} | {r['mode']} | "
            f"{r['k'] if r['k'] is not None else 'policy'} | {r['c'] or '-'} | "
            f"{r['acceptance'] if r['acceptance'] is not None else '-'} | {per_pos} | "
            f"{r['tokens_per_s']} | {r['speedup']:.2f}x |"
        )


if __name__ == "__main__":
    main()
