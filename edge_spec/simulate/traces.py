"""Acceptance traces: what `edge-spec simulate` replays.

A trace (scripts/record_traces.py, JSON) holds, per prompt, the target's greedy continuation
of N tokens and, for each position pos and each draft source, how many of the tokens the source
would propose there match the target's continuation (`agree[pos]`, at most K_MAX): for the
model draft also the draft's probability of each of its K_MAX greedy tokens, for the n-gram
lookup the proposal and its matched n-gram length. Greedy (T = 0) acceptance is a prefix match,
so one recording answers every k: drafting k tokens at pos accepts min(k, agree[pos]).

    {"schema": 1, "kind": "edge_spec.acceptance_trace", "temperature": 0.0,
     "target": "...", "draft": "...", "k_max": 16, "ngram": {"max_ngram": 3, "min_ngram": 1},
     "measured": {"target_token_ms", "draft_token_ms", "c"}, "recorded", "llama_cpp_python",
     "prompts": [{"id", "category", "prompt", "n_prompt",
                  "tokens": [N target token ids],
                  "model": {"agree": [N], "confidence": [N lists of min(16, N - pos)],
                            "alternates": [N lists of [token, p]]},
                  "ngram": {"agree": [N], "proposal": [N lists], "proposal_len": [N],
                            "match_len": [N], "n_occurrences": [N], "n_agreeing": [N],
                            "branches": [N lists of [depth, [tokens], [weights]]]}}]}

n_occurrences / n_agreeing (how the matched n-gram's recent occurrences went on, which the cost
policy keys its n-gram acceptance on) are absent from older traces: read as one occurrence.
"branches" (the other ways the occurrences went on: a token tree's branches) may be absent too:
then no tree is replayed. A tree step is replayed like the engine verifies it: the walk follows
the recorded greedy tokens down the tree, and the step costs t(1 + all the tree's tokens).
"alternates" (a draft head's runner-up at each chain position, absent from older traces) lets
the policy verify some of them beside the chain as one-token branches, as the engine does.

Only T = 0 is recorded. A T > 0 trace would need, per position, the acceptance probability
min(1, p_target / p_draft) of each sampled draft token; that variant is not recorded yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edge_spec.drafts.candidates import NO_MATCH, Branch, NgramCandidate

K_MAX = 16  # tokens recorded per position
TRACE_SCHEMA = 1
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces"


@dataclass(frozen=True)
class PromptTrace:
    """One prompt's recording; every per-position tuple has n_tokens entries."""

    id: str
    category: str
    tokens: tuple[int, ...]
    model_agree: tuple[int, ...]
    model_confidence: tuple[tuple[float, ...], ...]
    ngram_agree: tuple[int, ...]
    ngram_proposal: tuple[tuple[int, ...], ...]
    ngram_match_len: tuple[int, ...]
    ngram_occurrences: tuple[int, ...] = ()  # empty: not recorded (one occurrence each)
    ngram_agreeing: tuple[int, ...] = ()
    ngram_branches: tuple[tuple[Branch, ...], ...] = ()  # empty: not recorded (no trees)
    # Per position, the learned draft's runner-up (token, probability) at each chain
    # position: one-token branches of a token tree. Empty: not recorded (chains only).
    model_alternates: tuple[tuple[tuple[int, float], ...], ...] = ()

    def ngram_candidate(self, pos: int, k_cap: int) -> NgramCandidate:
        """What the n-gram lookup proposed at pos, cut to k_cap tokens."""
        if k_cap <= 0 or not self.ngram_proposal[pos]:
            return NO_MATCH
        occurrences = self.ngram_occurrences[pos] if self.ngram_occurrences else 1
        agreeing = self.ngram_agreeing[pos] if self.ngram_agreeing else 1
        branches = self.ngram_branches[pos] if self.ngram_branches else ()
        return NgramCandidate(
            self.ngram_proposal[pos][:k_cap],
            self.ngram_match_len[pos],
            occurrences,
            agreeing,
            branches,
        )

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TraceSet:
    path: str
    target: str
    draft: str
    meta: dict
    prompts: tuple[PromptTrace, ...]


def load_traces(path: str | Path) -> TraceSet:
    """A trace file, or every *.json trace in a folder merged. Raises ValueError if malformed."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no trace files in {path}")
    sets = [_load_trace_file(f) for f in files]
    first = sets[0]
    return TraceSet(
        str(path),
        first.target,
        first.draft,
        first.meta,
        tuple(p for s in sets for p in s.prompts),
    )


def _load_trace_file(path: Path) -> TraceSet:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != TRACE_SCHEMA or data.get("kind") != "edge_spec.acceptance_trace":
        raise ValueError(f"{path}: not an edge_spec acceptance trace (schema {TRACE_SCHEMA})")
    prompts = []
    for raw in data["prompts"]:
        n = len(raw["tokens"])
        model, ngram = raw["model"], raw["ngram"]
        trace = PromptTrace(
            id=raw["id"],
            category=raw["category"],
            tokens=tuple(raw["tokens"]),
            model_agree=tuple(model["agree"]),
            model_confidence=tuple(tuple(c) for c in model["confidence"]),
            ngram_agree=tuple(ngram["agree"]),
            ngram_proposal=tuple(tuple(p) for p in ngram["proposal"]),
            ngram_match_len=tuple(ngram["match_len"]),
            ngram_occurrences=tuple(ngram.get("n_occurrences", ())),
            ngram_agreeing=tuple(ngram.get("n_agreeing", ())),
            ngram_branches=tuple(
                tuple(Branch(int(d), tuple(t), tuple(w)) for d, t, w in at)
                for at in ngram.get("branches", ())
            ),
            model_alternates=tuple(
                tuple((int(t), float(w)) for t, w in at) for at in model.get("alternates", ())
            ),
        )
        lengths = {
            len(trace.model_agree),
            len(trace.model_confidence),
            len(trace.ngram_agree),
            len(trace.ngram_proposal),
            len(trace.ngram_match_len),
            *(
                len(c)
                for c in (
                    trace.ngram_occurrences,
                    trace.ngram_agreeing,
                    trace.ngram_branches,
                    trace.model_alternates,
                )
                if c
            ),
        }
        if lengths != {n}:
            raise ValueError(f"{path}: prompt {trace.id}: per-position lists differ in length")
        prompts.append(trace)
    meta = {k: v for k, v in data.items() if k != "prompts"}
    return TraceSet(str(path), data["target"], data["draft"], meta, tuple(prompts))
