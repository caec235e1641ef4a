"""Verifiers: given k draft tokens and the target's k + 1 rows, decide which tokens are kept.

The engine uses the two matching verifiers, greedy (T = 0) and keyed (T > 0): the target's
token at each row is its own choice -- its argmax, or its draw with the request's keys for that
position (keys.SampleKeys) -- and draft tokens are kept while they equal it. Output then
depends on the target's rows and the seed alone, never on what was drafted. Rejection sampling
stays as the reference that keyed acceptance is measured against (scripts/measure_keyed.py,
in git history).

Every verifier returns 1..k+1 tokens: the accepted draft prefix plus exactly one token chosen by
the target (the correction at the first rejection, or the bonus after all k drafts). Row i of the
target's array is the target's distribution for the token at draft position i; row k is the bonus.
Pure numpy: no model code here, and no Python loop over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edge_spec.decode.constraint import StepConstraint
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import LazyProbs, SamplingParams, argmax, sample

__all__ = [
    "Verdict",
    "check_tree",
    "verify_constrained",
    "verify_greedy",
    "verify_keyed",
    "verify_rejection",
    "verify_tree",
]

# A residual whose mass is below this is rounding noise (p_draft == p_target up to float error).
# Reaching it needs a rejection, whose probability is that same mass, so falling back to p_target
# there moves the output distribution by at most this much.
_RESIDUAL_EPS = 1e-12


@dataclass(frozen=True)
class Verdict:
    """What one verification step produced."""

    tokens: tuple[int, ...]  # accepted draft tokens + one target token; length n_accepted + 1
    n_accepted: int  # how many of the k draft tokens were accepted (0..k)
    path: tuple[int, ...] = ()  # a token tree: the indices of the accepted draft tokens


def verify_greedy(draft_tokens: Sequence[int], target_logits: np.ndarray) -> Verdict:
    """Greedy (temperature 0) verification.

    Requires: target_logits of shape (k + 1, n_vocab) with k = len(draft_tokens) (k may be 0),
    and every draft token in [0, n_vocab).
    Returns: the longest prefix of draft_tokens equal to the target's argmax row by row, then the
    target's argmax at the first mismatching row (row k if all matched).
    Raises: ValueError on a shape mismatch or an out-of-range token.
    """
    tokens = _checked_tokens(draft_tokens, target_logits, "target_logits")
    return _match(tokens, lambda i: argmax(target_logits[i]))


def verify_keyed(
    draft_tokens: Sequence[int],
    target_logits: np.ndarray,
    params: SamplingParams,
    keys: SampleKeys,
    first_position: int,
) -> Verdict:
    """Sampled (temperature > 0) verification that does not depend on the draft.

    The target's token at row i is keys.draw(target_logits[i], params, first_position + i):
    its own keyed draw for that position of the context. Draft tokens are kept while they
    equal it. Every token produced is the target's own draw with keys of its own, so the output
    is distributed exactly as sampling from the target, and it is the same whatever was
    drafted. A deterministic draft token x is accepted with probability p_target(x), as
    rejection sampling would accept it; a sampling draft that draws with the same keys is
    accepted where the two distributions agree (Gumbel coupling). Rows after the first
    mismatch are never looked at.

    Requires: target_logits of shape (k + 1, n_vocab) and params.temperature > 0.
    Raises: ValueError on a shape mismatch or an out-of-range token.
    """
    tokens = _checked_tokens(draft_tokens, target_logits, "target_logits")
    return _match(tokens, lambda i: keys.draw(target_logits[i], params, first_position + i)[0])


def _match(tokens: tuple[int, ...], target_token: Callable[[int], int]) -> Verdict:
    """Keep draft tokens while they equal the target's token of their row (computed row by row:
    an early mismatch skips the later rows), then add the target's token of the next row."""
    for i, token in enumerate(tokens):
        chosen = target_token(i)
        if chosen != token:
            return Verdict(tokens[:i] + (chosen,), i)
    return Verdict(tokens + (target_token(len(tokens)),), len(tokens))


def verify_tree(
    draft_tokens: Sequence[int],
    parents: Sequence[int],
    target_logits: np.ndarray,
    params: SamplingParams,
    keys: SampleKeys,
    first_position: int,
) -> Verdict:
    """Verification of a token tree, exact like the chain: starting at the context's last
    token (row 0), the target chooses its token for the next position (its argmax, or its
    keyed draw for that position); if a child of the current node is that token, it is
    accepted and the walk goes on from it (its row is 1 + its index), else the target's
    token ends the step. A chain (parents i - 1) gives verify_greedy's / verify_keyed's
    verdict; any tree gives the tokens the target alone would produce.

    Requires: a tree as check_tree accepts it and target_logits of shape (n + 1, n_vocab).
    Raises: ValueError on a malformed tree, a shape mismatch or an out-of-range token.
    """
    tokens = _checked_tokens(draft_tokens, target_logits, "target_logits")
    children = check_tree(tokens, parents)

    def choose(row: int, depth: int) -> int:
        if params.greedy:
            return argmax(target_logits[row])
        return keys.draw(target_logits[row], params, first_position + depth)[0]

    path, chosen = _walk(children, choose)
    return Verdict(tuple(tokens[i] for i in path) + (chosen,), len(path), tuple(path))


def _walk(
    children: dict[tuple[int, int], int], choose: Callable[[int, int], int]
) -> tuple[list[int], int]:
    """The walk every tree verification makes: from the context's last token (row 0), the
    target chooses (choose(row, depth)); a child that is that token is accepted and the walk
    goes on from its row (1 + its index). Returns (the accepted nodes, the token that ended it)."""
    path: list[int] = []
    node = -1
    while True:
        chosen = choose(node + 1, len(path))
        child = children.get((node, chosen))
        if child is None:
            return path, chosen
        path.append(child)
        node = child


