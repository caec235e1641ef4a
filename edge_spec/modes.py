"""The draft modes a request may ask for (light: the CLI's argument parsers import it)."""

from __future__ import annotations

from typing import Literal

DraftMode = Literal["auto", "model", "ngram", "none", "self", "head"]
# auto: per step the policy picks the learned draft (a head trained for the target if there is
# one, else the draft model), the n-gram lookup or none; model / ngram / head: that source or
# none; none: the target alone; self: the model draft is derived from the target
# (edge_spec.self_draft): EdgeSpec(target, "self") or draft_mode="self" at construction; head:
# the draft head `edge-spec head train` made for the target (edge_spec.drafts.head).
DRAFT_MODES: tuple[str, ...] = ("auto", "model", "ngram", "none", "self", "head")
SELF = "self"  # as a draft name: the self-draft, derived from the target
AUTO_DRAFT = "auto"  # as a draft name: the best local draft (edge_spec.models.stores)
HEAD = "head"
