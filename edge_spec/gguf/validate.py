"""Validate a GGUF file before llama.cpp sees it: everything its reader and its vocabulary
loader would trust or assert on, checked against the file's own size.

llama.cpp aborts the whole process on a failed GGML_ASSERT (two vocabulary entries with the same
text, for one) and a corrupted length can make a reader seek past any sane offset, so a file
that did not come from here is parsed in full -- header, every key/value, every tensor info --
and refused with one ModelFileError naming the field. Results are cached by file identity
(path, size, mtime, inode): a model is validated once per process, not once per load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_spec.errors import ModelFileError
from edge_spec.files import atomic_output, cache_dir, file_identity

log = logging.getLogger(__name__)

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name must be shorter
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 1 << 16
# Value types: scalars by struct format; 8 = string, 9 = array.
SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
# ggml tensor types: (elements per block, bytes per block), as ggml_blck_size / ggml_type_size
# report them in llama-cpp-python 0.3.36's ggml (types 4, 5, 31-33, 36-38 were removed).
TENSOR_TYPES = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
    40: (64, 36),
    41: (128, 18),
    42: (64, 18),
}
# Special token ids the vocabulary loader indexes with (when present, each must be a token).
SPECIAL_TOKEN_KEYS = tuple(
    f"tokenizer.ggml.{name}_token_id"
    for name in (
        "bos",
        "eos",
        "eot",
        "eom",
        "unknown",
        "seperator",
        "padding",
        "mask",
        "cls",
        "fim_pre",
        "fim_suf",
        "fim_mid",
        "fim_pad",
        "fim_rep",
        "fim_sep",
    )
)


@dataclass(frozen=True)
class GgufSummary:
    """What validation saw: counts, for messages and tests."""

    file_size_bytes: int
    version: int
    n_tensors: int
    n_kv: int
    n_vocab: int
    data_offset: int
    # name -> (ggml type, dims, absolute byte offset of its data): what a reader of one tensor
    # (the draft head's embedding rows) needs, already checked to lie inside the file.
    tensors: dict[str, TensorLayout] = field(default_factory=dict, compare=False, repr=False)
    # Every key's value: scalars and strings as read, arrays as their length (what memory
    # planning reads, gguf.read_metadata, without a second pass over the file).
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # sha256 of tokenizer.ggml.tokens as stored (each text with its length): equal digests,
    # equal vocabularies ("" when the file has none).
    vocab_sha256: str = field(default="", compare=False, repr=False)
    # name -> (value type, offset of its type field, offset past its value), in file order:
    # where each key's value lies, for a writer that copies them (models.layer_subset).
    kv_spans: dict[str, tuple[int, int, int]] = field(
        default_factory=dict, compare=False, repr=False
    )


@dataclass(frozen=True)
class TensorLayout:
    ggml_type: int
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    offset: int
    n_bytes: int


class _Bad(Exception):
    """A field that fails validation (turned into ModelFileError with the path)."""


class _Reader:
    """Bounded little-endian reads over the file's bytes: every length is checked against what
    is left before anything is sliced."""

    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data = data
        self.size = len(data)
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.size - self.pos:
            raise _Bad(f"{what}: {n} bytes at offset {self.pos} run past the end of the file")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", what))

    def string(self, what: str, limit: int | None = None) -> bytes:
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise _Bad(f"{what}: length {n} exceeds {limit}")
        return self.take(n, what)

    def skip(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise _Bad(f"{what}: {n} bytes at offset {self.pos} run past the end of the file")
        self.pos += n


_RULES = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]  # these rules, recorded
_cache: OrderedDict[tuple, GgufSummary] = OrderedDict()
_cache_lock = threading.Lock()


def validate_gguf(path: str | os.PathLike[str]) -> GgufSummary:
    """Requires nothing. Returns what the file holds, or raises ModelFileError naming the first
    field that llama.cpp would trust or assert on and that does not hold: magic and version,
    counts against the file size, every key (UTF-8, unique) and value (known types, lengths
    inside the file), the alignment, the vocabulary (token texts unique; scores, types and
    special token ids consistent with it), and every tensor info (a short unique name, 1-4
    positive dimensions, a known type whose rows are whole blocks, an aligned offset whose data
    lies inside the file)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {path}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror}") from exc
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    key = file_identity(path, st)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    summary = _read_record(path, st)
    if summary is None:
        summary = _validate_file(path, st)
        _write_record(path, st, summary)
    with _cache_lock:
        _cache[key] = summary
        while len(_cache) > 64:
            _cache.popitem(last=False)
    return summary


