#!/usr/bin/env python3
"""Replay the draft-free strategy offline against a committed T = 0 bench run.

The run's target-alone generations are the truth (greedy: every strategy must produce the same
tokens, up to batched-logit near-ties). The script walks each prompt the way the engine does,
with the n-gram lookup (NgramDraft) and the cost policy (CostModelK, shared across prompts as
in the bench), and charges every step the run's measured verify cost t(k + 1) plus the per-step
overhead measured in the run. It prints, per category, the replayed speedup over the target
alone next to the speedup the run measured, and a clairvoyant bound: the same candidates, each
step drafting exactly the tokens the target will accept when that pays. Variants of the lookup
or the policy can be tried in seconds this way before a 30-minute bench; the replay tracked the
real runs within 1-3 % so far.

    .venv/bin/python scripts/replay_ngram.py bench/results/issue4-peers-t0
    .venv/bin/python scripts/replay_ngram.py bench/results/issue13-agentic-idle-probes2 \
        --fitted both --shape linear    # agentic: long histories, each conversation too
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_spec.api import EdgeSpec, EngineConfig  # noqa: E402
from edge_spec.backend import common_prefix  # noqa: E402
from edge_spec.drafts.ngram import NgramDraft  # noqa: E402
from edge_spec.policy.cost import CostModelK  # noqa: E402
from edge_spec.policy.types import DEFAULT_K_MAX, CostCurve, StepOutcome  # noqa: E402
from edge_spec.prompts import load_prompts  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from prompt_ratios import pooled_ratios  # noqa: E402


def fitted_curve(runs, profile: CostCurve, strategy: str, linear: bool = False) -> CostCurve:
    """t(n) fitted to the run's own steps: t(1) from the target alone's runs (time inside
    llama_decode per step), and one factor on the extra cost of a larger batch, least squares
    over the replayed strategy's runs' histograms of k. The extra cost is beta * (profile t(n)
    - profile t(1)), or with linear=True beta * (n - 1): at the agentic sessions' long contexts
    attention adds a cost per verified token that the profile (taken at a 128-token context)
    does not show, and the profile's shape then misfits. One parameter, because runs use most
    sizes too rarely to fit each."""
    import numpy as np

    plain = [r for r in runs if r.get("llama_decode_s") and len(r["k_chosen"]) == 1]
    t1 = sum(r["llama_decode_s"] for r in plain) / sum(r["k_chosen"][0] for r in plain)
    n_max = len(profile.verify_s)

    def shape(n: int) -> float:
        return float(n - 1) if linear else profile.t(n) - profile.t(1)

    extra, rest = [], []
    for r in runs:
        if r["strategy"] == strategy and r.get("llama_decode_s") and len(r["k_chosen"]) > 1:
            counts = r["k_chosen"]
            extra.append(sum(c * shape(k + 1) for k, c in enumerate(counts)))
            rest.append(r["llama_decode_s"] - t1 * sum(counts))
    beta = float(np.dot(extra, rest) / np.dot(extra, extra))
    values = [t1 + beta * shape(n) for n in range(1, max(n_max, DEFAULT_K_MAX + 1) + 1)]
    return CostCurve(tuple(values), profile.draft_token_s, profile.ngram_s)


def walk(
    prompt,
    truth,
    curve,
    overhead_s,
    policy,
    clairvoyant=False,
    k_max=DEFAULT_K_MAX,
    charge=None,
    draft=None,
):
    """(tokens, replayed seconds) for one prompt; policy None with clairvoyant=True. Steps are
    charged at `charge` (default: curve, the one the policy plans with). `draft`: an NgramDraft
    to go on with (a conversation's session); default a fresh one for this prompt alone."""
    charge = charge or curve
    draft = draft or NgramDraft(3, 1)
    draft.begin(prompt)
    if policy is not None:
        policy.begin()
    context, pos, time_s = list(prompt), 0, 0.0
    while pos < len(truth):
        k_cap = min(k_max, len(truth) - pos - 1)
        candidate = draft.candidate(context, k_cap)
        agree = common_prefix(candidate.tokens, truth[pos:])
        if clairvoyant:
            pays = agree and (agree + 1) / curve.t(agree + 1) > 1 / curve.t(1)
            k = agree if pays else 0
        else:
            plan = policy.plan(("none", "ngram"), k_cap, candidate)
            k = plan.k if plan.source == "ngram" else 0
        accepted = min(k, agree)
        produced = tuple(truth[pos : pos + accepted + 1])
        verify_s = charge.t(k + 1)
        time_s += verify_s + overhead_s
        if policy is not None:
            source = "ngram" if k else "none"
            match_len = candidate.match_len if k else 0
            policy.update(
                StepOutcome(source, k, accepted, (), match_len, overhead_s, verify_s, produced)
            )
        context.extend(produced)
        pos += len(produced)
    return len(truth), time_s


def agentic_requests(spec, truth):
    """An agentic run's requests, rebuilt as run_agentic built them: each turn's messages after
    the target's own earlier answers (its token ids in the run, detokenized)."""
    from edge_spec.bench.agentic import KIND, load_sessions, request_messages
    from edge_spec.prompts import Prompt

    prompts, ids = [], {}
    for session in load_sessions():
        answers: list[str] = []
        for t in range(len(session.turns)):
            pid = f"{session.id}/{t + 1}"
            if pid not in truth:
                break
            messages = request_messages(session, answers)
            prompts.append(Prompt(pid, session.scenario, KIND, "", tuple(messages)))
            ids[pid] = spec.tokenize(spec.render_chat(messages))
            answers.append(spec.target.detokenize(truth[pid]))
    return prompts, ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a bench results folder (T = 0, with ngram-cost)")
    ap.add_argument("--k-max", type=int, default=DEFAULT_K_MAX, help="the engine's by default")
    ap.add_argument("--strategy", default=None, help="the run's n-gram strategy: ngram-cost, ngram")
    ap.add_argument("--worst", type=int, default=0, help="list the N slowest prompts, replayed")
    ap.add_argument("--ngram-prior", type=float, default=None, help="CostModelK's n-gram prior")
    ap.add_argument(
        "--risk-floor",
        default="0.5",
        help="CostModelK's risk_floor in plain steps ('none': the ledger off)",
    )
    ap.add_argument("--risk-rate", type=float, default=0.04, help="CostModelK's risk_rate")
    ap.add_argument(
        "--fitted",
        choices=("charge", "both"),
        default=None,
        help="charge steps at t(n) fitted to the run's own steps; 'both': plan with it too",
    )
    ap.add_argument(
        "--shape",
        choices=("profile", "linear"),
        default="profile",
        help="the fitted extra cost of n tokens: the profile's t(n) - t(1) scaled, or n - 1",
    )
    ap.add_argument(
        "--fresh", action="store_true", help="a new policy per prompt (a process per request)"
    )
    args = ap.parse_args()
    record = json.loads((args.folder / "results.json").read_text(encoding="utf-8"))
    cc = record["cost_curve"]
    curve = CostCurve(tuple(cc["verify_s"]), cc["draft_token_s"], cc["ngram_s"])
    summaries = {
        (s["category"], s["strategy"]): s for s in record["summaries"] if not s["temperature"]
    }
    strategy = args.strategy or next(
        (name for name in ("ngram-cost", "ngram") if ("all", name) in summaries), "ngram-cost"
    )
    charge = None
    if args.fitted:
        t0_runs = [r for r in record["runs"] if not r["temperature"]]
        charge = fitted_curve(t0_runs, curve, strategy, linear=args.shape == "linear")
        print("fitted t(n) ms:", " ".join(f"{t * 1e3:.1f}" for t in charge.verify_s[:8]))
        if args.fitted == "both":
            curve = charge
    chat = bool(record.get("settings", {}).get("chat"))
    everything = summaries.get(("all", strategy))
    overhead_s = 0.0
    if everything:
        split = everything["time_split_s"]
        overhead_s = (split["draft"] + split["other"]) / max(sum(everything["k_chosen"]), 1)
    truth = {
        r["prompt_id"]: r["token_ids"]
        for r in record["runs"]
        if r["strategy"] == "target" and not r["temperature"] and r["repeat"] == 0
    }
    target = Path(record["target"]).stem  # the run's model, by its name in the manifest
    agentic = bool(record.get("settings", {}).get("agentic"))
    n_ctx = int(record.get("settings", {}).get("ctx_size") or 2048)
    with EdgeSpec(target, None, draft_mode="none", config=EngineConfig(n_ctx=n_ctx)) as spec:
        if agentic:
            prompts, ids = agentic_requests(spec, truth)
        else:
            prompts = [p for p in load_prompts() if p.id in truth]
            ids = {
                p.id: spec.tokenize(spec.render_chat(p.messages) if chat else p.completion)
                for p in prompts
            }
    prior = None if args.ngram_prior is None else {"ngram": args.ngram_prior}
    risk = {
        "risk_floor": None if args.risk_floor == "none" else float(args.risk_floor),
        "risk_rate": args.risk_rate,
    }
    policy = CostModelK(curve, k_max=args.k_max, prior_alpha=prior, **risk)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    per_prompt = {}
    sessions: dict[str, NgramDraft] = {}  # agentic: a session per conversation, as run
    for p in prompts:
        if args.fresh:
            policy = CostModelK(curve, k_max=args.k_max, prior_alpha=prior, **risk)
        draft = None
        if agentic:
            conversation = p.id.split("/")[0]
            if conversation not in sessions:
                sessions[conversation] = NgramDraft(3, 1, session_tokens=32768)
                sessions[conversation].select(conversation)
            draft = sessions[conversation]
        n, replayed_s = walk(
            ids[p.id],
            truth[p.id],
            curve,
            overhead_s,
            policy,
            k_max=args.k_max,
            charge=charge,
            draft=draft,
        )
        _, bound_s = walk(
            ids[p.id], truth[p.id], charge or curve, overhead_s, None, True, args.k_max
        )
        plain_s = n * ((charge or curve).t(1) + overhead_s)
        per_prompt[p.id] = plain_s / replayed_s
        # Agentic runs: each conversation too, after its category.
        keys = (p.category, p.kind, "all") + ((p.id.split("/")[0],) if agentic else ())
        for key in keys:
            for i, value in enumerate((plain_s, replayed_s, bound_s)):
                totals[key][i] += value
    print(f"t(1) {curve.t(1) * 1e3:.1f} ms, overhead {overhead_s * 1e3:.2f} ms/step")
    print(f"{'category':<18} {'replayed':>9} {'measured':>9} {'clairvoyant':>12}")
    by_conversation = pooled_ratios(record["runs"], strategy, 0.0, sessions=True) if agentic else {}
    kinds = {p.kind for p in prompts}
    order = sorted(totals, key=lambda key: (key == "all", key in kinds))  # categories, kinds, all
    for key in order:
        plain_s, replayed_s, bound_s = totals[key]
        measured = summaries.get((key, strategy), {}).get("speedup") or by_conversation.get(key)
        shown = f"{measured:.2f}x" if measured else "-"
        print(f"{key:<18} {plain_s / replayed_s:>8.2f}x {shown:>9} {plain_s / bound_s:>11.2f}x")
    if args.worst:
        worst = sorted(per_prompt.items(), key=lambda item: item[1])[: args.worst]
        print("slowest, replayed: " + ", ".join(f"{p} {r:.3f}x" for p, r in worst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
