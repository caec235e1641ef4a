#!/usr/bin/env python3
"""A GPU check that fits a borrowed machine: CUDA build, exactness tests, full-offload profile.

A lent accelerator here comes with hard limits: minutes of device time, no network, and the
repository copy under 64 MiB. So the check is two steps.

`pack` (on a machine with the project set up) writes everything the run needs into one folder,
`.gpucheck/` by default (ignored by git; name it in the device tool's `carry`):
- the llama-cpp-python sdist of the pinned version, trimmed to what a CUDA build reads (the
  Python package, llama.cpp's library, ggml's CPU, CUDA and RPC backends, the common library and
  its vendored headers: no models, docs, tests, tools, examples or other backends);
- a small model derived for the purpose: the chat target's first blocks (a real vocabulary,
  tokenizer and chat template; garbage text, exact logits), re-quantized to Q4_0. It checks
  correctness and the t(n) curve, not quality; the draft is derived from it on the machine;
- the pure-Python wheels the machine's image lacks (gguf, diskcache).

`run` builds llama-cpp-python with CUDA from that source (CMake flags from bootstrap plus this
GPU's architecture; FlashAttention kernels only with --fa, since they double the build time),
then, on the small pair with every layer offloaded: the real-model exactness tests
(tests/test_engine_real.py: greedy speculative output against the target alone, same seed same
output, KV rollback, token trees) and `edge-spec profile --full` (the device's t(n) through the
GPU). It writes `gpu_check.json` (build time, GPU, offload, test counts, the profile's curve),
the profile and the logs into --out. `run --dry` skips the CUDA build and runs the rest on this
machine's own build (no offload): CI runs it, so the script cannot rot between loans.

    python3 scripts/gpu_check.py pack                      # here (about a minute)
    python3 scripts/gpu_check.py run --out "$OUT"           # there (about 8 minutes)
    python3 scripts/gpu_check.py pack && python3 scripts/gpu_check.py run --dry --out /tmp/g
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".gpucheck"
SOURCE_NAME = "llama-cpp-python-src.tar.gz"
MODEL_NAME = "tiny-target.gguf"
WHEELS = ("gguf", "diskcache")  # pure Python; numpy, jinja2, psutil, tqdm... are on the image
SOURCE_MODEL = "smollm2-135m-f16"  # ChatML template, 49k vocabulary, llama architecture
TARGET_LAYERS = (0, 1, 2, 3)
DRAFT_LAYERS = (0, 1)  # of the small target: shares its vocabulary, agrees often enough
BUDGET_BYTES = 32 * 2**20  # the pack's share of the 64 MiB that travels (the repo is ~18)
TESTS = "tests/test_engine_real.py"

# Inside vendor/llama.cpp: what a library build reads. Everything else (models 75 MB, docs
# 38 MB, tools, tests, examples, benches, conversion scripts) stays behind.
LLAMA_KEEP = (
    "CMakeLists.txt",
    "LICENSE",
    "cmake/",
    "common/",
    "ggml/",
    "include/",
    "licenses/",
    "src/",
    "vendor/",
)
LLAMA_DROP: tuple[str, ...] = ()  # vendor/CMakeLists.txt adds every vendored folder
GGML_BACKENDS_KEEP = ("ggml-cpu", "ggml-cuda", "ggml-rpc")
# The llama-cpp-python top level: its build files and the Python package.
TOP_KEEP = ("CMakeLists.txt", "pyproject.toml", "README.md", "LICENSE.md", "llama_cpp/")


def log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py imported (bootstrap's cmake_args and sdist)."""
    spec = importlib.util.spec_from_file_location(
        f"edge_spec_{name}", ROOT / "scripts" / f"{name}.py"
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import scripts/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keep_member(name: str, top: str) -> bool:
    """Whether a path of the sdist (under `top/`) goes into the trimmed source."""
    rel = name[len(top) + 1 :] if name.startswith(top + "/") else None
    if rel is None:
        return False
    if not rel.startswith("vendor/llama.cpp/"):
        return rel.startswith(TOP_KEEP) or rel in ("vendor", "vendor/llama.cpp")
    inner = rel[len("vendor/llama.cpp/") :]
    if not inner.startswith(LLAMA_KEEP) or inner.startswith(LLAMA_DROP):
        return False
    if inner.startswith("ggml/src/ggml-") and "/" in inner[len("ggml/src/") :]:
        return inner.split("/")[2] in GGML_BACKENDS_KEEP  # a backend's folder
    return True


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- pack: here -----------------------------------------------------------------------------


def pack(directory: Path) -> dict:
    bootstrap = load_script("bootstrap")
    version = bootstrap.LLAMA_CPP_VERSION
    py = bootstrap.venv_python()
    if not py.exists():
        raise SystemExit("no .venv: run python3 scripts/bootstrap.py first")
    directory.mkdir(parents=True, exist_ok=True)
    # llama.cpp as released: scripts/patches/ change only x86 CPU kernels, and this is a CUDA check.
    sdist = bootstrap.ensure_sdist(version, py)

    source = directory / SOURCE_NAME
    top = f"llama_cpp_python-{version}"
    log(f"trimming {sdist.name} -> {source}")
    n_files = 0
    with tarfile.open(sdist) as src, tarfile.open(source, "w:gz", compresslevel=6) as dst:
        for member in src:
            if not keep_member(member.name, top):
                continue
            data = src.extractfile(member) if member.isfile() else None
            dst.addfile(member, data)
            n_files += member.isfile()

    model = directory / MODEL_NAME
    code = (
        "import sys, tempfile; from pathlib import Path\n"
        "from edge_spec.models import resolve\n"
        "from edge_spec.models.layer_subset import write_layer_subset\n"
        "from edge_spec.backend.runtime import quantize\n"
        "layers = [int(x) for x in sys.argv[2].split(',')]\n"
        "with tempfile.TemporaryDirectory() as tmp:\n"
        "    full = Path(tmp) / 'subset.gguf'\n"
        "    write_layer_subset(resolve(sys.argv[1], progress=False), full, layers)\n"
        "    quantize(full, Path(sys.argv[3]), 'Q4_0', pure=True)\n"
    )
    layers = ",".join(map(str, TARGET_LAYERS))
    subprocess.run([str(py), "-c", code, SOURCE_MODEL, layers, str(model)], check=True, cwd=ROOT)

    wheels = directory / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    for name in WHEELS:
        version_code = f"import importlib.metadata as m; print(m.version({name!r}))"
        pinned = subprocess.run(
            [str(py), "-c", version_code], check=True, capture_output=True, text=True
        ).stdout.strip()
        cmd = [str(py), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        subprocess.run(cmd + ["-d", str(wheels), f"{name}=={pinned}"], check=True)

    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "pack.json")
    total = sum(p.stat().st_size for p in files)
    record = {
        "llama_cpp_python": version,
        "sdist": sdist.name,
        "source_files": n_files,
        "model": {
            "from": SOURCE_MODEL,
            "layers": list(TARGET_LAYERS),
            "ftype": "Q4_0 (pure)",
            "sha256": sha256(model),
        },
        "files": {str(p.relative_to(directory)): p.stat().st_size for p in files},
        "total_bytes": total,
    }
    (directory / "pack.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"{directory}: {total / 2**20:.1f} MiB in {len(files)} files")
    if total > BUDGET_BYTES:
        raise SystemExit(f"the pack is {total / 2**20:.1f} MiB, over its {BUDGET_BYTES >> 20} MiB")
    return record


# --- run: there ---------------------------------------------------------------------------


def gpu_name() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run(
        [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or None


def cuda_arch() -> str:
    """This GPU's compute capability as CMake wants it ("90"), else "native"."""
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if out and out[0].replace(".", "").isdigit():
            return out[0].replace(".", "")
    return "native"


def build(directory: Path, site: Path, work: Path, out: Path, fa: bool, extra: list[str]) -> dict:
    """llama-cpp-python with CUDA from the trimmed source, installed into `site`."""
    bootstrap = load_script("bootstrap")
    nvcc = bootstrap.find_nvcc()
    if nvcc is None:
        raise SystemExit("no nvcc: the GPU check needs CUDA's compiler (or use --dry)")
    with tarfile.open(directory / SOURCE_NAME) as tar:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(work, **kwargs)
    source = next(work.glob("llama_cpp_python-*"))
    args = [a for a in bootstrap.cmake_args() if a != "-DGGML_CUDA=on"]
    args += [
        "-DGGML_CUDA=on",
        f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch()}",
        f"-DGGML_CUDA_FA={'ON' if fa else 'OFF'}",
        "-DGGML_CUDA_NCCL=OFF",
        "-DLLAVA_BUILD=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        *extra,
    ]
    env = dict(
        os.environ,
        CMAKE_ARGS=" ".join(args),
        CUDACXX=nvcc,
        CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 4),
    )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "--no-cache-dir",
        "--target",
        str(site),
        str(source),
    ]
    log("$ CMAKE_ARGS='" + env["CMAKE_ARGS"] + "' " + " ".join(cmd))
    start = time.monotonic()
    with open(out / "build.log", "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    build_s = time.monotonic() - start
    if rc != 0:
        tail = (out / "build.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"the CUDA build failed (rc {rc}) after {build_s:.0f} s:\n{tail}")
    return {
        "cmake_args": args,
        "build_s": round(build_s, 1),
        "nvcc": nvcc,
        "exported_std_symbols": exported_std_symbols(site / "llama_cpp" / "lib"),
    }


def exported_std_symbols(lib_dir: Path) -> dict:
    """Per built library, how many C++ standard-library symbols it exports (`nm -D`): a library
    that exports its own copies can capture another's calls into them (the first CUDA run's
    crash was in libllama's std::regex with its frame inside libggml-cuda)."""
    nm = shutil.which("nm")
    counts: dict = {}
    for lib in sorted(lib_dir.glob("lib*.so*")) if nm else []:
        out = subprocess.run(
            [nm, "-D", "--defined-only", "-C", str(lib)], capture_output=True, text=True
        ).stdout
        counts[lib.name] = sum(" std::" in line for line in out.splitlines())
    return counts


def install_wheels(directory: Path, site: Path) -> None:
    wheels = sorted((directory / "wheels").glob("*.whl"))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
    ]
    subprocess.run(cmd + [str(w) for w in wheels], check=True)


def child(
    env: dict, out: Path, name: str, cmd: list[str], timeout_s: float
) -> tuple[int, str, str]:
    """Runs one step with its output in out/<name>.log; (returncode, stdout, all output)."""
    log(f"{name}: " + " ".join(cmd))
    try:
        done = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
        )
        rc, stdout, text = done.returncode, done.stdout, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        rc, text = 124, f"{stdout}\ntimed out after {timeout_s} s"
    (out / f"{name}.log").write_text(text)
    return rc, stdout, text


def run(
    directory: Path,
    out: Path,
    dry: bool,
    fa: bool = False,
    tests_timeout_s: float = 300,
    cmake_extra: tuple[str, ...] = (),
    budget_s: float | None = None,
    gdb: bool = False,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s if budget_s else None

    def left(cap_s: float) -> float:
        """A step's timeout: its cap, or what the whole run has left if that is less."""
        if deadline is None:
            return cap_s
        return max(10.0, min(cap_s, deadline - time.monotonic() - 5))

    if not (directory / SOURCE_NAME).is_file() or not (directory / MODEL_NAME).is_file():
        raise SystemExit(f"{directory} holds no pack: run `python3 scripts/gpu_check.py pack`")
    work = Path(tempfile.mkdtemp(prefix="edge_spec_gpu_"))
    site = work / "site"
    report: dict = {
        "mode": "dry" if dry else "cuda",
        "host": platform.node(),
        "python": platform.python_version(),
        "gpu": gpu_name(),
        "pack": json.loads((directory / "pack.json").read_text()),
    }
    env = dict(os.environ, PYTHONUNBUFFERED="1", EDGE_SPEC_CACHE=str(work / "cache"))
    python = sys.executable
    if dry:
        python = str(load_script("bootstrap").venv_python())
        env["PYTHONPATH"] = str(ROOT)
    else:
        report["build"] = build(directory, site, work, out, fa, list(cmake_extra))
        save(report, out)
        install_wheels(directory, site)
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])

    target = directory / MODEL_NAME
    draft = work / "tiny-draft.gguf"
    derive = (
        "import sys, json, llama_cpp; from pathlib import Path\n"
        "from edge_spec.models.layer_subset import write_layer_subset\n"
        "write_layer_subset(Path(sys.argv[1]), Path(sys.argv[2]), "
        "[int(x) for x in sys.argv[3].split(',')])\n"
        "from edge_spec.backend.runtime import exported_std_symbols, llama_library_paths\n"
        "print(json.dumps({'gpu_offload': bool(llama_cpp.llama_supports_gpu_offload()),\n"
        "  'system_info': llama_cpp.llama_print_system_info().decode(),\n"
        "  'std_exports': {p.name: exported_std_symbols(p) for p in llama_library_paths()\n"
        "                  if not p.is_symlink()}}))\n"
    )
    rc, stdout, text = child(
        env,
        out,
        "derive",
        [python, "-c", derive, str(target), str(draft), ",".join(map(str, DRAFT_LAYERS))],
        300,
    )
    if rc != 0:
        raise SystemExit(f"deriving the draft failed:\n{text[-2000:]}")
    report.update(json.loads(stdout.strip().splitlines()[-1]))
    save(report, out)
    if not dry and not report["gpu_offload"]:
        raise SystemExit("the CUDA build cannot offload: " + report["system_info"])

    report["loads"] = probe_loads(env, out, python, target, gdb)
    save(report, out)

    # How much the logits depend on the batch shape, offloaded and on this build's CPU backend:
    # the floor under greedy exactness that the tests below assume.
    report["batch_invariance"] = {}
    for name, layers in (("offloaded", -1), ("cpu", 0)):
        numerics = out / f"batch_invariance_{name}.json"
        cmd = [python, str(ROOT / "scripts" / "check_batch_invariance.py"), "-m", str(target)]
        cmd += ["--gpu-layers", str(layers), "--out", str(numerics)]
        rc, _, text = child(env, out, f"batch_invariance_{name}", cmd, left(90))
        report["batch_invariance"][name] = (
            json.loads(numerics.read_text()) if rc == 0 else {"returncode": rc, "tail": text[-500:]}
        )
    save(report, out)

    profile_cmd = [
        python,
        "-c",
        "import sys; from edge_spec.cli import main; sys.exit(main())",
        "profile",
        "-m",
        str(target),
        "-md",
        str(draft),
        "--quick" if dry else "--full",
        "--refresh",
        "--json",
    ]
    rc, stdout, text = child(env, out, "profile", profile_cmd, left(150))
    if rc == 0:
        measured = json.loads(stdout)
        shutil.copy(measured["path"], out / "profile.json")
        report["profile"] = {
            "returncode": 0,
            "cost_curve": measured["cost_curve"],
            "host": measured["profile"].get("host"),
        }
    else:
        report["profile"] = {"returncode": rc, "error": text[-2000:]}

    save(report, out)

    test_env = dict(env, EDGE_SPEC_TEST_TARGET=str(target), EDGE_SPEC_TEST_DRAFT=str(draft))
    junit = out / "tests.xml"
    rc, stdout, text = child(
        test_env,
        out,
        "tests",
        [
            python,
            "-c",
            # llama.cpp's libraries before numpy, as edge_spec's own import does: the test
            # module imports numpy first (see LOADS below)
            "import sys, llama_cpp, pytest; sys.exit(pytest.main(sys.argv[1:]))",
            "-q",
            "-p",
            "no:cacheprovider",
            "-s",
            f"--junitxml={junit}",
            TESTS,
        ],
        left(tests_timeout_s),
    )
    report["tests"] = {"returncode": rc, **junit_counts(junit)}
    report["tests"]["exactness"] = exactness_reports(text)
    save(report, out)
    ok = report["tests"]["returncode"] == 0 and report["profile"]["returncode"] == 0
    print(summary(report))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


