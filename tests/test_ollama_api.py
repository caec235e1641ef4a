"""Ollama's API (/api/chat, /api/generate), its pure parts: a request becomes the same
generation as the equivalent OpenAI request with Ollama's defaults, bad requests get a 400
naming the field, and the answers (one object, or the newline-delimited stream) parse as the
`ollama` package's own types and add up to the same text. The live server's checks through
Ollama's client are in test_server.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ollama import ChatResponse, GenerateResponse
from results import made_up_result

from edge_spec.api import GenerationConfig, TokenLogprob
from edge_spec.constrain.spec import Constraint, closed
from edge_spec.constrain.tools import ToolCall
from edge_spec.server.ollama_api import OllamaShape, parse_ollama_chat, parse_ollama_generate
from edge_spec.server.ollama_api.routes import served_name
from edge_spec.server.schemas import APIError, RequestLimits, parse_chat, parse_completion

LIMITS = RequestLimits(GenerationConfig(k=3, k_max=6), max_tokens_limit=256)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0}


def test_a_chat_request_is_the_equivalent_openai_chat_with_ollamas_defaults() -> None:
    """Options left out take Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, a random
    seed, until the context is full); given ones map to the OpenAI fields; a call's arguments
    (an object) become JSON text and a tool result's tool_name its name; format a schema."""
    ollama = parse_ollama_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": "", "thinking": "hm", "tool_calls": [
                    {"function": {"index": 0, "name": "get_weather",
                                  "arguments": {"city": "Rome"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
                {"role": "USER", "content": "And tomorrow?"},
            ],
            "tools": [TOOL],
            "options": {"temperature": 0.2, "seed": 7, "num_predict": 40, "stop": ["\n\n"],
                        "num_ctx": 8192, "num_thread": 4, "repeat_last_n": -1,
                        "mirostat": 0, "typical_p": 1.0},
            "keep_alive": "5m",
            "stream": False,
        },
        LIMITS,
    )  # fmt: skip
    openai = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                {"role": "tool", "content": "sunny", "name": "get_weather"},
                {"role": "user", "content": "And tomorrow?"},
            ],
            "tools": [TOOL],
            "temperature": 0.2, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "seed": 7,
            "max_tokens": 40, "stop": ["\n\n"], "repeat_last_n": 1 << 20,
        },
        LIMITS,
    )  # fmt: skip
    assert ollama.parsed == openai and not ollama.stream and ollama.chat

    plain = parse_ollama_chat(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}, LIMITS
    )
    assert plain.stream  # Ollama streams unless told not to
    assert plain.parsed is not None
    assert plain.parsed == parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
            "max_tokens": LIMITS.max_tokens_limit,  # num_predict -1: until the context is full
            **OLLAMA_DEFAULTS,
        },
        LIMITS,
    )
    assert plain.parsed.config.sampling.seed is None  # seed -1 / none: a random one each time

    json_mode = parse_ollama_chat(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "format": "json"}, LIMITS
    )
    assert json_mode.parsed is not None and json_mode.parsed.config.constraint is not None
    assert json_mode.parsed.config.constraint.kind == "json_object"
    schema = parse_ollama_chat(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "format": WEATHER}, LIMITS
    )
    assert schema.parsed is not None and schema.parsed.config.constraint is not None
    assert json.loads(schema.parsed.config.constraint.source) == closed(WEATHER)
    scored = parse_ollama_chat(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "logprobs": True,
         "top_logprobs": 3},
        LIMITS,
    )  # fmt: skip
    assert scored.logprobs and scored.parsed is not None and scored.parsed.config.logprobs == 3


