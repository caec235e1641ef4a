"""Read a GGUF file's metadata in pure Python, without loading weights: the planner needs layer
counts and KV shapes before it decides where (and whether) the models can be loaded."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_spec.errors import ModelFileError
from edge_spec.gguf.validate import validate_gguf

GGUF_MAGIC = b"GGUF"
GGUF_MIN_BYTES = 24  # magic, version, tensor count, kv count


@dataclass(frozen=True)
class GgufFacts:
    """What memory planning needs to know about a model."""

    path: Path
    file_size_bytes: int
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    n_ctx_train: int
    n_vocab: int

    def kv_bytes(self, n_ctx: int, bytes_per_value: int = 2) -> int:
        """KV cache size for n_ctx positions (f16 cache by default, every layer full size)."""
        per_token = self.n_layer * self.n_head_kv * (self.key_length + self.value_length)
        return n_ctx * per_token * bytes_per_value

    def layer_bytes(self) -> int:
        """Rough bytes per repeating layer (weights minus the vocabulary-sized tensors)."""
        vocab_bytes = self.n_vocab * self.n_embd  # at least one byte per embedding value
        return max((self.file_size_bytes - vocab_bytes) // max(self.n_layer, 1), 0)


def check_gguf_file(path: Path) -> int:
    """Requires nothing; returns the file size in bytes, or raises ModelFileError saying why the
    file cannot be a loadable GGUF (missing, a directory, too short, wrong magic)."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(GGUF_MIN_BYTES)
    if len(head) < GGUF_MIN_BYTES or head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic or too short): {path}")
    (version,) = struct.unpack_from("<I", head, 4)
    if version not in (2, 3):
        raise ModelFileError(f"unsupported GGUF version {version}: {path}")
    return size


def read_metadata(path: Path) -> dict[str, Any]:
    """All metadata key/values of a GGUF file; arrays are returned as their length only.
    Raises ModelFileError for a missing, non-GGUF or corrupt file. Read by the validation
    (cached by file identity), which parses every key anyway."""
    return dict(validate_gguf(path).metadata)


def read_facts(path: Path) -> GgufFacts:
    meta = read_metadata(path)
    arch = str(meta.get("general.architecture", ""))

    def get(name: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelFileError(f"GGUF metadata lacks {arch}.{name}: {path}")
        return int(value)

    n_embd, n_head = get("embedding_length"), get("attention.head_count")
    head_dim = n_embd // max(n_head, 1)
    return GgufFacts(
        path=path,
        file_size_bytes=path.stat().st_size,
        architecture=arch,
        n_layer=get("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=get("attention.head_count_kv", n_head),
        key_length=get("attention.key_length", head_dim),
        value_length=get("attention.value_length", head_dim),
        n_ctx_train=get("context_length", 0),
        n_vocab=int(meta.get("tokenizer.ggml.tokens", 0)) or get("vocab_size", 0),
    )
