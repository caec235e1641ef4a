"""Shared fixtures: the real registry models (prepared on first use) and prompt sets."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# edge_spec loads llama.cpp's native libraries before numpy (see edge_spec/__init__.py); the test
# modules import numpy first, so conftest, which pytest imports before them, imports edge_spec.
import edge_spec  # noqa: F401, E402

# Under pytest-xdist (scripts/test.sh runs two workers on this 2-core machine) each llama.cpp
# context uses one thread, so two workers never oversubscribe the cores; llama.cpp's results do
# not depend on the thread count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("EDGE_SPEC_THREADS", "1")

# A draft head this machine trained (edge-spec head train) would change what auto drafts with:
# the tests see only the heads they train themselves.
os.environ["EDGE_SPEC_HEADS"] = tempfile.mkdtemp(prefix="edge_spec_heads_")
# What the cost policy learned in this machine's earlier runs would change what the tests'
# engines draft first: each test process starts from the priors (edge_spec.device.learned).
os.environ["EDGE_SPEC_LEARNED_DIR"] = tempfile.mkdtemp(prefix="edge_spec_learned_")

# Chat-style and completion-style prompts; several reuse their input so n-gram drafts get used.
PROMPTS = [
    "The three primary colors are",
    "Once upon a time, in a small village by the sea,",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Q: What is the capital of France?\nA:",
    "List the days of the week: Monday, Tuesday,",
    "Copy this sentence exactly: The quick brown fox jumps over the lazy dog. "
    "Copy: The quick brown fox",
    "Photosynthesis is the process by which plants",
    "import numpy as np\n\ndef normalize(x):\n    return (x - x.mean()) / x.std()\n\n"
    "def standardize(x):\n    return",
    "The recipe: 1. Boil water. 2. Add pasta. 3. Stir. Repeat the recipe: 1. Boil water.",
    "Water boils at 100 degrees Celsius. At what temperature does water boil? Water boils at",
]


def _model(name: str) -> Path:
    from edge_spec.models.cache import resolve

    return resolve(name, progress=False)


def _pair() -> tuple[str, str]:
    """The manifest's default pair, the pair named by EDGE_SPEC_TEST_PAIR, or the two files
    EDGE_SPEC_TEST_TARGET and EDGE_SPEC_TEST_DRAFT (scripts/gpu_check.py's small models)."""
    from edge_spec.models.manifest import default_pair, list_pairs

    files = os.environ.get("EDGE_SPEC_TEST_TARGET"), os.environ.get("EDGE_SPEC_TEST_DRAFT")
    if all(files):
        return files[0], files[1]
    name = os.environ.get("EDGE_SPEC_TEST_PAIR")
    if not name:
        return default_pair()
    pair = list_pairs()[name]
    return pair.target, pair.draft


@pytest.fixture(scope="session")
def target_path() -> Path:
    return _model(_pair()[0])


@pytest.fixture(scope="session")
def draft_path() -> Path:
    return _model(_pair()[1])


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """A Gemma-3 model: a vocabulary unlike SmolLM2's, and no chat template."""
    return _model("gemma3-270m-q4_k_m")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """A SmolLM2 model: ChatML chat template, a vocabulary unlike Gemma's."""
    return _model("smollm2-135m-f16")


@pytest.fixture(scope="session")
def spec(target_path: Path, draft_path: Path) -> Iterator[object]:
    from edge_spec import EdgeSpec, EngineConfig

    with EdgeSpec(target_path, draft_path, config=EngineConfig(n_ctx=1024)) as engine:
        yield engine


def link_or_copy(src: Path, dst: Path) -> None:
    """src's bytes at dst, as a store or a cache keeps them: a hard link where the filesystem
    allows (safe: edge_spec replaces files by rename and never writes into them), else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
