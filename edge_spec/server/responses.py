"""Response bodies in the exact shapes the openai client parses, plus the `edge_spec` field that
carries each response's speculative statistics."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_spec.api import GenerationResult, TokenLogprob
from edge_spec.constrain.tools import GEMMA, HERMES

# Where a tool call can begin, in any family's format (constrain.tools).
CALL_BEGINS = (HERMES.begin.strip(), GEMMA.begin.strip())

# Ours -> OpenAI's: a stop string and an end-of-generation token both end the text naturally;
# max_tokens and a full context both cut it.
FINISH_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "length": "length",
    "context": "length",
    "tool_calls": "tool_calls",
}


@dataclass(frozen=True)
class Envelope:
    """What every body and chunk of one response shares."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.chat else "cmpl-"
            object.__setattr__(self, "id", prefix + uuid.uuid4().hex)

    def head(self, chunk: bool = False) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        if chunk and self.chat:
            kind = "chat.completion.chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def usage(result: GenerationResult, *more: GenerationResult, n: int = 1) -> dict[str, Any]:
    """Tokens of one answer, or of several (OpenAI's: n answers per prompt count each prompt
    once, and every answer's tokens)."""
    results = (result, *more)
    prompted = results[::n]
    n_prompt = sum(len(r.prompt_token_ids) for r in prompted)
    n_completion = sum(len(r.token_ids) for r in results)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
        # Prompt tokens whose KV the target kept from the request before (OpenAI's field).
        "prompt_tokens_details": {"cached_tokens": sum(r.stats.n_cached_tokens for r in prompted)},
    }


def speculative_stats(result: GenerationResult) -> dict[str, Any]:
    s = result.stats
    return {
        "n_drafted": s.n_drafted,
        "n_accepted": s.n_accepted,
        "acceptance_rate": s.acceptance_rate,
        "tokens_per_s": s.tokens_per_s,
        "time_to_first_token_s": s.time_to_first_token_s,
        "n_steps": s.n_steps,
        "tokens_per_step": s.tokens_per_step,
        "steps_by_source": dict(s.steps_by_source),
        "accepted_by_source": dict(s.accepted_by_source),  # "grammar": its forced text
        "constraint_s": s.constraint_s,  # grammar masks and checks (llguidance)
        "constraint_complete": result.constraint_complete,
        "draft_mode": result.draft_mode,
        "draft_vocab": result.draft_vocab,  # "shared", "translated" or None
        "policy": result.policy,
        "finish_reason": result.finish_reason,  # ours, finer than OpenAI's
    }


def full_body(
    env: Envelope, result: GenerationResult, *more: GenerationResult, n: int = 1
) -> dict[str, Any]:
    """A non-streaming response: one answer, or several (n per prompt), each its choice. Our
    stats are the first answer's, and with several each answer's in their `choices`."""
    results = (result, *more)
    choices = [{**_full_choice(env, r), "index": i} for i, r in enumerate(results)]
    stats = speculative_stats(result)
    if more:
        stats["choices"] = [speculative_stats(r) for r in results]
    return {
        **env.head(),
        "choices": choices,
        "usage": usage(*results, n=n),
        "edge_spec": stats,
    }


def _full_choice(env: Envelope, result: GenerationResult) -> dict[str, Any]:
    finish = FINISH_REASONS[result.finish_reason]
    if env.chat:
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            message["content"] = result.content
            message["tool_calls"] = [call.to_dict() for call in result.tool_calls]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs(env, result.logprobs),
            "finish_reason": finish,
        }
    else:
        scored = logprobs(env, _with_end(result, result.logprobs))
        choice = {"index": 0, "text": result.text, "logprobs": scored, "finish_reason": finish}
    return choice


def _with_end(
    result: GenerationResult, scored: tuple[TokenLogprob, ...] | None
) -> tuple[TokenLogprob, ...] | None:
    """A completion's logprobs end with its end-of-generation token's, where one ended it, as
    OpenAI's do (lm-evaluation-harness reads each answer's last entry as its generated token)."""
    if scored is None or result.end_logprob is None:
        return scored
    return (*scored, result.end_logprob)