# One model load and a short decode, several ways: where the tests crash, which way does not.
LOADS = {
    # edge_spec's import loads llama.cpp's libraries before numpy (edge_spec/__init__.py): the
    # first CUDA runs here (H200, CUDA 13.0) crashed in the vocabulary's std::regex inside
    # libllama, with the crashing frame in libggml-cuda, whenever numpy was loaded first, while
    # llama-cpp-python's own Llama() (which loads the libraries first) loaded and generated.
    "edge_spec_all_layers": (
        "from edge_spec.backend import LlamaModel; m = LlamaModel(sys.argv[1], n_ctx=256); "
        "print(m.decode([1, 2, 3], [2]).shape)"
    ),
    # The order a user's script may have: numpy first, then edge_spec.
    "numpy_then_edge_spec": (
        "import numpy; from edge_spec.backend import LlamaModel; "
        "m = LlamaModel(sys.argv[1], n_ctx=256); print(m.decode([1, 2, 3], [2]).shape)"
    ),
    "llama_cpp_python_all_layers": (
        "import llama_cpp; m = llama_cpp.Llama(sys.argv[1], n_gpu_layers=-1, n_ctx=256, "
        "verbose=False); print(m.create_completion('Hello', max_tokens=4)['choices'][0]['text'])"
    ),
}


