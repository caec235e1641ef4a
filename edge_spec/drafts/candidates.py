"""What a draft source can offer before the policy plans a step: the n-gram lookup's candidate
(its proposal, how well its match is supported, and the other ways the session went on, a token
tree's branches). Pure data, shared by the drafts that produce it and the policies that judge it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Consensus = Literal["one", "all", "split"]


@dataclass(frozen=True)
class Branch:
    """Another way the matched n-gram's occurrences went on: tokens that replace the main
    proposal from position `depth` on (depth 0: an alternative first token). weights[j] is the
    share of the occurrences that went on with tokens[: j + 1] there -- the empirical chance
    of reaching node j, which a token tree (SuffixDecoding's score) sums."""

    depth: int
    tokens: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class NgramCandidate:
    """What the n-gram lookup could propose this step (computed before planning: it is cheap)."""

    tokens: tuple[int, ...]
    match_len: int  # length of the suffix n-gram that matched (0: no match)
    # The matched n-gram's recent occurrences, and how many of them were followed by tokens[0]:
    # an n-gram whose occurrences all went on the same way predicts its next token far better
    # than one whose occurrences went different ways.
    n_occurrences: int = 1
    n_agreeing: int = 1
    # Where the other occurrences went different ways, heaviest first: a token tree's
    # branches (only when asked for, see NgramDraft.candidate).
    branches: tuple[Branch, ...] = ()

    @property
    def consensus(self) -> Consensus:
        """ "one" (a single occurrence), "all" (several, all agreeing) or "split"."""
        if self.n_agreeing < self.n_occurrences:
            return "split"
        return "one" if self.n_occurrences <= 1 else "all"


NO_MATCH = NgramCandidate((), 0, 0, 0)  # the n-gram lookup found nothing
