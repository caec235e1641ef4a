"""A draft for a target given without one: the local models (the stores' and the prepared
registry models) ranked by how well they could draft for it (the same vocabulary first, then
the same architecture, then a size nearest a tenth of the target's), and the choice made from
them, with its reason."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edge_spec.errors import ModelFileError
from edge_spec.models.manifest import list_models
from edge_spec.models.stores import Found, ModelFacts, is_model_file, model_facts, real, scan

MAX_DRAFT_RATIO = 0.5  # a draft at most half the target's size (what a step reads)
BEST_DRAFT_RATIO = 0.1  # among those, the nearest to a tenth first (cost against agreement)


@dataclass(frozen=True)
class DraftCandidate:
    """A local model that could draft for a target, and why it ranks where it does."""

    found: Found
    facts: ModelFacts
    size_ratio: float  # its file size over the target's
    same_vocab: bool  # the same token texts: drafts token for token; else through text
    same_architecture: bool

    @property
    def reason(self) -> str:
        vocab = (
            "same vocabulary"
            if self.same_vocab
            else "another vocabulary, drafting through text (the cross-vocabulary path)"
        )
        return f"{vocab}, {self.size_ratio:.2f}x the target's size"

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.found.name,
            "store": self.found.store,
            "path": str(self.found.path),
            "size_ratio": round(self.size_ratio, 4),
            "same_vocab": self.same_vocab,
            "same_architecture": self.same_architecture,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class DraftChoice:
    """The draft chosen for a target when none was given (None: draft-free), and why."""

    draft: str | None
    reason: str


def local_models(read_headers: bool = True) -> list[Found]:
    """The stores' models and edge_spec's own prepared registry models."""
    found = scan(read_headers)
    seen = {real(f.path) for f in found}
    for status in list_models():
        if status.present and real(status.path) not in seen:
            found.append(Found(status.entry.name, "registry", status.path))
    return found


def rank_drafts(
    target_path: Path, candidates: Iterable[Found] | None = None
) -> list[DraftCandidate]:
    """Local models that could draft for the target, best first: the same vocabulary before
    another, then the same architecture, then a size nearest a tenth of the target's; only
    valid models at most MAX_DRAFT_RATIO of its size."""
    target = model_facts(target_path)
    real_target = real(target_path)
    ranked: list[DraftCandidate] = []
    for found in candidates if candidates is not None else local_models(read_headers=False):
        try:
            if real(found.path) == real_target:
                continue
            # Sizes first: only files small enough are read.
            if found.path.stat().st_size > MAX_DRAFT_RATIO * target.size_bytes:
                continue
            if not is_model_file(found.path):
                continue
            facts = model_facts(found.path)
        except (OSError, ModelFileError):
            continue
        ratio = facts.size_bytes / max(target.size_bytes, 1)
        if facts.n_vocab == 0:
            continue
        same_vocab = facts.vocab_fingerprint == target.vocab_fingerprint != ""
        same_arch = facts.architecture == target.architecture
        ranked.append(DraftCandidate(found, facts, ratio, same_vocab, same_arch))
    ranked.sort(
        key=lambda c: (
            not c.same_vocab,
            not c.same_architecture,
            abs(math.log(max(c.size_ratio, 1e-6) / BEST_DRAFT_RATIO)),
            c.found.name,
        )
    )
    return ranked


def choose_draft(target_path: Path) -> DraftChoice:
    """The best local draft for a target given without one (rank_drafts' first), else none."""
    ranked = rank_drafts(target_path)
    if not ranked:
        return DraftChoice(
            None,
            f"no local model at most {MAX_DRAFT_RATIO:g}x the target's size: draft-free "
            "(the session's n-gram lookup)",
        )
    best = ranked[0]
    return DraftChoice(best.found.name, f"{best.found.name}: {best.reason}")
