"""A GGUF holding a subset of a model's layers: the self-draft's weights, derived from the target
alone with ggml-org's `gguf` package (reader and writer).

The kept blocks are renumbered 0..n-1 and `{arch}.block_count` set to n; per-layer metadata
arrays (one value per block) are cut the same way; the embeddings, the output norm and the
LM head are copied as they are, so the draft speaks the target's vocabulary exactly. Gemma-3
marks every sixth block as global attention by its index, so a subset of it must drop whole
periods of six consecutive blocks to keep each kept block's kind (`valid_subsets` says which).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge_spec.errors import InvalidRequestError, ModelFileError

log = logging.getLogger(__name__)

# Architectures whose blocks differ by index (a period of local/global attention): a subset
# may drop only whole periods of consecutive blocks.
LAYER_PERIOD = {"gemma3": 6, "gemma2": 2, "cohere2": 4, "llama4": 4}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def valid_subsets(n_layer: int, architecture: str) -> list[tuple[int, ...]]:
    """The layer subsets a self-draft tries: skips of a run of about an eighth and a quarter of
    the blocks, starting an eighth, a quarter and half way in (the last block kept), and early
    exit (the first blocks only) without the last eighth -- in whole periods where the
    architecture has one. Small models lose much more per dropped block than large ones, and
    early blocks the least (SmolLM2-135M: 0.57 top-1 agreement without blocks 8-11, 0.12
    without the last ten)."""
    period = LAYER_PERIOD.get(architecture, 1)
    drops = sorted({max(period, round(n_layer * f / period) * period) for f in (1 / 8, 1 / 4)})
    out: list[tuple[int, ...]] = []
    if drops[0] < n_layer - 1:
        out.append(tuple(range(n_layer - drops[0])))  # early exit
    for n_drop in drops:
        for start in sorted({max(1, round(n_layer * f)) for f in (1 / 8, 1 / 4, 1 / 2)}):
            if start + n_drop <= n_layer - 1:
                subset = tuple(i for i in range(n_layer) if not start <= i < start + n_drop)
                if subset not in out:
                    out.append(subset)
    return out


def check_subset(layers: Sequence[int], n_layer: int, architecture: str) -> None:
    """Raises InvalidRequestError unless `layers` is a usable subset of 0..n_layer-1."""
    if not layers or list(layers) != sorted(set(layers)) or layers[-1] >= n_layer or layers[0] < 0:
        raise InvalidRequestError(f"layers must be increasing ids below {n_layer}, got {layers}")
    period = LAYER_PERIOD.get(architecture, 1)
    if any((new - old) % period for new, old in enumerate(layers)):
        raise InvalidRequestError(
            f"{architecture} blocks alternate with a period of {period}: a subset must drop "
            f"whole runs of {period} consecutive blocks, got {list(layers)}"
        )


def read_gguf(src: Path) -> Any:
    """src parsed by gguf.GGUFReader (seconds on a 262k-token vocabulary: read once, write many)."""
    import gguf  # a dependency; imported here so that loading a model never pays for it

    return gguf.GGUFReader(src)


def write_layer_subset(src: Path, dst: Path, layers: Sequence[int], reader: Any = None) -> None:
    """Writes to dst a GGUF with src's blocks `layers` (renumbered) and everything else as is.
    `reader`: src already read by read_gguf."""
    import gguf

    reader = reader if reader is not None else read_gguf(src)
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ModelFileError(f"{src}: no general.architecture")
    arch = str(arch_field.contents())
    n_layer = int(reader.fields[f"{arch}.block_count"].contents())
    check_subset(layers, n_layer, arch)
    renumber = {old: new for new, old in enumerate(layers)}
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds these itself
        value = field.contents()
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if name == f"{arch}.block_count":
            value = len(layers)
        elif (
            name.startswith(f"{arch}.")
            and vtype == gguf.GGUFValueType.ARRAY
            and len(value) == n_layer
        ):
            value = [value[i] for i in layers]  # one value per block
        elif name == "general.name":
            value = f"{value} (layers {_ranges(layers)} of {n_layer})"
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        match = _BLOCK.match(tensor.name)
        name = tensor.name
        if match:
            old = int(match.group(1))
            if old not in renumber:
                continue
            name = f"blk.{renumber[old]}.{match.group(2)}"
        writer.add_tensor(
            name,
            tensor.data,
            raw_shape=tensor.data.shape,
            raw_dtype=gguf.GGMLQuantizationType(int(tensor.tensor_type)),
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log.info("wrote %s: layers %s of %d from %s", dst.name, _ranges(layers), n_layer, src.name)


def _ranges(layers: Sequence[int]) -> str:
    """0,1,2,5,6 -> '0-2,5-6'."""
    parts: list[str] = []
    start = prev = layers[0]
    for layer in [*layers[1:], None]:
        if layer is not None and layer == prev + 1:
            prev = layer
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if layer is not None:
            start = prev = layer
    return ",".join(parts)
