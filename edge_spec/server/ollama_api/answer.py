"""Ollama's answers: a chat or generate response object, or its stream of newline-delimited
JSON objects (one per verified piece of text, the last with `done: true`, the done reason and
Ollama's timings in nanoseconds); the model listings of /api/tags, /api/show and /api/ps."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from edge_spec.api import GenerationResult, TokenLogprob
from edge_spec.server.responses import ContentGate, speculative_stats

# Ours -> Ollama's: only max_tokens and a full context cut an answer.
DONE_REASONS = {"stop": "stop", "eos": "stop", "tool_calls": "stop", "length": "length"}
DONE_REASONS["context"] = "length"
_NS = 1_000_000_000


def now() -> str:
    """Ollama's created_at: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def error_line(message: str) -> str:
    return json.dumps({"error": message}) + "\n"


def timings(result: GenerationResult) -> dict[str, int]:
    """Ollama's metrics, in nanoseconds: the prompt's evaluation and the answer's."""
    s = result.stats
    return {
        "total_duration": int(s.total_s * _NS),
        "load_duration": 0,  # the server loaded its model at start
        "prompt_eval_count": len(result.prompt_token_ids),
        "prompt_eval_duration": int(s.prefill_s * _NS),
        "eval_count": len(result.token_ids),
        "eval_duration": int(max(s.total_s - s.prefill_s, 0.0) * _NS),
    }


def _tool_calls(result: GenerationResult) -> list[dict[str, Any]]:
    """Ollama's calls carry their arguments as an object."""
    return [
        {
            "id": call.id,
            "function": {"index": i, "name": call.name, "arguments": call.arguments_object()},
        }
        for i, call in enumerate(result.tool_calls)
    ]


def _logprobs(scored: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    def entry(t: TokenLogprob) -> dict[str, Any]:
        return {"token": t.token, "logprob": t.logprob, "bytes": list(t.token_bytes)}

    return [{**entry(t), "top_logprobs": [entry(u) for u in t.top]} for t in scored]


@dataclass(frozen=True)
class OllamaShape:
    """How /api/chat (chat) or /api/generate answers: one object, or newline-delimited ones."""

    model: str  # as the client named it
    chat: bool
    tools: bool = False
    logprobs: bool = False
    ndjson: bool = True  # app._serve streams lines, not server-sent events

    @property
    def param(self) -> str:
        return "messages" if self.chat else "prompt"

    def head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": now()}

    def piece(self, text: str, scored: tuple[TokenLogprob, ...] = ()) -> dict[str, Any]:
        """One object of the stream, not done."""
        body = {**self.head()}
        if self.chat:
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body["done"] = False
        if self.logprobs:
            body["logprobs"] = _logprobs(scored)
        return body

    def done(
        self, result: GenerationResult, text: str, scored: tuple[TokenLogprob, ...] = ()
    ) -> dict[str, Any]:
        body = self.piece(text, scored)
        body.update(
            done=True,
            done_reason=DONE_REASONS[result.finish_reason],
            **timings(result),
            edge_spec=speculative_stats(result),
        )
        return body

    def body(self, result: GenerationResult) -> dict[str, Any]:
        """The answer in one object (stream: false)."""
        text = result.content if result.tool_calls else result.text
        body = self.done(result, text, result.logprobs or ())
        if result.tool_calls:
            body["message"]["tool_calls"] = _tool_calls(result)
        return body

    def loaded(self) -> dict[str, Any]:
        """The answer to a request with nothing to generate: Ollama loads the model then."""
        body = self.piece("")
        body.pop("logprobs", None)
        return {**body, "done": True, "done_reason": "load"}

    def events(self) -> OllamaEvents:
        return OllamaEvents(self)


class OllamaEvents:
    """A streamed answer's lines: the text as it is verified (held back where a tool call may
    begin), then the calls in one object, then the done object with the timings."""

    def __init__(self, shape: OllamaShape) -> None:
        self.shape = shape
        self.gate = ContentGate() if shape.tools else None

    def _line(self, body: dict[str, Any]) -> str:
        return json.dumps(body, ensure_ascii=False) + "\n"

    def opening(self) -> list[str]:
        return []

    def delta(self, text: str, scored: tuple[TokenLogprob, ...] = ()) -> list[str]:
        if self.gate is not None:
            text = self.gate.feed(text)
        if not text and not (self.shape.logprobs and scored):
            return []
        return [self._line(self.shape.piece(text, scored))]

    def final(
        self, text: str, result: GenerationResult, scored: tuple[TokenLogprob, ...] = ()
    ) -> list[str]:
        if self.gate is not None:
            text = self.gate.feed(text) + self.gate.rest(bool(result.tool_calls))
        lines = []
        if result.tool_calls:
            if text or scored:
                lines.append(self._line(self.shape.piece(text, scored)))
                text, scored = "", ()
            calls = self.shape.piece("")
            calls.pop("logprobs", None)
            calls["message"]["tool_calls"] = _tool_calls(result)
            lines.append(self._line(calls))
        return [*lines, self._line(self.shape.done(result, text, scored))]

    def error(self, body: dict[str, Any]) -> list[str]:
        error = body.get("error", {})
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        return [error_line(message)]


def model_entry(name: str, info: Any, n_ctx: int) -> dict[str, Any]:
    """A model as /api/tags and /api/ps list it; `info` is the target's ModelInfo."""
    path = info.path
    modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    return {
        "name": name,
        "model": name,
        "modified_at": modified.isoformat().replace("+00:00", "Z"),
        "size": info.file_size_bytes,
        "digest": "",  # Ollama's is its manifest's hash; these files have no manifest
        "details": details(info),
        "context_length": n_ctx,
    }


def details(info: Any) -> dict[str, Any]:
    """Ollama's model details from llama.cpp's description ("gemma3 270M F16")."""
    words = str(info.description).split(" ", 2)
    quant = words[2] if len(words) == 3 else ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture] if info.architecture else None,
        "parameter_size": _size(info.n_params),
        "quantization_level": quant.replace(" - ", "_")
        .replace("Medium", "M")
        .replace("Small", "S"),
    }


def _quantization(name: str) -> str:
    """llama.cpp's "Q4_K - Medium" as Ollama writes it: "Q4_K_M"."""
    for long, short in (("Medium", "M"), ("Small", "S"), ("Large", "L")):
        name = name.replace(long, short)
    return name.replace(" - ", "_")


def _size(n_params: int) -> str:
    if n_params >= 10**9:
        return f"{n_params / 1e9:.1f}B"
    return f"{n_params / 1e6:.0f}M"
