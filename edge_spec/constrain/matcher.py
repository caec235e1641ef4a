"""One request's grammar state over the target's tokens (llguidance's LLMatcher): what the
decode loop asks of a constraint (decode.constraint.StepConstraint) -- the tokens the grammar
forces next, how much of a draft it allows, the mask of a target row -- and the state moved
forward by what verification kept. The mask's cost is counted per token."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_spec.constrain.grammars import limits
from edge_spec.errors import EdgeSpecError, InvalidRequestError


class GrammarConstraint:
    """A compiled grammar (grammars.compile_grammar) matched token by token. Requires rows of
    the tokenizer's vocabulary size."""

    def __init__(self, grammar: str, tokenizer: Any) -> None:
        from llguidance import LLMatcher

        self._matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=limits())
        if self._matcher.is_error():
            raise InvalidRequestError(f"the grammar does not compile: {self._matcher.get_error()}")
        self.n_vocab = int(tokenizer.vocab_size)
        # End tokens are allowed where the answer is complete; llguidance's validate_tokens
        # never counts them and its consume_tokens refuses them once the grammar has stopped.
        self._ends = frozenset(int(t) for t in tokenizer.eos_tokens)
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self.n_consumed = 0
        self.mask_s = 0.0  # time spent computing masks and checking tokens
        self.n_masks = 0

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next, tokenized the canonical way (empty
        where the next token is the model's choice)."""
        if limit <= 0:
            return []
        t0 = time.perf_counter()
        tokens = self._matcher.compute_ff_tokens()[:limit]
        self.mask_s += time.perf_counter() - t0
        return [int(t) for t in tokens]

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar allows from here."""
        if not tokens:
            return 0
        t0 = time.perf_counter()
        n = int(self._matcher.validate_tokens([int(t) for t in tokens]))
        self.mask_s += time.perf_counter() - t0
        return n

    def allows(self, token: int) -> bool:
        if token in self._ends:
            return self.complete
        return 0 <= token < self.n_vocab and self.valid_prefix([token]) == 1

    def mask(self, row: np.ndarray) -> None:
        """Set the logits of every token the grammar refuses here to -inf, in place."""
        t0 = time.perf_counter()
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._check()
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: row.shape[-1]]
        if not allowed.any():
            raise EdgeSpecError("the grammar allows no token here")
        row[allowed == 0] = -np.inf
        self.mask_s += time.perf_counter() - t0
        self.n_masks += 1

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume tokens the grammar allows; an end token (the answer is over) is not
        consumed."""
        kept = [int(t) for t in tokens if int(t) not in self._ends]
        if kept:
            if not self._matcher.consume_tokens(kept):
                self._check()
                raise EdgeSpecError("the grammar refused a token it had allowed")
            self.n_consumed += len(kept)

    def rollback(self, n: int) -> None:
        if n > 0:
            self._matcher.rollback(n)
            self.n_consumed -= n

    @property
    def complete(self) -> bool:
        """Whether what was generated so far is a whole answer of the grammar."""
        return bool(self._matcher.is_accepting())

    @property
    def finished(self) -> bool:
        """Whether the grammar allows nothing more but an end token."""
        return bool(self._matcher.is_stopped())

    def _check(self) -> None:
        if self._matcher.is_error():
            raise EdgeSpecError(f"the grammar failed: {self._matcher.get_error()[:300]}")
