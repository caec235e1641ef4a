"""Log-probabilities of the tokens a step produced, read from the target rows that chose them.

They are the target model's own distribution: the log-softmax of its logits row, before the
request's logit bias, penalties, temperature, top-k/top-p/min-p or grammar mask (what
OpenAI's and llama.cpp's servers report). A drafted token accepted in a step gets the logprob
of the same row the target alone would have read at that position (up to llama.cpp's
batching noise, docs/exactness.md), so logprobs, like the text, do not depend on what was
drafted. Pure numpy, but for prompt_logprobs, which decodes the prompt on the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge_spec.backend import common_prefix

if TYPE_CHECKING:
    from edge_spec.backend import LlamaModel

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
# Scoring a prompt outputs every row of each piece it decodes: pieces of at most this many
# bytes of logits (llama.cpp keeps its output buffer at the largest size asked for).
SCORE_PIECE_BYTES = 32 << 20


@dataclass(frozen=True)
class RowLogprobs:
    """One produced token's logprob, and the `top_n` most likely tokens of its row (best
    first, ties to the lower id) with theirs."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], top_n: int) -> tuple[RowLogprobs, ...]:
    """Requires rows of shape (len(tokens), n_vocab), row i the logits that chose tokens[i],
    and 0 <= top_n <= MAX_TOP_LOGPROBS. Returns one RowLogprobs per token."""
    if rows.ndim != 2 or rows.shape[0] != len(tokens):
        raise ValueError(f"need one row per token: {rows.shape} for {len(tokens)} tokens")
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_n must be in [0, {MAX_TOP_LOGPROBS}], got {top_n}")
    top_n = min(top_n, rows.shape[1])
    # float32 throughout: a float64 copy of a 262,144-token row costs more than the rest.
    peak = rows.max(axis=1)
    log_z = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1, dtype=np.float32))
    out = []
    for i, token in enumerate(tokens):
        top: tuple[tuple[int, float], ...] = ()
        if top_n:
            row = rows[i]
            top = tuple((int(t), float(row[t] - log_z[i])) for t in _top(row, peak[i], top_n))
        out.append(RowLogprobs(int(token), float(rows[i, token] - log_z[i]), top))
    return tuple(out)


def _top(row: np.ndarray, peak: float, n: int) -> np.ndarray:
    """The ids of the n largest logits, best first, ties to the lower id. Candidates within a
    margin of the peak first (a comparison costs a tenth of an argpartition of the row)."""
    margin = 4.0
    candidates = np.flatnonzero(row >= peak - margin)
    while candidates.size < n:
        margin *= 4
        candidates = np.flatnonzero(row >= peak - margin)
    if candidates.size > 64 * n:
        keep = np.argpartition(-row[candidates], n - 1)[:n]
        threshold = row[candidates[keep]].min()  # ties at the threshold stay candidates
        candidates = candidates[row[candidates] >= threshold]
    order = np.lexsort((candidates, -row[candidates]))[:n]
    return candidates[order]


def chosen_rows(n_tokens: int, path: Sequence[int]) -> list[int]:
    """The rows of a step's batch that chose its tokens: a chain's token i was chosen by row i;
    a tree's by the row of its parent on the accepted path (row 0: the context's last token,
    row 1 + j: draft node j)."""
    if not path:
        return list(range(n_tokens))
    return [0, *(node + 1 for node in path)]


class PromptScores:
    """The last scored prompt and its rows. A next prompt that begins the same way (the
    choices of one lm-evaluation-harness question, a conversation scored turn by turn) reuses
    the rows of the shared beginning and decodes only what follows, where the target's cache
    still holds that beginning. Rows are a function of the tokens alone, so a reused row is
    the row the target would give again (up to llama.cpp's batching noise)."""

    def __init__(self) -> None:
        self.prompt: tuple[int, ...] = ()
        self.rows: tuple[RowLogprobs, ...] = ()
        self.top_n = -1

    def reusable(self, prompt: Sequence[int], top_n: int) -> int:
        """How many of prompt[1:]'s rows are known: row i reads prompt[: i + 1] and scores
        prompt[i + 1], so it is known while prompt[: i + 2] is the last prompt's."""
        if top_n != self.top_n:
            return 0
        return max(0, common_prefix(prompt, self.prompt) - 1)


def prompt_logprobs(
    target: LlamaModel, prompt: Sequence[int], top_n: int, known: PromptScores | None = None
) -> tuple[tuple[RowLogprobs, ...], int]:
    """The logprobs of prompt[1:], each read from the row of the token before it, and the
    `top_n` most likely tokens of that row. The rows of a cached prefix are gone from the
    target, so they come from `known` (the last scored prompt) where it shares them, and the
    rest of prompt[:-1] is decoded in pieces whose every row is output; the target is left
    holding prompt[:-1], as the decode loop wants it before its first step, and `known` holds
    this prompt's rows. Returns the rows and how many of them were known (the prompt tokens
    whose cache was kept).

    Requires a non-empty prompt of valid ids that fits in the context."""
    body = list(prompt[:-1])
    start = 0
    if known is not None:
        start = min(known.reusable(prompt, top_n), common_prefix(target.tokens, body))
    target.truncate(start)
    out: list[RowLogprobs] = list(known.rows[:start]) if known is not None else []
    piece = max(1, min(target.n_batch, SCORE_PIECE_BYTES // (4 * target.n_vocab)))
    for first in range(start, len(body), piece):
        tokens = body[first : first + piece]
        rows = target.decode(tokens, range(len(tokens)))
        out.extend(token_logprobs(rows, prompt[first + 1 : first + 1 + len(tokens)], top_n))
    if known is not None:
        known.prompt, known.rows, known.top_n = tuple(prompt), tuple(out), top_n
    return tuple(out), start
