"""The one seam for where draft tokens come from.

A draft source has a lifecycle like llama.cpp's common/speculative: begin (a new request's
prompt) -> propose (up to k tokens continuing the context, as often as the policy asks). What
was accepted goes to the k policy (edge_spec.policy), not to the source: a model draft reads
it off the context on its next proposal. Sources never touch the target model.

A source that drafts from the target's hidden states (a draft head) says so with
`wants_hidden = True` and an `observe(n_context, hidden)` method: after every target pass the
engine hands it the final hidden state of the row that chose the newest token, the context
then being n_context tokens long (the target is loaded with hidden states on for it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Up to k proposed tokens. Verification compares them with the target's own choices (its
    argmax, or its keyed sample), so no draft distribution travels with them; a sampling source
    draws token i with the request's keyed uniform of that position to agree with the target
    as often as their distributions allow."""

    tokens: tuple[int, ...]
    confidences: tuple[float, ...] = ()  # the draft's probability of each token, when known
    # A token tree: parents[i] is the index of token i's parent, -1 for the context's last
    # token; parents come before their children. Empty: a chain (token i follows i - 1).
    parents: tuple[int, ...] = ()
    # A chain's runner-up candidates, (position i, token, the draft's probability of it): an
    # alternative to tokens[i] that the policy may verify beside the chain as a one-token
    # branch of a token tree (see policy.alternate_tree). Empty: none offered.
    alternates: tuple[tuple[int, int, float], ...] = ()


NO_DRAFT = Draft(tokens=())

# Asked after draft token i (0-based) was proposed with this probability: draft token i + 1?
KeepDrafting = Callable[[int, float], bool]


class DraftSource(Protocol):
    name: str
    # Seconds this source has spent in llama_decode, ever (0 for draft-free sources): the
    # engine tells model time from its own orchestration overhead with it.
    decode_s: float

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request starts with this prompt (prefill caches here, not in propose)."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        """Requires k >= 0; returns at most k tokens continuing `context` (prompt + output),
        stopping early when keep_drafting answers False. A source that samples draws the token
        for context position j with keys.u(j)."""


class NoDraft:
    """The target alone: the baseline every speedup is measured against."""

    name = "none"
    decode_s = 0.0

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        return NO_DRAFT
