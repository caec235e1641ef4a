#!/usr/bin/env python3
"""Measure model pairs side by side in one process: acceptance and tokens/s of speculative
decoding against the target alone, on the same prompts, interleaved so machine noise hits all
variants alike. Used to choose the default pair (README, "Why this default pair").

    .venv/bin/python scripts/measure_pairs.py --pairs default smollm2-f16-q8_0 --k 2 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import PROMPTS  # noqa: E402

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig  # noqa: E402
from edge_spec.models.manifest import list_pairs  # noqa: E402


def measure(pair_name: str, ks: list[int], max_tokens: int, repeats: int) -> list[dict]:
    pair = list_pairs()[pair_name]
    variants = [("none", 0)] + [("model", k) for k in ks] + [("ngram", k) for k in ks]
    totals = {
        v: {"tokens": 0, "decode_s": 0.0, "drafted": 0, "accepted": 0, "steps": 0} for v in variants
    }
    with EdgeSpec(pair.target, pair.draft, config=EngineConfig(n_ctx=1024)) as spec:
        spec.generate(PROMPTS[0], max_tokens=8)  # warm-up: page in both models
        for _ in range(repeats):
            for prompt in PROMPTS:
                for mode, k in variants:
                    cfg = GenerationConfig(max_tokens=max_tokens, k=k, draft_mode=mode)
                    s = spec.generate(prompt, cfg).stats
                    t = totals[(mode, k)]
                    t["tokens"] += s.n_generated
                    t["decode_s"] += s.total_s - s.prefill_s
                    t["drafted"] += s.n_drafted
                    t["accepted"] += s.n_accepted
                    t["steps"] += s.n_steps
    base_tps = totals[("none", 0)]["tokens"] / totals[("none", 0)]["decode_s"]
    rows = []
    for (mode, k), t in totals.items():
        tps = t["tokens"] / t["decode_s"]
        rows.append(
            {
                "pair": pair_name,
                "target": pair.target,
                "draft": pair.draft,
                "mode": mode,
                "k": k,
                "acceptance": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
                "tokens_per_step": round(t["tokens"] / t["steps"], 2),
                "tokens_per_s": round(tps, 1),
                "speedup": round(tps / base_tps, 3),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=["default"])
    ap.add_argument("--k", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    rows = [r for name in opts.pairs for r in measure(name, opts.k, opts.max_tokens, opts.repeats)]
    if opts.json:
        print(json.dumps(rows, indent=1))
        return
    print("| pair | target | draft | mode | k | acceptance | tokens/step | tokens/s | speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        draft = r["draft"] if r["mode"] == "model" else "-"
        print(
            f"| {r['pair']} | {r['target']} | {draft} | {r['mode']} | {r['k']} | "
            f"{r['acceptance'] if r['acceptance'] is not None else '-'} | "
            f"{r['tokens_per_step']} | {r['tokens_per_s']} | {r['speedup']:.2f}x |"
        )


if __name__ == "__main__":
    main()
