"""An Anthropic Messages API request as a chat request: `system` and the messages' content
blocks become chat messages (text; an assistant's tool_use blocks its tool calls, a user's
tool_result blocks tool messages), `tools` (name, description, input_schema) and `tool_choice`
the chat fields, `stop_sequences` the stop strings, `output_config.format` a JSON schema;
checked by schemas.parse_chat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from edge_spec.server.schemas import (
    ParsedRequest,
    RequestLimits,
    bad,
    check_known,
    parse_chat,
)

# temperature, top_p and top_k: older clients send them (the current API has none); the rest
# are edge_spec's chat extensions.
_PASSED = ("temperature", "top_p", "top_k", "stream", "seed", "min_p", "speculative")
_TRANSLATED = ("model", "max_tokens", "messages", "system", "stop_sequences", "tools")
_TRANSLATED += ("tool_choice", "metadata", "output_config", "thinking", "service_tier")
_TRANSLATED += ("cache_control",)  # a caching hint: the KV prefix is kept here anyway
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "container": (None,),
    "inference_geo": (None,),
    "diagnostics": (None,),
    "speed": (None,),
}
_ALLOWED = frozenset((*_PASSED, *_TRANSLATED, *_OFF_VALUES))
_BLOCK_EXTRAS = {"cache_control", "citations"}  # per-block hints, taken and not used


def parse_messages(body: object, limits: RequestLimits) -> ParsedRequest:
    """Requires a JSON object in Anthropic's Messages shape with text and tool blocks; raises
    APIError(400) naming the field otherwise."""
    body = check_known(body, _ALLOWED, _OFF_VALUES)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad("'max_tokens' is required: an integer >= 1", "max_tokens")
    thinking = body.get("thinking")
    if thinking is not None and thinking != {"type": "disabled"}:
        raise bad("extended thinking is not supported by this server", "thinking")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise bad("'service_tier' must be auto or standard_only", "service_tier")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, Mapping)
        and set(metadata) <= {"user_id"}
        and isinstance(metadata.get("user_id", ""), str | None)
    ):
        raise bad("'metadata' may only hold user_id (a string)", "metadata")

    chat: dict[str, Any] = {k: body[k] for k in _PASSED if body.get(k) is not None}
    chat["model"] = body.get("model")
    chat["max_tokens"] = max_tokens
    chat["messages"] = [*_system(body.get("system")), *_messages(body.get("messages"))]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"], parallel = _tool_choice(choice)
        if not parallel:
            chat["parallel_tool_calls"] = False
    schema = _output_schema(body.get("output_config"))
    if schema is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    return parse_chat(chat, limits)


def _system(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [{"role": "system", "content": _text(value, "system")}]


def _text(value: object, where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(_is_text_block(b) for b in value):
        return "".join(b["text"] for b in value)
    raise bad(f"'{where}' must be a string or an array of text blocks", where)


def _is_text_block(block: object) -> bool:
    return (
        isinstance(block, Mapping)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and set(block) <= {"type", "text", *_BLOCK_EXTRAS}
    )


def _messages(value: object) -> list[dict[str, Any]]:
    """Anthropic's turns as chat messages: a user turn's tool_result blocks become tool
    messages (before its text), an assistant turn's tool_use blocks its tool_calls."""
    if not isinstance(value, list) or not value:
        raise bad("'messages' must be a non-empty array", "messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping) or set(message) - {"role", "content"}:
            raise bad(f"{where} must be {{role, content}}", where)
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role must be user or assistant, got {role!r}", where)
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content must be a string or an array of blocks", where)
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, Mapping) else None
            if _is_text_block(block):
                texts.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                calls.append(_tool_use(block, at))
            elif kind == "tool_result" and role == "user":
                out.append(_tool_result(block, at))
            else:
                raise bad(
                    f"{at}: blocks of type {kind!r} are not supported here (text, an "
                    "assistant's tool_use and a user's tool_result are)",
                    where,
                )
        if calls:
            out.append({"role": "assistant", "content": "".join(texts), "tool_calls": calls})
        elif texts or not content:
            out.append({"role": role, "content": "".join(texts)})
    return out


def _tool_use(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, dict):
        raise bad(f"{where} must be {{type: tool_use, id, name, input (an object)}}", where)
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise bad(f"{where}.tool_use_id must be a string", where)
    content = block.get("content", "")
    text = _text(content, f"{where}.content")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _tools(value: object) -> list[dict[str, Any]]:
    """Anthropic's client tools ({name, description, input_schema}) as bare chat functions;
    server tools (web search, code execution, ...) are refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad("'tools' must be an array of tools", "tools")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping) or tool.get("type", "custom") not in ("custom", None):
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise bad(f"tools[{i}]: only client tools are supported, got {kind!r}", "tools")
        function: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if tool.get("input_schema") is not None:
            function["parameters"] = tool["input_schema"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        tools.append(function)
    return tools


def _tool_choice(value: object) -> tuple[Any, bool]:
    """Anthropic's tool_choice as chat's, and whether parallel calls are allowed."""
    if not isinstance(value, Mapping) or value.get("type") not in ("auto", "any", "tool", "none"):
        raise bad("'tool_choice' must be {type: auto | any | tool | none}", "tool_choice")
    parallel = value.get("disable_parallel_tool_use") is not True
    kind = value["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": value.get("name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _output_schema(value: object) -> Any:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"format", "effort"}:
        raise bad("'output_config' may hold format", "output_config")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise bad("'output_config.format' must be {type: json_schema, schema}", "output_config")
    return fmt["schema"]
