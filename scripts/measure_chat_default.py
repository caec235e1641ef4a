#!/usr/bin/env python3
"""Which model should answer a chat when the user names none? Measured on the bench's 48 chat
prompts (each with a hand-written reference answer), the target alone at T = 0:

- smollm2-135m-f16, an instruct model, with its own ChatML template (the chat pair's target);
- gemma3-270m-f16, the default pair's base model, with the built-in Gemma turn template
  (what edge_spec falls back to for its architecture) and with ChatML (llama.cpp's fallback).

Per variant: how often the answer ends its turn by itself within --max-tokens, how often it
runs on into an invented next turn (a turn marker or "User:" in the text), the mean token F1
against the reference answer, and tokens/s.

    .venv/bin/python scripts/measure_chat_default.py --out bench/results/chat-default
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path

from edge_spec import EdgeSpec, EngineConfig, GenerationConfig
from edge_spec.prompts import load_prompts

VARIANTS = (
    ("smollm2-135m-f16", None),
    ("gemma3-270m-f16", "gemma"),
    ("gemma3-270m-f16", "chatml"),
)
INVENTED_TURN = re.compile(r"<start_of_turn>|<\|im_start\|>|\n(User|Assistant|user|model):")


def token_f1(answer: str, reference: str) -> float:
    a, r = Counter(answer.lower().split()), Counter(reference.lower().split())
    common = sum((a & r).values())
    if not common:
        return 0.0
    precision, recall = common / sum(a.values()), common / sum(r.values())
    return 2 * precision * recall / (precision + recall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help="folder for results.json")
    args = parser.parse_args()
    prompts = load_prompts(quick=args.quick)
    cfg = GenerationConfig(max_tokens=args.max_tokens, draft_mode="none")
    rows = []
    for target, template in VARIANTS:
        config = EngineConfig(n_ctx=2048, chat_template=template)
        with EdgeSpec(target, draft_mode="none", config=config) as spec:
            spec.generate("Hello", max_tokens=4)  # page the weights in
            ended = invented = 0
            f1 = 0.0
            tokens, seconds = 0, 0.0
            t0 = time.perf_counter()
            for prompt in prompts:
                result = spec.chat(list(prompt.messages), cfg)
                ended += result.finish_reason == "eos"
                invented += bool(INVENTED_TURN.search(result.text))
                f1 += token_f1(result.text, prompt.reference)
                tokens += result.stats.n_generated
                seconds += result.stats.total_s - result.stats.prefill_s
            n = len(prompts)
            row = {
                "target": target,
                "template": template or "model's own",
                "prompts": n,
                "ends_its_turn": round(ended / n, 3),
                "invents_a_turn": round(invented / n, 3),
                "reference_f1": round(f1 / n, 3),
                "tokens_per_s": round(tokens / seconds, 1),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| target | template | ends its turn | invents a turn | F1 vs reference | tokens/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['target']} | {r['template']} | {r['ends_its_turn']:.0%} | "
            f"{r['invents_a_turn']:.0%} | {r['reference_f1']:.2f} | {r['tokens_per_s']} |"
        )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record = {"command": "scripts/measure_chat_default.py", "args": vars(args), "rows": rows}
        (out / "results.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