def logprobs(
    env: Envelope, scored: tuple[TokenLogprob, ...] | None, offset: int = 0
) -> dict[str, Any] | None:
    """Tokens' logprobs in OpenAI's shape: chat's {content: [{token, logprob, bytes,
    top_logprobs}]}, or the completions' {tokens, token_logprobs, top_logprobs, text_offset}
    (offset: where the first token's text starts in the answer). None where none were asked."""
    if scored is None:
        return None
    if env.chat:
        return {"content": [logprob_entry(t, top=True) for t in scored], "refusal": None}
    offsets = []
    for t in scored:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in scored],
        "token_logprobs": [t.logprob for t in scored],
        # An echoed prompt's first token has no logprob, and no alternatives: null, as OpenAI's.
        "top_logprobs": [
            None if t.logprob is None else {u.token: u.logprob for u in t.top} for t in scored
        ],
        "text_offset": offsets,
    }


def logprob_entry(scored: TokenLogprob, top: bool = False) -> dict[str, Any]:
    entry = {"token": scored.token, "logprob": scored.logprob, "bytes": list(scored.token_bytes)}
    if top:
        entry["top_logprobs"] = [logprob_entry(t) for t in scored.top]
    return entry


def first_chunk(env: Envelope, index: int = 0) -> dict[str, Any] | None:
    """Chat streams open with the assistant's role; completion streams need no opening."""
    if not env.chat:
        return None
    return {**env.head(True), "choices": [_choice(env, "", None, role=True, index=index)]}


def text_chunk(
    env: Envelope, text: str, scored: dict[str, Any] | None = None, index: int = 0
) -> dict[str, Any]:
    return {**env.head(True), "choices": [_choice(env, text, None, scored=scored, index=index)]}


def final_chunks(
    env: Envelope,
    tail: str,
    result: GenerationResult,
    scored: dict[str, Any] | None = None,
    index: int = 0,
) -> list:
    """The tool calls' chunk, if the answer made calls; then the chunk with finish_reason (and
    our stats, and the logprobs of tokens not yet sent)."""
    calls = []
    if result.tool_calls:
        deltas = [{"index": i, **call.to_dict()} for i, call in enumerate(result.tool_calls)]
        choice = {"index": index, "delta": {"tool_calls": deltas}, "logprobs": None}
        calls.append({**env.head(True), "choices": [{**choice, "finish_reason": None}]})
        tail = ""
    finish = FINISH_REASONS[result.finish_reason]
    last = {
        **env.head(True),
        "choices": [_choice(env, tail, finish, scored=scored, index=index)],
        "edge_spec": speculative_stats(result),
    }
    return [*calls, last]


def usage_chunk(env: Envelope, *results: GenerationResult, n: int = 1) -> dict[str, Any]:
    return {**env.head(True), "choices": [], "usage": usage(*results, n=n)}


class Events(Protocol):
    """One streamed response's server-sent events, each a data string or an {event, data}
    mapping (sse-starlette's forms), made as the generation goes."""

    def opening(self) -> list[Any]: ...
    def delta(self, text: str, scored: tuple[TokenLogprob, ...] = ()) -> list[Any]: ...
    def final(
        self, text: str, result: GenerationResult, scored: tuple[TokenLogprob, ...] = ()
    ) -> list[Any]: ...
    def error(self, body: dict[str, Any]) -> list[Any]: ...


class Shape(Protocol):
    """How one API answers a generation: a JSON body, or a stream of Events."""

    @property
    def param(self) -> str: ...
    def body(self, result: GenerationResult) -> dict[str, Any]: ...
    def events(self) -> Events: ...


@dataclass(frozen=True)
class ChatShape:
    """How a chat or completion request is answered: its JSON body, or its stream's events.
    `param` names what a prompt too long for the context is blamed on."""

    env: Envelope
    include_usage: bool = False
    tools: bool = False
    n_choices: int = 1  # answers in the response, one after another
    n: int = 1  # of them, answers per prompt (usage counts each prompt once)

    @property
    def param(self) -> str:
        return "messages" if self.env.chat else "prompt"

    def body(self, result: GenerationResult, *more: GenerationResult) -> dict[str, Any]:
        return full_body(self.env, result, *more, n=self.n)

    def events(self) -> ChatEvents:
        return ChatEvents(self.env, self.include_usage, self.tools, self.n_choices, self.n)


