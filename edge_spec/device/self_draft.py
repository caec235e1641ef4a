"""The self-draft: a draft derived from the target alone, with no second model to download.

It is the target with some of its blocks left out (edge_spec.models.layer_subset: early exit, or a
run of middle blocks skipped as Draft&Verify and SWIFT do), sharing the target's vocabulary,
embeddings and LM head, so its drafts are verified like any same-vocabulary model draft. Which
blocks to leave out is measured on this device, once per target: every candidate subset's
agreement with the target's greedy next token on a few prompts (teacher-forced along the
target's own continuation), its one-token cost against the target's (c), and from the
device's t(n) the best fixed k's projected speedup E[tokens] / (k c + t(k + 1) / t(1)). The
best candidate is kept (re-quantized to Q4_0 when that projects better) in the model cache,
and the measurement beside the device profiles ($EDGE_SPEC_CACHE/profiles/self-draft-*.json).

llama.cpp's eval callback could stop a pass after block E and so share the target's weights
and KV, but its logits would then need the output norm and the LM head outside the graph
(the head is most of a small model's work): a derived file is exact and fast, at the cost of
its own weights in memory (the planner counts them like any draft's).
"""

from __future__ import annotations

import datetime
import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edge_spec import backend
from edge_spec.backend import LlamaModel
from edge_spec.device.probes import time_batches
from edge_spec.device.profile import load_or_profile
from edge_spec.errors import ModelFileError
from edge_spec.files import atomic_output, cache_dir, file_sha256
from edge_spec.gguf.validate import validate_gguf
from edge_spec.models.layer_subset import _ranges, valid_subsets, write_layer_subset
from edge_spec.models.manifest import models_dir
from edge_spec.prompts import load_prompts

log = logging.getLogger(__name__)

PROBE_PROMPTS = 6  # bench completion prompts, one per category
PROBE_TOKENS = 32  # the target's greedy continuation of each
K_CHOICES = range(1, 9)
COST_CONTEXT, COST_REPEATS = 64, 16  # c is timed after 64 tokens, 16 one-token decodes each
SCHEMA = 1


@dataclass(frozen=True)
class Candidate:
    layers: tuple[int, ...]
    ftype: str | None  # None: the target's own tensor types
    agree: float  # top-1 agreement with the target's greedy next token
    c: float  # one draft token over one target token, measured here
    k: int  # the fixed k with the best projected speedup
    speedup: float  # projected on this device's t(n), with agreement per position = agree^i


@dataclass(frozen=True)
class SelfDraftChoice:
    target_sha256: str
    path: Path
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    measured: str
    seconds: float


def self_draft_path(target_path: str | Path, *, n_threads: int | None = None) -> Path:
    """The self-draft GGUF for this target: the cached choice, else derived and measured now
    (about a minute for a small target, logged)."""
    choice = load_or_choose(target_path, n_threads=n_threads)
    return choice.path


def load_or_choose(target_path: str | Path, *, n_threads: int | None = None) -> SelfDraftChoice:

    target_path = Path(target_path)
    validate_gguf(target_path)  # a bad file is one clear error, before anything is derived
    sha = file_sha256(target_path)
    record = _record_path(sha)
    if record.is_file():
        try:
            choice = _from_dict(json.loads(record.read_text(encoding="utf-8")))
            if choice.path.is_file():
                return choice
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", record, exc)
    choice = choose(target_path, sha, n_threads=n_threads)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(_to_dict(choice), indent=1) + "\n", encoding="utf-8")
    return choice


