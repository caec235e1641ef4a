"""One GGUF model with its own context: tokenize, decode a batch (a chain, or a token tree
with one sequence per branch) with chosen logit rows, roll the KV cache back, report facts.

llama.cpp aborts the whole process on a failed GGML_ASSERT, so everything it would assert on
(batch sizes, positions, token ids, sequence ids, file validity) is checked here first.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from edge_spec.backend.rpc import any_added as _rpc_added
from edge_spec.backend.rpc import local_devices as _local_devices
from edge_spec.backend.runtime import (
    _ensure_backend,
    _llama_error,
    _recent_errors,
    default_threads,
    llama_build,
    supports_gpu_offload,
)
from edge_spec.errors import (
    ContextOverflowError,
    EdgeSpecError,
    InvalidRequestError,
    ModelFileError,
    RpcError,
)
from edge_spec.gguf.validate import validate_gguf

log = logging.getLogger(__name__)

# Sequences a context holds: a token tree decodes one per leaf over the shared (unified) KV
# cache, so the policies' trees may have at most this many leaves.
MAX_SEQUENCES = 4


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a loaded model."""

    path: Path
    file_size_bytes: int
    description: str
    n_params: int
    n_vocab: int
    n_ctx: int
    n_ctx_train: int
    n_batch: int
    vocab_type: int
    bos_id: int
    eos_id: int
    add_bos: bool
    chat_template: str | None
    is_recurrent: bool
    architecture: str = ""  # general.architecture, e.g. "llama", "gemma3"


