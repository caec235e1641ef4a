#!/usr/bin/env python3
"""The GPU check for a borrowed machine: a CUDA build, a full-depth real model offloaded,
exactness against the target alone, the device's t(n) and the quick bench, in two device calls.

A lent accelerator here comes with hard limits: minutes of device time, no network, at most 64
MiB of repository copy per call (the tracked tree included), and 8 files back. The real model
(SmolLM2-135M-Instruct, all 30 blocks, pure Q4_0: 74 MiB, 68 MiB gzipped, the smallest
llama.cpp makes of it, since its 576-wide rows allow only 32-value blocks) does not fit one
call, so the check comes in two halves that meet on the warm machine:

`pack` (here, with the project set up) writes `.gpucheck/a/` and `.gpucheck/b/`, each small
enough to travel beside the tree:
- a/: the llama-cpp-python sdist of the pinned version trimmed to what a CUDA build reads, with
  bootstrap.py's patches for a CUDA build applied, and the gzipped model's first bytes;
- b/: the rest of it, the pure-Python wheels the machine's image lacks (gguf,
  diskcache), and the draft head trained for this exact model where this machine has one and
  the call has room (`edge-spec head train -m <the packed model>`: a 15 MiB graph; the head
  strategy is skipped without it).

`run --stage build` (call 1, carry `.gpucheck/a`) builds llama-cpp-python with CUDA for this
GPU's architecture into `.gpucheck-state/` (ignored by git, so it stays on the warm machine for
call 2) and moves the model's first part there. `run --stage check` (call 2, carry
`.gpucheck/b`, issued as soon as call 1 returns: the machine goes back after 30 s idle) joins the
model, checks its sha256, and runs, each step inside what `--budget` leaves:
1. the self-draft (the target without blocks 4-7, as `edge_spec.device.self_draft` chose for
   this model here), whether the build offloads, and the C++ standard-library symbols each
   library exports;
2. loads in fresh processes: edge_spec alone; numpy first; numpy, onnxruntime and other C++
   extension modules (matplotlib's ft2font, pyarrow, torch with its own CUDA runtime) first;
   llama-cpp-python's own; each must decode with every layer offloaded;
3. the batch deviation per batch size (`edge-spec profile --deviation`): offloaded as edge_spec
   runs it (GGML_CUDA_BATCH_INVARIANT=1, scripts/patches/cuda/), offloaded as llama.cpp ships
   (=0), with =2 (quantized weights through mul_mat_q at one tile width, every batch size),
   invariant with op fusion off (a diagnosis), and on the same build's CPU backend;
4. the real-model exactness tests (tests/test_engine_real.py) on the target and its self-draft;
5. `edge-spec profile --full` with the self-draft: the GPU's t(n), bundled as a device profile;
   and the target's t(n) with GGML_CUDA_BATCH_INVARIANT=0, what the invariance costs;
6. the quick bench, side by side in one run: the target alone (twice: the noise floor), the
   default mode, n-gram, the self-draft at fixed k and under the cost policy, the head; on the
   GPU, then again on the machine's CPU cores with the GPU hidden (a second device class),
   after their own t(n) (`profile --quick`, kept as profile-cpu.json);
7. where time is left, the target's t(n) with GGML_CUDA_BATCH_INVARIANT=2 (`--quick`).
It writes `gpu_check.json` (the report so far, after every step) and `files.tar.gz` (every log,
the profile, the bench results) into --out, so a call cut short still returns what it did.

    python3 scripts/gpu_check.py pack                                  # here (about a minute)
    python3 scripts/gpu_check.py pack --train-head 25                  # with the draft head
    python3 scripts/gpu_check.py run --stage build --out "$OUT"        # call 1 (about 4 min)
    python3 scripts/gpu_check.py run --stage check --out "$OUT" --budget 360  # call 2
    python3 scripts/gpu_check.py run --dry --out /tmp/g                # both, on this CPU build

`run --dry` skips the CUDA build, runs both stages on this machine's own build with short
settings, and is what CI runs, so the script cannot rot between loans.
"""

from __future__ import annotations

