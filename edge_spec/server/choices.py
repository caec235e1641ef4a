"""A request's answers as the worker's generations: one per choice (OpenAI's n answers per
prompt, and /v1/completions' several prompts), each with its prompt echoed where asked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from edge_spec.api import EdgeSpec, GenerationConfig, TextDelta, TokenLogprob
from edge_spec.server.schemas import ParsedRequest, Prompt
from edge_spec.server.worker import StartFn


def starts(req: ParsedRequest) -> list[StartFn]:
    """One start per choice, in the order of the response's choices."""
    out: list[StartFn] = []
    for prompt, cfg in req.choices():
        if prompt is None:
            assert req.messages is not None
            out.append(_chat(req.messages, cfg))
        else:
            out.append(_completion(prompt, cfg, req.echo))
    return out


def _chat(messages: tuple[dict[str, Any], ...], cfg: GenerationConfig) -> StartFn:
    def start(spec: EdgeSpec) -> Iterator[TextDelta]:
        return spec.stream_chat([dict(m) for m in messages], cfg)

    return start


def _completion(prompt: Prompt, cfg: GenerationConfig, echo: bool) -> StartFn:
    def start(spec: EdgeSpec) -> Iterator[TextDelta]:
        deltas = spec.stream(prompt, cfg)
        if not echo:
            return deltas
        text = prompt if isinstance(prompt, str) else spec.target.detokenize(prompt)
        return _echoed(deltas, text, cfg.logprobs is not None)

    return start


def _echoed(deltas: Iterator[TextDelta], text: str, logprobs: bool) -> Iterator[TextDelta]:
    """The answer with its prompt's text in front (OpenAI's echo: a string as it was given,
    token ids as their tokens' text): the first delta's text starts with it, and with logprobs
    the prompt's tokens' come first (the first token's null). The result's text and logprobs
    likewise; its token counts stay the answer's."""
    head: tuple[TokenLogprob, ...] = ()
    first = True
    try:
        for delta in deltas:
            if first:
                head = (delta.prompt_logprobs or ()) if logprobs else ()
                delta = replace(delta, text=text + delta.text, logprobs=head + delta.logprobs)
                first = False
            result = delta.result
            if result is not None:
                echoed = None if result.logprobs is None else head + result.logprobs
                result = replace(result, text=text + result.text, logprobs=echoed)
                delta = replace(delta, result=result)
            yield delta
    finally:
        close = getattr(deltas, "close", None)
        if close is not None:
            close()
