"""Per-step cost of the default mode's own work, in the engine, as a user's process meets it.

Runs the chat pair's quick chat prompts (or --prompts ids) through the Python API in this fresh
process, in the default mode at T = 0, and times the three calls every auto step makes besides
the target pass -- the n-gram lookup (NgramDraft.candidate), the cost policy's plan and its
update -- by wrapping them (the wrappers add ~1 us a call). Also prints what the stats report:
the overhead of the steps that drafted nothing, and of all steps.

    .venv/bin/python scripts/step_costs.py [--prompts chat-01,math-01] [--max-tokens 128]

Run it twice (or against an older checkout with PYTHONPATH=that/checkout) and compare: the
numbers are this machine's, noisy by 10-20 % from run to run.
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from collections.abc import Callable
from typing import Any

from edge_spec.api import EdgeSpec
from edge_spec.drafts import NgramDraft
from edge_spec.models.cache import pick_pair
from edge_spec.policy.cost import CostModelK
from edge_spec.prompts import load_prompts

spent_s: collections.Counter[str] = collections.Counter()


def timed(owner: type, name: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start_s = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent_s[name] += time.perf_counter() - start_s

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=None, help="prompt ids (default: the quick set)")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    prompts = load_prompts(quick=args.prompts is None)
    if args.prompts:
        wanted = args.prompts.split(",")
        prompts = [p for p in load_prompts() if p.id in wanted]
    timed(NgramDraft, "candidate")
    timed(CostModelK, "plan")
    timed(CostModelK, "update")
    target, draft, _ = pick_pair(None, None, chat=True)
    n_steps = n_plain = 0
    plain_s = plain_overhead_s = overhead_s = decode_wall_s = 0.0
    with EdgeSpec(target, draft) as spec:
        for prompt in prompts:
            text = spec.render_chat(list(prompt.messages))
            s = spec.generate(text, max_tokens=args.max_tokens, temperature=0.0).stats
            n_steps += s.n_steps
            # (absent from stats before commit 87b8520: 0 there)
            n_plain += getattr(s, "n_plain_steps", 0)
            plain_s += getattr(s, "plain_s", 0.0)
            plain_overhead_s += getattr(s, "plain_overhead_s", 0.0)
            overhead_s += s.overhead_s
            decode_wall_s += s.total_s - s.prefill_s
    per_step = {name: f"{1e6 * t / n_steps:.0f} us" for name, t in sorted(spent_s.items())}
    print(f"{len(prompts)} prompts, {n_steps} steps ({n_plain} drafted nothing)")
    print(f"per step: {per_step}")
    print(
        f"stats: overhead {100 * overhead_s / decode_wall_s:.2f} % of the decode, "
        f"{100 * plain_overhead_s / plain_s if plain_s else float('nan'):.2f} % on the steps "
        "that drafted nothing"
    )


if __name__ == "__main__":
    main()
