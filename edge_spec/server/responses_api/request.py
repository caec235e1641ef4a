"""A Responses API request as a chat request: instructions and input items become messages,
function tools and text.format the chat fields, checked by schemas.parse_chat; what the
response object repeats of the request is kept aside (ResponseEcho)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_spec.server.schemas import (
    ParsedRequest,
    RequestLimits,
    bad,
    check_known,
    parse_chat,
)

# Copied to the chat request as they are (their checks are the chat fields').
_PASSED = (
    ("temperature", "top_p", "stream", "parallel_tool_calls", "prompt_cache_key", "metadata")
    + ("user", "service_tier")
    + ("seed", "top_k", "min_p", "speculative", "draft_mode")  # extensions, as in chat
)
_TRANSLATED = ("model", "input", "instructions", "max_output_tokens", "tools", "tool_choice")
_TRANSLATED += ("text", "store", "stream_options", "safety_identifier", "truncation")
_TRANSLATED += ("include", "top_logprobs", "previous_response_id")
LOGPROBS_ITEM = "message.output_text.logprobs"  # the one `include` item served here
# Fields accepted only at the value that means "feature off".
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "conversation": (None,),
    "background": (None, False),
    "reasoning": (None, {}),
    "max_tool_calls": (None,),
    "prompt": (None,),  # a stored prompt template
}
_ALLOWED = frozenset((*_PASSED, *_TRANSLATED, *_OFF_VALUES))
_TEXT_PARTS = ("input_text", "output_text", "text")
_INPUT_ROLES = ("user", "system", "developer", "assistant")


@dataclass(frozen=True)
class ResponseEcho:
    """What a response object repeats of its request."""

    instructions: str | None
    max_output_tokens: int | None
    tools: list[dict[str, Any]]
    tool_choice: Any
    text_format: dict[str, Any]
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    store: bool
    metadata: dict[str, str] = field(default_factory=dict)
    prompt_cache_key: str | None = None
    previous_response_id: str | None = None
    # This request's input items as chat messages (instructions not among them: they are not
    # carried over to a later response, as OpenAI's are not).
    turn: tuple[dict[str, Any], ...] = ()


def parse_responses(
    body: object, limits: RequestLimits, history: Sequence[dict[str, Any]] = ()
) -> tuple[ParsedRequest, ResponseEcho]:
    """Requires a JSON object in OpenAI's Responses shape with text input and function tools;
    raises APIError(400) naming the field otherwise. `history`: the conversation of its
    previous_response_id (ResponseStore.conversation), put before its input."""
    body = check_known(body, _ALLOWED, _OFF_VALUES)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad("'previous_response_id' must be a string", "previous_response_id")
    if body.get("truncation") not in (None, "disabled"):  # "auto" would drop items: not here
        raise bad("'truncation' may only be 'disabled'", "truncation")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise bad("'store' must be a boolean", "store")
    for name in ("safety_identifier",):
        if body.get(name) is not None and not isinstance(body.get(name), str):
            raise bad(f"'{name}' must be a string", name)
    options = body.get("stream_options")
    if options is not None and not (
        isinstance(options, Mapping)
        and set(options) <= {"include_obfuscation"}
        and all(isinstance(v, bool) for v in options.values())
    ):
        raise bad("stream_options may only hold include_obfuscation", "stream_options")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("'instructions' must be a string", "instructions")

    chat: dict[str, Any] = {k: body[k] for k in _PASSED if body.get(k) is not None}
    chat["model"] = body.get("model")
    turn = _messages(body.get("input"))
    system = [] if instructions is None else [{"role": "system", "content": instructions}]
    chat["messages"] = [*system, *history, *turn]
    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int):
            raise bad("'max_output_tokens' must be an integer", "max_output_tokens")
        if max_output_tokens < 1:
            raise bad("'max_output_tokens' must be >= 1", "max_output_tokens")
        chat["max_completion_tokens"] = max_output_tokens
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools  # chat takes bare function objects too
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    include = body.get("include") or []
    if not isinstance(include, list) or any(item != LOGPROBS_ITEM for item in include):
        raise bad(f"'include' may only hold {LOGPROBS_ITEM!r}", "include")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise bad("'top_logprobs' must be an integer in [0, 20]", "top_logprobs")
    if include or top:
        chat["logprobs"] = True
        chat["top_logprobs"] = top or 0
    text_format = _text_format(body.get("text"))
    if text_format["type"] != "text":
        chat["response_format"] = _response_format(text_format)
    req = parse_chat(chat, limits)
    echo = ResponseEcho(
        instructions=instructions,
        max_output_tokens=body.get("max_output_tokens"),
        tools=[{"type": "function", "parameters": None, "strict": None, **t} for t in tools],
        tool_choice=body.get("tool_choice") or ("auto" if tools else "none"),
        text_format=text_format,
        parallel_tool_calls=req.config.parallel_tool_calls,
        temperature=req.config.sampling.temperature,
        top_p=req.config.sampling.top_p,
        store=store,
        metadata=dict(body.get("metadata") or {}),
        prompt_cache_key=body.get("prompt_cache_key"),
        previous_response_id=previous,
        turn=tuple(turn),
    )
    return req, echo


def _messages(value: object) -> list[dict[str, Any]]:
    """Input items as chat messages: messages, the answer's earlier function calls (joined to
    the assistant message before them) and their outputs."""
    messages: list[dict[str, Any]] = []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("'input' must be a string or a non-empty array of items", "input")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _INPUT_ROLES:
                raise bad(f"{where}.role must be one of {', '.join(_INPUT_ROLES)}", where)
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*last.get("tool_calls", []), call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad(f"{where}.call_id must be a string", where)
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise bad(
                f"{where}: input items of type {kind!r} are not supported here (messages, "
                "function_call and function_call_output are; nothing is stored to refer to)",
                where,
            )
    return messages


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise bad(f"{where} must be text: a string or an array of input_text parts", where)


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
    if not all(isinstance(v, str) for v in (name, call_id, arguments)):
        raise bad(f"{where} must be {{type: function_call, call_id, name, arguments}}", where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tools(value: object) -> list[dict[str, Any]]:
    """Responses' function tools ({type: function, name, description, parameters, strict}),
    without their type; any other tool type is refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad("'tools' must be an array of function tools", "tools")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise bad(f"tools[{i}]: only function tools are supported, got {kind!r}", "tools")
        tools.append({k: v for k, v in tool.items() if k != "type" and v is not None})
    return tools


def _tool_choice(value: object) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise bad("'tool_choice' must be none, auto, required or {type: function, name}", "tool_choice")


def _text_format(value: object) -> dict[str, Any]:
    if value is None:
        return {"type": "text"}
    if not isinstance(value, Mapping) or set(value) - {"format", "verbosity"}:
        raise bad("'text' may hold format (and verbosity)", "text")
    fmt = value.get("format") or {"type": "text"}
    if not isinstance(fmt, Mapping) or fmt.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise bad("'text.format.type' must be text, json_object or json_schema", "text")
    return dict(fmt)


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    """Responses' flat text.format as chat's response_format."""
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    inner = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": inner}
