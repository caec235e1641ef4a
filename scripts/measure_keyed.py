#!/usr/bin/env python3
"""What keyed sampling costs a model draft in acceptance, measured on the real pairs.

edge_spec draws every token at T > 0 with keys that depend on (seed, position, token) only
(an exponential race, sampling.SampleKeys), and a model draft draws with the same keys, so the
text never depends on what was drafted. Rejection sampling (Leviathan et al.) accepts a
sampled draft token with probability sum_x min(p_target, p_draft) = 1 - TV; a keyed draft is
accepted when both draws are the same token. This script walks sampled text of the target alone
and, at every position, takes the draft's and the target's rows for the same context (after
the same sampling transform) and computes: rejection sampling's acceptance (exact), one shared
uniform through both inverse CDFs (exact), and the keyed race (over --keys seeds).

    .venv/bin/python scripts/measure_keyed.py --pair smollm2-f16-q4_0 --temperature 0.8
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from edge_spec.backend import LlamaModel
from edge_spec.models.cache import resolve
from edge_spec.models.manifest import list_pairs
from edge_spec.models.templates import render_chat
from edge_spec.prompts import load_prompts
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import SamplingParams, probs_from_logits, sample


def coupled_match(p_target: np.ndarray, p_draft: np.ndarray) -> float:
    """P(inverse-CDF draws of both rows at one shared uniform are the same token), exactly: the
    overlap of each token's CDF interval in the two rows, summed (the cheaper coupling that
    edge_spec does not use)."""
    f_target, f_draft = np.cumsum(p_target), np.cumsum(p_draft)
    f_target /= f_target[-1]
    f_draft /= f_draft[-1]
    upper = np.minimum(f_target, f_draft)
    lower = np.maximum(
        np.concatenate(([0.0], f_target[:-1])), np.concatenate(([0.0], f_draft[:-1]))
    )
    return float(np.clip(upper - lower, 0.0, None).sum())


def keyed_match(p_target: np.ndarray, p_draft: np.ndarray, n: int, position: int) -> float:
    """P(the target's and the draft's keyed draws agree), over n seeds: what edge_spec does."""
    agree = [
        keys.sample(p_target, position) == keys.sample(p_draft, position)
        for keys in (SampleKeys(seed) for seed in range(n))
    ]
    return float(np.mean(agree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2-f16-q4_0")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=48, help="sampled positions per prompt")
    parser.add_argument("--quick", action="store_true", help="the 12 quick prompts only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keys", type=int, default=64, help="seeds per position (keyed race)")
    args = parser.parse_args()
    pair = list_pairs()[args.pair]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    target = LlamaModel(resolve(pair.target), n_ctx=2048)
    draft = LlamaModel(resolve(pair.draft), n_ctx=2048)
    chat = target.info.chat_template is not None
    rng = np.random.default_rng(args.seed)
    per_category: dict[str, list[tuple[float, float]]] = {}
    for prompt in load_prompts(quick=args.quick):
        if chat:
            text = render_chat(
                target.info.chat_template,
                prompt.messages,
                bos_token="",
                eos_token=target.token_text(target.info.eos_id).decode(),
            )
        else:
            text = prompt.completion
        ids = target.tokenize(text, add_special=True, parse_special=True)
        target.reset()
        draft.reset()
        target_row = target.decode(ids, [len(ids) - 1])[0]
        draft_row = draft.decode(ids, [len(ids) - 1])[0]
        rows = per_category.setdefault(prompt.category, [])
        for _ in range(args.tokens):
            p_target = probs_from_logits(target_row, params)
            p_draft = probs_from_logits(draft_row, params)
            rejection = float(np.minimum(p_target, p_draft).sum())
            rows.append(
                (
                    rejection,
                    coupled_match(p_target, p_draft),
                    keyed_match(p_target, p_draft, args.keys, len(ids)),
                )
            )
            token = sample(p_target, rng.random())
            ids.append(token)
            if target.is_eog(token):
                break
            target_row = target.decode([token], [0])[0]
            draft_row = draft.decode([token], [0])[0]
    summary = {}
    all_rows = [r for rows in per_category.values() for r in rows]
    for name, rows in [*per_category.items(), ("all", all_rows)]:
        values = np.array(rows)
        summary[name] = {
            "positions": len(rows),
            "rejection_sampling": round(float(values[:, 0].mean()), 4),
            "shared_uniform": round(float(values[:, 1].mean()), 4),
            "keyed_race": round(float(values[:, 2].mean()), 4),
        }
        print(
            f"{name:<18} {len(rows):5d} positions  rejection sampling {values[:, 0].mean():.3f}  "
            f"one shared uniform {values[:, 1].mean():.3f}  keyed race {values[:, 2].mean():.3f}"
        )
    print(json.dumps({"pair": args.pair, "params": vars(args), "acceptance": summary}))


if __name__ == "__main__":
    main()