class ChatEvents:
    """The server-sent events of one streamed chat or completion: the opening chunk, text chunks
    as the answer is verified (held back by a ContentGate where tool calls may begin), the
    final chunks, then [DONE]; or an error's body. Several answers (n, or several prompts) go
    one after another, each its choice's index; the usage chunk and [DONE] after the last."""

    def __init__(
        self, env: Envelope, include_usage: bool, tools: bool, n_choices: int = 1, n: int = 1
    ) -> None:
        self.env, self.include_usage, self.tools = env, include_usage, tools
        self.n_choices, self.n = n_choices, n
        self.results: list[GenerationResult] = []
        self._begin(0)

    def _begin(self, index: int) -> None:
        self.index = index
        self.gate = ContentGate() if self.tools else None
        self.scored: list[TokenLogprob] = []  # logprobs not sent yet (their text held back)
        self.offset = 0  # completions: where the next token's text starts

    def opening(self) -> list[str]:
        first = first_chunk(self.env, self.index)
        return [] if first is None else [json.dumps(first)]

    def delta(self, text: str, scored: tuple[TokenLogprob, ...] = ()) -> list[str]:
        text = text if self.gate is None else self.gate.feed(text)
        self.scored += scored
        if not text:
            return []
        return [json.dumps(text_chunk(self.env, text, self._take_scored(), self.index))]

    def final(
        self, text: str, result: GenerationResult, scored: tuple[TokenLogprob, ...] = ()
    ) -> list[str]:
        if self.gate is not None:
            text = self.gate.feed(text) + self.gate.rest(bool(result.tool_calls))
        self.scored += scored if self.env.chat else _with_end(result, scored) or ()
        pending = self._take_scored() if result.logprobs is not None else None
        chunks = final_chunks(self.env, text, result, pending, self.index)
        self.results.append(result)
        out = [json.dumps(chunk) for chunk in chunks]
        if len(self.results) < self.n_choices:
            self._begin(self.index + 1)
            return out + self.opening()
        if self.include_usage:
            out.append(json.dumps(usage_chunk(self.env, *self.results, n=self.n)))
        return [*out, "[DONE]"]

    def _take_scored(self) -> dict[str, Any] | None:
        if not self.scored:
            return None
        shaped = logprobs(self.env, tuple(self.scored), self.offset)
        self.offset += sum(len(t.token) for t in self.scored)
        self.scored = []
        return shaped

    def error(self, body: dict[str, Any]) -> list[str]:
        return [json.dumps(body)]


class ContentGate:
    """Streams an answer's text outside tool calls: what comes before a call goes out as it is
    verified; from where a call could begin (an opening of any family's call format, or the
    start of one at the end of the text so far) the text is held until the answer ends, when
    the calls go out as tool_calls (or the held text as content, if it was no call)."""

    def __init__(self, call_begins: tuple[str, ...] = CALL_BEGINS) -> None:
        self.begins = call_begins
        self.text = ""
        self.sent = 0
        self.holding = False

    def feed(self, text: str) -> str:
        """What of the text so far may go out now."""
        self.text += text
        if self.holding:
            return ""
        starts = [at for at in (self.text.find(b, self.sent) for b in self.begins) if at >= 0]
        if starts:
            self.holding = True
            end = min(starts)
        else:
            end = len(self.text) - max(_partial_suffix(self.text, b) for b in self.begins)
        out, self.sent = self.text[self.sent : end], max(end, self.sent)
        return out

    def rest(self, made_calls: bool) -> str:
        """At the end: the held text, unless it became calls."""
        return "" if made_calls else self.text[self.sent :]


def _partial_suffix(text: str, begin: str) -> int:
    """The length of the longest end of `text` that `begin` starts with."""
    for n in range(min(len(begin) - 1, len(text)), 0, -1):
        if begin.startswith(text[-n:]):
            return n
    return 0


def _choice(
    env: Envelope,
    text: str,
    finish: str | None,
    role: bool = False,
    scored: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    if env.chat:
        delta: dict[str, Any] = {"content": text} if text or role else {}
        if role:
            delta = {"role": "assistant", **delta}
        return {"index": index, "delta": delta, "logprobs": scored, "finish_reason": finish}
    return {"index": index, "text": text, "logprobs": scored, "finish_reason": finish}


def model_card(model_id: str, created: int, details: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "edge-spec",
        "edge_spec": details,
    }
