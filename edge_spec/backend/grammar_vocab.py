"""A model's vocabulary as llguidance sees it (its llama.cpp bridge), for grammar masks over the
target's own tokens. Building one walks every token's text (0.3 s for SmolLM2's 49,152 tokens,
2-6 s for Gemma-3's 262,144 here), so it is built once per model, on the first constrained
request, and kept."""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

import llama_cpp

from edge_spec.errors import InvalidRequestError

if TYPE_CHECKING:
    from edge_spec.backend.model import LlamaModel

_lock = threading.Lock()


def grammar_tokenizer(model: LlamaModel) -> Any:
    """The model's llguidance.LLTokenizer (built on first use, then the same object). Its end
    tokens are the model's end of text and end of turn, so a finished grammar lets the target
    stop however its template ends a turn."""
    with _lock:
        cached = getattr(model, "_grammar_tokenizer", None)
        if cached is not None:
            return cached
        if model._model is None:
            raise InvalidRequestError("the model is closed")
        from llguidance.llamacpp import lltokenizer_from_vocab

        vocab = model._vocab
        ends = [int(llama_cpp.llama_vocab_eos(vocab)), int(llama_cpp.llama_vocab_eot(vocab))]
        ends = sorted({t for t in ends if 0 <= t < model.n_vocab})
        with warnings.catch_warnings():  # the bridge calls a llama_cpp function it deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            tokenizer = lltokenizer_from_vocab(vocab, n_vocab=model.n_vocab, eos_token=ends or None)
        model._grammar_tokenizer = tokenizer
        return tokenizer
