"""scripts/gpu_check.py in its dry mode: the pack a borrowed GPU machine gets in two calls
(trimmed sources, the full-depth model in two parts, wheels) is built and each half fits beside
the tree, and both stages' steps (the model joined and checked, the self-draft derived, the
loads after other extension modules, the batch deviation, a real-model exactness test, the
profile, the bench) pass on this machine's own build, so that the check cannot rot between
loans."""

from __future__ import annotations

import importlib.util
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


def test_each_half_fits_a_call_and_holds_what_it_needs(packed: Path) -> None:
    record = json.loads((packed / "a" / "pack.json").read_text())
    assert json.loads((packed / "b" / "pack.json").read_text()) == record
    for half in ("a", "b"):
        size = sum(p.stat().st_size for p in (packed / half).rglob("*") if p.is_file())
        assert size + record["tree_bytes"] <= 64 * 2**20, half
    parts = [record["files"][f"{half}/target.gguf.gz.part{i}"] for i, half in enumerate("ab")]
    assert sum(parts) + record["tree_bytes"] > 64 * 2**20  # too big for one call, even gzipped
    assert record["model"]["size_bytes"] > 70 * 2**20  # all 30 blocks
    with tarfile.open(packed / "a" / "llama-cpp-python-src.tar.gz") as tar:
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
    # built as bootstrap.py builds for CUDA: the CPU kernels' patches and the batch-invariant one
    assert "ggml-cuda-batch-invariant.patch" in record["patches"]
    assert any(name.startswith("ggml-cpu-") for name in record["patches"])
    with tarfile.open(packed / "a" / "llama-cpp-python-src.tar.gz") as tar:
        mmvq = tar.extractfile(f"{top}/vendor/llama.cpp/ggml/src/ggml-cuda/mmvq.cu").read()
    assert b"mmvq_batch_invariant_chunk" in mmvq
    wheels = {w.split("-")[0] for w in record["files"] if w.startswith("b/wheels/")}
    assert wheels == {"b/wheels/gguf", "b/wheels/diskcache"}


def test_the_check_stage_refuses_without_the_build_stage(packed: Path, tmp_path: Path) -> None:
    """Call 2 on a machine that lost call 1's state says so in one line and writes a report."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "run", "--dry", "--stage", "check", "--dir", str(packed)]
    cmd += ["--state", str(tmp_path / "none"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0 and "run both calls again" in done.stderr
    assert json.loads((out / "gpu_check.json").read_text())["stage"] == "check"


def test_dry_run_passes_every_step_on_this_build(packed: Path, tmp_path: Path) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    base = [
        sys.executable,
        str(SCRIPT),
        "run",
        "--dry",
        "--dir",
        str(packed),
        "--state",
        str(state),
    ]
    for stage in ("build", "check"):  # two calls, as on the lent machine
        cmd = base + ["--stage", stage, "--out", str(out / stage)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads((out / "check" / "gpu_check.json").read_text())
    # no GPU device on a CPU build (llama.cpp's own llama_supports_gpu_offload() says yes: RPC)
    assert report["mode"] == "dry" and report["gpu_offload"] is False
    assert report["pack"]["model"]["sha256"]  # joined and checked
    assert report["std_exports"] and set(report["std_exports"].values()) <= {0, None}
    assert report["cuda_batch_invariant"] is None  # a CPU build: no CUDA library to ask
    loads = report["loads"]
    assert all(load["returncode"] == 0 and load["offloaded"] for load in loads.values()), loads
    # numpy, onnxruntime and a third C++ extension module (pybind11's) loaded before edge_spec
    assert {"numpy", "onnxruntime", "matplotlib.ft2font"} <= set(
        loads["extensions_then_edge_spec"]["first"]
    )
    deviation = report["deviation"]["offloaded"]  # edge_spec.device.numerics on a real model
    assert [b["n"] for b in deviation["batches"]] == [2, 3, 4, 5, 8, 12, 16]
    assert deviation["alone_repeatable"] is True  # one-token passes repeat bit for bit
    across = deviation["boundary"]  # a batch of 8 across the KV view's 256-cell step
    assert across["n"] == across["rows"] == 8
    measured = [*deviation["batches"], across]
    assert deviation["worst_gap_change"] == max(b["max_gap_change"] for b in measured)
    assert all(b["rows"] > 30 and 0 <= b["argmax_moved"] <= b["rows"] for b in deviation["batches"])
    tests = report["tests"]
    assert tests["returncode"] == 0 and tests["tests"] == 1 and tests["failures"] == 0
    curve = report["profile"]["cost_curve"]
    assert len(curve["verify_s"]) >= 8 and all(t > 0 for t in curve["verify_s"])
    mmq = report["profile_mmq"]["cost_curve"]  # the last step's own run (=2 means nothing here)
    assert len(mmq["verify_s"]) >= 8 and all(t > 0 for t in mmq["verify_s"])
    for device in ("gpu", "cpu"):  # on a CPU build both are this CPU
        assert {"target", "none", "auto"} <= set(report["bench"][device]["strategies"])
    # the CPU cores' own profile, which the CPU bench reused (here: the same key as above)
    assert report["profile_cpu"]["cost_curve"] == curve
    with tarfile.open(out / "check" / "files.tar.gz") as tar:
        names = set(tar.getnames())
    expected = {"files/profile.json", "files/profile-cpu.json", "files/tests.log"}
    assert expected | {"files/bench_gpu/results.json", "files/bench_cpu/results.json"} <= names


def test_exactness_reports_are_read_from_the_test_log_and_quotes_are_not() -> None:
    """The GPU run's exactness figures come from the tests' one-line reports in pytest's
    output; a failure's traceback that quotes a report line is not a second report."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    report = {"mode": "model", "prompts": 10, "diverged": 1, "drafted": 9, "accepted": 4}
    log = "\n".join(
        [
            ".",
            f"exactness report: {json.dumps(report)}",
            '>       print(f"\\nexactness report: {json.dumps(report)}")',
            "E   exactness report: {'mode': 'ngram'",
        ]
    )
    assert gpu_check.exactness_reports(log) == [report]
    assert "greedy model: 1 of 10 diverged, drafted 9, accepted 4" in gpu_check.summary(
        {"mode": "cuda", "gpu": "H200", "tests": {"exactness": [report]}}
    )