import argparse
import gzip
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
STATE_DIR = ROOT / ".gpucheck-state"  # call 1's build and model part, kept for call 2 (--state)
SOURCE_NAME = "llama-cpp-python-src.tar.gz"
MODEL_NAME = "target.gguf"
PARTS = ("a", "b")
WHEELS = ("gguf", "diskcache")  # pure Python; numpy, jinja2, psutil, onnxruntime... are there
SOURCE_MODEL = "smollm2-135m-f16"  # SmolLM2-135M-Instruct: ChatML template, 49k vocabulary
MODEL_FTYPE = "Q4_0"  # pure: the token embedding (tied output) too
TRAVEL_BYTES = 64 * 2**20  # what one device call carries, the tree included
MARGIN_BYTES = 3 * 2**19  # files the tree may gain between the pack and the call
TESTS = "tests/test_engine_real.py"
# The self-draft: the target without blocks 4-7, the subset `edge_spec.device.self_draft` chose
# for SmolLM2-135M's F16 on the 2-core CPU here (top-1 agreement 0.76, the best of 7 subsets).
# Searching again on the lent machine would cost minutes of its time; the draft's cost there is
# measured (profile, bench).
SELF_DRAFT_LAYERS = (0, 1, 2, 3, *range(8, 30))
# Extension modules a user's app may have loaded before edge_spec, where the machine has them:
# matplotlib's FreeType wrapper is a C++ (pybind11) one every edge_spec install has (bench plots).
FIRST_IMPORTS = ("numpy", "onnxruntime", "matplotlib.ft2font", "pyarrow", "torch")

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
    if not inner.startswith(LLAMA_KEEP):
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


