"""The one seam for where draft tokens come from.

A draft source has a lifecycle like llama.cpp's common/speculative: begin (a new request's
prompt) -> propose (up to k tokens continuing the context, as often as the policy asks). What
was accepted goes to the k policy (edge_spec.policy), not to the source: a model draft reads
it off the context on its next proposal. Sources never touch the target model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Up to k proposed tokens. p_draft (len(tokens), n_vocab) holds the distributions the
    tokens were sampled from, after the request's sampling transform; None means the source is
    deterministic (a point mass on each token) or the request is greedy."""

    tokens: tuple[int, ...]
    p_draft: np.ndarray | None = None
    confidences: tuple[float, ...] = ()  # the draft's probability of each token, when known


NO_DRAFT = Draft(tokens=())

# Asked after draft token i (0-based) was proposed with this probability: draft token i + 1?
KeepDrafting = Callable[[int, float], bool]


class DraftSource(Protocol):
    name: str

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request starts with this prompt (prefill caches here, not in propose)."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        """Requires k >= 0; returns at most k tokens continuing `context` (prompt + output),
        stopping early when keep_drafting answers False."""


class NoDraft:
    """The target alone: the baseline every speedup is measured against."""

    name = "none"

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        return NO_DRAFT