def probe_loads(env: dict, out: Path, python: str, target: Path, gdb: bool) -> dict:
    """Each way of loading in its own process; with gdb, the first that crashes is rerun under
    cuda-gdb (where the machine has it) for a native backtrace in out/<way>.gdb.log."""
    results = {}
    for name, code in LOADS.items():
        cmd = [python, "-X", "faulthandler", "-c", "import sys; " + code, str(target)]
        rc, _, text = child(env, out, f"load_{name}", cmd, 120)
        results[name] = {"returncode": rc, "tail": text.strip().splitlines()[-3:]}
    crashed = [n for n, r in results.items() if r["returncode"] < 0]
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if crashed and gdb and debugger:
        code = "import sys; " + LOADS[crashed[0]]
        cmd = [
            debugger,
            "-batch",
            "-ex",
            "run",
            "-ex",
            "bt 40",
            "--args",
            python,
            "-c",
            code,
            str(target),
        ]
        child(env, out, f"load_{crashed[0]}.gdb", cmd, 90)
    return results


def exactness_reports(text: str) -> list[dict]:
    """The tests' one-line JSON reports; a line that only quotes one (a failure's log) is not."""
    reports = []
    for line in text.splitlines():
        if "exactness report: " in line:
            try:
                reports.append(json.loads(line.split("exactness report: ", 1)[1]))
            except json.JSONDecodeError:
                continue
    return reports


