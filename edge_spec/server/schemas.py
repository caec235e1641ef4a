"""OpenAI request bodies -> a prompt (or messages) and a GenerationConfig, checked field by field.

Everything is validated here, in Python, before anything reaches llama.cpp (its asserts abort
the process). Unknown fields and OpenAI features this server does not implement are refused with
400 rather than silently ignored, so a client never gets an answer to a question it did not ask.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from edge_spec.api import GenerationConfig
from edge_spec.constrain.spec import Constraint, parse_tool_choice, parse_tools
from edge_spec.decode.logprobs import MAX_TOP_LOGPROBS
from edge_spec.errors import InvalidRequestError
from edge_spec.models.templates import ROLE_ALIASES, ROLES
from edge_spec.sampling.transform import MAX_LOGIT_BIAS, SamplingParams

MAX_STOP_STRINGS = 16
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound for /v1/completions' logprobs
MAX_SESSION_KEY = 256
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_CHOICES = 16  # n: answers per prompt, generated one after another
MAX_PROMPTS = 128  # /v1/completions: prompts in one request (lm-evaluation-harness batches)

_COMMON = frozenset(
    ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options")
    + ("n", "user", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs")
    + ("prompt_cache_key",)  # OpenAI's: requests sharing one share an n-gram session here
    + ("top_k", "min_p", "speculative", "draft_mode")  # extensions
    + ("repeat_penalty", "repeat_last_n")  # llama.cpp's server extensions
    + ("response_format", "grammar", "json_schema")  # structured output (the last two: llama.cpp's)
)
_COMPLETION = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT = _COMMON | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "metadata",
    "store",
    "service_tier",
}
# Fields accepted only at the value that means "feature off".
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
    "functions": (None, []),  # the deprecated forms of tools and tool_choice
    "function_call": (None, "none"),
    "store": (None, False),  # nothing is stored here
    "service_tier": (None, "auto", "default"),  # one tier
}
# Accepted and checked, then not used (docs/server.md): OpenAI's end-user id and metadata.
MAX_METADATA = 16


class APIError(Exception):
    """An error answered as OpenAI's JSON: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class RequestLimits:
    """What the server was started with: the base generation settings (k, policy, draft mode)
    and the caps a request may not exceed."""

    base: GenerationConfig
    max_tokens_limit: int
    server_draft_mode: str = "auto"


Prompt = str | tuple[int, ...]  # text, or the target's token ids


@dataclass(frozen=True)
class ParsedRequest:
    model: str
    prompts: tuple[Prompt, ...] | None  # /v1/completions: one or more
    messages: tuple[dict[str, Any], ...] | None  # /v1/chat/completions
    config: GenerationConfig
    stream: bool
    include_usage: bool
    n: int = 1  # answers per prompt (or per conversation)
    echo: bool = False  # /v1/completions: each answer's text (and logprobs) begin with its prompt

    def choices(self) -> list[tuple[Prompt | None, GenerationConfig]]:
        """What each choice generates from, in OpenAI's order (prompt by prompt, n each): its
        prompt (None: the messages) and its config. With a seed, choice j of a prompt draws
        with seed + j, so the n answers differ and each is reproducible."""
        seed = self.config.sampling.seed
        out = []
        for prompt in self.prompts or (None,):
            for j in range(self.n):
                cfg = self.config
                if seed is not None and j:
                    sampling = replace(cfg.sampling, seed=(seed + j) % 2**63)
                    cfg = replace(cfg, sampling=sampling)
                out.append((prompt, cfg))
        return out


