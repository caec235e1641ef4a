#!/usr/bin/env python3
"""Record acceptance traces on the real models, for `edge-spec simulate` (edge_spec/simulate/).

For each prompt the target's greedy continuation of N tokens is generated once; then, at every
position pos of it, the script records what each draft source would have proposed from the
context prompt + target[:pos]:

- model: the draft's greedy continuation of K_MAX tokens, how many of them match the target's
  continuation (`agree`), and the draft's probability of each of its tokens (`confidence`);
- ngram: the prompt-lookup proposal (edge_spec.drafts.ngram.lookup, max_ngram 3, min_ngram 1),
  its matched n-gram length, how many recent occurrences the matched n-gram had and how many of
  them went on with the proposal's first token (the policy's consensus), how many of its
  tokens match (`agree`), and the other ways the occurrences went on (`branches`: a token
  tree's branches, with their weights).

Greedy (T=0) only: the policies are judged on the acceptance pattern, and at T=0 acceptance is a
deterministic prefix match, so one recording serves every k. The draft's greedy chain is reused
from one position to the next while it keeps agreeing with the target (its context is then the
same), so recording costs a few draft decodes per position instead of K_MAX.

    .venv/bin/python scripts/record_traces.py                    # default pair, 16 prompts x 96
    .venv/bin/python scripts/record_traces.py --n-tokens 64 --prompts 4 --out /tmp/t.json
    .venv/bin/python scripts/record_traces.py --refresh-ngram bench/traces/X.json  # n-gram only
    .venv/bin/python scripts/record_traces.py --agentic              # the agentic sessions
    .venv/bin/python scripts/record_traces.py --target smollm2-135m-f16 --draft head

--draft head records the draft head `edge-spec head train` made for the target in place of a
draft model (its greedy chain from the target's hidden states, as the engine runs it: nothing
at the first position, where the engine has no hidden state yet); c is the head's own cost.

--agentic records every turn of the agentic bench's sessions (edge_spec/bench/agentic.json)
on the chat pair: each turn's request is the chat template over the system message, the
earlier turns and the target's own greedy answers to them, the way the bench sends it; the
target's greedy answer (up to --n-tokens, to its end of turn) is then recorded like a prompt's
continuation. The n-gram lookup there sees the whole history, which is in the request.

--refresh-ngram recomputes only the n-gram fields of an existing trace (the target's tokens
are kept; its tokenizer gives the prompts' ids), e.g. after the lookup learned something new.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_spec.backend import LlamaModel, common_prefix, llama_cpp_version  # noqa: E402
from edge_spec.device.probes import time_batches  # noqa: E402
from edge_spec.drafts import CrossVocabDraft  # noqa: E402
from edge_spec.drafts.ngram import lookup  # noqa: E402
from edge_spec.drafts.vocab import check_compatible  # noqa: E402
from edge_spec.errors import VocabMismatchError  # noqa: E402
from edge_spec.models.cache import resolve  # noqa: E402
from edge_spec.models.manifest import default_pair  # noqa: E402
from edge_spec.sampling.keys import SampleKeys  # noqa: E402
from edge_spec.sampling.transform import SamplingParams  # noqa: E402
from edge_spec.simulate.traces import K_MAX, TRACE_SCHEMA  # noqa: E402

MAX_NGRAM, MIN_NGRAM = 3, 1

# Completion-style prompts (the default target, Gemma-3-270M, is a base model), four per kind.
PROMPTS: list[tuple[str, str]] = [
    ("chat", "Q: What is the capital of France?\nA:"),
    ("chat", "User: Can you give me three tips for sleeping better?\nAssistant:"),
    ("chat", "Question: Why is the sky blue?\nAnswer:"),
    ("chat", "Customer: My order arrived damaged. What should I do?\nSupport agent:"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    (
        "code",
        "import numpy as np\n\ndef normalize(x):\n    return (x - x.mean()) / x.std()\n\n"
        "def standardize(x):\n    return",
    ),
    (
        "code",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
        "    def push(self, item):\n",
    ),
    ("code", "-- list customers and their orders\nSELECT customers.name, orders.id FROM"),
    (
        "extraction",
        "Copy this sentence exactly: The quick brown fox jumps over the lazy dog. "
        "Copy: The quick brown fox",
    ),
    (
        "extraction",
        "The recipe: 1. Boil water. 2. Add pasta. 3. Stir. Repeat the recipe: 1. Boil water.",
    ),
    (
        "extraction",
        "Text: John Smith, born 1970 in Boston, works as an engineer at Acme Corp.\n"
        "Fields:\nName: John Smith\nBorn:",
    ),
    ("extraction", "List the days of the week: Monday, Tuesday,"),
    ("prose", "Once upon a time, in a small village by the sea,"),
    ("prose", "Photosynthesis is the process by which plants"),
    ("prose", "The history of the bicycle begins"),
    ("prose", "In the winter of 1812, the army"),
]


def top_prob(logits: np.ndarray) -> float:
    """The softmax probability of the argmax token (the greedy draft's confidence)."""
    shifted = logits.astype(np.float64) - float(logits.max())
    return float(1.0 / np.exp(shifted).sum())


def target_greedy(target: LlamaModel, prompt: list[int], n_tokens: int) -> tuple[list[int], list]:
    """The target's greedy continuation, one token per decode (stops at end-of-generation)."""
    target.sync(prompt[:-1])
    out: list[int] = []
    times: list[float] = []
    last = prompt[-1]
    while len(out) < n_tokens:
        t0 = time.perf_counter()
        logits = target.decode([last], [0])[0]
        times.append(time.perf_counter() - t0)
        last = int(np.argmax(logits))
        if target.is_eog(last):
            break
        out.append(last)
    return out, times


def record_prompt(
    target: LlamaModel,
    draft: LlamaModel,
    category: str,
    text: str,
    n_tokens: int,
    prompt: list[int] | None = None,
) -> tuple[dict, list[float], list[float]]:
    """prompt: the text's token ids when they are not target.tokenize(text) (a chat request
    with its special tokens). draft: a LlamaModel, or a HeadDraft."""
    prompt = prompt if prompt is not None else target.tokenize(text)
    tokens, target_times = target_greedy(target, prompt, n_tokens)
    n = len(tokens)
    context = prompt + tokens
    n_prompt = len(prompt)
    if not isinstance(draft, LlamaModel):  # a draft head
        record = {
            "category": category,
            "prompt": text,
            "n_prompt": n_prompt,
            "tokens": tokens,
            "model": head_fields(target, draft, prompt, tokens),
            "ngram": ngram_fields(prompt, tokens),
        }
        return record, target_times, [draft.token_s]

    model_agree: list[int] = []
    model_conf: list[list[float]] = []
    draft_times: list[float] = []
    try:
        check_compatible(target, draft)
    except VocabMismatchError:
        model = translated_fields(target, draft, prompt, tokens)
        record = {
            "category": category,
            "prompt": text,
            "n_prompt": n_prompt,
            "tokens": tokens,
            "model": model,
            "ngram": ngram_fields(prompt, tokens),
        }
        # One-token times of both models, interleaved after the same 64-token context, so c
        # compares like with like (the translated proposals above are not single decodes).
        draft_times, target_times_64 = time_batches([draft, target], 64, [1], 24)
        return record, target_times_64[1], draft_times[1]

    # chain: the draft's greedy continuation of context[:n_prompt + pos]; the draft's KV holds
    # that context plus chain[:-1] (its last token is not decoded yet).
    chain: list[tuple[int, float]] = []
    draft.sync(prompt[:-1])
    for pos in range(n):
        ctx_len = n_prompt + pos
        want = min(K_MAX, n - pos)
        if not chain:
            draft.sync(context[: ctx_len - 1])
            logits = draft.decode([context[ctx_len - 1]], [0])[0]
            chain.append((int(np.argmax(logits)), top_prob(logits)))
        while len(chain) < want:
            t0 = time.perf_counter()
            logits = draft.decode([chain[-1][0]], [0])[0]
            draft_times.append(time.perf_counter() - t0)
            chain.append((int(np.argmax(logits)), top_prob(logits)))
        model_agree.append(common_prefix([t for t, _ in chain[:want]], tokens[pos:]))
        model_conf.append([round(c, 4) for _, c in chain[:want]])

        # Advance: the chain stays valid only if its first token is the target's.
        if chain[0][0] == tokens[pos]:
            chain = chain[1:]
        else:
            chain = []
    record = {
        "category": category,
        "prompt": text,
        "n_prompt": n_prompt,
        "tokens": tokens,
        "model": {"agree": model_agree, "confidence": model_conf},
        "ngram": ngram_fields(prompt, tokens),
    }
    return record, target_times, draft_times


def head_fields(target: LlamaModel, head, prompt: list[int], tokens: list[int]) -> dict:
    """The head's greedy chain at every position, from the hidden state of the row that chose
    the context's last token (the target re-decodes the continuation one token at a time)."""
    context = prompt + tokens
    greedy, keys = SamplingParams(), SampleKeys(0)
    fields: dict[str, list] = {"agree": [], "confidence": [], "alternates": []}
    target.sync(prompt[:-1])
    head.begin(prompt)
    for pos in range(len(tokens)):
        ctx_len = len(prompt) + pos
        target.decode([context[ctx_len - 1]], [0])
        want = min(K_MAX, len(tokens) - pos)
        proposal = head.propose(context[:ctx_len], want, greedy, keys, _always)
        fields["agree"].append(common_prefix(proposal.tokens, tokens[pos:]))
        conf = [round(c, 4) for c in proposal.confidences]
        fields["confidence"].append(conf + [0.0] * (want - len(conf)))
        fields["alternates"].append([[t, round(w, 4)] for _, t, w in proposal.alternates])
        head.observe(ctx_len + 1, target.hidden(0))  # for the next position
    return fields


def translated_fields(
    target: LlamaModel, draft: LlamaModel, prompt: list[int], tokens: list[int]
) -> dict:
    """A draft with another vocabulary, as the engine runs it (CrossVocabDraft): at every
    position its translated greedy proposal of up to K_MAX target tokens, how many match, and
    each token's confidence. A proposal may be shorter than K_MAX (the text of K_MAX + 1 draft
    tokens did not reach further); agree counts only what it proposed."""
    info = draft.info
    source = CrossVocabDraft(draft, target, [info.bos_id] if info.add_bos else [])
    context = prompt + tokens
    greedy, keys = SamplingParams(), SampleKeys(0)
    fields: dict[str, list] = {"agree": [], "confidence": [], "proposal_len": []}
    for pos in range(len(tokens)):
        want = min(K_MAX, len(tokens) - pos)
        proposal = source.propose(context[: len(prompt) + pos], want, greedy, keys, _always)
        fields["agree"].append(common_prefix(proposal.tokens, tokens[pos:]))
        conf = [round(c, 4) for c in proposal.confidences]
        fields["confidence"].append(conf + [0.0] * (want - len(conf)))
        fields["proposal_len"].append(len(proposal.tokens))
    return fields


def _always(i: int, confidence: float) -> bool:
    return True


def ngram_fields(prompt: list[int], tokens: list[int]) -> dict:
    """The n-gram lookup's proposal at every position of the target's continuation."""
    fields: dict[str, list] = {
        "agree": [],
        "proposal_len": [],
        "match_len": [],
        "n_occurrences": [],
        "n_agreeing": [],
        "proposal": [],
        "branches": [],
    }
    context = prompt + tokens
    for pos in range(len(tokens)):
        candidate = lookup(context[: len(prompt) + pos], K_MAX, MAX_NGRAM, MIN_NGRAM, (), True)
        proposal = candidate.tokens
        fields["agree"].append(common_prefix(proposal, tokens[pos:]))
        fields["proposal_len"].append(len(proposal))
        fields["match_len"].append(candidate.match_len)
        fields["n_occurrences"].append(candidate.n_occurrences)
        fields["n_agreeing"].append(candidate.n_agreeing)
        fields["proposal"].append(list(proposal))
        fields["branches"].append(
            [
                [b.depth, list(b.tokens), [round(w, 4) for w in b.weights]]
                for b in candidate.branches
            ]
        )
    return fields


def refresh_ngram(path: Path) -> None:
    """Recompute the n-gram fields of the trace at `path` in place."""
    trace = json.loads(path.read_text(encoding="utf-8"))
    with LlamaModel(resolve(trace["target"], progress=False), n_ctx=512) as target:
        for record in trace["prompts"]:
            prompt = target.tokenize(record["prompt"])
            if len(prompt) != record["n_prompt"]:
                raise SystemExit(f"{record['id']}: the prompt no longer tokenizes the same")
            record["ngram"] = ngram_fields(prompt, record["tokens"])
    trace["ngram_refreshed"] = datetime.date.today().isoformat()
    path.write_text(json.dumps(trace, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"refreshed the n-gram fields of {path} ({len(trace['prompts'])} prompts)")


def record_agentic(opts: argparse.Namespace) -> None:
    from edge_spec import EdgeSpec, EngineConfig
    from edge_spec.bench.agentic import load_sessions, request_messages

    started = time.perf_counter()
    target_name, draft_name = default_pair(chat=True)
    target_path = resolve(target_name, progress=False)
    draft_path = resolve(draft_name, progress=False)
    n_tokens = opts.n_tokens if opts.n_tokens != 96 else 384  # the agentic bench's max_tokens
    records = []
    target_times: list[float] = []
    draft_times: list[float] = []
    config = EngineConfig(n_ctx=4096, n_threads=opts.threads)
    with EdgeSpec(target_path, draft_path, config=config) as spec:
        assert spec.draft is not None
        for session in load_sessions():
            answers: list[str] = []
            for turn in range(len(session.turns)):
                text = spec.render_chat(request_messages(session, answers))
                ids = spec.tokenize(text)
                record, tt, dt = record_prompt(
                    spec.target, spec.draft, session.scenario, text, n_tokens, ids
                )
                record["id"] = f"{session.id}/{turn + 1}"
                records.append(record)
                answers.append(spec.target.detokenize(record["tokens"]))
                target_times += tt
                draft_times += dt
                g = record["ngram"]["agree"]
                print(
                    f"{record['id']:<20} {len(ids):>5} prompt {len(g):>4} tokens  "
                    f"ngram agree>0 {sum(x > 0 for x in g) / max(len(g), 1):.2f}  "
                    f"({time.perf_counter() - started:.0f}s)",
                    flush=True,
                )
        n_threads = spec.target.n_threads
    out = Path(
        opts.out or ROOT / "bench" / "traces" / "agentic" / f"{target_name}__{draft_name}.json"
    )
    write_trace(out, target_name, draft_name, records, target_times, draft_times, n_threads)
    print(f"wrote {out} ({len(records)} turns) in {time.perf_counter() - started:.0f}s")


def write_trace(
    out: Path,
    target: str,
    draft: str,
    records: list[dict],
    target_times: list[float],
    draft_times: list[float],
    n_threads: int,
) -> None:
    t1_ms = statistics.median(target_times) * 1e3
    draft_ms = statistics.median(draft_times) * 1e3
    trace = {
        "schema": TRACE_SCHEMA,
        "kind": "edge_spec.acceptance_trace",
        "temperature": 0.0,
        "target": target,
        "draft": draft,
        "k_max": K_MAX,
        "ngram": {"max_ngram": MAX_NGRAM, "min_ngram": MIN_NGRAM},
        "recorded": datetime.date.today().isoformat(),
        "llama_cpp_python": llama_cpp_version(),
        "n_threads": n_threads,
        # One-token decode times while recording (medians); c = draft / target.
        "measured": {
            "target_token_ms": round(t1_ms, 2),
            "draft_token_ms": round(draft_ms, 2),
            "c": round(draft_ms / t1_ms, 3),
        },
        "prompts": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace, separators=(",", ":")) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pair_target, pair_draft = default_pair()
    ap.add_argument("--target", default=pair_target)
    ap.add_argument("--draft", default=pair_draft)
    ap.add_argument("--n-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="default: bench/traces/<target>__<draft>.json")
    ap.add_argument("--refresh-ngram", type=Path, help="only recompute this trace's n-gram fields")
    ap.add_argument("--agentic", action="store_true", help="the agentic sessions, chat pair")
    opts = ap.parse_args()
    if opts.refresh_ngram:
        refresh_ngram(opts.refresh_ngram)
        return
    if opts.agentic:
        record_agentic(opts)
        return
    out = Path(opts.out or ROOT / "bench" / "traces" / f"{opts.target}__{opts.draft}.json")

    started = time.perf_counter()
    target_path = resolve(opts.target, progress=False)
    records = []
    target_times: list[float] = []
    draft_times: list[float] = []
    with contextlib.ExitStack() as stack:
        head = opts.draft == "head"
        target = stack.enter_context(
            LlamaModel(target_path, n_ctx=512, n_threads=opts.threads, hidden_states=head)
        )
        if head:
            from edge_spec.drafts.head import HeadDraft
            from edge_spec.models.heads import find_head

            directory = find_head(target_path)
            if directory is None:
                raise SystemExit(f"no draft head for {opts.target}: edge-spec head train first")
            draft = HeadDraft.load(directory, target_path, target.n_vocab)
        else:
            draft_path = resolve(opts.draft, progress=False)
            draft = stack.enter_context(LlamaModel(draft_path, n_ctx=512, n_threads=opts.threads))
        for i, (category, text) in enumerate(PROMPTS[: opts.prompts]):
            record, tt, dt = record_prompt(target, draft, category, text, opts.n_tokens)
            record["id"] = f"{category}-{i}"
            records.append(record)
            target_times += tt
            draft_times += dt
            a = record["model"]["agree"]
            g = record["ngram"]["agree"]
            print(
                f"{record['id']:<14} {len(record['tokens']):>3} tokens  "
                f"model agree>0 {sum(x > 0 for x in a) / max(len(a), 1):.2f}  "
                f"ngram agree>0 {sum(x > 0 for x in g) / max(len(g), 1):.2f}  "
                f"({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
        n_threads = target.n_threads
    write_trace(out, opts.target, opts.draft, records, target_times, draft_times, n_threads)
    t1_ms = statistics.median(target_times) * 1e3
    draft_ms = statistics.median(draft_times) * 1e3
    print(
        f"wrote {out} ({len(records)} prompts) in {time.perf_counter() - started:.0f}s; "
        f"target {t1_ms:.1f} ms/token, draft {draft_ms:.1f} ms/token, c={draft_ms / t1_ms:.2f}"
    )


if __name__ == "__main__":
    main()