def test_generate_is_a_chat_turn_or_with_raw_the_prompt_as_it_is() -> None:
    templated = parse_ollama_generate(
        {"model": "m", "prompt": "Why?", "system": "Be brief.", "options": {"temperature": 0}},
        LIMITS,
    )
    assert templated.parsed == parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Why?"},
            ],
            "stream": True,
            "max_tokens": LIMITS.max_tokens_limit,
            **{**OLLAMA_DEFAULTS, "temperature": 0},
        },
        LIMITS,
    )
    raw = parse_ollama_generate(
        {"model": "m", "prompt": "Once", "raw": True, "stream": False, "logprobs": True,
         "options": {"num_predict": 5}},
        LIMITS,
    )  # fmt: skip
    expected = parse_completion(
        {"model": "m", "prompt": "Once", "max_tokens": 5, "stream": False, **OLLAMA_DEFAULTS},
        LIMITS,
    )
    assert raw.parsed is not None and not raw.chat
    assert raw.parsed.config.logprobs == 0 and raw.parsed.prompts == expected.prompts
    assert raw.parsed.config.sampling == expected.config.sampling
    # Nothing to generate: Ollama's "load the model" (answered without the worker).
    assert parse_ollama_generate({"model": "m"}, LIMITS).parsed is None
    assert parse_ollama_chat({"model": "m", "messages": []}, LIMITS).parsed is None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"options": {"mirostat": 2}}, "options"),
        ({"options": {"typical_p": 0.7}}, "options"),
        ({"options": {"temprature": 0.5}}, "options"),
        ({"options": {"temperature": 3}}, "temperature"),
        ({"options": {"num_predict": 10_000}}, "max_tokens"),
        ({"options": "fast"}, "options"),
        ({"think": True}, "think"),
        ({"format": "yaml"}, "format"),
        ({"truncate": True}, "truncate"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"keep_alive": [1]}, "keep_alive"),
        ({"model": ""}, "model"),
        ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x", "colour": "red"}]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
        ({"messages": "Hi"}, "messages"),
        ({"tools": {"name": "x"}}, "tools"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_chat_requests_name_the_field(extra: dict[str, Any], param: str | None) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **extra}
    with pytest.raises(APIError) as err:
        parse_ollama_chat(body, LIMITS)
    assert err.value.status == 400
    if param is not None:
        assert err.value.param is not None and err.value.param.startswith(param), err.value


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": "return x"}, "suffix"),
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"context": [1, 2, 3]}, "context"),
        ({"images": ["aGk="]}, "images"),
        ({"raw": True, "system": "x"}, "system"),
        ({"prompt": 5}, "prompt"),
        ({"raw": "yes"}, "raw"),
    ],
)
def test_bad_generate_requests_name_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_ollama_generate({"model": "m", "prompt": "Hi", **extra}, LIMITS)
    assert err.value.status == 400 and err.value.param == param


def _result(text: str, finish: str, calls: tuple[ToolCall, ...] = (), **fields: Any) -> Any:
    return made_up_result(
        text, finish, tool_calls=calls, content="Let me check. " if calls else None, **fields
    )


CALL = ToolCall("call_1", "get_weather", '{"city": "Rome"}')


REASONS = [("eos", "stop"), ("stop", "stop"), ("length", "length"), ("context", "length")]


@pytest.mark.parametrize(
    ("chat", "finish", "reason"),
    [(True, *r) for r in [*REASONS, ("tool_calls", "stop")]] + [(False, *r) for r in REASONS],
)
def test_answers_parse_as_ollamas_types_and_the_stream_adds_up(
    chat: bool, finish: str, reason: str
) -> None:
    calls = (CALL,) if finish == "tool_calls" else ()
    text = "Let me check. <tool_call>" if calls else "Hello there."
    result = _result(text, finish, calls)
    shape = OllamaShape("m:latest", chat, tools=bool(calls))
    kind = ChatResponse if chat else GenerateResponse
    body = kind.model_validate(shape.body(result))
    assert body.done and body.done_reason == reason and body.model == "m:latest"
    assert body.eval_count == 2 and body.prompt_eval_count == 3
    assert body.total_duration == 500_000_000  # nanoseconds
    events = shape.events()
    lines = events.opening() + events.delta(text[:5]) + events.delta(text[5:])
    lines += events.final("", result)
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    parsed = [kind.model_validate(json.loads(line)) for line in lines]
    assert [p.done for p in parsed] == [False] * (len(parsed) - 1) + [True]
    assert parsed[-1].done_reason == reason and parsed[-1].eval_count == 2
    if chat:
        assert isinstance(body, ChatResponse)
        streamed = "".join(p.message.content or "" for p in parsed)  # type: ignore[union-attr]
        assert streamed.strip() == (body.message.content or "").strip()
        called = [c for p in parsed for c in p.message.tool_calls or []]  # type: ignore[union-attr]
        assert [(c.function.name, dict(c.function.arguments)) for c in called] == [
            (c.function.name, dict(c.function.arguments)) for c in body.message.tool_calls or []
        ]
        assert [c.function.arguments for c in called] == ([{"city": "Rome"}] if calls else [])
        assert "<tool_call>" not in streamed
    else:
        assert isinstance(body, GenerateResponse)
        assert "".join(p.response or "" for p in parsed) == body.response == text


