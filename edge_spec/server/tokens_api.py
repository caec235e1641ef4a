"""Token utilities: llama-server's /tokenize, /detokenize and /apply-template (also in vLLM's
spelling, with its /tokenizer_info: lm-evaluation-harness's remote tokenizer), and Anthropic's
/v1/messages/count_tokens. They read only the target's vocabulary and chat template, so they
run at once (Worker.with_spec), beside whatever generation runs, as llama-server's do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_spec.api import EdgeSpec
from edge_spec.server.messages_api import parse_messages
from edge_spec.server.schemas import RequestLimits, bad, check_known, parse_chat

MAX_DETOKENIZE = 1 << 20  # token ids in one /detokenize request


def tokenize(body: object) -> Any:
    """/tokenize {content, add_special (false), parse_special (true), with_pieces (false)} ->
    fn(spec) answering {tokens: [id]} or, with pieces, {tokens: [{id, piece}]} (a piece that
    is no whole UTF-8 text as its bytes). vLLM's spelling: `prompt`, `add_special_tokens`."""
    allowed = ("content", "add_special", "parse_special", "with_pieces")
    fields = dict(check_known(body, frozenset((*allowed, *_VLLM)), {}))
    for vllm, ours in _VLLM.items():
        if vllm in fields:
            if ours in fields:
                raise bad(f"give '{ours}' or '{vllm}', not both", vllm)
            fields[ours] = fields.pop(vllm)
    content = fields.get("content")
    if not isinstance(content, str):
        raise bad("'content' must be a string", "content", "missing_required_parameter")
    add_special = _flag(fields, "add_special", False)
    parse_special = _flag(fields, "parse_special", True)
    with_pieces = _flag(fields, "with_pieces", False)

    def run(spec: EdgeSpec) -> dict[str, Any]:
        ids = spec.target.tokenize(content, add_special=add_special, parse_special=parse_special)
        counts = {"count": len(ids), "max_model_len": spec.target.n_ctx}  # vLLM's
        if not with_pieces:
            return {"tokens": ids, **counts}
        pieces = spec.target.pieces(ids)
        return {"tokens": [{"id": t, "piece": _text(b)} for t, b in zip(ids, pieces)], **counts}

    return run


_VLLM = {"prompt": "content", "add_special_tokens": "add_special"}


def tokenizer_info(spec: EdgeSpec) -> dict[str, Any]:
    """vLLM's /tokenizer_info: the special tokens' text and the chat template."""
    info = spec.target.info

    def text(token: int) -> str | None:
        return spec.target.token_text(token).decode("utf-8", "replace") if token >= 0 else None

    return {
        "tokenizer_class": "llama.cpp",
        "bos_token": text(info.bos_id),
        "eos_token": text(info.eos_id),
        "pad_token": None,
        "chat_template": spec.chat_template.text,
        "model_max_length": spec.target.n_ctx,
    }


def _text(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def detokenize(body: object) -> Any:
    """/detokenize {tokens: [id]} -> fn(spec) answering {content} (and vLLM's {prompt})."""
    fields = check_known(body, frozenset(("tokens",)), {})
    tokens = fields.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise bad("'tokens' must be an array of token ids", "tokens", "missing_required_parameter")
    if len(tokens) > MAX_DETOKENIZE:
        raise bad(f"at most {MAX_DETOKENIZE} tokens per request", "tokens")

    def run(spec: EdgeSpec) -> dict[str, Any]:
        n_vocab = spec.target.n_vocab
        if any(not 0 <= t < n_vocab for t in tokens):
            raise bad(f"token ids must be in [0, {n_vocab})", "tokens")
        text = spec.target.detokenize(tokens)
        return {"content": text, "prompt": text}  # llama-server's name, and vLLM's

    return run


def apply_template(body: object, limits: RequestLimits, model: str) -> Any:
    """/apply-template {messages, tools?} -> fn(spec) answering {prompt}: the text a chat
    request's conversation becomes under the target's template."""
    if not isinstance(body, Mapping):
        raise bad("the request body must be a JSON object", code="invalid_request")
    req = parse_chat({"model": model, **body}, limits)
    return _rendered(req.messages or (), req.config.tools, lambda prompt, spec: {"prompt": prompt})


def count_tokens(body: object, limits: RequestLimits) -> Any:
    """/v1/messages/count_tokens, Anthropic's: a Messages request's conversation (system,
    messages, tools) -> fn(spec) answering {input_tokens}, the prompt's tokens here."""
    if not isinstance(body, Mapping):
        raise bad("the request body must be a JSON object", code="invalid_request")
    req = parse_messages({**body, "max_tokens": 1}, limits)

    def answer(prompt: str, spec: EdgeSpec) -> dict[str, Any]:
        return {"input_tokens": len(spec.tokenize(prompt))}

    return _rendered(req.messages or (), req.config.tools, answer)


def _rendered(messages: Any, tools: Any, answer: Any) -> Any:
    def run(spec: EdgeSpec) -> dict[str, Any]:
        return answer(spec.render_chat([dict(m) for m in messages], tools), spec)

    return run


def _flag(fields: Mapping[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name, default)
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean, got {value!r}", name, "invalid_type")
    return value
