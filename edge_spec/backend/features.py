"""Self-distillation data for a draft head: the target generates answers to many prompts,
several sequences per batch, and every decoded row gives its final hidden state and the
target's most likely next tokens.

A context of its own (n_seq_max sequences, embeddings on, pooling NONE): llama.cpp then
outputs every row of a batch, which is what collection wants -- prompt rows are data too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from edge_spec.backend.runtime import _ensure_backend, _llama_error, default_threads
from edge_spec.errors import InvalidRequestError, ModelFileError
from edge_spec.gguf.validate import validate_gguf

log = logging.getLogger(__name__)

TOP = 8  # next-token candidates kept per row
LOOP_NGRAM = 24  # a sequence that repeats a 24-token stretch of itself has looped: it stops


@dataclass(frozen=True)
class SequenceFeatures:
    """One prompt and the target's answer: row i is what the target computed after tokens[i]."""

    prompt_index: int
    tokens: np.ndarray  # int32 (n,)
    hidden: np.ndarray  # float16 (n, n_embd): final hidden state (after the output norm)
    top_ids: np.ndarray  # int32 (n, TOP): the most likely tokens after tokens[i], descending
    top_logits: np.ndarray  # float16 (n, TOP): their logits
    n_prompt: int


@dataclass
class _Live:
    index: int
    tokens: list[int]
    hidden: list[np.ndarray]
    top_ids: list[np.ndarray]
    top_logits: list[np.ndarray]
    n_prompt: int
    seen: set[tuple[int, ...]]


class FeatureCollector:
    """Generates with the target, n_parallel sequences per batch, recording every row."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_parallel: int = 16,
        n_ctx_seq: int = 640,
        n_threads: int | None = None,
    ) -> None:
        if not 1 <= n_parallel <= 64:
            raise InvalidRequestError(f"n_parallel must be 1-64, got {n_parallel}")
        if n_ctx_seq < 32:
            raise InvalidRequestError(f"n_ctx_seq must be at least 32, got {n_ctx_seq}")
        validate_gguf(path)
        _ensure_backend()
        self.n_parallel, self.n_ctx_seq = n_parallel, n_ctx_seq
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = -1
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise ModelFileError(f"llama.cpp could not load {path}: {_llama_error('corrupt?')}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        threads = n_threads or default_threads()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_parallel * n_ctx_seq
        cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_seq_max = n_parallel
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.embeddings = True
        cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        cparams.no_perf = True
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            llama_cpp.llama_model_free(model)
            raise ModelFileError(f"no context for {path}: {_llama_error('out of memory?')}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._eog = np.array(
            [bool(llama_cpp.llama_vocab_is_eog(self._vocab, t)) for t in range(self.n_vocab)]
        )

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> FeatureCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        prompts: Sequence[tuple[int, Sequence[int]]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[SequenceFeatures]:
        """(index, prompt tokens) pairs in, one SequenceFeatures per finished prompt out (in
        completion order). Greedy at temperature 0, else sampled with a seeded RNG. Prompts too
        long for n_ctx_seq are cut from the left. Continuous batching: a sequence that ends
        frees its slot for the next prompt, so every batch stays full."""
        rng = np.random.default_rng(seed)
        # A prompt must fit in its sequence's context with the answer, and in one batch beside
        # the other slots' tokens.
        limit = min(self.n_ctx_seq - max_new_tokens, self.n_batch - self.n_parallel)
        if limit < 8:
            raise InvalidRequestError("max_new_tokens leaves no room for the prompt")
        queue = [(i, list(p)[-limit:]) for i, p in prompts if len(p) > 0]
        queue.reverse()  # pop() takes them in order
        llama_cpp.llama_memory_clear(self._mem, True)
        slots: list[_Live | None] = [None] * self.n_parallel
        while not should_stop():
            entries: list[tuple[int, int]] = []
            free: list[int] = []
            for s in range(self.n_parallel):
                seq = slots[s]
                if seq is None:
                    free.append(s)
                    continue
                token = self._choose(seq, temperature, rng)
                n_new = len(seq.tokens) - seq.n_prompt
                if self._eog[token] or n_new >= max_new_tokens or self._looped(seq, token):
                    yield self._finished(seq)
                    llama_cpp.llama_memory_seq_rm(self._mem, s, -1, -1)
                    slots[s] = None
                    free.append(s)
                else:
                    entries.append((s, token))
            # Free slots take the next prompts while the batch has room for them whole.
            for s in free:
                if not queue or len(entries) + len(queue[-1][1]) > self.n_batch:
                    break
                index, prompt = queue.pop()
                slots[s] = _Live(index, [], [], [], [], len(prompt), set())
                entries.extend((s, token) for token in prompt)
            if not entries:
                return
            self._step(slots, entries)

    @staticmethod
    def _finished(seq: _Live) -> SequenceFeatures:
        return SequenceFeatures(
            seq.index,
            np.asarray(seq.tokens, dtype=np.int32),
            np.stack(seq.hidden).astype(np.float16),
            np.stack(seq.top_ids).astype(np.int32),
            np.stack(seq.top_logits).astype(np.float16),
            seq.n_prompt,
        )

    @staticmethod
    def _choose(seq: _Live, temperature: float, rng: np.random.Generator) -> int:
        ids, logits = seq.top_ids[-1], seq.top_logits[-1]
        if temperature <= 0.0:
            return int(ids[0])
        # Sampling among the kept candidates at the given temperature (the data's variety; the
        # tail beyond them is left out).
        weights = np.exp((logits.astype(np.float64) - float(logits[0])) / temperature)
        return int(rng.choice(ids, p=weights / weights.sum()))

    @staticmethod
    def _looped(seq: _Live, token: int) -> bool:
        if len(seq.tokens) - seq.n_prompt < LOOP_NGRAM:
            return False
        key = (*seq.tokens[-LOOP_NGRAM + 1 :], token)
        if key in seq.seen:
            return True
        seq.seen.add(key)
        return False

    def _step(self, live: list[_Live | None], entries: list[tuple[int, int]]) -> None:
        """Decode (sequence, token) entries in one batch; record every row."""
        if not 0 < len(entries) <= self.n_batch:
            raise InvalidRequestError(f"a collection batch of {len(entries)} tokens")
        batch = self._batch
        for i, (s, token) in enumerate(entries):
            batch.token[i] = token
            seq = live[s]
            assert seq is not None
            batch.pos[i] = len(seq.tokens)
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = s
            batch.logits[i] = True
            seq.tokens.append(token)
        n = len(entries)
        batch.n_tokens = n
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            raise ModelFileError(f"llama_decode failed with code {rc} while collecting")
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits(self._ctx), shape=(n, self.n_vocab)
        )
        hidden = np.ctypeslib.as_array(
            llama_cpp.llama_get_embeddings(self._ctx), shape=(n, self.n_embd)
        )
        top = np.argpartition(logits, -TOP, axis=1)[:, -TOP:]
        top_logits = np.take_along_axis(logits, top, axis=1)
        order = np.argsort(-top_logits, axis=1)
        top = np.take_along_axis(top, order, axis=1)
        top_logits = np.take_along_axis(top_logits, order, axis=1)
        for i, (s, _) in enumerate(entries):
            seq = live[s]
            assert seq is not None
            seq.hidden.append(hidden[i].copy())
            seq.top_ids.append(top[i])
            seq.top_logits.append(top_logits[i])
