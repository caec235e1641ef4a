"""A GenerationResult made up for the server's shape tests (no model behind it): 3 prompt
tokens, 2 answer tokens, and the fields a test names."""

from __future__ import annotations

from typing import Any

from edge_spec.api import GenerationResult
from edge_spec.decode.stats import StatsCollector


def made_up_result(text: str, finish: str, **fields: Any) -> GenerationResult:
    stats = StatsCollector().result(n_prompt=3, n_generated=2, total_s=0.5)
    return GenerationResult(
        text=text,
        finish_reason=finish,  # type: ignore[arg-type]
        token_ids=(5, 6),
        prompt_token_ids=(1, 2, 3),
        target="t.gguf",
        draft="d.gguf",
        draft_mode="model",
        policy="fixed",
        k=3,
        stats=stats,
        **fields,
    )
