"""An Anthropic Messages API answer: the `message` object, or its stream of events
(message_start, content blocks as the answer is verified, message_delta, message_stop)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge_spec.api import GenerationResult, TokenLogprob
from edge_spec.constrain.tools import ToolCall
from edge_spec.server.responses import ContentGate, Envelope, speculative_stats

STOP_REASONS = {
    "stop": "stop_sequence",
    "eos": "end_turn",
    "length": "max_tokens",
    "context": "model_context_window_exceeded",
    "tool_calls": "tool_use",
}
# HTTP status -> Anthropic's error type.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape: {type: error, error: {type, message}}."""
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
    }


def _usage(result: GenerationResult | None, n_input: int = 0) -> dict[str, Any]:
    n_cached = result.stats.n_cached_tokens if result is not None else 0
    return {
        "input_tokens": len(result.prompt_token_ids) if result is not None else n_input,
        "output_tokens": len(result.token_ids) if result is not None else 0,
        "cache_read_input_tokens": n_cached,  # the KV prefix kept from the request before
        "cache_creation_input_tokens": 0,
    }


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments_object()}


@dataclass(frozen=True)
class MessageShape:
    """How a /v1/messages request is answered: a `message` object, or its events."""

    env: Envelope
    tools: bool = False
    param: str = "messages"

    def message(
        self, content: list[dict[str, Any]], result: GenerationResult | None
    ) -> dict[str, Any]:
        reason = STOP_REASONS[result.finish_reason] if result is not None else None
        body = {
            "id": self.env.id,
            "type": "message",
            "role": "assistant",
            "model": self.env.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": result.stop_string if result is not None else None,
            "usage": _usage(result),
        }
        if result is not None:
            body["edge_spec"] = speculative_stats(result)
        return body

    def blocks(self, result: GenerationResult, text: str) -> list[dict[str, Any]]:
        """The answer's content blocks: its text (unless it is only tool calls), then one
        tool_use block per call."""
        content = [] if result.tool_calls and not text.strip() else [{"type": "text", "text": text}]
        return content + [_tool_use(c) for c in result.tool_calls]

    def body(self, result: GenerationResult) -> dict[str, Any]:
        return self.message(self.blocks(result, result.reply), result)

    def events(self) -> MessageEvents:
        return MessageEvents(self)


class MessageEvents:
    """A streamed message's events, each named: message_start, the text block's deltas as the
    answer is verified (held back where a tool call may begin), one tool_use block per call
    (its input as one input_json_delta), message_delta (stop reason, usage), message_stop."""

    def __init__(self, shape: MessageShape) -> None:
        self.shape = shape
        self.gate = ContentGate() if shape.tools else None
        self.opened = False
        self.index = 0

    @staticmethod
    def _event(kind: str, **fields: Any) -> dict[str, str]:
        return {"event": kind, "data": json.dumps({"type": kind, **fields})}

    def opening(self) -> list[dict[str, str]]:
        return [self._event("message_start", message=self.shape.message([], None))]

    def _text(self, text: str) -> list[dict[str, str]]:
        if not text:
            return []
        events = []
        if not self.opened:
            self.opened = True
            block = {"type": "text", "text": ""}
            events.append(self._event("content_block_start", index=0, content_block=block))
        delta = {"type": "text_delta", "text": text}
        events.append(self._event("content_block_delta", index=0, delta=delta))
        return events

    def delta(self, text: str, scored: tuple[TokenLogprob, ...] = ()) -> list[dict[str, str]]:
        return self._text(text if self.gate is None else self.gate.feed(text))

    def final(
        self, text: str, result: GenerationResult, scored: tuple[TokenLogprob, ...] = ()
    ) -> list[dict[str, str]]:
        if self.gate is not None:
            text = self.gate.feed(text) + self.gate.rest(bool(result.tool_calls))
        events = self._text(text)
        index = 0
        if self.opened:
            events.append(self._event("content_block_stop", index=0))
            index = 1
        elif not result.tool_calls:  # an empty answer is still one text block
            events += [
                self._event(
                    "content_block_start", index=0, content_block={"type": "text", "text": ""}
                ),
                self._event("content_block_stop", index=0),
            ]
        for call in result.tool_calls:
            block = _tool_use(call)
            partial = json.dumps(block["input"], ensure_ascii=False)
            events += [
                self._event(
                    "content_block_start", index=index, content_block={**block, "input": {}}
                ),
                self._event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": partial},
                ),
                self._event("content_block_stop", index=index),
            ]
            index += 1
        stop = {
            "stop_reason": STOP_REASONS[result.finish_reason],
            "stop_sequence": result.stop_string,
        }
        usage = _usage(result)
        events += [
            self._event(
                "message_delta", delta=stop, usage=usage, edge_spec=speculative_stats(result)
            ),
            self._event("message_stop"),
        ]
        return events

    def error(self, body: dict[str, Any]) -> list[dict[str, str]]:
        error = body.get("error", {})
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        return [{"event": "error", "data": json.dumps(error_body(500, message))}]
