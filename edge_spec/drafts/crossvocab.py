"""A draft model whose vocabulary differs from the target's: any small model drafts for any
target, over the text they share.

Each proposal
1. brings the draft's view of the context up to date: the target context's text (its tokens'
   bytes; control tokens have none) tokenized by the draft, re-tokenized from a few draft tokens
   before the first changed byte so a word that grew is split the way the draft would split it,
   and the draft's KV synced to that (the common prefix is reused, as for a same-vocabulary
   draft);
2. drafts greedily in its own vocabulary, one draft token past what it will propose;
3. translates the drafted text for the target: the text of the last committed target tokens
   (a lookbehind) plus the drafted text, tokenized by the target, must begin with those
   committed tokens (else a shorter lookbehind is tried), and only target tokens whose text
   ends before the last draft token's text begins are proposed, so a word the draft had not
   finished is never forced on the target. A draft that ended its turn proposes all of it.

Verification is the target's own choice (its argmax, or its keyed draw) compared with these
point-mass tokens, so the output is the target's at any temperature whatever the draft said.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from edge_spec.backend import common_prefix
from edge_spec.drafts.base import NO_DRAFT, Draft, KeepDrafting
from edge_spec.drafts.model import ModelDraft, _top_prob
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import SamplingParams, argmax

LOOKBEHIND = 2  # committed target tokens re-tokenized with a translation
REWIND = 2  # draft tokens re-tokenized before the first changed byte


class Vocabulary(Protocol):
    """What a translation needs of a model: its tokenizer (never its KV)."""

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


class CrossVocabDraft(ModelDraft):
    """A ModelDraft whose tokens are not the target's: it drafts text, the target's tokenizer
    turns it into target tokens. `draft_prefix` is what the draft model's own tokenization of
    a prompt starts with (its BOS, when it adds one)."""

    vocabulary = "translated"

    def __init__(
        self, draft_model, target_vocab: Vocabulary, draft_prefix: Sequence[int] = ()
    ) -> None:
        super().__init__(draft_model)
        self.target_vocab = target_vocab
        self.draft_prefix = list(draft_prefix)
        self._target = _TokenText(target_vocab)  # the target context as text
        self._tokens: list[int] = list(draft_prefix)  # the draft's tokens for that text
        self._draft_ends: list[int] = [0] * len(draft_prefix)  # byte end of each in the text

    def reset(self) -> None:
        """Forget the draft model's cache and the text translated so far."""
        super().reset()
        self._target = _TokenText(self.target_vocab)
        self._tokens = list(self.draft_prefix)
        self._draft_ends = [0] * len(self.draft_prefix)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        model = self.draft_model
        draft_context = self._draft_tokens(context)
        limit = min(k + 1, model.n_ctx - len(draft_context))  # one draft token of lookahead
        if k <= 0 or limit < 2 or not draft_context:
            return NO_DRAFT
        logits = self._catch_up(draft_context)  # (n_vocab,)
        pieces: list[bytes] = []
        confidences: list[float] = []
        ended = False
        while len(pieces) < limit:
            # Greedy whatever the temperature: a point-mass draft is accepted with the target's
            # own probability of it, which the draft's likeliest token tends to maximize.
            token = argmax(logits)
            if model.is_eog(token):
                ended = True
                break
            pieces.append(model.token_bytes(token))
            confidences.append(_top_prob(logits) if keep_drafting else 1.0)
            i = len(pieces) - 1
            if (
                keep_drafting is not None
                and i + 2 < limit
                and not keep_drafting(i, confidences[-1])
            ):
                limit = i + 2  # stop, after one more token to look ahead with
            if len(pieces) < limit:
                logits = model.decode([token], [0])[0]
        # Unless the draft ended its text, its last token only shows where the words before it
        # end: it is read with the rest, never proposed.
        n_confirmed = len(pieces) if ended else len(pieces) - 1
        tokens, token_confidences = self._translate(context, pieces, confidences, n_confirmed)
        return Draft(tokens[:k], token_confidences[:k]) if tokens else NO_DRAFT

    # ---- the draft's view of the context ---------------------------------------------------

    def _draft_tokens(self, context: Sequence[int]) -> list[int]:
        """The draft's tokens for the text of `context`, updated incrementally."""
        n_same_bytes = self._target.update(context)
        text = self._target.text
        # Keep draft tokens that end in unchanged text, less a few that may merge with new text.
        n_keep = len(self.draft_prefix)
        while n_keep < len(self._draft_ends) and self._draft_ends[n_keep] <= n_same_bytes:
            n_keep += 1
        n_keep = max(len(self.draft_prefix), n_keep - REWIND)
        start = self._draft_ends[n_keep - 1] if n_keep else 0
        while n_keep > len(self.draft_prefix) and _is_continuation(text, start):
            n_keep -= 1  # a byte-level draft token split a character: start before it
            start = self._draft_ends[n_keep - 1] if n_keep else 0
        del self._tokens[n_keep:], self._draft_ends[n_keep:]
        end = _complete_end(text, start)  # a trailing partial character waits for the rest
        if end > start:
            new = self.draft_model.tokenize(
                bytes(text[start:end]).decode("utf-8", "replace"), add_special=False
            )
            self._tokens.extend(new)
            self._draft_ends.extend(_ends(self.draft_model, new, start, end))
        return self._tokens

    # ---- drafted text to target tokens -----------------------------------------------------

    def _translate(
        self,
        context: Sequence[int],
        pieces: Sequence[bytes],
        confidences: Sequence[float],
        n_confirmed: int,
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Target tokens for the drafted pieces' text that end within the first n_confirmed
        pieces, continuing the committed context as read through a lookbehind of committed
        tokens; each token's confidence is the product of those of the pieces it begins."""
        confirmed_bytes = sum(len(p) for p in pieces[:n_confirmed])
        if confirmed_bytes == 0:
            return (), ()
        drafted = b"".join(pieces)
        vocab, view = self.target_vocab, self._target
        n = len(context)
        lookbehind = 0  # committed tokens with text, up to a control token
        while lookbehind < min(LOOKBEHIND, n) and view.piece_len(n - 1 - lookbehind) > 0:
            lookbehind += 1
        for n_behind in range(lookbehind, -1, -1):
            start = view.ends[n - n_behind - 1] if n_behind < n else 0
            tail = bytes(view.text[start:]) if n_behind else b""
            region = tail + drafted
            text = region[: _complete_end(region, 0)].decode("utf-8", "replace")
            ids = vocab.tokenize(text, add_special=False)
            if list(ids[:n_behind]) != list(context[n - n_behind :]):
                continue  # the committed tail reads differently next to this text
            tokens: list[int] = []
            token_confidences: list[float] = []
            starts = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0))
            end, j = 0, 0  # byte end of the last token in the drafted text; next piece
            for token in ids[n_behind:]:
                end += len(vocab.token_bytes(token))
                if end > confirmed_bytes:
                    break
                confidence = 1.0
                while j < len(pieces) and starts[j] < end:  # the pieces this token begins
                    confidence *= confidences[j]
                    j += 1
                tokens.append(token)
                token_confidences.append(confidence)
            return tuple(tokens), tuple(token_confidences)
        return (), ()


