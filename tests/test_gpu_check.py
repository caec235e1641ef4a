"""scripts/gpu_check.py in its dry mode: the pack a borrowed GPU machine gets (trimmed sources,
a small derived model, wheels) is built and fits its budget, and the run's steps (the small
draft derived, the loads, the real-model exactness tests on the small pair, the profile) pass on
this machine's own build, so that the check cannot rot between loans."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = [pytest.mark.models, pytest.mark.xdist_group("gpu_check")]
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    directory = tmp_path_factory.mktemp("gpucheck")
    subprocess.run([sys.executable, str(SCRIPT), "pack", "--dir", str(directory)], check=True)
    return directory


def test_the_pack_fits_and_holds_what_a_cuda_build_reads(packed: Path) -> None:
    record = json.loads((packed / "pack.json").read_text())
    assert record["total_bytes"] <= 32 * 2**20
    with tarfile.open(packed / "llama-cpp-python-src.tar.gz") as tar:
        names = tar.getnames()
    top = f"llama_cpp_python-{record['llama_cpp_python']}"
    must = [
        "pyproject.toml",
        "CMakeLists.txt",
        "llama_cpp/llama_cpp.py",
        "vendor/llama.cpp/CMakeLists.txt",
        "vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt",
        "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
        "vendor/llama.cpp/ggml/src/ggml-rpc/CMakeLists.txt",
        "vendor/llama.cpp/src/llama.cpp",
    ]
    assert all(f"{top}/{m}" in names for m in must)
    dropped = ("vendor/llama.cpp/models/", "vendor/llama.cpp/docs/", "ggml/src/ggml-vulkan/")
    assert not any(d in n for n in names for d in dropped)
    wheels = {w.split("-")[0] for w in record["files"] if w.startswith("wheels/")}
    assert wheels == {"wheels/gguf", "wheels/diskcache"}


def test_dry_run_passes_every_step_on_this_build(packed: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "run", "--dry", "--dir", str(packed), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    report = json.loads((out / "gpu_check.json").read_text())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert report["mode"] == "dry" and report["gpu_offload"] in (True, False)
    assert report["std_exports"] and set(report["std_exports"].values()) <= {0, None}
    assert all(load["returncode"] == 0 for load in report["loads"].values()), report["loads"]
    tests = report["tests"]
    assert tests["returncode"] == 0 and tests["tests"] >= 8 and tests["failures"] == 0
    assert {e["mode"] for e in tests["exactness"]} == {"model", "ngram", "ngram-tree"}
    curve = report["profile"]["cost_curve"]
    assert len(curve["verify_s"]) >= 8 and all(t > 0 for t in curve["verify_s"])
    assert (out / "profile.json").is_file()
