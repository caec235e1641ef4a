#!/usr/bin/env python3
"""The agentic bench's sessions through `edge-spec serve`, end to end: each draft mode gets a
server of its own (the chat pair, no model flags), and the official openai client drives every
session turn by turn with the full history, the way an agent framework does (no
`prompt_cache_key`), T = 0. Wall time at the client, prefill included, per session and over
all of them, as ratios to the first mode.

    .venv/bin/python scripts/measure_server_agentic.py [--modes none auto ngram] [--sessions ID ...]

Every mode answers the same requests: each session's history is the first mode's own answers
(at T = 0 every exact mode produces them anyway; the script says where one did not).

A mode `lcpp-nNgG` (not first) is the peer: llama-cpp-python's prompt lookup (N tokens,
G-grams) on the same target, the way its own server answers a conversation -- one `Llama`
that keeps the longest prefix of the last request's tokens and evaluates the rest with its
first draft -- driven in this process on the prompts edge-spec renders (the same token ids),
timed the same way: wall time per request, prefill included.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure_server import running_server  # noqa: E402

from edge_spec.bench.agentic import load_sessions, request_messages  # noqa: E402


def ttft_sum_s(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("edge_spec_time_to_first_token_seconds_sum"):
            return float(line.split()[-1])
    return float("nan")


def drive(mode: str, sessions, histories: dict | None, answer) -> dict:
    """Every session turn by turn, each request timed at the caller: answer(session id, turn
    index, messages) -> (completion tokens, text). {session id: (wall seconds, completion
    tokens, answers)}."""
    out = {}
    for session in sessions:
        wall, tokens, answers = 0.0, 0, []
        for i in range(len(session.turns)):
            # The history every mode is asked with: the first mode's answers.
            given = histories[session.id][:i] if histories else answers
            t0 = time.perf_counter()
            n_tokens, text = answer(session.id, i, request_messages(session, given))
            wall += time.perf_counter() - t0
            tokens += n_tokens
            answers.append(text)
        out[session.id] = (wall, tokens, answers)
        print(f"{mode} {session.id}: {wall:.2f} s, {tokens} tokens", flush=True)
    return out


def run_mode(mode: str, sessions, threads: int, histories: dict | None):
    """drive()'s results through `edge-spec serve --draft-mode MODE`, and the TTFT sum."""
    options = ["--draft-mode", mode, "--threads", str(threads), "--ctx-size", "4096"]
    with running_server(options, quiet=True) as (url, client, model):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
        )
        ttft0 = ttft_sum_s(url)

        def answer(_sid, _i, messages):
            done = client.chat.completions.create(
                model=model, messages=messages, max_tokens=384, temperature=0
            )
            return done.usage.completion_tokens, done.choices[0].message.content or ""

        out = drive(mode, sessions, histories, answer)
        return out, ttft_sum_s(url) - ttft0


def run_lcpp(mode: str, sessions, threads: int, histories: dict):
    """drive()'s results for the peer mode lcpp-nNgG on the histories' requests (rendered and
    tokenized before the clock starts), and the summed time to first token."""
    from edge_spec.api import EdgeSpec, EngineConfig
    from edge_spec.backend import PromptLookupPeer
    from edge_spec.models.manifest import choose_pair

    m = re.fullmatch(r"lcpp-n(\d+)g(\d+)", mode)
    if m is None:
        raise SystemExit(f"unknown mode {mode!r} (lcpp-nNgG, e.g. lcpp-n4g4)")
    target, _ = choose_pair(None, None, chat=True, draft_mode="none")
    with EdgeSpec(target, None, config=EngineConfig(n_ctx=4096, n_threads=threads)) as spec:
        prompts = {
            s.id: [
                spec.tokenize(spec.render_chat(request_messages(s, histories[s.id][:i])))
                for i in range(len(s.turns))
            ]
            for s in sessions
        }
        path = spec.target_path
    peer = PromptLookupPeer(path, n_ctx=4096, n_threads=threads)
    peer.generate(prompts[sessions[0].id][0][:8], 8, keep_prefix=True)  # page the weights in
    n_pred, n_gram = int(m[1]), int(m[2])
    prefill_s = []

    def answer(sid, i, _messages):  # the same request, rendered above
        gen = peer.generate(
            prompts[sid][i], 384, num_pred_tokens=n_pred, max_ngram_size=n_gram, keep_prefix=True
        )
        prefill_s.append(gen.prefill_s)
        return len(gen.token_ids), peer.detokenize(gen.token_ids)

    try:
        out = drive(mode, sessions, histories, answer)
    finally:
        peer.close()
    return out, sum(prefill_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["none", "auto", "ngram"])
    ap.add_argument("--sessions", nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sessions = load_sessions(args.sessions)
    results, ttft = {}, {}
    for mode in args.modes:
        first = results.get(args.modes[0])
        histories = {sid: r[2] for sid, r in first.items()} if first else None
        if mode.startswith("lcpp-"):
            if histories is None:
                raise SystemExit("a peer mode needs an edge-spec mode before it")
            results[mode], ttft[mode] = run_lcpp(mode, sessions, args.threads, histories)
        else:
            results[mode], ttft[mode] = run_mode(mode, sessions, args.threads, histories)
    base = args.modes[0]
    ids = [s.id for s in sessions]
    for sid in [*ids, "all"]:
        keys = ids if sid == "all" else [sid]
        wall = {m: sum(results[m][k][0] for k in keys) for m in args.modes}
        cells = "  ".join(f"{m} {wall[base] / wall[m]:.2f}x ({wall[m]:.2f} s)" for m in args.modes)
        differs = [
            m
            for m in args.modes
            if any(
                [a.strip() for a in results[m][k][2]] != [a.strip() for a in results[base][k][2]]
                for k in keys
            )
        ]
        note = f"  answers differ from {base}: {', '.join(differs)}" if differs else ""
        print(f"{sid}: {cells}{note}")
    print("time to first token, summed:", ", ".join(f"{m} {ttft[m]:.2f} s" for m in args.modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
