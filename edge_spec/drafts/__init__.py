"""Draft sources: a GGUF model, prompt-lookup n-grams, or none."""

from .base import NO_DRAFT, Draft, DraftSource, NoDraft
from .model import ModelDraft
from .ngram import NgramDraft

__all__ = ["NO_DRAFT", "Draft", "DraftSource", "ModelDraft", "NgramDraft", "NoDraft"]
