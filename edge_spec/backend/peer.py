"""A peer for the bench: llama-cpp-python's own prompt lookup, through its high-level Llama."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from edge_spec.backend.runtime import _ensure_backend, default_threads, supports_gpu_offload
from edge_spec.errors import ContextOverflowError, InvalidRequestError
from edge_spec.gguf.validate import validate_gguf


@dataclass(frozen=True)
class PeerGeneration:
    token_ids: tuple[int, ...]
    prefill_s: float  # evaluating the prompt
    decode_s: float  # from the first generated token's step to the last, as our stats count it
    finish_reason: str  # "eos" or "length"
    n_steps: int  # target passes that verified a draft
    n_drafted: int
    n_accepted: int  # tokens produced beyond one per pass


class PromptLookupPeer:
    """llama-cpp-python's speculation as its users run it: the high-level
    `Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens))` (defaults
    2 and 10), which verifies drafts through `Llama.generate` with logits for every row. Used by
    `edge-spec bench` as a peer, never by the engine."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        num_pred_tokens: int = 10,
        max_ngram_size: int = 2,
        n_ctx: int = 2048,
        n_threads: int | None = None,
    ) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        class Counting(LlamaPromptLookupDecoding):  # its calls are the target's passes
            calls = drafted = 0

            def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
                out = super().__call__(input_ids)
                self.calls += 1
                self.drafted += len(out)
                return out

        if num_pred_tokens < 1 or max_ngram_size < 1:
            raise InvalidRequestError("num_pred_tokens and max_ngram_size must be >= 1")
        validate_gguf(path)
        _ensure_backend()
        threads = n_threads or default_threads()
        self.settings = {"num_pred_tokens": num_pred_tokens, "max_ngram_size": max_ngram_size}
        self._llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=min(512, n_ctx),
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=-1 if supports_gpu_offload() else 0,
            draft_model=Counting(max_ngram_size, num_pred_tokens),
            # A draft model makes llama-cpp-python keep logits for every row, but it sizes
            # that buffer from this argument: left False, it holds n_batch rows and any
            # request past n_batch tokens fails with a broadcast error (0.3.36).
            logits_all=True,
            verbose=False,
        )
        self._draft = self._llm.draft_model
        self.n_ctx = self._llm.n_ctx()

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        *,
        num_pred_tokens: int | None = None,
        max_ngram_size: int | None = None,
        keep_prefix: bool = False,
        grammar: str | None = None,
        lookup: bool = True,
    ) -> PeerGeneration:
        """Greedy at temperature 0; otherwise its sampler with only the temperature on. The
        lookup settings may change per call (one Llama serves every setting of a sweep: with
        logits for every row it holds n_ctx x n_vocab floats).

        By default the prompt is evaluated from scratch and timed apart from the decode. With
        keep_prefix, as llama-cpp-python's own server serves a conversation, `Llama.generate`
        reuses the longest prefix it still holds from the previous call and evaluates the rest
        with its first draft; prefill_s is then the time to the first token.

        grammar: a GBNF grammar the answer must match (llama-cpp-python's LlamaGrammar, as its
        response_format with a schema uses it). lookup False: no prompt lookup, its plain
        decoding (the same loaded model)."""
        ids = [int(t) for t in prompt_ids]
        if not ids or len(ids) + max_tokens > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} + {max_tokens} tokens exceed {self.n_ctx}")
        llm = self._llm
        if not keep_prefix:
            llm.reset()
        llm.set_seed(seed)
        draft = self._draft
        draft.calls = draft.drafted = 0
        draft.num_pred_tokens = num_pred_tokens or self.settings["num_pred_tokens"]
        draft.max_ngram_size = max_ngram_size or self.settings["max_ngram_size"]
        t0 = time.perf_counter()
        if not keep_prefix:
            llm.eval(ids)  # the prompt; generate() below finds it cached and samples at once
        t1 = time.perf_counter()
        out: list[int] = []
        finish = "length"
        constraint = llama_cpp.LlamaGrammar.from_string(grammar, verbose=False) if grammar else None
        llm.draft_model = self._draft if lookup else None
        sampler = llm.generate(
            ids,
            temp=temperature,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            repeat_penalty=1.0,
            grammar=constraint,
        )
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        for token in sampler:
            if not out and keep_prefix:
                t1 = time.perf_counter()  # the prompt's pass ends with the first token
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                finish = "eos"
                break
            out.append(int(token))
            if len(out) >= max_tokens:
                break
        sampler.close()
        llm.draft_model = self._draft
        decode_s = time.perf_counter() - t1
        # Each draft call follows a pass that produced accepted drafts + 1 token; the first
        # token came from the prompt's pass.
        n_accepted = max(0, len(out) - 1 - draft.calls) if draft.drafted else 0
        return PeerGeneration(
            tuple(out), t1 - t0, decode_s, finish, draft.calls, draft.drafted, n_accepted
        )

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._llm.detokenize([int(t) for t in token_ids]).decode("utf-8", errors="replace")

    def close(self) -> None:
        self._llm.close()


def gbnf_of(options: Mapping[str, Any], call: Any) -> str | None:
    """The GBNF of a structured request, for llama-cpp-python: its response_format's JSON
    schema through llama-cpp-python's own converter (what its response_format does), or a
    call of one of its tools in the family's call format (call: a constrain.tools.CallFormat);
    None for free text."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    fmt = options.get("response_format")
    if fmt is not None:
        schema = (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema") or {}
        return json_schema_to_gbnf(json.dumps(schema or {"type": "object"}))
    tools = options.get("tools")
    if not tools:
        return None
    schemas = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for tool in tools
    ]
    body = json_schema_to_gbnf(json.dumps({"anyOf": schemas} if len(schemas) > 1 else schemas[0]))
    body = body.replace("root ::=", "call-body ::=")
    return f"root ::= {json.dumps(call.begin)} call-body {json.dumps(call.end)}\n{body}"