def verify_constrained(
    draft_tokens: Sequence[int],
    parents: Sequence[int],
    target_logits: np.ndarray,
    params: SamplingParams,
    keys: SampleKeys,
    first_position: int,
    constraint: StepConstraint,
) -> Verdict:
    """verify_greedy / verify_keyed / verify_tree (parents empty: a chain) under a grammar: the
    target chooses from each row with the grammar's mask at that position applied (its masked
    argmax, or its keyed draw over the masked row), so every token is the constrained target's
    own. Greedy masks only a row whose argmax the grammar refuses (the argmax over the allowed
    tokens is then the row's own); a sampled row is always masked. On return the constraint
    has advanced by the verdict's tokens.

    Requires: the constraint in the state after the context, and every draft token's path
    allowed by it; target_logits as verify_tree requires (never written).
    """
    tokens = _checked_tokens(draft_tokens, target_logits, "target_logits")
    chain = not parents
    children = check_tree(tokens, range(-1, len(tokens) - 1) if chain else parents)

    def choose(index: int, depth: int) -> int:
        row = target_logits[index]
        if params.greedy:
            chosen = argmax(row)
            if not constraint.allows(chosen):
                row = row.copy()  # the caller's rows stay as the target gave them
                constraint.mask(row)
                chosen = argmax(row)
        else:
            row = row.copy()
            constraint.mask(row)
            chosen = keys.draw(row, params, first_position + depth)[0]
        constraint.advance([chosen])
        return chosen

    path, chosen = _walk(children, choose)
    accepted = tuple(tokens[i] for i in path)
    return Verdict(accepted + (chosen,), len(path), () if chain else tuple(path))


def check_tree(tokens: Sequence[int], parents: Sequence[int]) -> dict[tuple[int, int], int]:
    """{(parent, token): child} of a token tree: one parent per token (-1: the context's last
    token), parents before children, siblings distinct. Raises ValueError otherwise."""
    if len(parents) != len(tokens):
        raise ValueError(f"a tree needs one parent per token: {len(parents)} for {len(tokens)}")
    children: dict[tuple[int, int], int] = {}
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        if not -1 <= parent < i:
            raise ValueError(f"token {i}'s parent must be in [-1, {i}), got {parent}")
        if (parent, token) in children:
            raise ValueError(f"token {i} repeats a sibling ({token})")
        children[parent, token] = i
    return children


def verify_rejection(
    draft_tokens: Sequence[int],
    p_draft: np.ndarray | None,
    p_target: np.ndarray | LazyProbs,
    rng: np.random.Generator,
) -> Verdict:
    """Rejection-sampling verification (Leviathan et al. 2023; Chen et al. 2023), temperature > 0.

    Draft token x at position i is accepted with probability min(1, p_target[i, x] / p_draft[i, x])
    (one rng.random() per position); the first rejection is replaced by a sample from
    norm(max(0, p_target[i] - p_draft[i])) and ends the step; if all k pass, a bonus token is drawn
    from p_target[k]. The tokens produced are distributed exactly as sampling from p_target.

    Requires: p_target of shape (k + 1, n_vocab), rows summing to 1 (an array, or LazyProbs so
    that rows after the first rejection are never computed); p_draft of shape (k, n_vocab)
    with the rows the draft tokens were sampled from, after the same sampling transform, or None
    for a deterministic draft (n-gram lookup, greedy draft), which is a point mass on each draft
    token. Inputs are not modified.
    Raises: ValueError on a shape mismatch or an out-of-range token.
    """
    tokens = _checked_tokens(draft_tokens, p_target, "p_target")
    k = len(tokens)
    if p_draft is not None and (p_draft.ndim != 2 or p_draft.shape != (k, p_target.shape[1])):
        raise ValueError(
            f"p_draft must have shape ({k}, {p_target.shape[1]}) for k={k}, got {p_draft.shape}"
        )
    for i, token in enumerate(tokens):
        p_target_row = p_target[i]
        p_draft_x = 1.0 if p_draft is None else p_draft[i, token]
        # u < p_target/p_draft without dividing: also right when p_draft_x is 0.
        if rng.random() * p_draft_x < p_target_row[token]:
            continue
        if p_draft is None:
            residual = p_target_row.copy()  # point-mass draft: the residual is p_target without x
            residual[token] = 0.0
        else:
            residual = p_target_row - p_draft[i]
            np.maximum(residual, 0.0, out=residual)
        if residual.sum() <= _RESIDUAL_EPS:
            residual = p_target_row
        return Verdict(tokens[:i] + (sample(residual, rng.random()),), i)
    return Verdict(tokens + (sample(p_target[k], rng.random()),), k)


def _checked_tokens(
    draft_tokens: Sequence[int], rows: np.ndarray | LazyProbs, name: str
) -> tuple[int, ...]:
    """Return draft_tokens as a tuple of ints after checking rows is (k + 1, n_vocab)."""
    tokens = tuple(int(token) for token in draft_tokens)
    k = len(tokens)
    if len(rows.shape) != 2 or rows.shape[0] != k + 1:
        raise ValueError(f"{name} must have shape ({k + 1}, n_vocab) for k={k}, got {rows.shape}")
    n_vocab = rows.shape[1]
    for token in tokens:
        if not 0 <= token < n_vocab:
            raise ValueError(f"draft token {token} is outside the vocabulary [0, {n_vocab})")
    return tokens