def choose(target_path: Path, sha: str, *, n_threads: int | None = None) -> SelfDraftChoice:
    """Measure every candidate subset of the target's blocks and keep the best."""

    started = time.perf_counter()
    costs = load_or_profile(target_path, None, n_threads=n_threads, quick=True).cost_curve()
    rel = [costs.rel(n) for n in range(1, max(K_CHOICES) + 2)]
    work = models_dir() / "self-draft-work"
    work.mkdir(parents=True, exist_ok=True)
    with LlamaModel(target_path, n_ctx=1024, n_threads=n_threads) as target:
        arch = target.info.architecture
        n_layer = _block_count(target_path, arch)
        probes = _probes(target)
        candidates: list[Candidate] = []

        def measure(path: Path, layers: tuple[int, ...], ftype: str | None) -> Candidate:
            with LlamaModel(path, n_ctx=1024, n_threads=n_threads) as draft:
                agree = _agreement(draft, probes)
                c = _one_token_cost_ratio(draft, target)
            k, speedup = _best_k(agree, c, rel)
            candidate = Candidate(layers, ftype, round(agree, 4), round(c, 4), k, round(speedup, 4))
            log.info(
                "self-draft candidate layers %s%s: agree %.2f, c %.2f -> k %d, %.2fx projected",
                _ranges(layers), f" {ftype}" if ftype else "", agree, c, k, speedup,
            )  # fmt: skip
            return candidate

        scratch = work / f"{sha[:16]}.candidate.gguf"
        try:
            for layers in valid_subsets(n_layer, arch):
                write_layer_subset(target_path, scratch, layers)
                candidates.append(measure(scratch, layers, None))
            best = max(candidates, key=lambda c: (c.speedup, c.agree))
            write_layer_subset(target_path, scratch, best.layers)
            quantized = work / f"{sha[:16]}.candidate-q4_0.gguf"
            backend.quantize(scratch, quantized, "Q4_0", n_threads)
            candidates.append(measure(quantized, best.layers, "Q4_0"))
            chosen = max(candidates[-1:] + [best], key=lambda c: (c.speedup, c.agree))
            suffix = "-q4_0" if chosen.ftype else ""
            dst = models_dir() / f"{target_path.stem}.self-{_ranges(chosen.layers)}{suffix}.gguf"
            with atomic_output(dst) as tmp:
                (quantized if chosen.ftype else scratch).replace(tmp)
        finally:
            for leftover in work.glob(f"{sha[:16]}.candidate*.gguf"):
                leftover.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    log.info(
        "self-draft for %s: layers %s%s (%.2fx projected), chosen in %.0f s -> %s",
        target_path.name, _ranges(chosen.layers), f" {chosen.ftype}" if chosen.ftype else "",
        chosen.speedup, seconds, dst.name,
    )  # fmt: skip
    return SelfDraftChoice(
        sha, dst, chosen, tuple(candidates), datetime.date.today().isoformat(), round(seconds, 1)
    )


def _best_k(agree: float, c: float, rel: Sequence[float]) -> tuple[int, float]:
    """The fixed k maximizing E[tokens per step] / (k c + t(k + 1) / t(1)), with each draft
    position accepted with probability agree (given the ones before)."""
    best = (1, 0.0)
    for k in K_CHOICES:
        expected = sum(agree**i for i in range(k + 1))
        speedup = expected / (k * c + rel[k])
        best = max(best, (k, speedup), key=lambda b: b[1])
    return best


def _probes(target) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy continuation) for one bench prompt per category."""

    seen: set[str] = set()
    probes = []
    for prompt in load_prompts():
        if prompt.category in seen or len(probes) == PROBE_PROMPTS:
            continue
        seen.add(prompt.category)
        ids = target.tokenize(prompt.completion)[-512:]
        target.reset()
        target.decode(ids[:-1])
        out: list[int] = []
        last = ids[-1]
        for _ in range(PROBE_TOKENS):
            last = int(np.argmax(target.decode([last], [0])[0]))
            out.append(last)
        probes.append((ids, out))
    target.reset()
    return probes


def _agreement(draft, probes: Sequence[tuple[list[int], list[int]]]) -> float:
    """How often the draft's argmax is the target's next token, along the target's own path."""
    hits = total = 0
    for ids, out in probes:
        draft.reset()
        draft.decode(ids[:-1])
        rows = draft.decode([ids[-1], *out[:-1]], range(len(out)))  # (len(out), n_vocab)
        hits += int((rows.argmax(axis=1) == np.array(out)).sum())
        total += len(out)
    draft.reset()
    return hits / total


def _one_token_cost_ratio(draft, target) -> float:
    """c: the draft's median one-token decode over the target's, timed interleaved."""

    draft_times, target_times = time_batches([draft, target], COST_CONTEXT, [1], COST_REPEATS)
    return statistics.median(draft_times[1]) / statistics.median(target_times[1])


def _block_count(path: Path, arch: str) -> int:
    n_layer = validate_gguf(path).metadata.get(f"{arch}.block_count")
    if not isinstance(n_layer, int):
        raise ModelFileError(f"{arch} model has no block_count: no self-draft")
    return n_layer


def _record_path(sha: str) -> Path:

    return cache_dir() / "profiles" / f"self-draft-{sha[:24]}.json"


def _to_dict(choice: SelfDraftChoice) -> dict:
    data = asdict(choice)
    data["schema"] = SCHEMA
    data["path"] = str(choice.path)
    return data


def _from_dict(data: dict) -> SelfDraftChoice:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {data.get('schema')}")

    def candidate(raw: dict) -> Candidate:
        return Candidate(**{**raw, "layers": tuple(raw["layers"])})

    return SelfDraftChoice(
        data["target_sha256"],
        Path(data["path"]),
        candidate(data["chosen"]),
        tuple(candidate(c) for c in data["candidates"]),
        data["measured"],
        data["seconds"],
    )
