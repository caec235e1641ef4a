"""A smaller GGUF model drafting for the target.

At temperature > 0 it draws each token with the request's keys for that position, the ones
the target's own draw will use, so the two agree wherever their distributions do.
Its KV cache stays in sync with the accepted text and is reused across steps: each proposal
re-decodes only the tokens after the longest prefix the cache already holds (the newly
accepted tokens and the target's own token), then extends greedily or by sampling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edge_spec.backend import LlamaModel, common_prefix
from edge_spec.drafts.base import NO_DRAFT, Draft, KeepDrafting
from edge_spec.errors import EdgeSpecError
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.penalties import penalize, recent
from edge_spec.sampling.transform import SamplingParams, argmax


class ModelDraft:
    name = "model"
    vocabulary = "shared"  # the draft's token ids are the target's

    def __init__(self, draft_model: LlamaModel) -> None:
        self.draft_model = draft_model

    @property
    def decode_s(self) -> float:
        return self.draft_model.decode_s

    def _draft_tokens(self, context: Sequence[int]) -> Sequence[int]:
        """The draft's own tokens for the context: the same ids here (a draft with another
        vocabulary re-tokenizes the text)."""
        return context

    def begin(self, prompt: Sequence[int]) -> None:
        # The target decodes prompt[:-1] in prefill; the draft does the same so that the first
        # proposal only decodes the last prompt token. (The engine skips this when the policy
        # does not expect to draft with the model: then its first proposal catches up.)
        self.draft_model.sync(self._draft_tokens(prompt)[:-1])

    def reset(self) -> None:
        """Forget the draft model's cache (after a failure: the next request starts clean)."""
        self.draft_model.reset()

    def lag(self, context: Sequence[int]) -> int:
        """How many tokens the next proposal's first decode would cover: those after the
        longest prefix of the draft's tokens[:-1] the cache holds (at least the last token)."""
        tokens = self._draft_tokens(context)
        return max(1, len(tokens) - self._reusable(tokens))

    def _reusable(self, tokens: Sequence[int]) -> int:
        """Cached tokens a proposal keeps: the prefix shared with tokens[:-1] (the last token
        is always re-decoded, for its logits)."""
        return common_prefix(self.draft_model.tokens, tokens[: len(tokens) - 1])

    def _catch_up(self, tokens: Sequence[int]) -> np.ndarray:
        """Bring the cache to `tokens`, reusing the cached prefix but re-decoding at least the
        last token; returns its logits, (n_vocab,)."""
        n_reused = self._reusable(tokens)
        self.draft_model.truncate(n_reused)
        fresh = tokens[n_reused:]
        return self.draft_model.decode(fresh, [len(fresh) - 1])[0]

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        model = self.draft_model
        k = min(k, model.n_ctx - len(context))
        if k <= 0:
            return NO_DRAFT
        logits = self._catch_up(context)  # (n_vocab,)
        tokens: list[int] = []
        confidences: list[float] = []
        for i in range(k):
            if params.penalized:  # as the target's rows will be: closer drafts, same output
                logits = penalize(logits, recent(context, params) + tokens, params)
            if params.greedy:
                token = argmax(logits)
                # Only an adaptive policy reads confidences: skip the softmax otherwise.
                confidence = _top_prob(logits) if keep_drafting else 1.0
            else:
                # The same keys the target's own draw for this position will use: where the two
                # distributions agree, so do the two tokens.
                token, confidence = keys.draw(logits, params, len(context) + i)
            tokens.append(token)
            confidences.append(confidence)
            if i + 1 == k or (keep_drafting is not None and not keep_drafting(i, confidence)):
                break
            logits = model.decode([token], [0])[0]
        return Draft(tuple(tokens), tuple(confidences))


def _top_prob(logits: np.ndarray) -> float:
    # float32 exp (4x faster than float64 here), float64 sum.
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted).sum(dtype=np.float64))


class LazyModelDraft(ModelDraft):
    """A draft model loaded on first use: when a request's policy first wants it (its prompt
    prefilled, `begin`) or first plans a model draft (`load`, which the engine calls before
    drafting and times apart from the draft). A run whose policy never drafts with the model
    never pays its load (with a 4096-token context on 2 cores: 0.8 s for Gemma-3-270M Q4_0,
    0.2 s for SmolLM2-135M Q4_0) nor its prefill.

    `load_source` builds the real source (a ModelDraft, or a CrossVocabDraft across
    vocabularies) from the loaded model; `vocabulary` is what the files say until then. A load
    that fails is not retried: every later use raises the same error, which sets the source
    aside for the request (the target answers alone)."""

    def __init__(
        self,
        load_source: Callable[[], ModelDraft],
        vocabulary: str,
        expected_load_s: float = 0.0,
    ) -> None:
        self._load_source = load_source
        self._vocabulary = vocabulary
        # What the load is expected to cost (the policy's risk ledger charges it to the plan
        # that would load it), until it is loaded.
        self.expected_load_s = expected_load_s
        self._source: ModelDraft | None = None
        self._error: Exception | None = None

    @property
    def loaded(self) -> ModelDraft | None:
        """The real source once loaded, else None (loads nothing)."""
        return self._source

    def load(self) -> ModelDraft:
        if self._source is None:
            if self._error is not None:
                raise EdgeSpecError(f"the draft model did not load: {self._error}")
            try:
                self._source = self._load_source()
            except Exception as exc:
                self._error = exc
                raise
        return self._source

    @property
    def draft_model(self) -> LlamaModel:  # type: ignore[override]
        return self.load().draft_model

    @property
    def vocabulary(self) -> str:  # type: ignore[override]
        return self._source.vocabulary if self._source is not None else self._vocabulary

    @property
    def decode_s(self) -> float:
        return self._source.decode_s if self._source is not None else 0.0

    def begin(self, prompt: Sequence[int]) -> None:
        self.load().begin(prompt)

    def reset(self) -> None:
        if self._source is not None:
            self._source.reset()

    def lag(self, context: Sequence[int]) -> int:
        # Not loaded: its first proposal decodes the whole context.
        return self._source.lag(context) if self._source is not None else max(1, len(context))

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        return self.load().propose(context, k, params, keys, keep_drafting)

    def close(self) -> None:
        """Free the draft model if it was loaded."""
        if self._source is not None:
            self._source.draft_model.close()
