#!/usr/bin/env python3
"""edge_spec's GGUF metadata reader against ggml-org's `gguf` package (GGUFReader) on the
registry models, Gemma-3-270M's 262,144-token vocabulary included: median wall time of a full
metadata read, each run on a file already in the page cache. edge_spec's is its validation
(gguf_validate.validate_gguf: every key and tensor info parsed and checked, the metadata kept
for gguf.read_metadata), timed with its per-process cache emptied before each run.

    .venv/bin/python scripts/measure_gguf_reader.py
"""

from __future__ import annotations

import statistics
import time

from edge_spec.gguf import validate as gguf_validate
from edge_spec.gguf.facts import read_metadata
from edge_spec.models.cache import resolve


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    import gguf  # edge_spec writes self-drafts with it

    for name in ("smollm2-135m-f16", "gemma3-270m-f16"):
        path = resolve(name, progress=False)
        read_metadata(path)  # page the file in

        def uncached(p=path):
            gguf_validate._cache.clear()
            return read_metadata(p)

        ours = timed(uncached, 5)
        theirs = timed(lambda p=path: gguf.GGUFReader(p), 3)
        print(
            f"{name}: edge_spec.gguf.read_metadata {ours * 1e3:.0f} ms, "
            f"gguf {gguf.__name__} GGUFReader {theirs * 1e3:.0f} ms ({theirs / ours:.0f}x)"
        )


if __name__ == "__main__":
    main()
