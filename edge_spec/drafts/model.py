"""A smaller GGUF model drafting for the target.

Its KV cache stays in sync with the accepted text and is reused across steps: each proposal
re-decodes only the tokens after the longest prefix the cache already holds (the newly
accepted tokens and the target's own token), then extends greedily or by sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..backend import LlamaModel, common_prefix
from ..sampling import SamplingParams, argmax, probs_from_logits, sample
from .base import NO_DRAFT, Draft


class ModelDraft:
    name = "model"

    def __init__(self, draft_model: LlamaModel, p_min: float = 0.0) -> None:
        """p_min > 0 stops drafting once the draft's own probability for its token falls below it
        (llama.cpp's --draft-p-min); 0 always drafts k tokens."""
        self.draft_model = draft_model
        self.p_min = p_min

    def begin(self, prompt: Sequence[int]) -> None:
        # The target decodes prompt[:-1] in prefill; the draft does the same so that the first
        # proposal only decodes the last prompt token.
        self.draft_model.sync(prompt[:-1])

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        model = self.draft_model
        k = min(k, model.n_ctx - len(context))
        if k <= 0:
            return NO_DRAFT
        # Reuse the cached prefix but re-decode at least the last token: we need its logits.
        n_reused = common_prefix(model.tokens, context[: len(context) - 1])
        model.truncate(n_reused)
        fresh = context[n_reused:]
        logits = model.decode(fresh, [len(fresh) - 1])[0]  # (n_vocab,)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for i in range(k):
            if params.greedy:
                token = argmax(logits)
                confidence = _top_prob(logits) if self.p_min > 0 else 1.0
            else:
                p_draft = probs_from_logits(logits, params)  # (n_vocab,)
                token = sample(p_draft, rng)
                rows.append(p_draft)
                confidence = float(p_draft[token])
            if tokens and confidence < self.p_min:
                break
            tokens.append(token)
            if i + 1 < k:
                logits = model.decode([token], [0])[0]
        p_draft_rows = np.stack(rows[: len(tokens)]) if rows else None  # (k, n_vocab)
        return Draft(tokens=tuple(tokens), p_draft=p_draft_rows)

    def accept(self, n_accepted: int) -> None:
        pass


def _top_prob(logits: np.ndarray) -> float:
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float64).sum())
