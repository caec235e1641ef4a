"""What the decode loop needs of a grammar (edge_spec.constrain.matcher implements it; tests use
scripted ones): the output stays exactly the constrained target's -- every row the target
chooses from is masked by the grammar at that position -- drafts never carry a token the
grammar refuses, and the text the grammar forces is drafted at no cost and verified like any
draft, so where the target would tokenize it differently its own tokens win."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class StepConstraint(Protocol):
    mask_s: float  # time spent on masks and checks, for the statistics

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (empty: the target's choice)."""

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar allows from the current state."""

    def allows(self, token: int) -> bool:
        """Whether the grammar allows `token` next."""

    def mask(self, row: np.ndarray) -> None:
        """Set the logits of the tokens the grammar refuses next to -inf, in place."""

    def advance(self, tokens: Sequence[int]) -> None:
        """The state after `tokens` (which the grammar allows)."""

    def rollback(self, n: int) -> None:
        """Undo the last n tokens advanced."""
