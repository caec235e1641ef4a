#!/usr/bin/env python3
"""Fuzz edge_spec's model loading with mutated copies of the registry models (edge_spec/fuzz.py).

Each mutant is loaded in a worker process as a user's process would load it (EdgeSpec, then a
four-token generation). Prints the outcomes by mutation kind and every finding (a death, a
hang, or an exception other than the project's errors); exits 1 if there was any.

    .venv/bin/python scripts/fuzz_gguf.py --n 2500                 # per model, both models
    .venv/bin/python scripts/fuzz_gguf.py --models smollm2-135m-q4_0 --n 200 --seed 7
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_spec import fuzz  # noqa: E402
from edge_spec.models.cache import resolve  # noqa: E402

DEFAULT_MODELS = ("smollm2-135m-q4_0", "gemma3-270m-q4_0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--n", type=int, default=200, help="mutants per model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the counts and findings here")
    args = ap.parse_args()

    started = time.perf_counter()
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    findings: list[dict[str, str]] = []
    loader = fuzz.Loader()
    try:
        with tempfile.TemporaryDirectory(prefix="edge-spec-fuzz-") as tmp:
            for name in args.models:
                original = resolve(name, progress=False)
                for i, outcome in enumerate(
                    fuzz.run(original, args.n, args.seed, Path(tmp), loader), 1
                ):
                    counts[name, outcome.mutant.kind, outcome.verdict] += 1
                    if outcome.is_finding:
                        findings.append(
                            {
                                "model": name,
                                "kind": outcome.mutant.kind,
                                "mutation": outcome.mutant.description,
                                "verdict": outcome.verdict,
                                "detail": outcome.detail,
                            }
                        )
                        print(f"FINDING {name} {outcome.mutant.description}: {outcome.verdict}")
                        print(outcome.detail)
                    if i % 100 == 0:
                        print(f"{name}: {i}/{args.n} ({time.perf_counter() - started:.0f}s)")
    finally:
        loader.close()
    print(f"\n{sum(counts.values())} mutants in {time.perf_counter() - started:.0f}s")
    print(f"{'model':<20} {'kind':<16} {'verdict':<10} {'count':>6}")
    for (name, kind, verdict), n in sorted(counts.items()):
        print(f"{name:<20} {kind:<16} {verdict:<10} {n:>6}")
    print(f"findings: {len(findings)}")
    if args.json:
        rows = [
            {"model": m, "kind": k, "verdict": v, "count": n} for (m, k, v), n in counts.items()
        ]
        args.json.write_text(json.dumps({"counts": rows, "findings": findings}, indent=1))
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
