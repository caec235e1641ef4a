"""edge_spec: speculative decoding for edge and on-device hardware, on GGUF models via llama.cpp.

    from edge_spec import EdgeSpec
    with EdgeSpec("smollm2-135m-f16", "smollm2-135m-q4_0") as spec:
        result = spec.generate("The three laws of motion are", max_tokens=64)
        print(result.text, result.stats.acceptance_rate, result.stats.tokens_per_s)

The engine's names load lazily, so the pure modules (sampling, verify) import without llama.cpp.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

# llama.cpp's native libraries load before numpy's extension modules. On the CUDA build of the
# GPU check (H200, CUDA 13.0), loading any model crashed in libllama's std::regex when numpy
# had been imported first, and worked with llama.cpp imported first
# (bench/results/issue17-gpu-check-h200/run3). Where llama-cpp-python is not installed, the
# pure modules (sampling, verify) still import without it.
if importlib.util.find_spec("llama_cpp") is not None:
    from edge_spec.backend import runtime as _runtime  # noqa: F401

from edge_spec.errors import (
    ContextOverflowError,
    EdgeSpecError,
    InvalidRequestError,
    ModelFileError,
    VocabMismatchError,
)
from edge_spec.sampling import SamplingParams

__version__ = "0.1.0"

_LAZY = {
    "DRAFT_MODES": "api",
    "EdgeSpec": "api",
    "EngineConfig": "api",
    "GenerationConfig": "api",
    "GenerationResult": "api",
    "TextDelta": "api",
    "GenerationStats": "decode.stats",
}

__all__ = [
    "ContextOverflowError",
    "EdgeSpecError",
    "InvalidRequestError",
    "ModelFileError",
    "SamplingParams",
    "VocabMismatchError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'edge_spec' has no attribute {name!r}")
