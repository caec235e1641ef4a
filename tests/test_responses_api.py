"""OpenAI's Responses API (/v1/responses), its pure parts: a request becomes the same generation
as the equivalent chat request, bad requests get a 400 naming the field, and the answer (body
and stream of events) parses as the openai package's own types. The live server's end-to-end
checks through the openai client are in test_server.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from results import made_up_result

from edge_spec.api import GenerationConfig, GenerationResult
from edge_spec.constrain.tools import ToolCall
from edge_spec.server.responses import Envelope
from edge_spec.server.responses_api import ResponseShape, ResponseStore, parse_responses
from edge_spec.server.schemas import APIError, RequestLimits, parse_chat

LIMITS = RequestLimits(GenerationConfig(k=3, k_max=6), max_tokens_limit=256)
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EVENTS = TypeAdapter(ResponseStreamEvent)


def test_a_responses_request_is_the_equivalent_chat_request() -> None:
    """Instructions, input items (text parts, an earlier call and its output), function tools,
    a named tool_choice, text.format and max_output_tokens map onto the chat fields."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    responses, echo = parse_responses(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Rome?"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                 "arguments": '{"city": "Rome"}', "id": "fc_1", "status": "completed"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "message", "role": "developer", "content": "Answer in JSON."},
            ],
            "tools": [{"type": "function", **WEATHER}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 40,
            "temperature": 0.5,
            "seed": 3,
            "store": False,
        },
        LIMITS,
    )  # fmt: skip
    chat = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "system", "content": "Answer in JSON."},
            ],
            "tools": [{"type": "function", "function": WEATHER}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_completion_tokens": 40,
            "temperature": 0.5,
            "seed": 3,
        },
        LIMITS,
    )  # fmt: skip
    assert responses == chat
    assert echo.tool_choice == {"type": "function", "name": "get_weather"}
    assert echo.store is False and echo.max_output_tokens == 40

    formatted, _ = parse_responses(
        {
            "model": "m",
            "input": "Is it?",
            "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}},
        },
        LIMITS,
    )
    as_chat = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Is it?"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema},
            },
        },
        LIMITS,
    )
    assert formatted == as_chat and formatted.config.constraint is not None


def test_included_logprobs_are_the_chat_logprobs() -> None:
    req, _ = parse_responses(
        {
            "model": "m",
            "input": "Hi",
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 4,
        },
        LIMITS,
    )
    assert req.config.logprobs == 4
    assert parse_responses({"model": "m", "input": "Hi"}, LIMITS)[0].config.logprobs is None


def test_an_assistant_message_and_its_calls_are_one_chat_message() -> None:
    """Our own output replayed as input (a message item, then its function_call items) is one
    assistant turn with content and tool_calls, as the chat API would send it."""
    req, _ = parse_responses(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "Weather in Rome and Oslo?"},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                {"type": "function_call", "call_id": "a", "name": "get_weather",
                 "arguments": '{"city": "Rome"}'},
                {"type": "function_call", "call_id": "b", "name": "get_weather",
                 "arguments": '{"city": "Oslo"}'},
            ],
        },
        LIMITS,
    )  # fmt: skip
    assert req.messages is not None
    assistant = req.messages[1]
    assert assistant["content"] == "Checking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": 5}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": "ten"}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0]"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0]"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text"),
        ({"temperature": 3}, "temperature"),
        ({"store": "yes"}, "store"),
        ({"instructions": 5}, "instructions"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"model": ""}, "model"),
    ],
)
def test_bad_responses_requests_name_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_responses({"model": "m", "input": "Hi", **extra}, LIMITS)
    assert err.value.status == 400
    assert err.value.param is not None and err.value.param.startswith(param), err.value.param


def _result(text: str, finish: str, calls: tuple[ToolCall, ...] = ()) -> GenerationResult:
    return made_up_result(
        text, finish, tool_calls=calls, content="Let me check. " if calls else None
    )


def _shape(tools: bool) -> ResponseShape:
    body: dict[str, Any] = {"model": "m", "input": "Hi"}
    if tools:
        body["tools"] = [{"type": "function", **WEATHER}]
    _, echo = parse_responses(body, LIMITS)
    return ResponseShape(Envelope(chat=True, model="m", id="resp_1"), echo, tools=tools)


CALL = ToolCall("call_1", "get_weather", '{"city": "Rome"}')


