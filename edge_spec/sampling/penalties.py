"""OpenAI's logit_bias, then llama.cpp's repetition penalties (its `logit_bias` and `penalties`
samplers, first in its default chain). The bias is added to its tokens' logits. Over
the last repeat_last_n tokens of the context, each token that occurs c > 0 times there has its
logit divided by repeat_penalty (multiplied where the logit is negative), then lowered by
c * frequency_penalty + presence_penalty. OpenAI's presence_penalty and frequency_penalty are
the same two terms (as llama.cpp's server maps them).

A penalized row depends on the tokens before its position, so in a verification batch each row
is penalized with the context plus the draft tokens ahead of it on its path: every token the
engine keeps is the penalized target's own choice, whatever was drafted. Pure numpy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from edge_spec.sampling.transform import SamplingParams


def penalize(row: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """A copy of a logits row with the logit bias and the penalties of `history` (the tokens
    before its position, oldest first) applied; the row itself when neither is on. Requires
    nothing: ids the row has not (a draft's smaller vocabulary) are left out."""
    if not params.penalized:
        return row
    out = row.copy()
    _apply(out, history, params)
    return out


def _apply(out: np.ndarray, history: Sequence[int], params: SamplingParams) -> None:
    """penalize, in place."""
    for token, bias in params.logit_bias:
        if token < out.shape[0]:
            out[token] += np.float32(bias)
    if not params.repeats_penalized:
        return
    counts = Counter(t for t in recent(history, params) if 0 <= t < out.shape[0])
    if not counts:
        return
    ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
    seen = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    values = out[ids]
    if params.repeat_penalty != 1:
        penalty = np.float32(params.repeat_penalty)
        values = np.where(values <= 0, values * penalty, values / penalty)
    values = values - seen * np.float32(params.frequency_penalty)
    values = values - np.float32(params.presence_penalty)
    out[ids] = values


def recent(tokens: Sequence[int], params: SamplingParams) -> list[int]:
    """The last repeat_last_n tokens (none when it is 0: `tokens[-0:]` would be all of them)."""
    n = params.repeat_last_n
    return list(tokens[-n:]) if n else []


def penalize_rows(
    rows: np.ndarray,
    context: Sequence[int],
    draft: Sequence[int],
    parents: Sequence[int],
    params: SamplingParams,
) -> np.ndarray:
    """The rows of one verification batch [last context token, draft...], each penalized with
    the context and the draft tokens on its path: row 0 with the context, row 1 + j with the
    context and the path to draft node j (a chain when parents is empty)."""
    if not params.penalized:
        return rows
    out = rows.copy()  # one copy of the batch (the caller's rows are llama.cpp's buffer)
    paths: list[list[int]] = []
    for j, token in enumerate(draft):
        parent = (j - 1) if not parents else parents[j]
        paths.append([*(paths[parent] if parent >= 0 else []), int(token)])
    tail = recent(context, params)
    _apply(out[0], tail, params)
    for j, path in enumerate(paths):
        _apply(out[j + 1], tail + path, params)
    return out
