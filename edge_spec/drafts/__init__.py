"""Draft sources: a GGUF model (sharing the target's vocabulary or not), prompt-lookup
n-grams, or none."""

from .base import NO_DRAFT, Draft, DraftSource, NoDraft
from .crossvocab import CrossVocabDraft
from .model import ModelDraft
from .ngram import NgramDraft

__all__ = [
    "NO_DRAFT",
    "CrossVocabDraft",
    "Draft",
    "DraftSource",
    "ModelDraft",
    "NgramDraft",
    "NoDraft",
]