def tree_bytes() -> int:
    """What travels besides the carried folders: tracked files and untracked ones git does
    not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    paths = {p for p in listed.decode().split("\0") if p}
    return sum((ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file())


def extract(archive: Path, destination: Path) -> None:
    """Unpack a tar archive, with the data filter where this Python has it."""
    with tarfile.open(archive) as tar:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(destination, **kwargs)


def folder_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# --- pack: here -----------------------------------------------------------------------------


def find_head(py: Path, model: Path) -> str:
    """The draft head trained on this machine for this exact file ("" where there is none)."""
    code = "import sys; from pathlib import Path; from edge_spec.models.heads import find_head\n"
    code += "print(find_head(Path(sys.argv[1])) or '')"
    found = subprocess.run([str(py), "-c", code, str(model)], check=True, capture_output=True)
    return found.stdout.decode().strip()


def pack(directory: Path, train_head_minutes: float = 0.0) -> dict:
    bootstrap = load_script("bootstrap")
    version = bootstrap.LLAMA_CPP_VERSION
    py = bootstrap.venv_python()
    if not py.exists():
        raise SystemExit("no .venv: run python3 scripts/bootstrap.py first")
    shutil.rmtree(directory, ignore_errors=True)
    part_dirs = {name: directory / name for name in PARTS}
    for d in part_dirs.values():
        d.mkdir(parents=True)
    # llama.cpp with every patch a CUDA build of bootstrap.py gets (the CPU kernels' and
    # scripts/patches/cuda/: GGML_CUDA_BATCH_INVARIANT), applied here, where `patch` is known.
    sdist = bootstrap.ensure_sdist(version, py)
    patched = [p.name for p in bootstrap.patches(True, cuda=True)]
    source = part_dirs["a"] / SOURCE_NAME
    top = f"llama_cpp_python-{version}"
    log(f"trimming {sdist.name} with {len(patched)} patches -> {source}")
    n_files = 0
    with tempfile.TemporaryDirectory() as tmp:
        bootstrap.patched_source(sdist, Path(tmp), True, cuda=True)
        with tarfile.open(sdist) as src, tarfile.open(source, "w:gz", compresslevel=6) as dst:
            for member in src:
                if not keep_member(member.name, top):
                    continue
                if not member.isfile():
                    dst.addfile(member)
                    continue
                with open(Path(tmp) / member.name, "rb") as f:
                    member.size = os.fstat(f.fileno()).st_size  # a patched file's own
                    dst.addfile(member, f)
                n_files += 1

    wheels = part_dirs["b"] / "wheels"
    for name in WHEELS:
        version_code = f"import importlib.metadata as m; print(m.version({name!r}))"
        pinned = subprocess.run(
            [str(py), "-c", version_code], check=True, capture_output=True, text=True
        ).stdout.strip()
        cmd = [str(py), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        subprocess.run(cmd + ["-d", str(wheels), f"{name}=={pinned}"], check=True)

    tree = tree_bytes()
    room = TRAVEL_BYTES - MARGIN_BYTES - tree - 4096  # each half's, pack.json aside
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / MODEL_NAME
        code = (
            "import sys; from pathlib import Path\n"
            "from edge_spec.models import resolve\n"
            "from edge_spec.backend.runtime import quantize\n"
            "quantize(resolve(sys.argv[1], progress=False), Path(sys.argv[2]), sys.argv[3], "
            "pure=True)\n"
        )
        quantize = [str(py), "-c", code, SOURCE_MODEL, str(model), MODEL_FTYPE]
        subprocess.run(quantize, check=True, cwd=ROOT, capture_output=True)
        head = find_head(py, model)
        if not head and train_head_minutes > 0:
            # The head for this exact file (kept in the model cache under its sha256), so that
            # the check benches it; a rerun resumes.
            log(f"training a draft head for the packed model ({train_head_minutes:g} min)")
            cli_cmd = [str(py), "-m", "edge_spec.cli", "head", "train", "-m", str(model)]
            subprocess.run([*cli_cmd, "--minutes", str(train_head_minutes)], check=True, cwd=ROOT)
            head = find_head(py, model)
        digest, size = sha256(model), model.stat().st_size
        packed = Path(tmp) / f"{MODEL_NAME}.gz"  # Q4_0 blocks still shrink by ~8 %
        with open(model, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        first = room - folder_bytes(part_dirs["a"])
        rest = packed.stat().st_size - first
        if first <= 0 or rest > room - folder_bytes(part_dirs["b"]):
            raise SystemExit(
                f"the model ({packed.stat().st_size / 2**20:.1f} MiB compressed) does not fit "
                f"two calls beside a tree of {tree / 2**20:.1f} MiB"
            )
        with open(packed, "rb") as f:
            (part_dirs["a"] / f"{MODEL_NAME}.gz.part0").write_bytes(f.read(first))
            (part_dirs["b"] / f"{MODEL_NAME}.gz.part1").write_bytes(f.read())
        if head:  # the head trained for this exact file, where the second call has room
            archive = part_dirs["b"] / "head.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:  # the graph and its description
                for name in ("head.onnx", "head.json"):
                    tar.add(Path(head) / name, arcname=f"head/{name}")
            if folder_bytes(part_dirs["b"]) > room:
                archive.unlink()
                log(f"no room for the draft head ({head}): the check skips the head strategy")
                head = ""
        else:
            log(
                "no draft head trained for this model here (`pack --train-head MINUTES` trains "
                "one, keyed by the packed model's sha256): the check skips the head strategy"
            )

    record = {
        "llama_cpp_python": version,
        "sdist": sdist.name,
        "patches": patched,
        "source_files": n_files,
        "model": {
            "name": MODEL_NAME,
            "from": SOURCE_MODEL,
            "ftype": f"{MODEL_FTYPE} (pure)",
            "size_bytes": size,
            "sha256": digest,
            "parts": "gzip, split in two",
        },
        "head": bool(head),
        "tree_bytes": tree,
        "files": {
            str(p.relative_to(directory)): p.stat().st_size
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        },
    }
    for d in part_dirs.values():
        (d / "pack.json").write_text(json.dumps(record, indent=2) + "\n")
        half = folder_bytes(d)
        log(f"{d}: {half / 2**20:.1f} MiB (with the tree {(half + tree) / 2**20:.1f} MiB)")
    return record


# --- run: there -----------------------------------------------------------------------------


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


class Report:
    """The run's report and files: `gpu_check.json` and `files.tar.gz` in `out`, rewritten after
    every step so that a run cut off by the machine's time limit returns the steps before."""

    def __init__(self, out: Path, logs: Path, data: dict) -> None:
        self.out, self.logs, self.data = out, logs, data
        out.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.logs / "gpu_check.json").write_text(json.dumps(self.data, indent=2) + "\n")
        tmp = self.out / "files.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.logs, arcname="files")
        tmp.replace(self.out / "files.tar.gz")


class Clock:
    """Each step's timeout: its cap, or what the run's --budget has left if that is less."""

    def __init__(self, budget_s: float | None) -> None:
        self.deadline = time.monotonic() + budget_s if budget_s else None

    def left(self, cap_s: float) -> float:
        if self.deadline is None:
            return cap_s
        return max(5.0, min(cap_s, self.deadline - time.monotonic() - 5))

    def out_of_time(self, need_s: float = 20) -> bool:
        return self.deadline is not None and self.deadline - time.monotonic() < need_s


