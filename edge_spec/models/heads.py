"""Where a target's draft head lives and what it needs besides its ONNX graph.

A head trained by `edge-spec head train` is kept in the model cache, keyed by the target's
sha256: `heads/<sha[:24]>/head.onnx` (the graph ONNX Runtime runs) and `head.json` (the reduced
vocabulary's target ids, the input scales, and how it was trained and measured). Its input is
the target's own token embedding of the newest token, read from the target's GGUF here
(dequantized by ggml-org's gguf package), so the graph does not carry a copy of the vocabulary.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_spec.errors import InvalidRequestError, ModelFileError
from edge_spec.gguf.validate import TensorLayout, validate_gguf

log = logging.getLogger(__name__)

SCHEMA = 1
GRAPH_NAME, INFO_NAME = "head.onnx", "head.json"


@dataclass(frozen=True)
class HeadInfo:
    """A trained head's description (head.json)."""

    target_sha256: str
    kind: str  # "eagle": [h_t ; E(x_{t+1})] -> the next hidden state and the next token
    n_embd: int
    hidden_size: int
    vocab_ids: tuple[int, ...]  # reduced vocabulary row -> target token id
    trained: dict[str, Any] = field(default_factory=dict)  # data, time, held-out acceptance

    @property
    def first_acceptance(self) -> float | None:
        """The held-out acceptance of the head's first draft token, where training measured
        it (a float in (0, 1)), else None."""
        try:
            value = float(self.trained["eagle"]["conditional"][0])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        return value if 0.0 < value < 1.0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "target_sha256": self.target_sha256,
            "kind": self.kind,
            "n_embd": self.n_embd,
            "hidden_size": self.hidden_size,
            "vocab_ids": list(self.vocab_ids),
            "trained": self.trained,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadInfo:
        if data.get("schema") != SCHEMA:
            raise ModelFileError(f"head.json schema {data.get('schema')}, expected {SCHEMA}")
        return cls(
            str(data["target_sha256"]),
            str(data["kind"]),
            int(data["n_embd"]),
            int(data["hidden_size"]),
            tuple(int(i) for i in data["vocab_ids"]),
            dict(data.get("trained", {})),
        )


def heads_dir() -> Path:
    """`$EDGE_SPEC_HEADS`, else `heads/` in the model cache."""
    if os.environ.get("EDGE_SPEC_HEADS"):
        return Path(os.environ["EDGE_SPEC_HEADS"]).expanduser()
    from edge_spec.files import cache_dir

    return cache_dir() / "heads"


def head_dir(target_sha256: str) -> Path:
    return heads_dir() / target_sha256[:24]


def find_head(target_path: Path) -> Path | None:
    """The directory of the head trained for this target file, or None."""
    from edge_spec.files import file_sha256

    if not Path(target_path).is_file():
        return None  # loading the target says what is wrong with the path
    try:
        directory = head_dir(file_sha256(Path(target_path)))
    except OSError:
        return None
    if (directory / GRAPH_NAME).is_file() and (directory / INFO_NAME).is_file():
        return directory
    return None


def load_info(directory: Path) -> HeadInfo:
    try:
        return HeadInfo.from_json(json.loads((directory / INFO_NAME).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"unreadable head description in {directory}: {exc}") from exc


class TargetEmbeddings:
    """Rows of the target's token embedding matrix (token_embd.weight) and LM head, as
    float32, read from a memory map of the GGUF (quantized rows dequantized by the gguf
    package); the layout comes from edge_spec's own validation of the file."""

    def __init__(self, target_path: Path) -> None:
        summary = validate_gguf(target_path)
        embd = summary.tensors.get("token_embd.weight")
        if embd is None or len(embd.dims) != 2:
            raise ModelFileError(f"{target_path} has no 2-D token_embd.weight")
        self._file = np.memmap(target_path, dtype=np.uint8, mode="r")
        self._embd = embd
        self._output = summary.tensors.get("output.weight", embd)  # tied when absent
        self.n_embd, self.n_vocab = int(embd.dims[0]), int(embd.dims[1])

    def _rows(self, layout: TensorLayout, ids: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        n_rows = int(layout.dims[1])
        if ids.size and (ids.min() < 0 or ids.max() >= n_rows):
            raise InvalidRequestError(f"token id out of range [0, {n_rows})")
        row_bytes = layout.n_bytes // n_rows
        data = self._file[layout.offset : layout.offset + layout.n_bytes].reshape(n_rows, -1)
        raw = np.asarray(data[ids])
        kind = GGMLQuantizationType(layout.ggml_type)
        if kind == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(len(ids), -1).copy()
        if kind == GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(len(ids), -1).astype(np.float32)
        assert raw.shape[1] == row_bytes
        return quants.dequantize(raw, kind).reshape(len(ids), -1).astype(np.float32)

    def rows(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Input embeddings of these token ids, (len(ids), n_embd) float32."""
        return self._rows(self._embd, np.asarray(ids, dtype=np.int64).reshape(-1))

    def output_rows(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """The LM head's rows for these ids (the tied embedding when the model has none)."""
        return self._rows(self._output, np.asarray(ids, dtype=np.int64).reshape(-1))
