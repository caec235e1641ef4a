#!/usr/bin/env python3
"""What the n-gram session index costs at its bound: memory, and time per decode step.

Fills a session (NgramDraft with session_tokens) with earlier requests made of real text --
the bench prompts' chat forms and references, tokenized by the target -- until it holds the
bound (32,768 tokens by default), then times the per-step work the engine does on a live
request: one lookup (with the token-tree branches the cost policy asks for) that also indexes
the tokens the last step added (1 to 5 of them). Memory
is what tracemalloc sees the index allocate. The per-step time is compared with the target's
own step t(1) from the cached device profile of the pair (or --t1-ms).

    .venv/bin/python scripts/measure_session_index.py            # the chat pair's target
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_spec.drafts.ngram import NgramDraft  # noqa: E402
from edge_spec.prompts import load_prompts  # noqa: E402


def texts() -> list[str]:
    out = []
    for p in load_prompts():
        chat = "\n".join(m["content"] for m in p.messages)
        out.append(chat + "\n" + p.reference)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-f16")
    ap.add_argument("--session-tokens", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument(
        "--t1-ms", type=float, default=None, help="the target's step (default: t(1) measured now)"
    )
    args = ap.parse_args()

    from edge_spec import backend, models
    from edge_spec.device import probes

    path = models.resolve(args.target)
    with backend.LlamaModel(
        path, n_ctx=2048, n_batch=512, n_threads=backend.default_threads()
    ) as model:
        docs = [model.tokenize(t) for t in texts()]
        t1_s = (
            args.t1_ms / 1e3
            if args.t1_ms
            else statistics.median(probes.time_batches([model], 256, (1,), 15)[0][1])
        )
    draft = NgramDraft(session_tokens=args.session_tokens)
    draft.select("bench")
    tracemalloc.start()
    held = 0
    i = 0
    while held < args.session_tokens:  # earlier requests, each indexed as the engine does
        doc = docs[i % len(docs)]
        draft.begin(doc)
        context = list(doc)
        draft.candidate(context, 8)
        held += len(doc) - 1
        i += 1
    index_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # A live request: its prompt, then steps of 1-5 new tokens (a step's accepted drafts and
    # the target's token), each followed by the lookup the next step plans with.
    live = list(docs[0])
    draft.begin(live)
    draft.candidate(live, 8)
    tail = [t for d in docs[1:] for t in d]
    times = []
    pos = 0
    for step in range(args.steps):
        n_new = 1 + step % 5
        live.extend(tail[pos : pos + n_new])
        pos += n_new
        start = time.perf_counter()
        draft.candidate(live, 8, branches=True)  # as the engine asks under the cost policy
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    p95_s = sorted(times)[int(0.95 * len(times))]
    print(
        f"session: {len(draft._index._docs) - 1} earlier requests, "
        f"{sum(map(len, draft._index._docs)) - len(draft._index._docs[-1])} tokens held "
        f"(bound {args.session_tokens})"
    )
    print(
        f"index memory: {index_bytes / 2**20:.1f} MiB "
        f"({index_bytes / max(held, 1):.0f} bytes per token held); the bound's estimate "
        f"{draft.bytes_estimate() / 2**20:.1f} MiB"
    )
    print(
        f"per step (lookup + indexing the step's tokens): median {step_s * 1e6:.0f} us, "
        f"p95 {p95_s * 1e6:.0f} us; target t(1) {t1_s * 1e3:.1f} ms -> "
        f"{step_s / t1_s * 100:.2f} % of a target step (p95 {p95_s / t1_s * 100:.2f} %)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