def child(
    env: dict, logs: Path, name: str, cmd: list[str], timeout_s: float
) -> tuple[int, str, str]:
    """Runs one step with its output in logs/<name>.log; (returncode, stdout, all output)."""
    log(f"{name} ({timeout_s:.0f} s at most): " + " ".join(cmd)[:300])
    start = time.monotonic()
    try:
        done = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
        )
        rc, stdout, text = done.returncode, done.stdout, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        rc, text = 124, f"{stdout}\n{stderr}\ntimed out after {timeout_s:.0f} s"
    (logs / f"{name}.log").write_text(text + f"\n[{time.monotonic() - start:.1f} s, rc {rc}]\n")
    return rc, stdout, text


def stage_build(
    part: Path, state: Path, report: Report, dry: bool, fa: bool, extra: list[str]
) -> None:
    """Call 1: the model's first part into the state folder; the CUDA build there too."""
    if not (part / SOURCE_NAME).is_file():
        raise SystemExit(f"{part} holds no pack's first half: run `gpu_check.py pack` here")
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    shutil.copy(part / f"{MODEL_NAME}.gz.part0", state / f"{MODEL_NAME}.gz.part0")
    shutil.copy(part / "pack.json", state / "pack.json")
    if dry:
        report.data["build"] = {"dry": True}
    else:
        report.data["build"] = build(part, state / "site", report.logs, fa, extra)
    (state / "build.json").write_text(json.dumps(report.data["build"], indent=2) + "\n")
    report.save()


