"""The public API: EdgeSpec (spec.py), put together in named steps (assembly.py), and its
configuration and result types (config.py).

    from edge_spec import EdgeSpec
    with EdgeSpec("smollm2-135m-f16", "smollm2-135m-q4_0") as spec:
        result = spec.generate("The three laws of motion are", max_tokens=64)
"""

from __future__ import annotations

from edge_spec.api.config import (
    EngineConfig,
    FinishReason,
    GenerationConfig,
    GenerationResult,
    TextDelta,
    TokenLogprob,
)
from edge_spec.api.spec import EdgeSpec
from edge_spec.modes import DRAFT_MODES

__all__ = [
    "DRAFT_MODES",
    "EdgeSpec",
    "EngineConfig",
    "FinishReason",
    "GenerationConfig",
    "GenerationResult",
    "TextDelta",
    "TokenLogprob",
]