def parse_completion(body: object, limits: RequestLimits) -> ParsedRequest:
    """Requires a JSON object in OpenAI's completions shape; raises APIError(400) otherwise."""
    fields = _check_fields(body, _COMPLETION)
    prompts = _prompts(fields.get("prompt"))
    max_tokens = _int(fields, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
    logprobs = _int(fields, "logprobs", None)  # the top alternatives per token, or null
    if logprobs is not None and logprobs > MAX_COMPLETION_LOGPROBS:
        raise bad(
            f"'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {logprobs}", "logprobs"
        )
    echo = _bool(fields, "echo", False)
    req = _parsed(fields, limits, max_tokens, prompts=prompts, logprobs=logprobs)
    if echo and logprobs is not None:  # the echoed tokens' logprobs: the prompt is scored
        req = replace(req, config=replace(req.config, prompt_logprobs=logprobs))
    return replace(req, echo=echo)


def _prompts(value: object) -> tuple[Prompt, ...]:
    """OpenAI's forms of `prompt`: a string, token ids, or an array of either."""
    if isinstance(value, str) or _token_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad(
            "'prompt' must be a string, an array of token ids, or an array of either",
            "prompt",
            "missing_required_parameter",
        )
    if len(value) > MAX_PROMPTS:
        raise bad(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}", "prompt")
    prompts: list[Prompt] = []
    for i, prompt in enumerate(value):
        if isinstance(prompt, str):
            prompts.append(prompt)
        elif _token_ids(prompt):
            if any(t < 0 for t in prompt):
                raise bad(f"prompt[{i}]: token ids must be >= 0", "prompt")
            prompts.append(tuple(prompt))
        else:
            raise bad(f"prompt[{i}] must be a string or a non-empty array of token ids", "prompt")
    return tuple(prompts)


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(t) for t in value)


def parse_chat(body: object, limits: RequestLimits) -> ParsedRequest:
    """Requires a JSON object in OpenAI's chat shape with text-only messages."""
    fields = _check_fields(body, _CHAT)
    raw = fields.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("'messages' must be a non-empty array", "messages", "missing_required_parameter")
    messages = tuple(_message(i, m) for i, m in enumerate(raw))
    if fields.get("max_completion_tokens") is not None:
        max_tokens = _int(fields, "max_completion_tokens", limits.max_tokens_limit)
    else:
        max_tokens = _int(fields, "max_tokens", limits.max_tokens_limit)
    return _parsed(fields, limits, max_tokens, messages=messages, logprobs=_chat_logprobs(fields))


def _chat_logprobs(fields: Mapping[str, Any]) -> int | None:
    """Chat's logprobs (a boolean) and top_logprobs (0-20, only beside logprobs: true) as the
    number of alternatives per token, or None for no logprobs."""
    top = _int(fields, "top_logprobs", None)
    if not _bool(fields, "logprobs", False):
        if top:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise bad(f"'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs")
    return top or 0


def check_known(
    body: object, allowed: frozenset[str], off_values: Mapping[str, tuple[Any, ...]]
) -> Mapping[str, Any]:
    """A JSON object holding only `allowed` fields, each of `off_values`' fields at a value
    that means "feature off"; raises APIError(400) naming the first field that is not."""
    if not isinstance(body, Mapping):
        raise bad("the request body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"unrecognized request argument: {unknown[0]}", unknown[0], "unknown_parameter")
    for name, off in off_values.items():
        value = body.get(name)
        # `False == 0` and `0.0 == 0` in Python: compare types too, so `n: true` is refused.
        if name in body and not any(type(value) is type(v) and value == v for v in off):
            if not (isinstance(value, float) and value == 0 and 0 in off):
                raise bad(f"'{name}' is not supported by this server (got {value!r})", name)
    return body


def _check_fields(body: object, allowed: frozenset[str]) -> dict[str, Any]:
    body = check_known(body, allowed, _OFF_VALUES)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' must be a non-empty string", "model", "missing_required_parameter")
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise bad("'user' must be a string of at most 256 characters", "user")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, Mapping)
        and len(metadata) <= MAX_METADATA
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    ):
        raise bad(
            f"'metadata' must hold at most {MAX_METADATA} string pairs (keys up to 64 "
            "characters, values up to 512)",
            "metadata",
        )
    return dict(body)