def build(part: Path, site: Path, logs: Path, fa: bool, extra: list[str]) -> dict:
    """llama-cpp-python with CUDA from the trimmed source, installed into `site`."""
    bootstrap = load_script("bootstrap")
    nvcc = bootstrap.find_nvcc()
    if nvcc is None:
        raise SystemExit("no nvcc: the GPU check needs CUDA's compiler (or use --dry)")
    work = Path(tempfile.mkdtemp(prefix="edge_spec_gpu_build_"))
    extract(part / SOURCE_NAME, work)
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
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps"]
    cmd += ["--no-index", "--no-cache-dir", "--target", str(site), str(source)]
    log("$ CMAKE_ARGS='" + env["CMAKE_ARGS"] + "' " + " ".join(cmd))
    start = time.monotonic()
    with open(logs / "build.log", "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    build_s = time.monotonic() - start
    shutil.rmtree(work, ignore_errors=True)
    if rc != 0:
        tail = (logs / "build.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"the CUDA build failed (rc {rc}) after {build_s:.0f} s:\n{tail}")
    return {"cmake_args": args, "build_s": round(build_s, 1), "nvcc": nvcc}


def install_wheels(part: Path, site: Path) -> None:
    wheels = sorted((part / "wheels").glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site)]
    subprocess.run(cmd + [str(w) for w in wheels], check=True)


def join_model(part: Path, state: Path, dst: Path) -> dict:
    """The model from call 1's part (in the state folder) and this call's, decompressed; its
    sha256 checked against the pack's record."""
    record = json.loads((part / "pack.json").read_text())
    first = state / f"{MODEL_NAME}.gz.part0"
    if not first.is_file():
        raise SystemExit(
            f"{first} is missing: call 1 (`run --stage build`) did not run on this machine "
            "(was it given back between the calls?); run both calls again"
        )
    packed = dst.with_name(dst.name + ".gz")
    with open(packed, "wb") as out:
        for piece in (first, part / f"{MODEL_NAME}.gz.part1"):
            with open(piece, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    with gzip.open(packed, "rb") as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    packed.unlink()
    if sha256(dst) != record["model"]["sha256"]:
        raise SystemExit("the joined model's sha256 differs from the pack's: pack both again")
    return record


# One load and a short decode in a fresh process, several ways; each reports how many layers
# llama.cpp put on the GPU (its load log) and which modules were loaded before.
PROBE = """
import importlib, json, logging, sys
first = [name for name in sys.argv[2].split(",") if name]
loaded = []
for name in first:
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    loaded.append(name)
    if name == "torch" and module.cuda.is_available():
        module.zeros(1).cuda()  # torch's own CUDA runtime and context, up first
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
if sys.argv[3] == "edge_spec":
    logger = logging.getLogger("edge_spec.llama_cpp")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Keep())
    from edge_spec.backend import LlamaModel
    with LlamaModel(sys.argv[1], n_ctx=256) as model:
        shape = list(model.decode(model.tokenize("Hello, world"), [0, 1]).shape)
        text = model.tokenize("Hello")
else:
    import llama_cpp
    model = llama_cpp.Llama(sys.argv[1], n_gpu_layers=-1, n_ctx=256, verbose=True)
    text = model.create_completion("Hello", max_tokens=4)["choices"][0]["text"]
    shape = None
offloaded = [line for line in lines if "offloaded" in line and "layers to GPU" in line]
print(json.dumps({"first": loaded, "decode_shape": shape, "offloaded": offloaded}))
"""
LOADS = {  # name: (modules imported first, loader)
    "edge_spec_alone": ((), "edge_spec"),
    "numpy_then_edge_spec": (("numpy",), "edge_spec"),
    "extensions_then_edge_spec": (FIRST_IMPORTS, "edge_spec"),
    "llama_cpp_python_alone": ((), "llama_cpp"),
}


def probe_loads(env: dict, logs: Path, python: str, target: Path, clock: Clock) -> dict:
    results = {}
    for name, (first, loader) in LOADS.items():
        cmd = [python, "-X", "faulthandler", "-c", PROBE, str(target), ",".join(first), loader]
        rc, stdout, text = child(env, logs, f"load_{name}", cmd, clock.left(90))
        result: dict = {"returncode": rc}
        try:
            result.update(json.loads(stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            result["tail"] = text.strip().splitlines()[-3:]
        if loader == "llama_cpp":  # its own verbose load log goes to stderr
            result["offloaded"] = [ln for ln in text.splitlines() if "layers to GPU" in ln]
        results[name] = result
    return results


def cli(python: str, *args: str) -> list[str]:
    return [python, "-c", "import sys; from edge_spec.cli import main; sys.exit(main())", *args]


def stage_check(part: Path, state: Path, report: Report, dry: bool, clock: Clock) -> bool:
    """Call 2: join the model, then every step in order inside the budget."""
    logs = report.logs
    work = Path(tempfile.mkdtemp(prefix="edge_spec_gpu_"))
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        EDGE_SPEC_CACHE=str(work / "cache"),
        EDGE_SPEC_HEADS=str(work / "heads"),
        EDGE_SPEC_LEARNED_DIR=str(work / "learned"),  # every bench starts from the priors
    )
    python = sys.executable
    if dry:
        python = str(load_script("bootstrap").venv_python())
        env["PYTHONPATH"] = str(ROOT)
    else:
        site = state / "site"
        if not (site / "llama_cpp").is_dir():
            raise SystemExit(f"no CUDA build in {site}: run call 1 (`run --stage build`) first")
        install_wheels(part, site)
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    build_record = state / "build.json"
    report.data["build"] = json.loads(build_record.read_text()) if build_record.is_file() else {}
    target = work / MODEL_NAME
    report.data["pack"] = join_model(part, state, target)
    has_head = (part / "head.tar.gz").is_file()
    if has_head:
        sha = report.data["pack"]["model"]["sha256"]
        extract(part / "head.tar.gz", work / "heads")
        (work / "heads" / "head").rename(work / "heads" / sha[:24])
    report.save()

    draft = str(work / "self-draft.gguf")
    facts = (
        "import json, sys, llama_cpp; from pathlib import Path\n"
        "from edge_spec.backend.runtime import (cuda_batch_invariant, exported_std_symbols,\n"
        "    llama_library_paths, supports_gpu_offload)\n"
        "from edge_spec.models.layer_subset import write_layer_subset\n"
        "layers = [int(x) for x in sys.argv[3].split(',')]\n"
        "write_layer_subset(Path(sys.argv[1]), Path(sys.argv[2]), layers)\n"
        "print(json.dumps({'draft_layers': layers,\n"
        # a GPU device, not llama_supports_gpu_offload(): that says yes for any RPC build
        "  'gpu_offload': supports_gpu_offload(),\n"
        "  'system_info': llama_cpp.llama_print_system_info().decode(),\n"
        "  'cuda_batch_invariant': cuda_batch_invariant(),\n"
        "  'std_exports': {p.name: exported_std_symbols(p) for p in llama_library_paths()\n"
        "                  if not p.is_symlink()}}))\n"
    )
    layers = ",".join(map(str, SELF_DRAFT_LAYERS))
    rc, stdout, text = child(
        env, logs, "facts", [python, "-c", facts, str(target), draft, layers], 60
    )
    if rc != 0:
        report.data["facts"] = {"returncode": rc, "tail": text[-2000:]}
        report.save()
        raise SystemExit(f"the self-draft or the build's facts failed:\n{text[-2000:]}")
    report.data.update(json.loads(stdout.strip().splitlines()[-1]))
    report.save()
    if not dry and not report.data["gpu_offload"]:
        raise SystemExit("the CUDA build cannot offload: " + report.data["system_info"])

    report.data["loads"] = probe_loads(env, logs, python, target, clock)
    report.save()

    # How much the logits depend on the batch shape: offloaded as edge_spec runs it
    # (GGML_CUDA_BATCH_INVARIANT=1, scripts/patches/cuda/), offloaded as llama.cpp ships
    # (=0), and on this build's CPU backend: the floor under greedy exactness that the tests
    # below assume (what `edge-spec profile --deviation` prints, without the profile).
    deviation = (
        "import json, sys; from edge_spec.backend import LlamaModel\n"
        "from edge_spec.device import numerics\n"
        "layers = int(sys.argv[2])\n"
        # 512 cells: room for a batch across the KV view's first 256-cell step (numerics)
        "with LlamaModel(sys.argv[1], n_ctx=512, n_gpu_layers=layers) as model:\n"
        "    print(json.dumps(numerics.measure(model, layers).to_dict()))\n"
    )
    report.data["deviation"] = {}
    # Also invariant with llama.cpp's op fusion off: should a batch still move the logits, this
    # says whether a fused kernel (the one-token pass's gate, up and GLU in one) is the cause.
    runs = (
        ("offloaded", -1, {"GGML_CUDA_BATCH_INVARIANT": "1"}),
        ("offloaded_stock", -1, {"GGML_CUDA_BATCH_INVARIANT": "0"}),
        # =2: quantized weights through mul_mat_q, one tile width for every batch (common.cuh)
        ("offloaded_mmq", -1, {"GGML_CUDA_BATCH_INVARIANT": "2"}),
        (
            "offloaded_no_fusion",
            -1,
            {"GGML_CUDA_BATCH_INVARIANT": "1", "GGML_CUDA_DISABLE_FUSION": "1"},
        ),
        ("cpu", 0, {"GGML_CUDA_BATCH_INVARIANT": "1"}),
    )
    for name, layers, variables in runs[: 1 if dry else len(runs)]:
        cmd = [python, "-c", deviation, str(target), str(layers)]
        run_env = dict(env, **variables)
        rc, stdout, text = child(run_env, logs, f"deviation_{name}", cmd, clock.left(60))
        report.data["deviation"][name] = (
            json.loads(stdout.strip().splitlines()[-1])
            if rc == 0
            else {"returncode": rc, "tail": text[-500:]}
        )
        report.save()

    tests = ["-k", "kv_rollback"] if dry else []  # dry: the glue, with one cheap real test
    test_env = dict(env, EDGE_SPEC_TEST_TARGET=str(target), EDGE_SPEC_TEST_DRAFT=draft)
    junit = logs / "tests.xml"
    # llama.cpp's libraries before numpy, as edge_spec's own import does.
    pytest_main = "import sys, llama_cpp, pytest; sys.exit(pytest.main(sys.argv[1:]))"
    pytest_args = ["-q", "-p", "no:cacheprovider", "-s", f"--junitxml={junit}", *tests, TESTS]
    rc, _, text = child(
        test_env, logs, "tests", [python, "-c", pytest_main, *pytest_args], clock.left(200)
    )
    report.data["tests"] = {"returncode": rc, **junit_counts(junit)}
    report.data["tests"]["exactness"] = exactness_reports(text)
    report.save()

    def profile_step(
        name: str, profile_env: dict, args: list[str], limit_s: float, keep_as: str = ""
    ) -> None:
        """`edge-spec profile -m <target> --json <args>` under `profile_env`: its curve as
        report.data[name], its file kept as logs/`keep_as` (to be bundled) where named."""
        cmd = cli(python, "profile", "-m", str(target), "--json", *args)
        rc, stdout, text = child(profile_env, logs, name, cmd, clock.left(limit_s))
        if rc != 0:
            report.data[name] = {"returncode": rc, "error": text[-2000:]}
        else:
            measured = json.loads(stdout)
            report.data[name] = {
                "returncode": 0,
                "cost_curve": measured["cost_curve"],
                "host": measured["profile"].get("host"),
            }
            if keep_as:
                shutil.copy(measured["path"], logs / keep_as)
        report.save()

    # The GPU's t(n) with the self-draft, kept as profile.json; the bench below reuses it.
    full = "--quick" if dry else "--full"
    profile_step("profile", env, ["-md", draft, full, "--refresh"], 120, "profile.json")

    def target_curve(name: str, invariant: str, depth: str, limit_s: float) -> None:
        """The target's t(n) with GGML_CUDA_BATCH_INVARIANT=`invariant`, in a cache of its own
        (the bench below reads the profile above), as report.data[name]."""
        curve_env = dict(env, GGML_CUDA_BATCH_INVARIANT=invariant, EDGE_SPEC_CACHE=str(work / name))
        profile_step(name, curve_env, ["--no-draft", "--refresh", depth], limit_s)

    # What the invariance costs: the target's t(n) as llama.cpp ships it.
    if not dry and not clock.out_of_time(40):
        target_curve("profile_stock", "0", "--full", 90)

    # The quick bench in its chat form (an instruct model), T = 0, on the GPU and then on this
    # machine's CPU cores with the GPU hidden: fewer entries there, where a pass costs more.
    report.data["bench"] = {}
    entries = {
        "gpu": ["auto", "ngram", "model", "model-k1", "model-k2", "model-k4", "model-k6"],
        "cpu": ["auto", "ngram", "model", "model-k2"],
    }
    bench_args = ["-m", str(target), "-md", draft, "--chat", "--quick", "--temperatures", "0"]
    bench_args += ["--no-progress", "--no-plots"]
    if dry:  # the steps, not the figures: one category, a few tokens; on a CPU build the "cpu"
        # entry's profile has the key of the one above, so it is reused, not measured again
        entries = {"gpu": ["auto"], "cpu": ["auto"]}
        bench_args += ["--categories", "summarization", "--max-tokens", "12"]
    for device, strategies in entries.items():
        if clock.out_of_time(30):
            report.data["bench"][device] = {"skipped": "out of time"}
            break
        strategies = strategies + ["head"] if has_head else strategies
        bench_env = dict(env) if device == "gpu" else dict(env, CUDA_VISIBLE_DEVICES="")
        if device == "cpu":  # the CPU cores' own t(n), a second device class, in the cache
            args = ["-md", draft, "--quick"]  # the CPU bench then reads
            profile_step("profile_cpu", bench_env, args, 90, "profile-cpu.json")
        cmd = cli(python, "bench", *bench_args, "--out", str(logs / f"bench_{device}"))
        rc, _, text = child(
            bench_env, logs, f"bench_{device}", cmd + ["--strategies", *strategies], clock.left(150)
        )
        report.data["bench"][device] = bench_summary(logs / f"bench_{device}", rc, text)
        report.save()

    # What =2 (mul_mat_q for every batch size, the one-token pass included) costs beside =1 and
    # stock: t(n) with the quick profile, last, where time is left.
    # (Dry: the step itself, on this CPU build, where the variable means nothing.)
    if not clock.out_of_time(30):
        target_curve("profile_mmq", "2", "--quick", 60)

    print(summary(report.data))
    shutil.rmtree(work, ignore_errors=True)
    return report.data["tests"]["returncode"] == 0 and report.data["profile"]["returncode"] == 0


def bench_summary(directory: Path, rc: int, text: str) -> dict:
    """Per strategy (at T = 0): tokens/s over every prompt, the geometric mean of its
    per-prompt speedups against the target alone and the run's noise floor, from the bench's
    results.json (the whole of it is in files.tar.gz)."""
    results = directory / "results.json"
    if rc != 0 or not results.is_file():
        return {"returncode": rc, "tail": text[-1500:]}
    data = json.loads(results.read_text())
    rows: dict = {}
    for s in data["summaries"]:
        if s["category"] == "all":
            rows[s["strategy"]] = {"tokens_per_s": round(s["tokens_per_s"], 1)}
    for r in data["prompt_ratios"]:
        rows.setdefault(r["strategy"], {}).update(
            geometric_mean=round(r["geometric_mean"], 3),
            floor_low=round(r["floor_low"], 3) if r.get("floor_low") else None,
        )
    return {"returncode": rc, "strategies": rows}


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


def summary(data: dict) -> str:
    tests = data.get("tests", {})
    lines = [
        f"mode {data['mode']}; GPU {data['gpu'] or 'none'}; offload {data.get('gpu_offload')}",
        f"build {data.get('build', {}).get('build_s', '-')} s; "
        f"self-draft layers {data.get('draft_layers')}",
        f"C++ standard-library symbols exported: {data.get('std_exports')}",
        f"CUDA batch invariance (patched build; 1 as edge_spec sets it): "
        f"{data.get('cuda_batch_invariant')}",
        "loads: "
        + ", ".join(
            f"{name} rc {r['returncode']} {r.get('offloaded', [''])[-1:]}"
            for name, r in data.get("loads", {}).items()
        ),
        "worst batch deviation (logit gap): "
        + ", ".join(
            f"{name} {d.get('worst_gap_change')}" for name, d in data.get("deviation", {}).items()
        ),
        f"tests: {tests.get('tests')} run, {tests.get('failures')} failed, "
        f"{tests.get('errors')} errors, {tests.get('skipped')} skipped "
        f"(rc {tests.get('returncode')})",
    ]
    for item in tests.get("exactness", []):
        lines.append(
            f"  greedy {item['mode']}: {item['diverged']} of {item['prompts']} diverged, "
            f"drafted {item['drafted']}, accepted {item['accepted']}"
        )
    for key in ("profile", "profile_stock", "profile_mmq", "profile_cpu"):
        if key in data:
            curve = data[key].get("cost_curve")
            lines.append(f"{key}: " + (json.dumps(curve) if curve else "failed"))
    for device, result in data.get("bench", {}).items():
        lines.append(f"bench {device}: {json.dumps(result.get('strategies', result))[:800]}")
    return "\n".join(lines)


def run(opts: argparse.Namespace) -> int:
    out, clock = opts.out, Clock(opts.budget)
    logs = Path(tempfile.mkdtemp(prefix="edge_spec_gpu_logs_"))
    report = Report(
        out,
        logs,
        {
            "mode": "dry" if opts.dry else "cuda",
            "stage": opts.stage,
            "host": platform.node(),
            "python": platform.python_version(),
            "gpu": gpu_name(),
            "cpu_count": os.cpu_count(),
        },
    )
    ok = True
    try:
        if opts.stage in ("build", "all"):
            stage_build(opts.dir / "a", opts.state, report, opts.dry, opts.fa, list(opts.cmake_arg))
        if opts.stage in ("check", "all"):
            ok = stage_check(opts.dir / "b", opts.state, report, opts.dry, clock)
    finally:
        report.save()
        shutil.rmtree(logs, ignore_errors=True)
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="trimmed sources, the model in two parts, wheels (here)")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    p.add_argument(
        "--train-head",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help="where this machine has no draft head for the packed model, train one first "
        "(`edge-spec head train`, this wall-time budget; 25 gave 0.50 and 0.56 first-token "
        "acceptance held out)",
    )
    r = sub.add_parser("run", help="build with CUDA, test, profile, bench (on the GPU machine)")
    r.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    r.add_argument(
        "--stage",
        choices=("build", "check", "all"),
        default="all",
        help="build: call 1 (carry .gpucheck/a); check: call 2 (carry .gpucheck/b); all: both",
    )
    r.add_argument(
        "--state", type=Path, default=STATE_DIR, help="where call 1 leaves what call 2 reads"
    )
    r.add_argument("--dry", action="store_true", help="no CUDA build: this machine's own build")
    r.add_argument("--fa", action="store_true", help="also build FlashAttention kernels")
    r.add_argument("--cmake-arg", action="append", default=[], help="one more CMake flag")
    r.add_argument(
        "--budget", type=float, help="seconds for the check stage: later steps get what is left"
    )
    opts = ap.parse_args()
    if opts.command == "pack":
        pack(opts.dir, opts.train_head)
        return
    sys.exit(run(opts))


if __name__ == "__main__":
    main()
