"""Ollama's /api/chat and /api/generate requests as chat or completion requests: `options` become
the sampling fields (with Ollama's defaults where a request leaves them out), `format` a JSON
object or schema, the messages' object arguments JSON text; checked by schemas.parse_chat and
parse_completion. What this server cannot do as asked (images, thinking, a Go template, the
deprecated `context`, mirostat) is refused with a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from edge_spec.decode.logprobs import MAX_TOP_LOGPROBS
from edge_spec.server.schemas import (
    ParsedRequest,
    RequestLimits,
    bad,
    check_known,
    parse_chat,
    parse_completion,
)

# Ollama's sampling defaults (api/types.go DefaultOptions): what a request without options
# gets from Ollama, so it gets it here too. num_predict -1: until the context is full.
DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "repeat_last_n": 64,
}
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n")
_SAMPLING += ("presence_penalty", "frequency_penalty", "seed", "stop", "num_predict")
# Sampling methods this server does not implement: accepted only at the value that is off.
_OFF_OPTIONS: dict[str, tuple[float, ...]] = {
    "mirostat": (0,),
    "typical_p": (1.0,),
    "tfs_z": (1.0,),
}
# Set when a model loads (here: when the server starts), or only meaningful with mirostat on:
# accepted whatever their value and not used (docs/server.md).
_LOAD_OPTIONS = frozenset(
    ("num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all")
    + ("vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "numa")
    + ("num_keep", "num_gqa", "rope_frequency_base", "rope_frequency_scale")
    + ("draft_num_predict", "mirostat_tau", "mirostat_eta", "penalize_newline")
)
_WHOLE_CONTEXT = 1 << 20  # repeat_last_n -1: the whole context (SamplingParams' bound)

_COMMON = ("model", "stream", "format", "options", "keep_alive", "think", "logprobs")
_COMMON += ("top_logprobs", "truncate", "shift")
_CHAT = frozenset((*_COMMON, "messages", "tools"))
_GENERATE = frozenset((*_COMMON, "prompt", "suffix", "system", "template", "raw", "images"))
_GENERATE |= {"context"}
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
    "template": (None, ""),
    "images": (None, []),
    "context": (None, []),
    "truncate": (None, False),  # a prompt too long for the context is refused, never cut
    "shift": (None, False),
}
_MESSAGE_FIELDS = {"role", "content", "images", "thinking", "tool_calls", "tool_name"}
_MESSAGE_FIELDS |= {"tool_call_id"}


@dataclass(frozen=True)
class OllamaRequest:
    """A parsed Ollama request: the generation (None when it only asks the model to load:
    no messages, or an empty prompt) and how to answer it."""

    model: str
    parsed: ParsedRequest | None
    stream: bool
    chat: bool
    logprobs: bool = False


def parse_ollama_chat(body: object, limits: RequestLimits) -> OllamaRequest:
    """POST /api/chat: {model, messages, tools, format, options, stream (default true), ...}."""
    fields = _common(body, _CHAT)
    messages = fields.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise bad("'messages' must be an array", "messages")
    model, stream = fields["model"], _stream(fields)
    if not messages:
        return OllamaRequest(model, None, stream, chat=True)
    chat = {
        **_generation(fields, limits),
        "messages": [_message(i, m) for i, m in enumerate(messages)],
    }
    tools = fields.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("'tools' must be an array", "tools")
        chat["tools"] = [
            {"type": "function", **t} if isinstance(t, Mapping) and "type" not in t else t
            for t in tools
        ]
    parsed = parse_chat(chat, limits)
    return OllamaRequest(
        model, parsed, stream, chat=True, logprobs=parsed.config.logprobs is not None
    )


def parse_ollama_generate(body: object, limits: RequestLimits) -> OllamaRequest:
    """POST /api/generate: {model, prompt, system, raw, format, options, stream, ...}. Without
    raw the prompt is a user turn under the model's chat template (with `system` before it),
    as at Ollama; with raw it is completed as it is."""
    fields = _common(body, _GENERATE)
    prompt, system, raw = fields.get("prompt"), fields.get("system"), fields.get("raw")
    if prompt is not None and not isinstance(prompt, str):
        raise bad("'prompt' must be a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise bad("'system' must be a string", "system")
    if raw is not None and not isinstance(raw, bool):
        raise bad("'raw' must be a boolean", "raw")
    if raw and system:
        raise bad("'system' has no effect with raw: true (the prompt is used as it is)", "system")
    model, stream = fields["model"], _stream(fields)
    if not prompt:
        return OllamaRequest(model, None, stream, chat=False)
    request = _generation(fields, limits)
    if raw:
        top = request.pop("top_logprobs", None)
        logprobs = request.pop("logprobs", False)
        parsed = parse_completion({**request, "prompt": prompt}, limits)
        if logprobs:
            parsed = replace(parsed, config=replace(parsed.config, logprobs=top or 0))
    else:
        turns = [{"role": "system", "content": system}] if system else []
        parsed = parse_chat(
            {**request, "messages": [*turns, {"role": "user", "content": prompt}]}, limits
        )
    return OllamaRequest(
        model, parsed, stream, chat=False, logprobs=parsed.config.logprobs is not None
    )


def _common(body: object, allowed: frozenset[str]) -> dict[str, Any]:
    fields = dict(check_known(body, allowed, _OFF_VALUES))
    if not isinstance(fields.get("model"), str) or not fields["model"]:
        raise bad("model is required", "model")
    think = fields.get("think")
    if think not in (None, False):
        raise bad(f"{fields['model']!r} does not support thinking", "think")
    keep_alive = fields.get("keep_alive")
    if keep_alive is not None and (
        isinstance(keep_alive, bool) or not isinstance(keep_alive, (str, int, float))
    ):
        raise bad(
            "'keep_alive' must be a duration (a string such as '5m', or seconds)", "keep_alive"
        )
    return fields


def _stream(fields: Mapping[str, Any]) -> bool:
    stream = fields.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream")
    return stream is not False  # Ollama streams unless told not to


def _generation(fields: Mapping[str, Any], limits: RequestLimits) -> dict[str, Any]:
    """The OpenAI fields of a request's model, options, format and logprobs."""
    out: dict[str, Any] = {"model": fields["model"], "stream": _stream(fields)}
    out.update(_options(fields.get("options"), limits))
    fmt = fields.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, Mapping):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": fmt},
        }
    elif fmt not in (None, ""):
        raise bad("'format' must be \"json\" or a JSON schema (an object)", "format")
    logprobs, top = fields.get("logprobs"), fields.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("'logprobs' must be a boolean", "logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad(
                f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs"
            )
        if top and not logprobs:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if logprobs:
        out["logprobs"], out["top_logprobs"] = True, top or 0
    return out