class LlamaModel:
    """One GGUF model with its own context holding a single sequence.

    The KV cache mirrors `self.tokens`: decode() appends, truncate() drops a suffix. Logit rows
    returned by decode() are views into llama.cpp's buffer, valid until the next decode() on
    this model.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        n_gpu_layers: int = -1,
        hidden_states: bool = False,
        devices: Sequence[int] | None = None,
        flash_attn: bool | None = None,
        warm_rows: int = 0,
    ) -> None:
        """devices: the ggml devices the offloaded layers may use (backend.rpc: the RPC
        servers' for a target spread over machines, this machine's own for a local draft);
        None: every registered device, llama.cpp's default. flash_attn: None is off when every
        layer runs on this machine's CPU and llama.cpp's own choice (auto) otherwise (see
        _flash_attn_type). warm_rows: how many logit rows the context should have output
        before its first verification (see sync())."""
        self.path = Path(path)
        file_size = validate_gguf(self.path).file_size_bytes
        if n_ctx < 16:
            raise InvalidRequestError(f"n_ctx must be at least 16, got {n_ctx}")
        if n_batch < 1:
            raise InvalidRequestError(f"n_batch must be at least 1, got {n_batch}")
        _ensure_backend()
        self._model = None
        self._ctx = None
        self._batch = None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers if supports_gpu_offload() else 0
        if devices is None and _rpc_added():
            devices = _local_devices()  # rpc-servers only for those who ask for them
        device_array = None
        # Spread over rpc-servers: llama.cpp calls that talk to them go through rpc's guard.
        self._rpc = bool(devices) and any(d not in _local_devices() for d in devices or ())
        if devices is not None:
            device_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            mparams.devices = ctypes.cast(device_array, ctypes.c_void_p)
            if devices:
                mparams.n_gpu_layers = n_gpu_layers  # RPC servers take layers on a CPU build
        self.n_gpu_layers = mparams.n_gpu_layers  # offloaded layers (-1: all; 0 on CPU builds)
        _recent_errors.clear()
        model = self._call(llama_cpp.llama_model_load_from_file, str(self.path).encode(), mparams)
        del device_array  # llama.cpp copied the list
        if not model:
            reason = _llama_error("truncated or corrupt?")
            raise ModelFileError(f"llama.cpp could not load {self.path}: {reason}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        n_ctx = min(n_ctx, n_ctx_train) if n_ctx_train > 0 else n_ctx
        n_batch = min(n_batch, n_ctx)
        threads = n_threads or default_threads()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        # Token trees: one sequence per branch over one shared (unified) KV buffer; a chain
        # uses sequence 0 alone, as with a single sequence.
        cparams.n_seq_max = MAX_SEQUENCES
        cparams.kv_unified = True
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = _flash_attn_type(flash_attn, mparams.n_gpu_layers)
        cparams.no_perf = True
        if hidden_states:
            # Per-token final hidden states beside the logits (switched on per decode, below).
            cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        ctx = self._call(llama_cpp.llama_init_from_model, model, cparams)
        if not ctx:
            self.close()
            reason = _llama_error("out of memory?")
            raise ModelFileError(f"llama.cpp could not create a context for {self.path}: {reason}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, MAX_SEQUENCES)
        for i in range(self.n_batch):  # every token belongs to sequence 0 alone (but in trees)
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._tree: _Tree | None = None  # a decoded tree awaiting keep_tree()
        self.n_threads = threads
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        # Whether decodes that output every row also return the hidden states (hidden()): with
        # embeddings on llama.cpp outputs every row of a batch, so a prefill asking for a few
        # rows keeps them off.
        self.hidden_states = hidden_states
        self._embeddings_on = False
        self._hidden_rows = 0  # rows of hidden states the last decode left (0: none)
        self.warm_rows = max(0, warm_rows)
        self._rows_out = 0  # the most logit rows one decode has output in this context
        # llama.cpp may pad the context up; the limit the caller asked for is the one we keep.
        self.n_ctx = min(n_ctx, int(llama_cpp.llama_n_ctx(ctx)))
        self.tokens: list[int] = []
        self.decode_s = 0.0  # seconds spent inside llama_decode, ever (the engine takes deltas)
        self._logits_cache: tuple[int, np.ndarray] | None = None
        template = llama_cpp.llama_model_chat_template(model, None)
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, desc, 256)
        self.info = ModelInfo(
            path=self.path,
            file_size_bytes=file_size,
            description=desc.value.decode("utf-8", "replace"),
            n_params=int(llama_cpp.llama_model_n_params(model)),
            n_vocab=self.n_vocab,
            n_ctx=self.n_ctx,
            n_ctx_train=n_ctx_train,
            n_batch=self.n_batch,
            vocab_type=int(llama_cpp.llama_vocab_type(self._vocab)),
            bos_id=int(llama_cpp.llama_vocab_bos(self._vocab)),
            eos_id=int(llama_cpp.llama_vocab_eos(self._vocab)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(self._vocab)),
            chat_template=template.decode("utf-8") if template else None,
            is_recurrent=bool(llama_cpp.llama_model_is_recurrent(model)),
            architecture=self._meta("general.architecture"),
        )
        self._piece_buf = ctypes.create_string_buffer(256)
        log.debug(
            "loaded %s: %s, n_ctx=%d n_batch=%d threads=%d",
            self.path.name,
            self.info.description,
            self.n_ctx,
            self.n_batch,
            threads,
        )

    def _meta(self, key: str) -> str:
        """A string metadata value of the model ("" if absent)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, 256)
        return buf.value.decode("utf-8", "replace") if n >= 0 else ""

    # ---- lifecycle -------------------------------------------------------------------------

    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        """A llama.cpp call that may talk to rpc-servers: guarded on an RPC model."""
        if not getattr(self, "_rpc", False):
            return fn(*args)
        from edge_spec.backend.rpc import call_guarded

        return call_guarded(fn, *args)

    def close(self) -> None:
        # llguidance's tokenizer calls into this model's vocabulary: never past its life.
        self._grammar_tokenizer = None
        if getattr(self, "_rpc", False):
            from edge_spec.backend.rpc import lost

            if lost() is not None:  # freeing would talk to the lost server: leave it
                self._batch = self._ctx = self._model = None
                return
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)  # host memory only
            self._batch = None
        try:  # freeing an RPC model's buffers talks to its servers: guarded
            if getattr(self, "_ctx", None):
                self._call(llama_cpp.llama_free, self._ctx)
                self._ctx = None
            if getattr(self, "_model", None):
                self._call(llama_cpp.llama_model_free, self._model)
                self._model = None
        except RpcError:
            log.warning("an rpc-server was lost while freeing %s: left allocated", self.path)
            self._ctx = self._model = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- vocabulary ------------------------------------------------------------------------

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, cap, add_special, parse_special
            )
        if n < 0:
            raise EdgeSpecError(f"tokenization failed ({n})")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token contributes to output text (control tokens contribute nothing)."""
        return self._piece(token, self._piece_buf)

    def _piece(self, token: int, buf: ctypes.Array) -> bytes:
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, big, -n, 0, False)
            return big.raw[:n]
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.pieces(tokens)).decode("utf-8", "replace")

    def pieces(self, tokens: Sequence[int]) -> list[bytes]:
        """Each token's bytes, each id in [0, n_vocab). Safe beside a running decode on
        another thread (a buffer of its own; the vocabulary is read-only), as in a server's
        handler."""
        ids = [int(t) for t in tokens]
        if ids and (min(ids) < 0 or max(ids) >= self.n_vocab):
            raise InvalidRequestError(f"token id out of range [0, {self.n_vocab})")
        buf = ctypes.create_string_buffer(256)
        return [self._piece(t, buf) for t in ids]

    def token_text(self, token: int) -> bytes:
        """The vocabulary's raw text for a token id (used by the compatibility check)."""
        return bytes(llama_cpp.llama_vocab_get_text(self._vocab, token) or b"")

    def is_eog(self, token: int) -> bool:
        # Asked once per produced token: a table of the whole vocabulary would cost every load
        # 0.1 s (Gemma's 262,144 tokens), more than a whole answer's calls.
        token = int(token)
        if not 0 <= token < self.n_vocab:  # llama.cpp would throw across the C boundary
            raise InvalidRequestError(f"token id {token} out of range [0, {self.n_vocab})")
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # ---- decoding --------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def decode(self, tokens: Sequence[int], logit_rows: Sequence[int] = ()) -> np.ndarray:
        """Append `tokens` to the KV cache at positions n_past.. and return the logits of the
        requested rows (indices into `tokens`, ascending), shape (len(logit_rows), n_vocab).

        Requires every id in [0, n_vocab) and n_past + len(tokens) <= n_ctx; raises
        ContextOverflowError / InvalidRequestError before llama.cpp sees anything bad. Batches
        longer than n_batch are split; rows may then only be asked for in the last chunk.
        """
        n = len(tokens)
        if n == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if self._tree is not None:
            raise InvalidRequestError("keep_tree() must follow decode_tree()")
        if self.n_past + n > self.n_ctx:
            raise ContextOverflowError(
                f"{self.n_past + n} tokens do not fit in the context of {self.n_ctx}"
            )
        ids = [int(t) for t in tokens]  # plain ints: a step's batch is a handful of tokens
        if min(ids) < 0 or max(ids) >= self.n_vocab:
            raise InvalidRequestError(f"token id out of range [0, {self.n_vocab})")
        rows = list(logit_rows)
        if rows and (rows != sorted(set(rows)) or rows[0] < 0 or rows[-1] >= n):
            raise InvalidRequestError(f"logit rows must be ascending indices into {n} tokens")
        last_start = self._last_chunk_start(n)
        if rows and rows[0] < last_start:
            raise InvalidRequestError("logit rows are only available in the last n_batch tokens")
        for start in range(0, n, self.n_batch):
            chunk = ids[start : start + self.n_batch]
            self._decode_chunk(chunk, [r - start for r in rows if start <= r < start + len(chunk)])
        if not rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return self._logits_view(len(rows))

    def _last_chunk_start(self, n: int) -> int:
        """Where the last n_batch chunk of an n-token decode starts (0 for n = 0): only its
        rows can be output."""
        return (max(n - 1, 0) // self.n_batch) * self.n_batch

    def _logits_view(self, n_rows: int) -> np.ndarray:
        """A (n_rows, n_vocab) view of llama.cpp's logits buffer. Building a view costs 0.06-0.15
        ms (a ctypes array type per call), so the last one is reused while the buffer stays put:
        it moves only when llama.cpp grows it for more output rows."""
        # llama_get_logits waits for the decode's graph (llama_decode may return before it
        # finishes): on an RPC target that wait is on the servers, so it is guarded too.
        logits = self._call(llama_cpp.llama_get_logits, self._ctx)
        address = ctypes.cast(logits, ctypes.c_void_p).value
        cached = self._logits_cache
        if cached is None or cached[0] != address or cached[1].shape[0] < n_rows:
            interface = {
                "data": (address, False),
                "shape": (n_rows, self.n_vocab),
                "typestr": "<f4",
                "version": 3,
            }
            view = np.asarray(_ArrayInterface(interface))
            self._logits_cache = cached = (address, view)
        return cached[1][:n_rows]

    def _decode_chunk(self, chunk: list[int], rows: list[int]) -> None:
        batch = self._batch
        token, pos, logits = batch.token, batch.pos, batch.logits  # n_seq_id, seq_id: fixed
        n = len(chunk)
        pos0 = self.n_past
        want = set(rows)
        for i in range(n):
            token[i] = chunk[i]
            pos[i] = pos0 + i
            logits[i] = i in want
        batch.n_tokens = n
        self._rows_out = max(self._rows_out, len(want))
        self._set_embeddings(self.hidden_states and len(want) == n)
        t0 = time.perf_counter()
        rc = self._call(llama_cpp.llama_decode, self._ctx, batch)
        self.decode_s += time.perf_counter() - t0
        self._hidden_rows = n if rc == 0 and self._embeddings_on else 0
        if rc != 0:
            # Leave the cache consistent with self.tokens before reporting.
            self._call(llama_cpp.llama_memory_seq_rm, self._mem, 0, pos0, -1)
            if rc == 1:
                raise ContextOverflowError(f"no KV slot for {n} tokens at position {pos0}")
            raise EdgeSpecError(f"llama_decode failed with code {rc}")
        self.tokens.extend(chunk)

    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            llama_cpp.llama_set_embeddings(self._ctx, on)
            self._embeddings_on = on

    def hidden(self, row: int) -> np.ndarray:
        """The final hidden state (after the output norm) of a row of the last decode, a copy
        of n_embd floats. Requires hidden_states=True and a last decode (or tree) that output
        every row of its batch -- the engine's target passes do."""
        if not 0 <= row < self._hidden_rows:
            raise InvalidRequestError(
                f"no hidden state for row {row}: the last decode left {self._hidden_rows}"
            )
        pointer = self._call(llama_cpp.llama_get_embeddings_ith, self._ctx, row)
        return np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).copy()

    def truncate(self, n_keep: int) -> None:
        """Drop every cached position >= n_keep (exact rollback: re-decoding gives the same
        logits bit for bit)."""
        if self._tree is not None:
            raise InvalidRequestError("keep_tree() must follow decode_tree()")
        if not 0 <= n_keep <= self.n_past:
            raise InvalidRequestError(f"cannot truncate to {n_keep} of {self.n_past} tokens")
        if n_keep == self.n_past:
            return
        if not self._call(llama_cpp.llama_memory_seq_rm, self._mem, 0, n_keep, -1):
            # Some caches (sliding window, recurrent) cannot drop a partial sequence: start over.
            self._call(llama_cpp.llama_memory_clear, self._mem, True)
            kept = self.tokens[:n_keep]
            self.tokens = []
            self.decode(kept)
            return
        del self.tokens[n_keep:]

    def decode_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Decode a token tree in one batch and return every token's logits, shape (n, n_vocab).

        tokens[0] continues the cache (parents[0] == -1); every other token's parent is an
        earlier index. Each leaf's branch is one sequence sharing the cached prefix (unified
        KV), so a token attends to the cache and its own ancestors only: row i equals what
        decoding the branch up to token i as a chain would give. Until keep_tree() says which
        branch is kept, nothing else may be decoded. Requires at most MAX_SEQUENCES leaves (an
        attention-free model, which cannot share a prefix, has max_tree_leaves 1), ids in
        range, and the tree's depth within the context.
        """
        n = len(tokens)
        if self._tree is not None:
            raise InvalidRequestError("keep_tree() must follow decode_tree()")
        if not 1 <= n <= self.n_batch:
            raise InvalidRequestError(f"a tree needs 1 to {self.n_batch} tokens, got {n}")
        ids = [int(t) for t in tokens]
        if min(ids) < 0 or max(ids) >= self.n_vocab:
            raise InvalidRequestError(f"token id out of range [0, {self.n_vocab})")
        tree = _Tree.build(self.n_past, ids, parents)
        if len(tree.leaves) > self.max_tree_leaves:
            raise InvalidRequestError(
                f"a tree of {len(tree.leaves)} leaves; this context holds {self.max_tree_leaves}"
            )
        if self.n_past + max(tree.depth) + 1 > self.n_ctx:
            raise ContextOverflowError(f"a tree of depth {max(tree.depth) + 1} does not fit")
        batch, mem = self._batch, self._mem
        for seq in range(1, len(tree.leaves)):  # every branch sees the cached prefix
            llama_cpp.llama_memory_seq_cp(mem, 0, seq, -1, -1)
        for i in range(n):
            batch.token[i] = ids[i]
            batch.pos[i] = tree.pos0 + tree.depth[i]
            batch.logits[i] = True
            batch.n_seq_id[i] = len(tree.seqs[i])
            for j, seq in enumerate(tree.seqs[i]):
                batch.seq_id[i][j] = seq
        batch.n_tokens = n
        self._set_embeddings(self.hidden_states)
        t0 = time.perf_counter()
        try:
            rc = self._call(llama_cpp.llama_decode, self._ctx, batch)
            self._hidden_rows = n if rc == 0 and self._embeddings_on else 0
        finally:
            self.decode_s += time.perf_counter() - t0
            for i in range(n):
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
        if rc != 0:
            llama_cpp.llama_memory_seq_rm(mem, 0, tree.pos0, -1)
            for seq in range(1, len(tree.leaves)):
                llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
            raise EdgeSpecError(f"llama_decode failed with code {rc} on a token tree")
        self._tree = tree
        return self._logits_view(n)

    def keep_tree(self, path: Sequence[int]) -> None:
        """After decode_tree(): keep tokens[0] and the tree tokens on `path` (indices, each the
        child of the one before, the first a child of tokens[0]) in the cache; drop the rest."""
        tree = self._tree
        if tree is None:
            raise InvalidRequestError("keep_tree() without a decoded tree")
        path = [int(i) for i in path]
        for prev, node in zip([0, *path], path):
            if not 0 < node < len(tree.tokens) or tree.parents[node] != prev:
                raise InvalidRequestError(f"{path} is not a path of the tree")
        self._tree = None
        end = tree.pos0 + 1 + len(path)  # the kept positions end here
        mem = self._mem
        seq = tree.seqs[path[-1] if path else 0][0]  # a branch holding the whole path
        if seq == 0:
            ok = llama_cpp.llama_memory_seq_rm(mem, 0, end, -1)
        else:
            ok = llama_cpp.llama_memory_seq_rm(mem, 0, tree.pos0 + 1, -1)
            llama_cpp.llama_memory_seq_cp(mem, seq, 0, tree.pos0 + 1, end)
        for other in range(1, len(tree.leaves)):
            llama_cpp.llama_memory_seq_rm(mem, other, -1, -1)
        kept = [tree.tokens[0], *(tree.tokens[i] for i in path)]
        if not ok:  # a cache that cannot drop part of a sequence: start over
            kept = self.tokens + kept
            self.reset()
            self.decode(kept)
            return
        self.tokens.extend(kept)

    @property
    def max_tree_leaves(self) -> int:
        """How many branches a token tree may have here (1: chains only)."""
        return 1 if self.info.is_recurrent else MAX_SEQUENCES

    def sync(self, tokens: Sequence[int], keep_max: int | None = None) -> int:
        """Make the cache hold exactly `tokens`, re-decoding only after the common prefix (at most
        keep_max tokens of it kept); returns how many cached tokens were reused.

        Until the context has output warm_rows logit rows in one decode, this prefill outputs
        its last ones (up to warm_rows) and drops them: llama.cpp's buffers for k + 1 rows are
        first touched here and not in the first verification, whose pages would otherwise
        fault in then (Gemma-3-270M F16 here: a first 5-token step 51-59 ms, then 37-42; a
        first 1-token step 37-46 ms, then 28-35). A draft's first verification would pay for
        the process's memory and the risk ledger would charge its drafting that loss."""
        common = common_prefix(self.tokens, tokens)
        if keep_max is not None:
            common = min(common, keep_max)
        self.truncate(common)
        n_new = len(tokens) - common
        warm = min(self.warm_rows, n_new - self._last_chunk_start(n_new))
        rows = range(n_new - warm, n_new) if warm > self._rows_out else ()
        self.decode(tokens[common:], rows)
        return common

    def reset(self) -> None:
        self._call(llama_cpp.llama_memory_clear, self._mem, True)
        self.tokens = []
        self._tree = None


