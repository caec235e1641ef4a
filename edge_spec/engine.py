"""The decode loop: draft -> one batched target pass -> verify -> roll back -> repeat.

Invariant between steps: the target's KV cache holds context[:-1]; the last token (the
target's latest choice, or the prompt's last token) is decoded at the head of the next batch,
so every step asks the target for exactly k + 1 logit rows and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .backend import LlamaModel
from .drafts import Draft, DraftSource
from .errors import ContextOverflowError, InvalidRequestError
from .sampling import SamplingParams, make_rng, probs_from_logits
from .verify import Verdict, verify_greedy, verify_rejection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """What one speculative step produced: the new tokens (accepted draft tokens, then one
    token chosen by the target) and where the time went."""

    tokens: tuple[int, ...]
    n_drafted: int
    n_accepted: int
    draft_s: float
    verify_s: float


@dataclass(frozen=True)
class Prefill:
    n_prompt: int
    n_cached: int  # prompt tokens whose KV was reused from the previous request
    prefill_s: float


def run_steps(
    target: LlamaModel,
    source: DraftSource,
    prompt: Sequence[int],
    *,
    k: int,
    max_tokens: int,
    sampling: SamplingParams,
) -> Iterator[Prefill | Step]:
    """Yields one Prefill, then Steps until max_tokens tokens were produced or the context is
    full (the caller stops earlier at EOS or a stop string by closing the generator).

    Requires a non-empty prompt that fits in the target's context, k >= 0, max_tokens >= 0.
    """
    if not prompt:
        raise InvalidRequestError("the prompt is empty")
    if k < 0:
        raise InvalidRequestError(f"k must be >= 0, got {k}")
    if len(prompt) > target.n_ctx:
        raise ContextOverflowError(
            f"prompt of {len(prompt)} tokens does not fit in the context of {target.n_ctx}"
        )
    rng = make_rng(sampling.seed)
    context = list(prompt)

    t0 = time.perf_counter()
    cached = target.sync(context[:-1])
    source.begin(context)
    yield Prefill(len(prompt), cached, time.perf_counter() - t0)

    n_out = 0
    while n_out < max_tokens and len(context) <= target.n_ctx:
        # The batch [last, d_1..d_k] lands at positions len-1 .. len-1+k, all < n_ctx.
        k_step = min(k, target.n_ctx - len(context), max_tokens - n_out - 1, target.n_batch - 1)
        t0 = time.perf_counter()
        draft = source.propose(context, k_step, sampling, rng)
        t1 = time.perf_counter()
        batch = [context[-1], *draft.tokens]
        logits = target.decode(batch, range(len(batch)))  # (k + 1, n_vocab), a view
        verdict = _verify(draft, logits, sampling, rng)
        target.truncate(len(context) + verdict.n_accepted)  # drop rejected drafts' KV
        source.accept(verdict.n_accepted)
        context.extend(verdict.tokens)
        n_out += len(verdict.tokens)
        t2 = time.perf_counter()
        yield Step(verdict.tokens, len(draft.tokens), verdict.n_accepted, t1 - t0, t2 - t1)


def _verify(
    draft: Draft, logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator
) -> Verdict:
    if sampling.greedy:
        return verify_greedy(draft.tokens, logits)
    p_target = probs_from_logits(logits, sampling)  # (k + 1, n_vocab)
    return verify_rejection(draft.tokens, draft.p_draft, p_target, rng)
