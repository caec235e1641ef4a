"""The only module that imports llama_cpp: load a GGUF, tokenize, decode a batch with chosen logit
rows, roll the KV cache back, and report model facts.

llama.cpp aborts the whole process on a failed GGML_ASSERT, so everything it would assert on
(batch sizes, positions, token ids, file validity) is checked here in Python first.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from .errors import ContextOverflowError, EdgeSpecError, InvalidRequestError, ModelFileError
from .gguf import check_gguf_file
from .policy import MAX_TREE_LEAVES

log = logging.getLogger(__name__)
llama_log = logging.getLogger("edge_spec.llama_cpp")


# ggml log levels: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5. Everything goes to debug
# logging (load chatter, expected quantizer fallbacks); errors are also kept so that the exception
# we raise can say what llama.cpp objected to.
GGML_LOG_ERROR = 4
_recent_errors: collections.deque[str] = collections.deque(maxlen=4)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace").rstrip()
    if level == GGML_LOG_ERROR:
        _recent_errors.append(message)
    llama_log.debug("%s", message)


def _llama_error(default: str) -> str:
    """The first error llama.cpp logged since the last call (its root cause), or default."""
    reason = _recent_errors[0] if _recent_errors else default
    _recent_errors.clear()
    return reason.split(": ", 1)[-1] if reason.startswith("llama_") else reason


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
_init_lock = threading.Lock()
_backend_ready = False


def _ensure_backend() -> None:
    global _backend_ready
    with _init_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


FTYPES = {
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
}


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def llama_cpp_version() -> str:
    return str(getattr(llama_cpp, "__version__", "unknown"))


def llama_build() -> str:
    """What the installed llama.cpp was compiled with, as llama.cpp reports it: backends and CPU
    features, e.g. "CPU : SSE3 = 1 | ... | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1". Two builds
    of one version with other flags (no AVX-512, tinyBLAS off, CUDA) decode at other speeds."""
    _ensure_backend()
    text = (llama_cpp.llama_print_system_info() or b"").decode("utf-8", "replace")
    return " ".join(text.split()).strip(" |")


def quantize(src: Path, dst: Path, ftype: str, n_threads: int | None = None) -> None:
    """Requires a loadable GGUF at src; writes dst converted to ftype (requantizing is allowed)."""
    check_gguf_file(src)
    if ftype not in FTYPES:
        raise InvalidRequestError(f"unknown ftype {ftype!r}; choose from {sorted(FTYPES)}")
    _ensure_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    params.nthread = n_threads or os.cpu_count() or 1
    _recent_errors.clear()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        reason = _llama_error(f"code {rc}")
        raise ModelFileError(f"llama_model_quantize failed for {src} -> {ftype}: {reason}")


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
    ) -> None:
        self.path = Path(path)
        file_size = check_gguf_file(self.path)
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
        _recent_errors.clear()
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
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
        cparams.n_seq_max = MAX_TREE_LEAVES
        cparams.kv_unified = True
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            self.close()
            reason = _llama_error("out of memory?")
            raise ModelFileError(f"llama.cpp could not create a context for {self.path}: {reason}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, MAX_TREE_LEAVES)
        for i in range(self.n_batch):  # every token belongs to sequence 0 alone (but in trees)
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._tree: _Tree | None = None  # a decoded tree awaiting keep_tree()
        self.n_threads = threads
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
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
        self._eog = np.array(
            [bool(llama_cpp.llama_vocab_is_eog(self._vocab, t)) for t in range(self.n_vocab)]
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

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

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
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, False)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, big, -n, 0, False)
            return big.raw[:n]
        return self._piece_buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def token_text(self, token: int) -> bytes:
        """The vocabulary's raw text for a token id (used by the compatibility check)."""
        return bytes(llama_cpp.llama_vocab_get_text(self._vocab, token) or b"")

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

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
        last_start = ((n - 1) // self.n_batch) * self.n_batch
        if rows and rows[0] < last_start:
            raise InvalidRequestError("logit rows are only available in the last n_batch tokens")
        for start in range(0, n, self.n_batch):
            chunk = ids[start : start + self.n_batch]
            self._decode_chunk(chunk, [r - start for r in rows if start <= r < start + len(chunk)])
        if not rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return self._logits_view(len(rows))

    def _logits_view(self, n_rows: int) -> np.ndarray:
        """A (n_rows, n_vocab) view of llama.cpp's logits buffer. Building a view costs 0.06-0.15
        ms (a ctypes array type per call), so the last one is reused while the buffer stays put:
        it moves only when llama.cpp grows it for more output rows."""
        address = ctypes.cast(llama_cpp.llama_get_logits(self._ctx), ctypes.c_void_p).value
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
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, batch)
        self.decode_s += time.perf_counter() - t0
        if rc != 0:
            # Leave the cache consistent with self.tokens before reporting.
            llama_cpp.llama_memory_seq_rm(self._mem, 0, pos0, -1)
            if rc == 1:
                raise ContextOverflowError(f"no KV slot for {n} tokens at position {pos0}")
            raise EdgeSpecError(f"llama_decode failed with code {rc}")
        self.tokens.extend(chunk)

    def truncate(self, n_keep: int) -> None:
        """Drop every cached position >= n_keep (exact rollback: re-decoding gives the same
        logits bit for bit)."""
        if self._tree is not None:
            raise InvalidRequestError("keep_tree() must follow decode_tree()")
        if not 0 <= n_keep <= self.n_past:
            raise InvalidRequestError(f"cannot truncate to {n_keep} of {self.n_past} tokens")
        if n_keep == self.n_past:
            return
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
            # Some caches (sliding window, recurrent) cannot drop a partial sequence: start over.
            llama_cpp.llama_memory_clear(self._mem, True)
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
        branch is kept, nothing else may be decoded. Requires at most MAX_TREE_LEAVES leaves (an
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
        t0 = time.perf_counter()
        try:
            rc = llama_cpp.llama_decode(self._ctx, batch)
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
        return 1 if self.info.is_recurrent else MAX_TREE_LEAVES

    def sync(self, tokens: Sequence[int], keep_max: int | None = None) -> int:
        """Make the cache hold exactly `tokens`, re-decoding only after the common prefix (at most
        keep_max tokens of it kept); returns how many cached tokens were reused."""
        common = common_prefix(self.tokens, tokens)
        if keep_max is not None:
            common = min(common, keep_max)
        self.truncate(common)
        self.decode(tokens[common:])
        return common

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self.tokens = []
        self._tree = None


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
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def default_threads() -> int:
    """Physical cores where psutil knows them, else logical CPUs: decode is bandwidth-bound and
    hyper-threads only add contention."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil is a dependency, but never fail on this
        n = None
    return max(1, n or os.cpu_count() or 1)


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


# ---- a peer for the bench: llama-cpp-python's own prompt lookup ------------------------------


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
        check_gguf_file(Path(path))
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
    ) -> PeerGeneration:
        """Greedy at temperature 0; otherwise its sampler with only the temperature on. The
        lookup settings may change per call (one Llama serves every setting of a sweep: with
        logits for every row it holds n_ctx x n_vocab floats)."""
        ids = [int(t) for t in prompt_ids]
        if not ids or len(ids) + max_tokens > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} + {max_tokens} tokens exceed {self.n_ctx}")
        llm = self._llm
        llm.reset()
        llm.set_seed(seed)
        draft = self._draft
        draft.calls = draft.drafted = 0
        draft.num_pred_tokens = num_pred_tokens or self.settings["num_pred_tokens"]
        draft.max_ngram_size = max_ngram_size or self.settings["max_ngram_size"]
        t0 = time.perf_counter()
        llm.eval(ids)  # the prompt; generate() below finds it cached and samples at once
        t1 = time.perf_counter()
        out: list[int] = []
        finish = "length"
        sampler = llm.generate(
            ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0
        )
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        for token in sampler:
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                finish = "eos"
                break
            out.append(int(token))
            if len(out) >= max_tokens:
                break
        sampler.close()
        decode_s = time.perf_counter() - t1
        # Each draft call follows a pass that produced accepted drafts + 1 token; the first
        # token came from the prompt's pass.
        n_accepted = max(0, len(out) - 1 - draft.calls) if draft.drafted else 0
        return PeerGeneration(
            tuple(out), t1 - t0, decode_s, finish, draft.calls, draft.drafted, n_accepted
        )

    def close(self) -> None:
        self._llm.close()
