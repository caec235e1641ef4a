"""Token trees: a draft's chain with branches hanging from it (Draft.parents' layout), built from
an n-gram candidate's branches or a learned draft's runner-up tokens, within a leaf budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge_spec.drafts.candidates import NgramCandidate

# Branches per token tree: the target's context keeps one sequence per leaf (the backend's
# LlamaModel holds backend.model.MAX_SEQUENCES; a test checks this fits).
MAX_TREE_LEAVES = 4


@dataclass(frozen=True)
class TokenTree:
    """An n-gram draft as a token tree: the first k proposal tokens as a chain, then branch
    tokens (Draft.parents' layout), with each branch token's weight."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    branch_weights: tuple[float, ...]

    @property
    def n_main(self) -> int:
        return len(self.tokens) - len(self.branch_weights)


def token_tree(
    candidate: NgramCandidate,
    k: int,
    lengths: Sequence[int],
    max_leaves: int = MAX_TREE_LEAVES,
) -> TokenTree:
    """The candidate's first k tokens as a chain, then lengths[i] tokens of its branch i: a
    branch forking at depth d hangs from main token d - 1 (from the context's last token when
    d = 0; it needs d <= k). Each branch adds a leaf; branches past max_leaves - 1 are left
    out."""
    tokens = list(candidate.tokens[:k])
    parents = list(range(-1, len(tokens) - 1))
    weights: list[float] = []
    leaves = 1
    for branch, n in zip(candidate.branches, lengths):
        if n <= 0 or branch.depth > len(tokens) or leaves >= max_leaves:
            continue
        parent = branch.depth - 1
        for token, weight in zip(branch.tokens[:n], branch.weights):
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
            weights.append(weight)
        leaves += 1
    return TokenTree(tuple(tokens), tuple(parents), tuple(weights))


def alternate_tree(
    tokens: Sequence[int], alternates: Sequence[tuple[int, int, float]], chosen: Sequence[int]
) -> TokenTree:
    """A draft chain with some of its runner-up candidates as one-token branches: alternate
    (i, token, weight) hangs from chain token i - 1 (from the context's last token when i = 0),
    beside tokens[i]. chosen: indices into alternates; one that does not fit the chain (i past
    its end, or the chain's own token) is left out."""
    out = list(tokens)
    parents = list(range(-1, len(out) - 1))
    weights: list[float] = []
    for j in chosen:
        i, token, weight = alternates[j]
        if i < len(tokens) and token != tokens[i]:
            out.append(token)
            parents.append(i - 1)
            weights.append(weight)
    return TokenTree(tuple(out), tuple(parents), tuple(weights))


def heaviest_alternates(alternates: Sequence[tuple[int, int, float]], n: int) -> tuple[int, ...]:
    """The indices of the n alternates with the highest weights, heaviest first."""
    order = sorted(range(len(alternates)), key=lambda j: -alternates[j][2])
    return tuple(order[: max(n, 0)])


def branch_lengths(
    candidate: NgramCandidate, k: int, n_nodes: int, max_leaves: int = MAX_TREE_LEAVES
) -> tuple[int, ...]:
    """Whole branches, heaviest first, up to n_nodes tokens (the fixed policy's tree): per
    branch of the candidate, how many of its tokens a tree over its first k tokens takes."""
    lengths, left, leaves = [], n_nodes, 1
    for branch in candidate.branches:
        n = 0
        if left > 0 and leaves < max_leaves and branch.depth < k:
            n = min(len(branch.tokens), left)
            left -= n
            leaves += 1
        lengths.append(n)
    return tuple(lengths)
