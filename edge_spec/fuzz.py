"""Fuzzing GGUF files: mutants of a real model's header region, and what loading each one does.

A mutant is the model with a few bytes changed -- random bytes anywhere in the header region
(key/values, the vocabulary, tensor infos), a chosen field set to an adversarial value (a
count, a string or array length, a value type, a tensor dimension, type or offset), two
vocabulary entries made identical -- or the file cut short. Each one is loaded the way a user's
process loads a model (`EdgeSpec(path)` and a four-token generation) in a worker process, so
that a llama.cpp abort kills the worker, not the harness. Every mutant must end one of two
ways: it loads and generates, or EdgeSpec raises an EdgeSpecError (for a file, ModelFileError);
a death, a hang or any other exception is a finding.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import shutil
import struct
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from edge_spec.gguf.validate import ARRAY, SCALAR_FORMATS, STRING

KINDS = ("bytes", "field", "duplicate_token", "truncate")
MUTANT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Field:
    """A number in the header that a structure-aware mutation may rewrite."""

    offset: int
    fmt: str  # struct format of the stored value
    what: str


@dataclass(frozen=True)
class Layout:
    """Where one valid GGUF file's header fields and vocabulary texts lie."""

    size: int
    header_end: int  # the end of the tensor infos: mutations change bytes before it
    fields: tuple[Field, ...]
    tokens: tuple[tuple[int, int], ...]  # (offset, length) of each vocabulary text


@dataclass(frozen=True)
class Mutant:
    kind: str
    description: str
    patches: tuple[tuple[int, bytes], ...]  # (offset, new bytes)
    truncate_to: int | None = None


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    # "ok" (loaded and generated), "refused" (an EdgeSpecError), or a finding: "died" (the
    # worker was killed: an abort), "hung", "traceback" (any other exception).
    verdict: str
    detail: str

    @property
    def is_finding(self) -> bool:
        return self.verdict not in ("ok", "refused")


def layout(path: Path) -> Layout:
    """The header of a valid GGUF file (requires one: the originals, never a mutant)."""
    with path.open("rb") as f:
        data = f.read(64 << 20)

    def u64(at: int) -> int:
        return int(struct.unpack_from("<Q", data, at)[0])

    def u32(at: int) -> int:
        return int(struct.unpack_from("<I", data, at)[0])

    fields = [Field(4, "<I", "version"), Field(8, "<Q", "tensor count")]
    fields.append(Field(16, "<Q", "key/value count"))
    tokens: list[tuple[int, int]] = []
    pos = 24
    for _ in range(u64(16)):
        fields.append(Field(pos, "<Q", "key length"))
        key = data[pos + 8 : pos + 8 + u64(pos)].decode()
        pos += 8 + u64(pos)
        vtype = u32(pos)
        fields.append(Field(pos, "<I", f"{key} type"))
        pos += 4
        if vtype in SCALAR_FORMATS:
            fields.append(Field(pos, SCALAR_FORMATS[vtype], key))
            pos += struct.calcsize(SCALAR_FORMATS[vtype])
        elif vtype == STRING:
            fields.append(Field(pos, "<Q", f"{key} length"))
            pos += 8 + u64(pos)
        elif vtype == ARRAY:
            item, n = u32(pos), u64(pos + 4)
            fields += [Field(pos, "<I", f"{key} item type"), Field(pos + 4, "<Q", f"{key} count")]
            pos += 12
            if item == STRING:
                for i in range(n):
                    if i < 4 or i % 997 == 0:  # a sample of the string lengths
                        fields.append(Field(pos, "<Q", f"{key}[{i}] length"))
                    if key == "tokenizer.ggml.tokens":
                        tokens.append((pos + 8, u64(pos)))
                    pos += 8 + u64(pos)
            else:
                pos += n * struct.calcsize(SCALAR_FORMATS[item])
    for t in range(u64(8)):
        fields.append(Field(pos, "<Q", f"tensor {t} name length"))
        pos += 8 + u64(pos)
        n_dims = u32(pos)
        fields.append(Field(pos, "<I", f"tensor {t} dimension count"))
        pos += 4
        for d in range(n_dims):
            fields.append(Field(pos, "<Q", f"tensor {t} dimension {d}"))
            pos += 8
        fields.append(Field(pos, "<I", f"tensor {t} type"))
        fields.append(Field(pos + 4, "<Q", f"tensor {t} offset"))
        pos += 12
    return Layout(path.stat().st_size, pos, tuple(fields), tuple(tokens))