def _validate_file(path: Path, st: os.stat_result) -> GgufSummary:
    try:
        with path.open("rb") as f:
            if st.st_size == 0:
                raise _Bad("the file is empty")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                summary = _validate(_Reader(data))
    except _Bad as exc:
        raise ModelFileError(f"invalid GGUF {path}: {exc}") from None
    except (OSError, ValueError) as exc:  # mmap of an unreadable file, a vanished file
        raise ModelFileError(f"cannot read {path}: {exc}") from exc
    return summary


# ---- validated files, remembered across processes -------------------------------------------
#
# A one-shot process validated each model again: 0.27 s for a Gemma-3 file (its 262k-token
# vocabulary walked), twice with a draft. A file that passed is recorded under the model
# cache, by its path and size and by this module's own source (new rules, new records), with
# the sha256 of everything validation reads: the bytes before the tensor data (4 ms for
# Gemma-3's, which its vocabulary fills). A record whose bytes differ, or that does not read
# back, is ignored: a file rewritten in place within one clock tick is validated again.

MAX_RECORDS = 256


def _records_dir() -> Path:
    return cache_dir() / "validated"


def _record_path(path: Path, st: os.stat_result) -> Path:
    name = json.dumps([str(path.resolve()), st.st_size, _RULES])
    return _records_dir() / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.json"


def _header_sha256(path: Path, n_bytes: int) -> str:
    with path.open("rb") as f:
        return hashlib.sha256(f.read(n_bytes)).hexdigest()


