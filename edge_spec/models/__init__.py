"""Models: the manifest and edge_spec's own cache (`prepare`, `resolve`), GGUF files checked in a
child process before a first load (isolation), placement of a pair in memory, derived layer
subsets, the draft heads' store, chat templates, and the models already in Ollama, LM Studio
and Hugging Face stores (stores: scanned, resolved by name), the draft chosen for a target from
them (draft_choice).

    from edge_spec.models import resolve
    path = resolve("smollm2-135m-f16")   # prepared on first use
    path = resolve("ollama:llama3.2:1b")  # a model Ollama already holds
"""

from __future__ import annotations

from edge_spec.files import cache_dir
from edge_spec.models.cache import pick_pair, prepare, resolve
from edge_spec.models.manifest import (
    ModelEntry,
    ModelPair,
    ModelStatus,
    choose_pair,
    default_pair,
    list_models,
    list_pairs,
    load_manifest,
    model_path,
    models_dir,
)

__all__ = [
    "ModelEntry",
    "ModelPair",
    "ModelStatus",
    "cache_dir",
    "choose_pair",
    "default_pair",
    "list_models",
    "list_pairs",
    "load_manifest",
    "model_path",
    "models_dir",
    "pick_pair",
    "prepare",
    "resolve",
]
