#!/usr/bin/env python3
"""A target's draft head through the engine, on held-out prompts: greedy output against the
target alone, acceptance per draft position, and speed, every variant interleaved prompt by
prompt in one process.

The prompts are the head prompt set's held-out topics (edge_spec.headtrain.prompts) past the
ones `edge-spec head train` evaluated on: topics the head never trained on, answers it never
saw. Chat models get them through their chat template; base models continue the document
opening.

    .venv/bin/python scripts/measure_head.py --target smollm2-135m-f16 --prompts 16 \\
        --out bench/results/issue16-head/smollm2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig  # noqa: E402
from edge_spec.headtrain.data import EVAL_PROMPTS  # noqa: E402
from edge_spec.headtrain.prompts import head_prompts  # noqa: E402

# (name, draft mode, fixed k or None for the cost policy, token tree branch tokens)
VARIANTS = [
    ("target", "none", None, None),
    ("head-k1", "head", 1, None),
    ("head-k2-t2", "head", 2, 2),  # the chain and two runner-ups as one-token branches
    ("head", "head", None, None),
    ("auto", "auto", None, None),
]


def top2_gap(spec: EdgeSpec, context: list[int]) -> float:
    """The target's top-2 logit gap for the token after `context`, decoded alone."""
    target = spec.target
    target.sync(context[:-1])
    row = np.sort(np.asarray(target.decode([context[-1]], [0])[0], dtype=np.float64))
    target.truncate(len(context) - 1)
    return float(row[-1] - row[-2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", type=Path)
    opts = ap.parse_args()
    held = head_prompts(held_out=True)[EVAL_PROMPTS : EVAL_PROMPTS + opts.prompts]
    spec = EdgeSpec(opts.target, config=EngineConfig(n_ctx=2048))
    chat = spec.target.info.chat_template is not None
    texts = [
        spec.render_chat([{"role": "user", "content": p.chat}]) if chat else p.text for p in held
    ]
    spec.generate(texts[0], max_tokens=8)  # page in, profile if needed
    totals: dict = defaultdict(lambda: defaultdict(float))
    per_position: dict = defaultdict(lambda: [[0, 0] for _ in range(32)])
    same = defaultdict(int)
    divergences = []
    for text in texts:
        outputs = {}
        for name, mode, k, tree_nodes in VARIANTS:
            spec.clear_session()  # no variant drafts from another's answer to this prompt
            result = spec.generate(
                text,
                GenerationConfig(),
                max_tokens=opts.max_tokens,
                k=k,
                tree_nodes=tree_nodes,
                draft_mode=mode,
                temperature=opts.temperature,
                seed=1,
            )
            outputs[name] = list(result.token_ids)
            s = result.stats
            t = totals[name]
            t["tokens"] += s.n_generated
            t["decode_s"] += s.total_s - s.prefill_s
            t["drafted"] += s.n_drafted
            t["accepted"] += s.n_accepted
            t["branch_nodes"] += s.n_branch_drafted
            t["branch_accepted"] += s.n_branch_accepted
            for source, n in s.drafted_by_source.items():
                t[f"drafted_{source}"] += n
            for pos, (d, a) in enumerate(zip(s.drafted_per_position, s.accepted_per_position)):
                per_position[name][pos][0] += d
                per_position[name][pos][1] += a
        alone = outputs["target"]
        for name, out in outputs.items():
            same[name] += out == alone
            if out != alone:  # where and how close the target's own choice was
                at = next(i for i, (a, b) in enumerate(zip(out + [-1], alone)) if a != b)
                prompt_ids = spec.tokenize(text)
                gap = top2_gap(spec, prompt_ids + alone[:at])
                divergences.append({"variant": name, "prompt": text[:60], "at": at, "gap": gap})
    base_tps = totals["target"]["tokens"] / totals["target"]["decode_s"]
    rows = []
    print(
        f"{opts.target}: {len(texts)} held-out prompts x {opts.max_tokens} tokens, "
        f"T = {opts.temperature}; head on {spec._sources['head'].provider}, "
        f"{spec._sources['head'].token_s * 1e3:.3f} ms per head step"
    )
    print(
        f"{'variant':<9} {'same':>5} {'tok/s':>7} {'ratio':>6} {'drafted':>8} {'acc':>6}  "
        "acceptance per position"
    )
    for name, *_ in VARIANTS:
        t = totals[name]
        tps = t["tokens"] / t["decode_s"]
        positions = [a / d for d, a in per_position[name] if d > 0][:4]
        row = {
            "variant": name,
            "same_as_target": same[name],
            "prompts": len(texts),
            "tokens_per_s": tps,
            "ratio": tps / base_tps,
            "drafted": t["drafted"],
            "accepted": t["accepted"],
            "acceptance": t["accepted"] / t["drafted"] if t["drafted"] else 0.0,
            "acceptance_per_position": positions,
            "drafted_by_source": {k[8:]: v for k, v in t.items() if k.startswith("drafted_")},
            "branch_nodes": t["branch_nodes"],
            "branch_accepted": t["branch_accepted"],
        }
        rows.append(row)
        print(
            f"{name:<9} {same[name]:>2}/{len(texts):<2} {tps:7.1f} {tps / base_tps:6.2f} "
            f"{int(t['drafted']):>8} {row['acceptance']:6.2f}  "
            + " ".join(f"{a:.2f}" for a in positions)
        )
    for row in rows:
        if row["branch_nodes"]:
            print(
                f"{row['variant']}: {int(row['branch_nodes'])} runner-ups verified as branches, "
                f"{int(row['branch_accepted'])} accepted"
            )
    for d in divergences:
        print(
            f"divergence: {d['variant']} left the target alone's text at token {d['at']} of "
            f"{d['prompt']!r}..., where the target's top-2 logit gap was {d['gap']:.4f}"
        )
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"target": opts.target, "rows": rows, "divergences": divergences}
        opts.out.write_text(json.dumps(record, indent=1) + "\n")
    spec.close()


if __name__ == "__main__":
    main()
