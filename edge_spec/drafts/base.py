"""The one seam for where draft tokens come from.

A draft source has the lifecycle of llama.cpp's common/speculative: begin (a new request's
prompt) -> propose (up to k tokens continuing the context) -> accept (feedback after
verification). Sources never touch the target model.
"""

from __future__ import annotations

from collections.abc import Sequence
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


NO_DRAFT = Draft(tokens=())


class DraftSource(Protocol):
    name: str

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request starts with this prompt (prefill caches here, not in propose)."""

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        """Requires k >= 0; returns at most k tokens continuing `context` (prompt + output)."""

    def accept(self, n_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""


class NoDraft:
    """The target alone: the baseline every speedup is measured against."""

    name = "none"

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        return NO_DRAFT

    def accept(self, n_accepted: int) -> None:
        pass
