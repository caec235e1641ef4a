"""The draft modes a request may ask for (light: the CLI's argument parsers import it)."""

from __future__ import annotations

from typing import Literal

DraftMode = Literal["auto", "model", "ngram", "none", "self"]
# auto: per step the policy picks the model draft, the n-gram lookup or none; model / ngram:
# that source or none; none: the target alone; self: the model draft is derived from the
# target (edge_spec.self_draft): EdgeSpec(target, "self") or draft_mode="self" at construction.
DRAFT_MODES: tuple[str, ...] = ("auto", "model", "ngram", "none", "self")
SELF = "self"  # as a draft name: the self-draft, derived from the target