class _TokenText:
    """A token sequence's text, bytes per token, kept in step with a growing context."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.tokens: list[int] = []
        self.ends: list[int] = []  # byte end of each token's piece in text
        self.text = bytearray()

    def update(self, context: Sequence[int]) -> int:
        """Make this the text of `context`; returns how many leading bytes stayed the same."""
        n_common = common_prefix(self.tokens, context)
        n_bytes = self.ends[n_common - 1] if n_common else 0
        del self.tokens[n_common:], self.ends[n_common:], self.text[n_bytes:]
        for token in context[n_common:]:
            self.text += self.vocab.token_bytes(token)
            self.tokens.append(token)
            self.ends.append(len(self.text))
        return n_bytes

    def piece_len(self, i: int) -> int:
        return self.ends[i] - (self.ends[i - 1] if i else 0)


def _ends(vocab: Vocabulary, tokens: Sequence[int], start: int, end: int) -> list[int]:
    """Byte ends of tokens tokenized from text[start:end] (clamped to end: a replaced invalid
    byte has a longer piece than the byte it replaced)."""
    out = []
    position = start
    for token in tokens:
        position = min(position + len(vocab.token_bytes(token)), end)
        out.append(position)
    return out


def _is_continuation(text: bytes | bytearray, i: int) -> bool:
    """Is text[i] inside a UTF-8 character (a 10xxxxxx byte)?"""
    return i < len(text) and text[i] & 0xC0 == 0x80


def _complete_end(text: bytes | bytearray, start: int) -> int:
    """The end of text without a trailing incomplete UTF-8 character (from start on)."""
    end = len(text)
    for back in range(1, min(4, end - start) + 1):
        byte = text[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        if byte & 0x80 == 0:
            return end  # ASCII: complete
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return end if back >= need else end - back
    return end
