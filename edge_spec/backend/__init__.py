"""The only package that imports llama_cpp: llama.cpp's runtime (runtime.py), one model with
its context and batched decoding (model.py), llama-cpp-python's prompt lookup as a bench peer
(peer.py), and many-sequence generation recording hidden states, a draft head's training data
(features.py)."""

from __future__ import annotations

from edge_spec.backend.model import LlamaModel, ModelInfo, common_prefix, smoke_test
from edge_spec.backend.peer import PeerGeneration, PromptLookupPeer
from edge_spec.backend.runtime import (
    FTYPES,
    cuda_batch_invariant,
    default_threads,
    llama_build,
    llama_cpp_version,
    llama_library_paths,
    quantize,
    supports_gpu_offload,
)

__all__ = [
    "FTYPES",
    "LlamaModel",
    "ModelInfo",
    "PeerGeneration",
    "PromptLookupPeer",
    "common_prefix",
    "cuda_batch_invariant",
    "default_threads",
    "llama_build",
    "llama_cpp_version",
    "llama_library_paths",
    "quantize",
    "smoke_test",
    "supports_gpu_offload",
]