def _message(i: int, message: object) -> dict[str, Any]:
    """A message of text; an assistant's may carry tool_calls (its content then may be null),
    a tool's result its tool_call_id."""
    param = f"messages[{i}]"
    if not isinstance(message, Mapping):
        raise bad(f"{param} must be an object", param)
    role, content = message.get("role"), message.get("content")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        names = ", ".join((*ROLES, *ROLE_ALIASES))
        raise bad(f"{param}.role must be one of {names}, got {role!r}", param)
    allowed = {"role", "content", "name"}
    allowed |= {"tool_calls", "refusal"} if role == "assistant" else set()
    allowed |= {"tool_call_id"} if role == "tool" else set()
    unknown = sorted(set(message) - allowed)
    if unknown:
        raise bad(f"{param} has unknown field {unknown[0]!r}", param)
    if isinstance(content, list):  # content parts: only text is understood
        if not all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
            raise bad(f"{param}.content: only text parts are supported", param)
        content = "".join(str(p.get("text", "")) for p in content)
    calls = message.get("tool_calls")
    if content is None and role == "assistant" and calls:
        content = ""
    if not isinstance(content, str):
        raise bad(f"{param}.content must be a string", param)
    out: dict[str, Any] = {"role": str(role), "content": content}
    if calls is not None:
        out["tool_calls"] = _tool_calls(calls, f"{param}.tool_calls")
    if role == "tool" and message.get("tool_call_id") is not None:
        if not isinstance(message["tool_call_id"], str):
            raise bad(f"{param}.tool_call_id must be a string", param)
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _tool_calls(value: object, param: str) -> list[dict[str, Any]]:
    """An assistant's earlier calls, as OpenAI sends them back: [{id, type, function: {name,
    arguments (JSON text)}}]."""
    if not isinstance(value, list):
        raise bad(f"{param} must be an array", param)
    calls = []
    for j, call in enumerate(value):
        where = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad(
                f"{where} must be {{id, type: function, function: {{name, arguments}}}}", where
            )
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise bad(f"{where}.function.arguments must be a JSON string", where)
        calls.append(
            {
                "id": str(call.get("id", "")),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return calls


def _parsed(
    fields: dict[str, Any],
    limits: RequestLimits,
    max_tokens: int,
    *,
    prompts: tuple[Prompt, ...] | None = None,
    messages: tuple[dict[str, str], ...] | None = None,
    logprobs: int | None = None,
) -> ParsedRequest:
    if max_tokens < 1 and prompts is None:  # a completion of 0 tokens: scoring its prompt
        raise bad(f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    if max_tokens > limits.max_tokens_limit:
        raise bad(
            f"max_tokens is {max_tokens}, above this server's limit of {limits.max_tokens_limit}",
            "max_tokens",
        )
    stream = _bool(fields, "stream", False)
    options = fields.get("stream_options")
    if options is not None and not stream:
        raise bad("stream_options is only allowed when stream is true", "stream_options")
    if options is not None and (
        not isinstance(options, Mapping) or set(options) - {"include_usage"}
    ):
        raise bad("stream_options may only hold include_usage", "stream_options")
    include_usage = _bool(dict(options or {}), "include_usage", False)
    try:
        sampling = SamplingParams(
            temperature=_number(fields, "temperature", 1.0, high=2.0),
            top_p=_number(fields, "top_p", 1.0, high=1.0),
            min_p=_number(fields, "min_p", 0.0, high=1.0),
            top_k=_int(fields, "top_k", 0),
            seed=_int(fields, "seed", None),
            presence_penalty=_number(fields, "presence_penalty", 0.0, low=-2.0, high=2.0),
            frequency_penalty=_number(fields, "frequency_penalty", 0.0, low=-2.0, high=2.0),
            repeat_penalty=_number(fields, "repeat_penalty", 1.0, high=10.0),
            repeat_last_n=_int(fields, "repeat_last_n", 64),
            logit_bias=_logit_bias(fields.get("logit_bias")),
        )
        config = replace(
            limits.base,
            max_tokens=max_tokens,
            stop=_stop(fields.get("stop")),
            draft_mode=_draft_mode(fields, limits),
            sampling=sampling,
            session=_session(fields),
            logprobs=logprobs,
            **_structured(fields),
        )
    except InvalidRequestError as exc:  # the library's own range checks; they name the field
        name = str(exc).split(" ", 1)[0].strip("'")
        name = next((f for f in fields if name.startswith(f)), name)
        raise bad(str(exc), name if name in fields else None) from exc
    n = _int(fields, "n", 1)
    if not 1 <= n <= MAX_CHOICES:
        raise bad(f"'n' must be in [1, {MAX_CHOICES}], got {n}", "n")
    return ParsedRequest(fields["model"], prompts, messages, config, stream, include_usage, n)


def _structured(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The request's structured output as config fields: OpenAI's response_format, or
    llama.cpp's grammar (GBNF) or json_schema; tools, tool_choice and parallel_tool_calls.
    Raises InvalidRequestError naming what is wrong."""
    given = [f for f in ("response_format", "grammar", "json_schema") if fields.get(f) is not None]
    if len(given) > 1:
        raise InvalidRequestError(f"'{given[0]}' and '{given[1]}': give one")
    constraint = None
    if fields.get("response_format") is not None:
        constraint = Constraint.from_response_format(fields["response_format"])
    elif fields.get("grammar") is not None:
        constraint = Constraint.grammar(fields["grammar"], "gbnf")
    elif fields.get("json_schema") is not None:
        constraint = Constraint.json_schema(fields["json_schema"])
    tools = parse_tools(fields.get("tools"))
    return {
        "constraint": constraint,
        "tools": tools,
        "tool_choice": parse_tool_choice(fields.get("tool_choice"), tools),
        "parallel_tool_calls": _bool(fields, "parallel_tool_calls", True),
    }


def _draft_mode(fields: dict[str, Any], limits: RequestLimits) -> Any:
    """The draft source is chosen at server start; a request may only switch speculation off."""
    mode = fields.get("draft_mode")
    if mode is not None and mode not in ("none", limits.server_draft_mode):
        raise bad(
            f"draft_mode may be 'none' or the server's {limits.server_draft_mode!r}, got {mode!r}",
            "draft_mode",
        )
    if not _bool(fields, "speculative", True):
        mode = "none"
    return mode or limits.base.draft_mode


def _session(fields: Mapping[str, Any]) -> str | None:
    """OpenAI's prompt_cache_key names a conversation: requests that share one draft from one
    n-gram session (their earlier prompts and answers). Without it a request drafts from its
    own text alone, so no client's text reaches another's drafts."""
    key = fields.get("prompt_cache_key")
    if key is None:
        return None
    if not isinstance(key, str) or not 0 < len(key) <= MAX_SESSION_KEY:
        raise bad(
            f"'prompt_cache_key' must be a string of 1 to {MAX_SESSION_KEY} characters",
            "prompt_cache_key",
        )
    return "prompt_cache_key:" + key


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("'stop' must be a non-empty string or an array of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", "stop")
    return tuple(stops)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(fields: Mapping[str, Any], name: str, default: Any) -> Any:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{name}' must be an integer, got {value!r}", name, "invalid_type")
    if value < 0:
        raise bad(f"'{name}' must be >= 0, got {value}", name)
    return value


def _number(
    fields: Mapping[str, Any], name: str, default: float, *, high: float, low: float = 0.0
) -> float:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"'{name}' must be a number, got {value!r}", name, "invalid_type")
    if not math.isfinite(value) or not low <= value <= high:
        raise bad(f"'{name}' must be in [{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]}."""
    if value is None:
        return ()
    if not isinstance(value, Mapping) or len(value) > MAX_LOGIT_BIAS:
        raise bad(
            f"'logit_bias' must map at most {MAX_LOGIT_BIAS} token ids to biases", "logit_bias"
        )
    pairs = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() and len(key) < 10 else None
        if token is None:
            raise bad(f"'logit_bias' keys are token ids, got {key!r}", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise bad(f"'logit_bias' values are numbers, got {bias!r}", "logit_bias")
        if not math.isfinite(bias) or not -100 <= bias <= 100:
            raise bad(f"'logit_bias' values must be in [-100, 100], got {bias!r}", "logit_bias")
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def _bool(fields: Mapping[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean, got {value!r}", name, "invalid_type")
    return value
