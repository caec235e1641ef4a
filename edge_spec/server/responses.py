"""Response bodies in the exact shapes the openai client parses, plus the `edge_spec` field that
carries each response's speculative statistics."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from edge_spec.api import GenerationResult

# Ours -> OpenAI's: a stop string and an end-of-generation token both end the text naturally;
# max_tokens and a full context both cut it.
FINISH_REASONS = {"stop": "stop", "eos": "stop", "length": "length", "context": "length"}


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


def usage(result: GenerationResult) -> dict[str, int]:
    n_prompt, n_completion = len(result.prompt_token_ids), len(result.token_ids)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
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
        "draft_mode": result.draft_mode,
        "draft_vocab": result.draft_vocab,  # "shared", "translated" or None
        "policy": result.policy,
        "finish_reason": result.finish_reason,  # ours, finer than OpenAI's
    }


def full_body(env: Envelope, result: GenerationResult) -> dict[str, Any]:
    """A non-streaming response."""
    finish = FINISH_REASONS[result.finish_reason]
    if env.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": None,
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {
        **env.head(),
        "choices": [choice],
        "usage": usage(result),
        "edge_spec": speculative_stats(result),
    }


def first_chunk(env: Envelope) -> dict[str, Any] | None:
    """Chat streams open with the assistant's role; completion streams need no opening."""
    if not env.chat:
        return None
    return {**env.head(True), "choices": [_choice(env, "", None, role=True)]}


def text_chunk(env: Envelope, text: str) -> dict[str, Any]:
    return {**env.head(True), "choices": [_choice(env, text, None)]}


def final_chunks(env: Envelope, tail: str, result: GenerationResult, include_usage: bool) -> list:
    """The chunk with finish_reason (and our stats), then the usage chunk if it was asked for."""
    last = {
        **env.head(True),
        "choices": [_choice(env, tail, FINISH_REASONS[result.finish_reason])],
        "edge_spec": speculative_stats(result),
    }
    if not include_usage:
        return [last]
    return [last, {**env.head(True), "choices": [], "usage": usage(result)}]


def _choice(env: Envelope, text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
    if env.chat:
        delta: dict[str, Any] = {"content": text} if text or role else {}
        if role:
            delta = {"role": "assistant", **delta}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


def model_card(model_id: str, created: int, details: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "edge-spec",
        "edge_spec": details,
    }