def test_logprobs_and_errors_take_ollamas_shape() -> None:
    top = (TokenLogprob(6, b" there", -0.25), TokenLogprob(7, b" you", -1.5))
    scored = (TokenLogprob(5, b"Hi", -0.5), TokenLogprob(6, b" there", -0.25, top))
    result = _result("Hi there", "eos", logprobs=scored)
    shape = OllamaShape("m", chat=True, logprobs=True)
    body = ChatResponse.model_validate(shape.body(result))
    assert [(p.token, p.logprob) for p in body.logprobs or []] == [("Hi", -0.5), (" there", -0.25)]
    assert [t.token for t in (body.logprobs or [])[1].top_logprobs or []] == [" there", " you"]
    line = shape.events().delta("Hi", scored[:1])[0]
    assert ChatResponse.model_validate(json.loads(line)).logprobs[0].token == "Hi"  # type: ignore[index]
    error = shape.events().error(APIError(413, "too long").body())
    assert json.loads(error[0]) == {"error": "too long"}
    loaded = ChatResponse.model_validate(shape.loaded())
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""


def test_schemas_close_objects_to_undeclared_fields_as_llama_cpp_reads_them() -> None:
    """An object that lists properties and says nothing of others gets additionalProperties:
    false, nested ones too; one that says, or combines with other schemas, stays as it is."""
    person = {"type": "object", "properties": {"name": {"type": "string"},
              "pets": {"type": "array", "items": {"type": "object",
                                                   "properties": {"kind": {"type": "string"}}}}},
              "$defs": {"A": {"type": "object", "properties": {"x": {}}}}}  # fmt: skip
    shut = closed(person)
    assert shut["additionalProperties"] is False
    assert shut["properties"]["pets"]["items"]["additionalProperties"] is False
    assert shut["$defs"]["A"]["additionalProperties"] is False
    assert person.get("additionalProperties") is None  # the caller's schema is left alone
    for left_open in (
        {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
        {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}},
        {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
        {"type": "object"},  # any object: no properties listed
    ):
        assert closed(left_open) == left_open
    combined = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert closed(combined) == combined
    source = json.loads(Constraint.json_schema(person).source)
    assert source == shut and list(source) == [*person, "additionalProperties"]


def test_ollamas_names_find_the_served_model() -> None:
    """A tag (`:latest`) and a model served from Ollama's store, asked for by Ollama's name."""
    ids = ("smollm2-chat", "ollama:llama3.2:3b", "ollama:qwen3")
    assert served_name("smollm2-chat:latest", ids) == "smollm2-chat"
    assert served_name("llama3.2:3b", ids) == "ollama:llama3.2:3b"
    assert served_name("qwen3:latest", ids) == served_name("qwen3", ids) == "ollama:qwen3"
    assert served_name("ollama:llama3.2:3b", ids) == "ollama:llama3.2:3b"
    assert served_name("llama3.2", ids) == "llama3.2"  # another tag: not this model (a 404)
    assert served_name("gemma3", ("ollama:gemma3:latest",)) == "ollama:gemma3:latest"