def _options(value: object, limits: RequestLimits) -> dict[str, Any]:
    """Ollama's options as the OpenAI request's sampling fields, Ollama's defaults filled in."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise bad("'options' must be an object", "options")
    known = set(_SAMPLING) | set(_OFF_OPTIONS) | _LOAD_OPTIONS
    unknown = sorted(set(value) - known)
    if unknown:
        raise bad(f"unknown option {unknown[0]!r} in 'options'", "options")
    for name, off in _OFF_OPTIONS.items():
        if value.get(name) is not None and value[name] not in off:
            raise bad(
                f"option {name!r} is not supported by this server (got {value[name]!r})", "options"
            )
    out = dict(DEFAULTS)
    out.update({k: v for k, v in value.items() if k in _SAMPLING and v is not None})
    seed = out.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:
        del out["seed"]  # -1: a random seed
    if out.get("repeat_last_n") == -1:
        out["repeat_last_n"] = _WHOLE_CONTEXT
    predict = out.pop("num_predict", None)
    if predict is None or (
        isinstance(predict, int) and not isinstance(predict, bool) and predict <= 0
    ):
        predict = limits.max_tokens_limit  # -1 (until the context is full), -2 (fill it)
    out["max_tokens"] = predict
    return out


def _message(i: int, message: object) -> dict[str, Any]:
    """An Ollama message as an OpenAI one: tool calls' arguments (an object) as JSON text, a
    tool result's tool_name as its name; an assistant's thinking is dropped."""
    where = f"messages[{i}]"
    if not isinstance(message, Mapping):
        raise bad(f"{where} must be an object", where)
    unknown = sorted(set(message) - _MESSAGE_FIELDS)
    if unknown:
        raise bad(f"{where} has unknown field {unknown[0]!r}", where)
    if message.get("images"):
        raise bad(f"{where}.images: this server's models read text only", where)
    role = message.get("role")
    out: dict[str, Any] = {
        "role": role.lower() if isinstance(role, str) else role,
        "content": message.get("content") or "",
    }
    if message.get("tool_calls"):
        out["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
    if out["role"] == "tool":  # which call it answers: by id (newer clients) or by name
        if message.get("tool_call_id") is not None:
            out["tool_call_id"] = message["tool_call_id"]
        if message.get("tool_name") is not None:
            out["name"] = message["tool_name"]
    return out


def _tool_calls(value: object, where: str) -> Any:
    if not isinstance(value, list):
        raise bad(f"{where} must be an array", where)
    calls = []
    for j, call in enumerate(value):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise bad(f"{where}[{j}] must be {{function: {{name, arguments}}}}", where)
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": call.get("id") or f"call_{j}",
                "type": "function",
                "function": {"name": function.get("name"), "arguments": arguments},
            }
        )
    return calls
