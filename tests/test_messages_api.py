"""Anthropic's Messages API (/v1/messages), its pure parts: a request becomes the same
generation as the equivalent chat request, bad requests get a 400 naming the field, and the
answer (body and event stream) parses as the anthropic package's own types. The live server's
checks through Anthropic's client are in test_server.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter
from results import made_up_result

from edge_spec.api import GenerationConfig, GenerationResult
from edge_spec.constrain.tools import ToolCall
from edge_spec.server.messages_api import MessageShape, error_body, parse_messages
from edge_spec.server.responses import Envelope
from edge_spec.server.schemas import APIError, RequestLimits, parse_chat

LIMITS = RequestLimits(GenerationConfig(k=3, k_max=6), max_tokens_limit=256)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
EVENTS = TypeAdapter(RawMessageStreamEvent)
EPHEMERAL = {"type": "ephemeral"}
ROME = {"city": "Rome"}


def test_a_messages_request_is_the_equivalent_chat_request() -> None:
    """system, text blocks, an assistant's tool_use and the user's tool_result, tools,
    tool_choice, stop_sequences and max_tokens map onto the chat fields."""
    messages, chat = (
        parse_messages(
            {
                "model": "m",
                "max_tokens": 40,
                "system": [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}],
                "messages": [
                    {"role": "user", "content": "Weather in Rome?"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": ROME},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                        {"type": "text", "text": "And tomorrow?"},
                    ]},
                ],
                "tools": [{"name": "get_weather", "description": "Weather",
                           "input_schema": SCHEMA}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                "stop_sequences": ["\n\n"],
                "temperature": 0.5,
                "metadata": {"user_id": "u1"},
            },
            LIMITS,
        ),
        parse_chat(
            {
                "model": "m",
                "max_tokens": 40,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Weather in Rome?"},
                    {"role": "assistant", "content": "Checking.", "tool_calls": [
                        {"id": "t1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
                    {"role": "user", "content": "And tomorrow?"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "get_weather", "description": "Weather", "parameters": SCHEMA}}],
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "stop": ["\n\n"],
                "temperature": 0.5,
            },
            LIMITS,
        ),
    )  # fmt: skip
    assert messages == chat
    named = parse_messages(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"name": "get_weather", "input_schema": SCHEMA}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
        },
        LIMITS,
    )
    assert named.config.tool_choice is not None and named.config.tool_choice.name == "get_weather"
    formatted = parse_messages(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        },
        LIMITS,
    )
    assert formatted.config.constraint is not None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0]"),
        ({"system": 5}, "system"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"output_config": {"format": {"type": "yaml"}}}, "output_config"),
        ({"metadata": {"team": "a"}}, "metadata"),
        ({"container": "c1"}, "container"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_messages_requests_name_the_field(extra: dict[str, Any], param: str) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(APIError) as err:
        parse_messages({**body, **extra}, LIMITS)
    assert err.value.status == 400
    assert err.value.param is not None and err.value.param.startswith(param), err.value.param


def _result(text: str, finish: str, calls: tuple[ToolCall, ...] = ()) -> GenerationResult:
    return made_up_result(
        text,
        finish,
        tool_calls=calls,
        content="Let me check. " if calls else None,
        stop_string="\n\n" if finish == "stop" else None,
    )


CALL = ToolCall("call_1", "get_weather", '{"city": "Rome"}')


@pytest.mark.parametrize(
    ("text", "finish", "calls", "reason"),
    [
        ("Hello there.", "eos", (), "end_turn"),
        ("Hello", "length", (), "max_tokens"),
        ("Hello", "stop", (), "stop_sequence"),
        ('Let me check. <tool_call>{"name": ...}</tool_call>', "tool_calls", (CALL,), "tool_use"),
    ],
)
def test_the_body_and_the_stream_parse_as_the_anthropic_types_and_agree(
    text: str, finish: str, calls: tuple[ToolCall, ...], reason: str
) -> None:
    result = _result(text, finish, calls)
    shape = MessageShape(Envelope(chat=True, model="m", id="msg_1"), tools=bool(calls))
    body = Message.model_validate(shape.body(result))
    assert body.stop_reason == reason and body.usage.output_tokens == 2
    assert body.stop_sequence == result.stop_string
    assert [b.type for b in body.content] == ["text"] + ["tool_use"] * len(calls)
    events = shape.events()
    raw = events.opening()
    pieces = [text[:5], text[5:]] if not calls else ["Let me check. <tool", "_call>"]
    for piece in pieces:
        raw += events.delta(piece)
    raw += events.final("", result)
    parsed = [EVENTS.validate_python(json.loads(e["data"])) for e in raw]
    assert [e["event"] for e in raw] == [p.type for p in parsed]
    assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop"
    assert parsed[-2].type == "message_delta" and parsed[-2].delta.stop_reason == reason
    streamed = "".join(
        p.delta.text
        for p in parsed
        if p.type == "content_block_delta" and p.delta.type == "text_delta"
    )
    assert streamed.strip() == body.content[0].text.strip()
    if calls:
        inputs = [
            json.loads(p.delta.partial_json)
            for p in parsed
            if p.type == "content_block_delta" and p.delta.type == "input_json_delta"
        ]
        assert inputs == [{"city": "Rome"}] and "<tool_call>" not in streamed


def test_errors_take_anthropics_shape() -> None:
    assert error_body(400, "bad") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert error_body(503, "busy")["error"]["type"] == "overloaded_error"
    assert error_body(500, "?")["error"]["type"] == "api_error"