@pytest.mark.parametrize(
    ("text", "finish", "calls", "status"),
    [
        ("Hello there.", "eos", (), "completed"),
        ("Hello", "length", (), "incomplete"),
        ('Let me check. <tool_call>{"name": ...}</tool_call>', "tool_calls", (CALL,), "completed"),
    ],
)
def test_the_body_and_the_stream_parse_as_the_openai_types_and_agree(
    text: str, finish: str, calls: tuple[ToolCall, ...], status: str
) -> None:
    """The body validates as openai's Response; the stream's events each as a typed event, in
    sequence, the text deltas adding up to the message, ending in the same response."""
    result = _result(text, finish, calls)
    shape = _shape(tools=bool(calls))
    body = Response.model_validate(shape.body(result))
    assert body.status == status and body.model_extra is not None
    assert body.model_extra["edge_spec"]["n_accepted"] == 0
    assert body.usage is not None and body.usage.total_tokens == 5
    assert [o.type for o in body.output] == ["message"] + ["function_call"] * len(calls)
    assert body.output_text == (result.content if calls else text)

    events = shape.events()
    raw = events.opening()
    pieces = [text[:5], text[5:9], text[9:]] if not calls else ["Let me check. <tool", "_call>"]
    for piece in pieces:
        raw += events.delta(piece)
    raw += events.final("", result)
    parsed = [EVENTS.validate_python(json.loads(e["data"])) for e in raw]
    assert [e["event"] for e in raw] == [p.type for p in parsed]
    assert [p.sequence_number for p in parsed] == list(range(len(parsed)))
    assert parsed[0].type == "response.created" and parsed[0].response.status == "in_progress"
    last = parsed[-1]
    assert last.type == f"response.{status}"
    streamed = "".join(p.delta for p in parsed if p.type == "response.output_text.delta")
    assert last.response.output_text == streamed
    assert streamed.strip() == body.output_text.strip()
    if calls:
        done = [p for p in parsed if p.type == "response.function_call_arguments.done"]
        assert [d.arguments for d in done] == [CALL.arguments]
        assert last.response.output[-1].call_id == CALL.id
        assert "<tool_call>" not in streamed


def test_an_error_mid_stream_is_an_error_event() -> None:
    events = _shape(tools=False).events()
    raw = events.opening() + events.delta("Hi")
    raw += events.error({"error": {"message": "lost", "code": "rpc_server_lost", "param": None}})
    parsed = EVENTS.validate_python(json.loads(raw[-1]["data"]))
    assert parsed.type == "error" and parsed.message == "lost"


def test_stored_turns_make_the_conversation_per_key_and_expire_oldest_first() -> None:
    """A chain's turns come back oldest first; another key cannot reach them; a conversation
    one of whose turns went out (least recently used first) is a 404."""
    store = ResponseStore(max_responses=3)
    store.put(
        "a", "r1", None, [{"role": "user", "content": "1"}, {"role": "assistant", "content": "one"}]
    )
    store.put(
        "a", "r2", "r1", [{"role": "user", "content": "2"}, {"role": "assistant", "content": "two"}]
    )
    assert [m["content"] for m in store.conversation("a", "r2")] == ["1", "one", "2", "two"]
    for scope, response_id in (("b", "r2"), ("a", "r9")):
        with pytest.raises(APIError) as err:
            store.conversation(scope, response_id)
        assert err.value.status == 404 and err.value.param == "previous_response_id"
    # Reading r2 used r1 last: r1 is now the most recently used, r2 the least.
    store.put("a", "x1", None, [])
    store.put("a", "x2", None, [])
    with pytest.raises(APIError, match="not found$"):
        store.conversation("a", "r2")
    assert [m["content"] for m in store.conversation("a", "r1")] == ["1", "one"]
    fresh = ResponseStore(max_responses=3)
    fresh.put("a", "r1", None, [])
    fresh.put("a", "r2", "r1", [])
    fresh.put("a", "x1", None, [])
    fresh.put("a", "x2", None, [])  # r1, the least recently used, goes out before its child
    with pytest.raises(APIError, match="expired"):
        fresh.conversation("a", "r2")


def test_a_previous_response_comes_before_the_input_and_instructions_first() -> None:
    history = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "OK."},
    ]
    req, echo = parse_responses(
        {"model": "m", "input": "Name?", "instructions": "Be brief.", "previous_response_id": "r1"},
        LIMITS,
        history,
    )
    assert req.messages is not None
    assert [m["content"] for m in req.messages] == ["Be brief.", "My name is Ada.", "OK.", "Name?"]
    assert echo.turn == ({"role": "user", "content": "Name?"},)
    assert echo.previous_response_id == "r1" and echo.store is True