def _flash_attn_type(flash_attn: bool | None, n_gpu_layers: int) -> int:
    """llama.cpp's flash attention on its CPU backend computes a batch's query rows one at a
    time, so a verify batch of n tokens reads the whole KV cache n times; its default (auto)
    turns it on there all the same. Measured at a 3,000-token context (SmolLM2-135M F16, 2
    threads; scripts/measure_flash_attn.py, in git history): t(17) / t(1) 6.3 with it, 3.9
    without, and t(1) 5 % slower with it. So None means off when no layer is offloaded (nor on
    RPC servers), llama.cpp's auto where layers run on a GPU (whose kernels batch the rows),
    and also on a build without tinyBLAS (`bootstrap.py --batch-invariant`): that build is
    chosen for output bit-identical whatever was drafted, which was measured with flash
    attention on (and a token tree's rows are bit-identical to its chains' only with it)."""
    if flash_attn is not None:
        return (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
    if n_gpu_layers == 0 and "LLAMAFILE = 1" in llama_build():
        return llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO


@dataclass(frozen=True)
class _Tree:
    """A decoded token tree's layout: each token's depth below tokens[0] and the sequences
    (one per leaf, in index order) whose branch passes through it."""

    pos0: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depth: tuple[int, ...]
    seqs: tuple[tuple[int, ...], ...]
    leaves: tuple[int, ...]

    @classmethod
    def build(cls, pos0: int, tokens: list[int], parents: Sequence[int]) -> _Tree:
        n = len(tokens)
        parents = tuple(int(p) for p in parents)
        if len(parents) != n or parents[0] != -1:
            raise InvalidRequestError("a tree needs one parent per token, -1 for the first")
        if any(not 0 <= p < i for i, p in enumerate(parents) if i > 0):
            raise InvalidRequestError("a tree token's parent must be an earlier token")
        depth = [0] * n
        has_child = [False] * n
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
            has_child[parents[i]] = True
        leaves = tuple(i for i in range(n) if not has_child[i])
        seqs: list[list[int]] = [[] for _ in range(n)]
        for seq, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                seqs[node].append(seq)
                node = parents[node]
        return cls(pos0, tuple(tokens), parents, tuple(depth), tuple(map(tuple, seqs)), leaves)


class _ArrayInterface:
    """Memory numpy may view through the array interface (no copy)."""

    def __init__(self, interface: dict[str, object]) -> None:
        self.__array_interface__ = interface


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (two lists or two tuples
    that agree throughout are compared as slices, without a loop per token)."""
    n = min(len(a), len(b))
    if isinstance(a, list | tuple) and type(a) is type(b) and a[:n] == b[:n]:
        return n
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return n


def smoke_test(path: str | os.PathLike[str]) -> None:
    """Load `path`, decode a short prompt as one batch and then token by token, and check the
    logits are finite. The set-up runs this in a child process right after installing, so a
    broken build (e.g. the AMX segfault on first decode) fails set-up loudly, not a user's run."""
    with LlamaModel(path, n_ctx=128, n_batch=32) as model:
        ids = model.tokenize("The capital of France is")
        logits = model.decode(ids, [len(ids) - 1])
        if not np.isfinite(logits).all():
            raise EdgeSpecError("smoke decode produced non-finite logits")
        token = int(np.argmax(logits[0]))
        for _ in range(4):
            token = int(np.argmax(model.decode([token], [0])[0]))
