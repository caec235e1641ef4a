"""Draft sources: a GGUF model (sharing the target's vocabulary or not), prompt-lookup
n-grams, or none."""

from edge_spec.drafts.base import NO_DRAFT, Draft, DraftSource, NoDraft
from edge_spec.drafts.crossvocab import CrossVocabDraft
from edge_spec.drafts.model import LazyModelDraft, ModelDraft
from edge_spec.drafts.ngram import NgramDraft

__all__ = [
    "NO_DRAFT",
    "CrossVocabDraft",
    "Draft",
    "DraftSource",
    "LazyModelDraft",
    "ModelDraft",
    "NgramDraft",
    "NoDraft",
]