def save(report: dict, out: Path) -> None:
    """The report so far: a step cut off by the machine's time limit leaves the earlier ones."""
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")


def junit_counts(path: Path) -> dict:
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return {}
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    counts = {k: int(suite.get(k, 0)) for k in keys}
    counts["time_s"] = float(suite.get("time", 0))
    return counts


def summary(report: dict) -> str:
    tests = report["tests"]
    lines = [
        f"mode {report['mode']}; GPU {report['gpu'] or 'none'}; offload {report['gpu_offload']}",
        f"build {report.get('build', {}).get('build_s', '-')} s",
        f"C++ standard-library symbols exported: {report.get('std_exports')}",
        f"tests: {tests.get('tests')} run, {tests.get('failures')} failed, "
        f"{tests.get('errors')} errors, {tests.get('skipped')} skipped (rc {tests['returncode']})",
    ]
    for item in tests.get("exactness", []):
        lines.append(
            f"  greedy {item['mode']}: {item['diverged']} of {item['prompts']} diverged, "
            f"drafted {item['drafted']}, accepted {item['accepted']}"
        )
    curve = report["profile"].get("cost_curve")
    if curve:
        lines.append("profile: " + json.dumps(curve))
    else:
        lines.append("profile failed: " + report["profile"].get("error", "")[-300:])
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="trimmed sources, the small model, wheels (here)")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    r = sub.add_parser("run", help="build with CUDA, test, profile (on the GPU machine)")
    r.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    r.add_argument("--dry", action="store_true", help="no CUDA build: this machine's own build")
    r.add_argument("--fa", action="store_true", help="also build FlashAttention kernels")
    r.add_argument("--tests-timeout", type=float, default=300, help="seconds (default 300)")
    r.add_argument("--cmake-arg", action="append", default=[], help="one more CMake flag")
    r.add_argument(
        "--budget", type=float, help="seconds for the whole run: later steps get what is left"
    )
    r.add_argument("--gdb", action="store_true", help="rerun the first crashing load under gdb")
    opts = ap.parse_args()
    if opts.command == "pack":
        pack(opts.dir)
        return
    sys.exit(
        run(
            opts.dir,
            opts.out,
            opts.dry,
            opts.fa,
            opts.tests_timeout,
            tuple(opts.cmake_arg),
            opts.budget,
            opts.gdb,
        )
    )


if __name__ == "__main__":
    main()
