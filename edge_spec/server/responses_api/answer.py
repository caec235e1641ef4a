"""A Responses API answer: the `response` object, or its stream of typed events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_spec.api import GenerationResult, TokenLogprob
from edge_spec.server.responses import ContentGate, Envelope, logprob_entry, speculative_stats
from edge_spec.server.responses_api.request import ResponseEcho


def _usage(result: GenerationResult) -> dict[str, Any]:
    n_input, n_output = len(result.prompt_token_ids), len(result.token_ids)
    return {
        "input_tokens": n_input,
        # Prompt tokens whose KV the target kept from the request before.
        "input_tokens_details": {
            "cached_tokens": result.stats.n_cached_tokens,
            "cache_write_tokens": 0,
        },
        "output_tokens": n_output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_input + n_output,
    }


@dataclass(frozen=True)
class ResponseShape:
    """How a /v1/responses request is answered: a `response` object, or its events.
    `remember` is given each finished response's turn (input and answer as chat messages)."""

    env: Envelope
    echo: ResponseEcho
    tools: bool = False
    param: str = "input"
    remember: Callable[[list[dict[str, Any]]], None] | None = None

    def response(
        self, status: str, output: list[dict[str, Any]], result: GenerationResult | None = None
    ) -> dict[str, Any]:
        e = self.echo
        return {
            "id": self.env.id,
            "object": "response",
            "created_at": self.env.created,
            "status": status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.env.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "prompt_cache_key": e.prompt_cache_key,
            "store": e.store,
            "temperature": e.temperature,
            "text": {"format": e.text_format},
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "metadata": e.metadata,
            "usage": None if result is None else _usage(result),
            **({} if result is None else {"edge_spec": speculative_stats(result)}),
        }

    def finished(
        self, result: GenerationResult, text: str, message_id: str, message: bool = False
    ) -> dict[str, Any]:
        """The whole response to a finished generation whose message text is `text`: a message
        unless the answer is only tool calls (or `message` asks for one), then the calls."""
        status = "incomplete" if result.finish_reason in ("length", "context") else "completed"
        with_message = message or not result.tool_calls or bool(text.strip())
        scored = result.logprobs or ()
        output = [_message(message_id, text, scored=scored)] if with_message else []
        output += [_call_item(call.id, call.name, call.arguments) for call in result.tool_calls]
        if self.remember is not None:
            answer: dict[str, Any] = {"role": "assistant", "content": text}
            if result.tool_calls:
                answer["tool_calls"] = [call.to_dict() for call in result.tool_calls]
            self.remember([*self.echo.turn, answer])
        return self.response(status, output, result)

    def body(self, result: GenerationResult) -> dict[str, Any]:
        return self.finished(result, result.reply, _item_id("msg"))

    def events(self) -> ResponseEvents:
        return ResponseEvents(self)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output_text(text: str, scored: tuple[TokenLogprob, ...] = ()) -> dict[str, Any]:
    logprobs = [logprob_entry(t, top=True) for t in scored]
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _message(
    item_id: str, text: str, status: str = "completed", scored: tuple[TokenLogprob, ...] = ()
) -> dict[str, Any]:
    content = [_output_text(text, scored)] if status == "completed" else []
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(
    call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    item_id = "fc_" + call_id.removeprefix("call_")
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponseEvents:
    """A streamed response's typed events: response.created, the message's text deltas as the
    answer is verified (held back where a tool call may begin), each function call's item,
    then response.completed (or .incomplete) with the whole response."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape
        self.gate = ContentGate() if shape.tools else None
        self.sequence = 0
        self.message_id = _item_id("msg")
        self.opened = False
        self.text = ""
        self.scored: list[TokenLogprob] = []  # logprobs not sent yet (their text held back)

    def _event(self, kind: str, **fields: Any) -> dict[str, str]:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return {"event": kind, "data": json.dumps(data)}

    def opening(self) -> list[dict[str, str]]:
        shell = self.shape.response("in_progress", [])
        return [
            self._event("response.created", response=shell),
            self._event("response.in_progress", response=shell),
        ]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": 0, "content_index": 0}

    def _text(self, text: str, scored: tuple[TokenLogprob, ...]) -> list[dict[str, str]]:
        self.scored += scored
        if not text:
            return []
        events = []
        if not self.opened:
            events += self._open()
        self.text += text
        logprobs = [logprob_entry(t, top=True) for t in self.scored]
        self.scored = []
        events.append(
            self._event(
                "response.output_text.delta", **self._where(), delta=text, logprobs=logprobs
            )
        )
        return events

    def _open(self) -> list[dict[str, str]]:
        self.opened = True
        item = _message(self.message_id, "", "in_progress")
        return [
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", **self._where(), part=_output_text("")),
        ]

    def delta(self, text: str, scored: tuple[TokenLogprob, ...] = ()) -> list[dict[str, str]]:
        return self._text(text if self.gate is None else self.gate.feed(text), scored)

    def final(
        self, text: str, result: GenerationResult, scored: tuple[TokenLogprob, ...] = ()
    ) -> list[dict[str, str]]:
        if self.gate is not None:
            text = self.gate.feed(text) + self.gate.rest(bool(result.tool_calls))
        events = self._text(text, scored)
        response = self.shape.finished(result, self.text, self.message_id, self.opened)
        index = 0
        for item in response["output"]:
            if item["type"] == "message":
                if not self.opened:
                    events += self._open()
                part = item["content"][0]
                events += [
                    self._event(
                        "response.output_text.done",
                        **self._where(),
                        text=self.text,
                        logprobs=part["logprobs"],
                    ),
                    self._event("response.content_part.done", **self._where(), part=part),
                    self._event("response.output_item.done", output_index=0, item=item),
                ]
            else:
                where = {"item_id": item["id"], "output_index": index}
                events += [
                    self._event(
                        "response.output_item.added",
                        output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"},
                    ),
                    self._event(
                        "response.function_call_arguments.delta", **where, delta=item["arguments"]
                    ),
                    self._event(
                        "response.function_call_arguments.done",
                        **where,
                        arguments=item["arguments"],
                    ),
                    self._event("response.output_item.done", output_index=index, item=item),
                ]
            index += 1
        done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append(self._event(done, response=response))
        return events

    def error(self, body: dict[str, Any]) -> list[dict[str, str]]:
        error = body.get("error", {})
        return [
            self._event(
                "error",
                message=error.get("message", ""),
                code=error.get("code"),
                param=error.get("param"),
            )
        ]