def _read_record(path: Path, st: os.stat_result) -> GgufSummary | None:
    try:
        raw = json.loads(_record_path(path, st).read_text(encoding="utf-8"))
        s = raw["summary"]
        if raw["rules"] != _RULES or s["file_size_bytes"] != st.st_size:
            return None
        if raw["header_sha256"] != _header_sha256(path, s["data_offset"]):
            return None
        return GgufSummary(
            s["file_size_bytes"],
            s["version"],
            s["n_tensors"],
            s["n_kv"],
            s["n_vocab"],
            s["data_offset"],
            {n: TensorLayout(t, tuple(d), o, b) for n, (t, d, o, b) in s["tensors"].items()},
            s["metadata"],
            s["vocab_sha256"],
            {n: (v, a, b) for n, (v, a, b) in s["kv_spans"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(path: Path, st: os.stat_result, summary: GgufSummary) -> None:
    record = {
        "rules": _RULES,
        "summary": {
            "file_size_bytes": summary.file_size_bytes,
            "version": summary.version,
            "n_tensors": summary.n_tensors,
            "n_kv": summary.n_kv,
            "n_vocab": summary.n_vocab,
            "data_offset": summary.data_offset,
            "tensors": {
                n: [t.ggml_type, list(t.dims), t.offset, t.n_bytes]
                for n, t in summary.tensors.items()
            },
            "metadata": summary.metadata,
            "vocab_sha256": summary.vocab_sha256,
            "kv_spans": {n: list(span) for n, span in summary.kv_spans.items()},
        },
    }
    try:
        record["header_sha256"] = _header_sha256(path, summary.data_offset)
        target = _record_path(path, st)
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(target) as tmp:
            tmp.write_text(json.dumps(record), encoding="utf-8")
        records = sorted(target.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in records[:-MAX_RECORDS]:
            old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError) as exc:  # a read-only cache: validate each time
        log.debug("validated file not recorded: %s", exc)


def _validate(r: _Reader) -> GgufSummary:
    if r.size < 24 or r.take(4, "magic") != MAGIC:
        raise _Bad("not a GGUF file (bad magic or shorter than a header)")
    version = r.u32("version")
    if version not in VERSIONS:
        raise _Bad(f"unsupported version {version}")
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("key/value count")
    # Every key/value takes at least 13 bytes (an empty key's length, a type, a u8); every
    # tensor info at least 29 (name length, n_dims, one dim, type, offset).
    if n_kv > (r.size - r.pos) // 13:
        raise _Bad(f"key/value count {n_kv} cannot fit in the file")
    if n_tensors > (r.size - r.pos) // 29:
        raise _Bad(f"tensor count {n_tensors} cannot fit in the file")
    meta: dict[str, Any] = {}
    spans: dict[str, tuple[int, int, int]] = {}
    for i in range(n_kv):
        raw = r.string(f"key {i}", MAX_KEY_BYTES)
        name = _utf8(raw, f"key {i}")
        if name in meta:
            raise _Bad(f"duplicate key {name!r}")
        start = r.pos
        vtype = r.u32(f"type of {name}")
        meta[name] = _value(r, vtype, name, depth=0)
        spans[name] = (vtype, start, r.pos)
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Bad(f"general.alignment must be a power of two, got {alignment!r}")
    tensors = [_tensor_info(r, i) for i in range(n_tensors)]
    data_offset = -(-r.pos // alignment) * alignment
    if data_offset > r.size:
        raise _Bad("the tensor data section starts past the end of the file")
    data_size = r.size - data_offset
    seen: set[bytes] = set()
    layouts: dict[str, TensorLayout] = {}
    for name, n_bytes, offset, ttype, dims in tensors:
        label = name.decode("utf-8", "replace")
        if name in seen:
            raise _Bad(f"duplicate tensor name {label!r}")
        seen.add(name)
        if offset % alignment:
            raise _Bad(f"tensor {label!r}: offset {offset} is not a multiple of {alignment}")
        if offset > data_size or n_bytes > data_size - offset:
            raise _Bad(f"tensor {label!r}: its {n_bytes} bytes at {offset} run past the file")
        layouts[label] = TensorLayout(ttype, dims, data_offset + offset, n_bytes)
    n_vocab = _check_vocab(meta)
    _check_hparams(meta)
    metadata = {k: len(v) if isinstance(v, _Array) else v for k, v in meta.items()}
    tokens = meta.get("tokenizer.ggml.tokens")
    span = tokens.span if isinstance(tokens, _Array) else None
    digest = hashlib.sha256(r.data[span[0] : span[1]]).hexdigest() if span else ""
    return GgufSummary(
        r.size, version, n_tensors, n_kv, n_vocab, data_offset, layouts, metadata, digest, spans
    )


class _Array:
    """An array value: its item type, count, and the items (strings and scalars read only when
    the vocabulary checks need them)."""

    def __init__(
        self, item_type: int, items: list[Any], span: tuple[int, int] | None = None
    ) -> None:
        self.item_type = item_type
        self.items = items
        self.span = span  # a read string array: where its items lie in the file

    def __len__(self) -> int:
        return len(self.items)


# Arrays whose items the vocabulary checks read; other arrays are bounds-checked and skipped.
_READ_ARRAYS = {
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
}


def _value(r: _Reader, vtype: int, name: str, depth: int) -> Any:
    if vtype in SCALAR_FORMATS:
        return r.scalar(SCALAR_FORMATS[vtype], name)
    if vtype == STRING:
        return _utf8(r.string(name), name)
    if vtype != ARRAY:
        raise _Bad(f"{name}: unknown value type {vtype}")
    if depth > 0:
        raise _Bad(f"{name}: arrays of arrays are not supported")
    item_type, n = r.u32(f"{name} item type"), r.u64(f"{name} count")
    if item_type in SCALAR_FORMATS:
        fmt = SCALAR_FORMATS[item_type]
        size = struct.calcsize(fmt)
        if n > (r.size - r.pos) // size:
            raise _Bad(f"{name}: {n} items cannot fit in the file")
        if name in _READ_ARRAYS:
            raw = r.take(n * size, name)
            return _Array(item_type, list(struct.unpack(f"<{n}{fmt[1]}", raw)))
        r.skip(n * size, name)
        return _SkippedArray(item_type, n)
    if item_type == STRING:
        if n > (r.size - r.pos) // 8:
            raise _Bad(f"{name}: {n} strings cannot fit in the file")
        keep = name in _READ_ARRAYS
        items: list[bytes] = []
        data, pos, size = r.data, r.pos, r.size
        start = pos
        # The vocabulary's walk is most of a file's validation: the tightest loop Python
        # gives (smollm2's 49k strings: 0.17 s -> 0.06 s measured).
        unpack = _U64.unpack_from
        append = items.append
        for i in range(n):
            if size - pos < 8:
                raise _Bad(f"{name}[{i}]: runs past the end of the file")
            (length,) = unpack(data, pos)
            pos += 8
            if length > size - pos:
                raise _Bad(f"{name}[{i}]: length {length} runs past the end of the file")
            if keep:
                append(data[pos : pos + length])
            pos += length
        r.pos = pos
        return _Array(item_type, items, (start, pos)) if keep else _SkippedArray(item_type, n)
    if item_type == ARRAY:
        raise _Bad(f"{name}: arrays of arrays are not supported")
    raise _Bad(f"{name}: unknown array item type {item_type}")


class _SkippedArray(_Array):
    def __init__(self, item_type: int, n: int) -> None:
        super().__init__(item_type, [])
        self.n = n

    def __len__(self) -> int:
        return self.n


def _tensor_info(r: _Reader, i: int) -> tuple[bytes, int, int, int, tuple[int, ...]]:
    name = r.string(f"tensor {i} name", MAX_NAME - 1)
    label = name.decode("utf-8", "replace")
    n_dims = r.u32(f"tensor {label!r} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Bad(f"tensor {label!r}: {n_dims} dimensions (1-{MAX_DIMS} allowed)")
    dims = [r.u64(f"tensor {label!r} dimension {d}") for d in range(n_dims)]
    n_elements = 1
    for d in dims:
        if d < 1 or d >= 1 << 62:
            raise _Bad(f"tensor {label!r}: dimension {d} out of range")
        n_elements *= d
        if n_elements >= 1 << 62:
            raise _Bad(f"tensor {label!r}: {dims} elements overflow")
    ttype = r.u32(f"tensor {label!r} type")
    if ttype not in TENSOR_TYPES:
        raise _Bad(f"tensor {label!r}: unknown type {ttype}")
    block, block_bytes = TENSOR_TYPES[ttype]
    if dims[0] % block:
        raise _Bad(f"tensor {label!r}: rows of {dims[0]} are not whole blocks of {block}")
    offset = r.u64(f"tensor {label!r} offset")
    return name, n_elements // block * block_bytes, offset, ttype, tuple(dims)


def _check_vocab(meta: dict[str, Any]) -> int:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return 0
    if not isinstance(tokens, _Array) or tokens.item_type != STRING:
        raise _Bad("tokenizer.ggml.tokens must be an array of strings")
    n_vocab = len(tokens)
    if n_vocab == 0 or n_vocab >= 1 << 31:
        raise _Bad(f"tokenizer.ggml.tokens: {n_vocab} tokens")
    # llama.cpp reads each text as a C string: a NUL byte ends it there.
    texts = tokens.items
    if b"\0" in b"".join(texts):  # one search in C (a generator over 262k texts: 0.24 s)
        texts = [text.split(b"\0", 1)[0] for text in texts]
    if len(set(texts)) != n_vocab:
        seen: set[bytes] = set()
        for i, text in enumerate(texts):
            if text in seen:
                raise _Bad(f"tokenizer.ggml.tokens[{i}] repeats an earlier token ({text[:40]!r})")
            seen.add(text)
    for key, kinds in (("tokenizer.ggml.scores", (6,)), ("tokenizer.ggml.token_type", (5, 4))):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, _Array) or value.item_type not in kinds or len(value) != n_vocab:
            raise _Bad(f"{key} must be {n_vocab} values like the tokens, got {_describe(value)}")
    for key in SPECIAL_TOKEN_KEYS:
        value = meta.get(key)
        if value is None:
            continue
        # -1 (or its u32 form) is how a converter writes "no such token"; llama.cpp skips it.
        if isinstance(value, int) and value in (-1, 0xFFFFFFFF):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n_vocab:
            raise _Bad(f"{key} = {value!r} is not a token id (vocabulary of {n_vocab})")
    return n_vocab


MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def _check_hparams(meta: dict[str, Any]) -> None:
    """The architecture's hyperparameters that llama.cpp asserts on or divides by when it loads
    them (a zero block count aborts; a zero head count divides by zero)."""
    arch = meta.get("general.architecture")
    if arch is None:
        return
    if not isinstance(arch, str) or not arch:
        raise _Bad(f"general.architecture must be a name, got {arch!r}")

    def number(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        if value is None or isinstance(value, _Array):
            return None  # absent, or per layer (llama.cpp checks arrays' lengths itself)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"{arch}.{key} must be an integer, got {value!r}")
        return value

    n_layer = number("block_count")
    if n_layer is not None and not 1 <= n_layer <= MAX_LAYERS:
        raise _Bad(f"{arch}.block_count = {n_layer} (1-{MAX_LAYERS} allowed)")
    nextn = number("nextn_predict_layers")
    if nextn is not None and n_layer is not None and not 0 <= nextn <= n_layer:
        raise _Bad(f"{arch}.nextn_predict_layers = {nextn} exceeds the block count")
    for key in ("embedding_length", "attention.head_count", "context_length"):
        value = number(key)
        if value is not None and not 1 <= value < 1 << 31:
            raise _Bad(f"{arch}.{key} = {value} is out of range")
    head_kv = number("attention.head_count_kv")
    if head_kv is not None and not 0 <= head_kv < 1 << 31:
        raise _Bad(f"{arch}.attention.head_count_kv = {head_kv} is out of range")
    n_expert = number("expert_count") or 0
    used = number("expert_used_count") or 0
    groups = number("expert_group_count") or 0
    if not (0 <= n_expert <= MAX_EXPERTS and 0 <= used <= n_expert):
        raise _Bad(f"{arch}: {used} of {n_expert} experts used (at most {MAX_EXPERTS})")
    if (n_expert > 0) != (used > 0) or (groups and (groups >= n_expert or n_expert % groups)):
        raise _Bad(f"{arch}: expert counts disagree ({n_expert}, {used} used, {groups} groups)")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        raise _Bad(f"{arch}.rope.scaling.type = {scaling!r} is not one of {ROPE_SCALING_TYPES}")


def _describe(value: Any) -> str:
    if isinstance(value, _Array):
        return f"an array of {len(value)} (item type {value.item_type})"
    return type(value).__name__


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(f"{what} is not UTF-8") from None
