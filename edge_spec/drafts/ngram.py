"""Draft-free drafting: the context (and earlier requests) repeating itself.

Finds the longest suffix n-gram of the context (max_ngram down to min_ngram tokens) that
occurred before, in this request's context or in the session's earlier requests (their prompts
and outputs), and proposes the tokens that followed it. Among the recent occurrences of that
n-gram it takes the one whose agreement with the context reaches furthest back (a suffix
match, as in SuffixDecoding), ties to the most recent. The match length it reports (up to
MAX_MATCH tokens) is what the cost policy keys its acceptance estimates on: a 20-token match
predicts a long copy far better than a 2-token one. When the copied occurrence is so recent
that its continuation runs into the end of the context, the text is repeating itself with that
period (a loop, frequent in small models' greedy output) and the proposal goes on around it.
Where the other occurrences went on differently, the candidate can also carry those
continuations as branches with how many occurrences took each (asked for with
`branches=True`): the nodes of a token tree, weighted as SuffixDecoding weights its tree.
Deterministic, so it carries no p_draft; verification treats each token as a point mass.

It runs on every step of the auto mode, so it keeps an index that grows with the context
instead of scanning it each step; `lookup` is the plain scan, the reference the index is
tested against.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from edge_spec.backend import common_prefix
from edge_spec.drafts.base import Draft, KeepDrafting
from edge_spec.drafts.candidates import NO_MATCH, Branch, NgramCandidate
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import SamplingParams

MAX_MATCH = 32  # how far back a match is extended when comparing occurrences
N_RECENT = 16  # occurrences kept per n-gram
# Longer n-grams indexed besides 1..max_ngram. A short n-gram's 16 most recent occurrences
# often miss the place a copy comes from (in code, "    return self" recurs on every other
# line); an 8-gram's rarely do. Replayed on the agentic bench's sessions
# (scripts/replay_ngram.py FOLDER --strategy ngram, in git history): 2.38x -> 2.44x,
# retrieval 2.90x -> 3.20x;
# neutral on the 48-prompt benches of both pairs.
LONG_NGRAMS = (8, 16)
# What an index holds in memory, estimated from above: per distinct n-gram, per token of the
# n-grams' keys, per occurrence recorded (one per token and n-gram length) and per token kept.
# Fitted with tracemalloc on random tokens over 50 and 49k ids (1.18-1.25x the allocation) and
# checked on real text (scripts/measure_session_index.py, in git history; the random-token
# bounds are a test).
KEY_BYTES = 220
KEY_TOKEN_BYTES = 8
OCCURRENCE_BYTES = 60
TOKEN_BYTES = 8


# A session named "scope<SCOPE_SEP>name" belongs to that scope (the server: one per API key);
# the bounds apply per scope, so one scope's sessions never push out another's.
SCOPE_SEP = "\x1f"


def _scope(session: str) -> str:
    return session.partition(SCOPE_SEP)[0] if SCOPE_SEP in session else ""


class NgramDraft:
    """The lookup over the live request and, when one is selected, a session: the earlier
    requests of one conversation. Sessions are kept by name, the least recently used dropped
    beyond max_sessions (and session_bytes), counted per scope (SCOPE_SEP); no session (None)
    drafts from the live request alone."""

    name = "ngram"
    decode_s = 0.0

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        session_tokens: int = 0,
        max_sessions: int = 16,
        session_bytes: int | None = None,
    ) -> None:
        """session_tokens: how many tokens of a session's earlier requests (prompts and
        outputs) to keep drafting from; 0 drafts from the current request only.
        session_bytes: what all sessions together may hold (their estimated bytes); beyond it
        the least recently used sessions go first, then the oldest requests of the one in
        use. Checked whenever a request selects its session. None: no byte bound."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if session_tokens < 0 or max_sessions < 1 or (session_bytes or 0) < 0:
            raise ValueError(
                f"need session_tokens >= 0, max_sessions >= 1 and session_bytes >= 0, got "
                f"{session_tokens}, {max_sessions}, {session_bytes}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.session_tokens = session_tokens
        self.max_sessions = max_sessions
        self.session_bytes = session_bytes
        self._sessions: OrderedDict[str, NgramIndex] = OrderedDict()
        self._index = NgramIndex(max_ngram, session_tokens)  # until select() says otherwise

    def select(self, session: str | None) -> None:
        """Draft the next requests within this session (None: from each request alone)."""
        if session is None or self.session_tokens <= 0:
            self._index = NgramIndex(self.max_ngram)
            return
        index = self._sessions.pop(session, None)
        if index is None:
            index = NgramIndex(self.max_ngram, self.session_tokens)
        self._sessions[session] = index  # most recently used last
        scope = _scope(session)
        mine = [name for name in self._sessions if _scope(name) == scope]  # oldest first
        while len(mine) > self.max_sessions:
            del self._sessions[mine.pop(0)]
        if self.session_bytes is not None:
            while len(mine) > 1 and self.bytes_estimate(scope) > self.session_bytes:
                del self._sessions[mine.pop(0)]
            index.shrink(self.session_bytes)
        self._index = index

    def bytes_estimate(self, scope: str | None = None) -> int:
        """What the kept sessions (of one scope, or of all) hold in memory, from above."""
        return sum(
            index.bytes_estimate()
            for name, index in self._sessions.items()
            if scope is None or _scope(name) == scope
        )

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request: its prompt is indexed now, with the prefill (the engine passes the
        list its steps then grow), not in the first step."""
        self._index.new_document()
        self._index.update(prompt)

    def clear_session(self, session: str | None = None) -> None:
        """Forget one session's earlier requests, or every session's (None)."""
        if session is None:
            self._sessions.clear()
        else:
            self._sessions.pop(session, None)
        self._index = NgramIndex(self.max_ngram)

    def candidate(self, context: Sequence[int], k: int, branches: bool = False) -> NgramCandidate:
        """What a proposal of up to k tokens would be, with the length of the match and how
        the matched n-gram's occurrences continued (with `branches`, also where they went
        other ways, for a token tree)."""
        return self._index.lookup(context, k, self.min_ngram, branches)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        return Draft(tokens=self.candidate(context, k).tokens)


class NgramIndex:
    """The n-grams (n <= max_ngram) of a growing context and of earlier documents (the
    session), each with where its N_RECENT most recent occurrences ended. Updating costs
    max_ngram dict writes per new token; a lookup, max_ngram reads and at most N_RECENT
    backward comparisons of up to MAX_MATCH tokens."""

    def __init__(self, max_ngram: int, session_tokens: int = 0) -> None:
        self.max_ngram = max_ngram
        self.sizes = ngram_sizes(max_ngram)
        self.session_tokens = session_tokens
        self._docs: list[list[int]] = [[]]  # earlier documents, then the live one (last)
        self._first = 0  # id of self._docs[0] (ids grow; old documents are dropped)
        self._ends: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # -> [(doc id, end)]
        self._key_tokens = 0  # the keys' lengths summed
        self._context: Sequence[int] | None = None  # the sequence the live document follows

    @property
    def _live(self) -> list[int]:
        return self._docs[-1]

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self._docs))

    def bytes_estimate(self) -> int:
        """Its memory, estimated from above (the constants' comment)."""
        n_tokens = self.n_tokens
        return (
            KEY_BYTES * len(self._ends)
            + KEY_TOKEN_BYTES * self._key_tokens
            + (OCCURRENCE_BYTES * len(self.sizes) + TOKEN_BYTES) * n_tokens
        )

    def shrink(self, max_bytes: int) -> None:
        """Drop the oldest documents, but the live one, while over max_bytes."""
        while len(self._docs) > 1 and self.bytes_estimate() > max_bytes:
            self._drop_oldest()

    def new_document(self) -> None:
        """The live context becomes part of the session (or is forgotten without one)."""
        self._context = None
        if self.session_tokens <= 0:
            self._docs, self._first, self._ends = [[]], 0, {}
            self._key_tokens = 0
            return
        if not self._live:  # nothing indexed yet: keep using it
            return
        self._docs.append([])
        while len(self._docs) > 1 and sum(map(len, self._docs)) > self.session_tokens:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self._docs.pop(0)
        self._first += 1
        self._ends = {
            key: kept
            for key, ends in self._ends.items()
            if (kept := [(d, e) for d, e in ends if d >= self._first])
        }
        self._key_tokens = sum(map(len, self._ends))

    def lookup(
        self, context: Sequence[int], k: int, min_ngram: int, branches: bool = False
    ) -> NgramCandidate:
        """The same answer as `lookup(context, k, max_ngram, min_ngram, history, branches)`
        with the session's documents as history."""
        self.update(context)
        if k <= 0:
            return NO_MATCH
        n, ends = self._longest(context, min_ngram)
        if not ends:
            return NO_MATCH
        # (the occurrence's document, its end, its match length); the live document
        # is read from the context itself, which also holds its last token.
        docs, first = self._docs, self._first
        live_doc = first + len(docs) - 1
        scored = [
            (src, e, _extend(src, e, context, n))
            for d, e in reversed(ends)
            for src in (context if d == live_doc else docs[d - first],)
        ]
        # The first of ties: the most recent.
        best = max(range(len(scored)), key=lambda i: scored[i][2])
        source, end, match = scored[best]
        tokens = _continuation(source, end, k, periodic=source is context)
        agreeing = _n_following(scored, tokens)
        forks = _branches(scored, best, tokens, k) if branches else ()
        return NgramCandidate(tokens, match, len(scored), agreeing, forks)

    def update(self, context: Sequence[int]) -> None:
        """Index the n-grams of `context` not indexed yet: its new tokens when it extends the
        live document, else all of it as a new document."""
        live = self._live
        n_ctx, n_seen = len(context), len(live)
        # The engine passes one list that only grows: then the prefix need not be compared.
        grown = context is self._context and n_ctx > n_seen
        if not grown and (n_ctx <= n_seen or list(context[:n_seen]) != live):
            self.new_document()  # not an extension of the live document: a new one
            live, n_seen = self._live, 0
        self._context = context
        doc = self._first + len(self._docs) - 1
        # Index every n-gram ending before the last position: the suffix itself must not match.
        for end in range(n_seen + 1, n_ctx):
            for n in self.sizes:
                if n > end:
                    break
                key = tuple(context[end - n : end])
                ends = self._ends.get(key)
                if ends is None:
                    ends = self._ends[key] = []
                    self._key_tokens += n
                ends.append((doc, end))
                if len(ends) > N_RECENT:
                    del ends[0]
        live.extend(context[n_seen : n_ctx - 1])

    def _longest(
        self, context: Sequence[int], min_ngram: int
    ) -> tuple[int, list[tuple[int, int]] | None]:
        """The longest indexed n (>= min_ngram, < len(context)) whose suffix n-gram occurred,
        with its occurrences (None: none did). An n-gram's occurrence holds every shorter
        suffix's, so the sizes are bisected: two or three dict reads instead of one per size."""
        n_ctx = len(context)
        sizes = [n for n in self.sizes if min_ngram <= n < n_ctx]
        best: tuple[int, list[tuple[int, int]] | None] = (0, None)
        lo, hi = 0, len(sizes)
        while lo < hi:
            mid = (lo + hi) // 2
            n = sizes[mid]
            ends = self._ends.get(tuple(context[n_ctx - n :]))
            if ends:
                best, lo = (n, ends), mid + 1
            else:
                hi = mid
        return best


def _continuation(source: Sequence[int], end: int, k: int, periodic: bool) -> tuple[int, ...]:
    """Up to k tokens of source from `end`. periodic: source is the live context, whose end a
    continuation may run into; the context then repeats with period len(source) - end, and the
    proposal goes on around the loop up to k tokens."""
    tokens = list(map(int, source[end : end + k]))
    if periodic and 0 < len(tokens) < k:
        period = len(tokens)
        for i in range(period, k):
            tokens.append(tokens[i - period])
    return tuple(tokens)


def _branches(
    occurrences: Sequence[tuple[Sequence[int], int, int]],
    best: int,
    tokens: tuple[int, ...],
    k: int,
) -> tuple[Branch, ...]:
    """The ways the occurrences (source, end, match), most recent first, went on other than
    the proposal `tokens` (copied from occurrences[best]): one branch per (fork depth, first
    differing token), its tokens from the most recent occurrence that went that way, its
    weights the share of all occurrences that went on with each of its prefixes; heaviest
    first, ties to the most recent."""
    groups: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    for i, (source, end, _) in enumerate(occurrences):
        if i == best:
            continue
        went = tuple(map(int, source[end : end + k]))
        depth = common_prefix(went, tokens)
        if depth < min(len(went), len(tokens)):  # else it agrees as far as either goes
            groups.setdefault((depth, went[depth]), []).append(went[depth:])
    n = len(occurrences)
    out = []
    for (depth, _), ways in groups.items():
        head = ways[0]  # the most recent
        if len(ways) == 1:
            out.append(Branch(depth, head, (1 / n,) * len(head)))
            continue
        # reach[j]: how many of them went on with head[: j + 1]
        ending = [0] * (len(head) + 1)  # ending[m]: how many agree with head for m tokens
        for way in ways:
            ending[common_prefix(way, head)] += 1
        reach, going = [], len(ways)
        for m in range(len(head)):
            going -= ending[m]
            reach.append(going / n)
        out.append(Branch(depth, head, tuple(reach)))
    out.sort(key=lambda branch: -branch.weights[0])  # stable: ties stay most recent first
    return tuple(out)


def _n_following(scored: Sequence[tuple[Sequence[int], int, int]], tokens: tuple[int, ...]) -> int:
    """How many of the occurrences (source, end, match) were followed by the proposal's first
    token (an earlier request's document ends before its last token: nothing follows there)."""
    if not tokens:
        return 0
    first = tokens[0]
    return sum(1 for source, end, _ in scored if end < len(source) and source[end] == first)


def _extend(source: Sequence[int], end: int, context: Sequence[int], n: int) -> int:
    """How many tokens before `end` in source agree with the end of context (>= n, the
    matched n-gram; at most MAX_MATCH)."""
    match = n
    limit = min(MAX_MATCH, end, len(context) - 1)
    if match >= limit or source[end - match - 1] != context[-match - 1]:
        return match  # most occurrences of a short n-gram
    n_ctx = len(context)
    if isinstance(source, list) and (
        source[end - limit : end - match] == context[n_ctx - limit : n_ctx - match]
    ):
        return limit  # a long copy (the index's documents are lists)
    while match < limit and source[end - match - 1] == context[-match - 1]:
        match += 1
    return match


def lookup(
    context: Sequence[int],
    k: int,
    max_ngram: int,
    min_ngram: int,
    history: Sequence[Sequence[int]] = (),
    branches: bool = False,
) -> NgramCandidate:
    """The reference: up to k tokens that followed an earlier occurrence of the longest
    matching suffix n-gram of `context` (in `history`, oldest first, or in context itself),
    the match length, and how many of the N_RECENT most recent occurrences there were and
    were followed by the proposal's first token. The occurrence copied is the one agreeing with
    the context furthest back (up to MAX_MATCH), ties to the most recent; NO_MATCH when nothing
    matches. With `branches`, also how the other occurrences went on (`_branches`). History
    documents are as the index holds them (each request's context but its last token); the
    context's own occurrences exclude its final position."""
    n_ctx = len(context)
    if k <= 0 or n_ctx < min_ngram + 1:
        return NO_MATCH
    docs = [np.asarray(d, dtype=np.int64) for d in history]
    ids = np.asarray(context, dtype=np.int64)
    docs.append(ids[:-1])
    for n in reversed(ngram_sizes(max_ngram)):
        if n > n_ctx - 1 or n < min_ngram:
            continue
        pattern = ids[-n:]
        hits = []  # (doc, end) in order of recency
        for d, doc in enumerate(docs):
            if doc.size < n:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(doc, n)
            hits += [(d, int(s) + n) for s in np.flatnonzero((windows == pattern).all(axis=1))]
        if hits:
            recent = hits[-N_RECENT:]
            scored = [
                (_extend(_full(d, docs, ids), e, context, n), i) for i, (d, e) in enumerate(recent)
            ]
            match, best = max(scored)
            d, end = recent[best]
            tokens = _continuation(_full(d, docs, ids), end, k, periodic=d == len(docs) - 1)
            agreeing = _n_following([(_full(d, docs, ids), e, 0) for d, e in recent], tokens)
            forks: tuple[Branch, ...] = ()
            if branches:
                newest_first = [(_full(d, docs, ids), e, 0) for d, e in reversed(recent)]
                forks = _branches(newest_first, len(recent) - 1 - best, tokens, k)
            return NgramCandidate(tokens, match, len(recent), agreeing, forks)
    return NO_MATCH


def ngram_sizes(max_ngram: int) -> tuple[int, ...]:
    """The n-gram lengths indexed, ascending: 1..max_ngram and the LONG_NGRAMS beyond it."""
    return tuple(range(1, max_ngram + 1)) + tuple(n for n in LONG_NGRAMS if n > max_ngram)


def _full(d: int, docs: list[np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Document d, the context itself (with its last token) for the last one."""
    return ids if d == len(docs) - 1 else docs[d]