def mutants(path: Path, lay: Layout, rng: random.Random, n: int) -> Iterator[Mutant]:
    """n mutants of the file at path (with this layout), the kinds in turn."""
    with path.open("rb") as f:
        head = f.read(lay.header_end)
    by_length: dict[int, list[int]] = {}
    for at, length in lay.tokens:
        by_length.setdefault(length, []).append(at)
    same_length = [ats for length, ats in by_length.items() if len(ats) > 1 and length > 0]
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if kind == "duplicate_token" and not same_length:
            kind = "bytes"
        if kind == "bytes":
            patches = tuple(
                (rng.randrange(lay.header_end), bytes([rng.randrange(256)]))
                for _ in range(rng.randint(1, 8))
            )
            yield Mutant(kind, f"{len(patches)} random bytes", patches)
        elif kind == "field":
            field = rng.choice(lay.fields)
            size = struct.calcsize(field.fmt)
            old = int.from_bytes(head[field.offset : field.offset + size], "little")
            bits = size * 8
            value = rng.choice(
                [0, 1, old + 1, max(old - 1, 0), (1 << bits) - 1, 1 << (bits - 1)]
                + [rng.randrange(1 << bits), rng.randrange(1 << min(bits, 20))]
            ) % (1 << bits)
            patch = (field.offset, value.to_bytes(size, "little"))
            yield Mutant(kind, f"{field.what}: {old} -> {value}", (patch,))
        elif kind == "duplicate_token":
            src, dst = rng.sample(rng.choice(same_length), 2)
            length = next(n for at, n in lay.tokens if at == src)
            patch = (dst, head[src : src + length])
            yield Mutant(kind, f"token text at {dst} := the one at {src}", (patch,))
        else:
            # Mostly inside the header; sometimes inside the tensor data.
            top = lay.header_end if rng.random() < 0.8 else lay.size
            cut = rng.randrange(top)
            yield Mutant(kind, f"cut at {cut} of {lay.size} bytes", (), cut)


def write_mutant(original: Path, mutant: Mutant, dst: Path) -> None:
    """dst := original with the mutant's changes (dst is rewritten in place when it already
    holds the original, so a run copies the model once, not once per mutant)."""
    if mutant.truncate_to is not None:
        with original.open("rb") as src, dst.open("wb") as out:
            left = mutant.truncate_to
            while left > 0:
                chunk = src.read(min(left, 8 << 20))
                out.write(chunk)
                left -= len(chunk)
        return
    with dst.open("r+b") as out:
        for offset, raw in mutant.patches:
            out.seek(offset)
            out.write(raw)


def restore(original: Path, mutant: Mutant, dst: Path) -> None:
    """Undo write_mutant: dst holds the original again."""
    if mutant.truncate_to is not None or not dst.exists():
        shutil.copyfile(original, dst)
        return
    with original.open("rb") as src, dst.open("r+b") as out:
        for offset, raw in mutant.patches:
            src.seek(offset)
            out.seek(offset)
            out.write(src.read(len(raw)))


def _worker(conn: Connection) -> None:
    """Load each path it is sent as a user's process would; answer (verdict, detail)."""
    import logging

    logging.disable(logging.CRITICAL)
    from edge_spec.api import EdgeSpec, EngineConfig
    from edge_spec.errors import EdgeSpecError

    while True:
        path = conn.recv()
        if path is None:
            return
        try:
            with EdgeSpec(path, None, config=EngineConfig(n_ctx=128)) as spec:
                spec.generate("Hello", max_tokens=4, draft_mode="none")
            conn.send(("ok", ""))
        except EdgeSpecError as exc:
            conn.send(("refused", f"{type(exc).__name__}: {exc}"[:300]))
        except BaseException:  # noqa: BLE001 - a finding, reported with its traceback
            conn.send(("traceback", traceback.format_exc()[-2000:]))


class Loader:
    """A worker process that loads mutants one after another; replaced when one kills it."""

    def __init__(self, timeout_s: float = MUTANT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")  # never fork a process that holds llama.cpp threads
        self._start()

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def load(self, path: Path) -> tuple[str, str]:
        self._conn.send(str(path))
        if self._conn.poll(self.timeout_s):
            try:
                return self._conn.recv()
            except (EOFError, OSError):  # the worker died while answering
                pass
        if self._proc.is_alive():  # no answer in time
            self._proc.kill()
            self._proc.join()
            self._start()
            return "hung", f"no answer in {self.timeout_s:.0f} s"
        self._proc.join()
        code = self._proc.exitcode
        self._start()
        return "died", f"worker exit code {code}"

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()


def run(
    original: Path, n: int, seed: int, workdir: Path, loader: Loader | None = None
) -> Iterator[Outcome]:
    """n mutants of original, each loaded; yields every outcome."""
    lay = layout(original)
    rng = random.Random(seed)
    dst = workdir / f"mutant-0-{original.name}"
    restore(original, Mutant("copy", "", (), 0), dst)
    own = loader is None
    loader = loader or Loader()
    try:
        for i, mutant in enumerate(mutants(original, lay, rng, n), 1):
            # A new name per mutant: nothing cached by file identity may carry over.
            renamed = workdir / f"mutant-{i}-{original.name}"
            dst.rename(renamed)
            dst = renamed
            write_mutant(original, mutant, dst)
            verdict, detail = loader.load(dst)
            yield Outcome(mutant, verdict, detail)
            restore(original, mutant, dst)
    finally:
        if own:
            loader.close()
