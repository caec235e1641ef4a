#!/usr/bin/env python3
"""Create or reuse the project's virtual environment and install only what is missing.

Standard library only: this runs before anything is installed. It
1. creates `.venv/` beside the project if it is absent;
2. installs the package (editable) and the named extras when their requirements are not met;
3. builds llama-cpp-python from its sdist, with the project's patches to the vendored llama.cpp
   (`scripts/patches/*.patch`, and `cuda/*.patch` for a CUDA build; `patch -p1`) and CMake
   flags chosen from this machine (CUDA where a CUDA toolkit *and* a GPU are present, Metal on
   Apple Silicon, otherwise the CPU's real features with AMX left off: a native build segfaults
   in ggml_backend_amx_mul_mat on AMX CPUs; on Linux, a linker version script that keeps the
   C++ standard library's symbols local, EXPORTS_MAP), keeping the wheel in
   `.cache/wheels/<version>-<flags and patches hash>/` so it is rebuilt only when the version,
   the flags or the patches change (pip's own wheel cache does not key on CMAKE_ARGS);
4. runs a smoke decode in a child process so that a broken build fails set-up loudly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("EDGE_SPEC_VENV", ROOT / ".venv"))
WHEEL_CACHE = ROOT / ".cache" / "wheels"
SDIST_DIR = ROOT / ".cache" / "sdist"
# Changes to the vendored llama.cpp, unified diffs against its root (see each file's header).
PATCHES_DIR = ROOT / "scripts" / "patches"
LLAMA_CPP_VERSION = "0.3.36"  # the tested version; pyproject pins the same range

# /proc/cpuinfo flag -> ggml CMake option. AMX is deliberately absent (see module docstring).
X86_FEATURES = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
    "avx_vnni": "GGML_AVX_VNNI",
}


def log(msg: str) -> None:
    print(f"[bootstrap] {msg}", file=sys.stderr, flush=True)


def venv_python() -> Path:
    sub = "Scripts/python.exe" if os.name == "nt" else "bin/python"
    return VENV / sub


def find_nvcc() -> str | None:
    """nvcc on PATH, or where JetPack and the CUDA installers put it."""
    found = shutil.which("nvcc")
    if found is None and Path("/usr/local/cuda/bin/nvcc").exists():
        found = "/usr/local/cuda/bin/nvcc"
    return found


def has_nvidia_gpu() -> bool:
    """A CUDA toolkit alone is not enough: this project's CI machines have nvcc and no GPU."""
    if not find_nvcc():
        return False
    if Path("/etc/nv_tegra_release").exists():  # Jetson: integrated GPU, no nvidia-smi
        return True
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            return out.returncode == 0 and "GPU" in out.stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    return Path("/dev/nvidia0").exists()


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


# The built libraries export no C++ standard-library symbols. Their copies of std templates
# (std::regex, std::vector, ...) are otherwise exported weak, and the dynamic linker may bind
# them to another extension's copies loaded first (numpy's, onnxruntime's): the first CUDA
# build crashed so in libllama's std::regex (bench/results/issue17-gpu-check-h200). Every
# symbol whose demangled name holds std:: or __gnu_cxx:: stays local; the rest is exported as
# before (the libraries import none of these from one another). GNU ld and lld read it.
EXPORTS_MAP = """{
  global:
    *;
  local:
    extern "C++" {
      *std::*;
      *__gnu_cxx::*;
    };
};
"""


def exports_map() -> Path:
    """The version script above, written under .cache/ (named by its content)."""
    digest = hashlib.sha256(EXPORTS_MAP.encode()).hexdigest()[:12]
    path = ROOT / ".cache" / f"exports-{digest}.map"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(EXPORTS_MAP)
    return path


def cmake_args(batch_invariant: bool = False) -> list[str]:
    """CMake flags for this machine; user CMAKE_ARGS are appended and win. batch_invariant:
    without tinyBLAS (GGML_LLAMAFILE), so that a CPU build computes a position's logits the
    same alone and inside a batch (F16/Q8_0 models), at the cost of slower long batches."""
    system, machine = platform.system(), platform.machine().lower()
    args: list[str] = ["-DGGML_LLAMAFILE=OFF"] if batch_invariant else []
    # llama.cpp's RPC backend: a target's layers on other machines' rpc-servers (--rpc).
    args.append("-DGGML_RPC=ON")
    if system == "Darwin" and machine == "arm64":
        args.append("-DGGML_METAL=on")
    elif has_nvidia_gpu():
        args.append("-DGGML_CUDA=on")
    if machine in ("x86_64", "amd64"):
        flags = cpu_flags()
        args.append("-DGGML_NATIVE=OFF")
        for feature, option in X86_FEATURES.items():
            args.append(f"-D{option}={'ON' if feature in flags else 'OFF'}")
        args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    if system == "Linux":
        script = f"-Wl,--version-script={exports_map()}"
        args += [f"-DCMAKE_SHARED_LINKER_FLAGS={script}", f"-DCMAKE_MODULE_LINKER_FLAGS={script}"]
    extra = os.environ.get("CMAKE_ARGS", "").split()
    return args + extra


def run(cmd: list[str], **kw) -> None:
    log("$ " + " ".join(map(str, cmd)))
    subprocess.run(cmd, check=True, **kw)


def installed_version(py: Path, dist: str) -> str | None:
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError: pass\n"
    )
    out = subprocess.run([str(py), "-c", code, dist], capture_output=True, text=True)
    return out.stdout.strip() or None


def ensure_venv() -> Path:
    py = venv_python()
    if not py.exists():
        log(f"creating virtual environment {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    return py


def patches(use: bool = True, cuda: bool = False) -> list[Path]:
    """scripts/patches/*.patch, and for a CUDA build scripts/patches/cuda/*.patch too (those touch
    only ggml-cuda, so a CPU build's key and sources stay as they were)."""
    if not use:
        return []
    found = sorted(PATCHES_DIR.glob("*.patch"))
    return found + sorted((PATCHES_DIR / "cuda").glob("*.patch")) if cuda else found


def patches_key(use: bool = True, cuda: bool = False) -> str:
    """A hash of the patches' names and contents ("" when there are none)."""
    found = patches(use, cuda)
    if not found:
        return ""
    digest = hashlib.sha256()
    for path in found:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def apply_patches(llama_cpp_root: Path, use: bool = True, cuda: bool = False) -> None:
    """Apply patches(use, cuda) to a llama.cpp source tree; a patch that does not apply
    cleanly (another llama.cpp version) stops the build with the reason."""
    found = patches(use, cuda)
    if found and shutil.which("patch") is None:
        raise SystemExit("`patch` not found on PATH: install it, or build with --no-patches")
    for path in found:
        log(f"patching {llama_cpp_root} with {path.name}")
        with open(path, "rb") as diff:
            out = subprocess.run(
                ["patch", "-p1", "--forward", "--batch", "-d", str(llama_cpp_root)],
                stdin=diff,
                capture_output=True,
                text=True,
            )
        if out.returncode != 0:
            sys.stderr.write(out.stdout + out.stderr)
            raise SystemExit(f"{path.name} does not apply to {llama_cpp_root}")


def build_key(args: list[str], patched: str) -> str:
    """What a llama.cpp build folder is keyed on: its CMake flags and patches_key()."""
    return hashlib.sha256((" ".join(args) + patched).encode()).hexdigest()[:12]


def ensure_sdist(version: str, pip_python: Path) -> Path:
    """The llama-cpp-python sdist in .cache/sdist/, downloaded with pip when absent."""
    found = SDIST_DIR / f"llama_cpp_python-{version}.tar.gz"
    if found.is_file():
        return found
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    run(
        [str(pip_python), "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        + ["-d", str(SDIST_DIR), f"llama-cpp-python=={version}"],
        stdout=sys.stderr,
    )
    if not found.is_file():
        raise SystemExit(f"pip download did not leave {found}")
    return found


def patched_source(sdist: Path, dest: Path, use_patches: bool = True, cuda: bool = False) -> Path:
    """The sdist extracted into dest (replaced) with the patches applied; returns its root."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kwargs)
    (root,) = [p for p in dest.iterdir() if p.is_dir()]
    apply_patches(root / "vendor" / "llama.cpp", use_patches, cuda)
    return root


def ensure_llama_cpp(py: Path, batch_invariant: bool = False, use_patches: bool = True) -> None:
    args = cmake_args(batch_invariant)
    cuda = "-DGGML_CUDA=on" in args
    patched = patches_key(use_patches, cuda)
    key = build_key(args, patched)
    stamp = VENV / ".llama_cpp_build.json"
    want = {"version": LLAMA_CPP_VERSION, "cmake_args": args, "patches": patched}
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == want
        and installed_version(py, "llama_cpp_python") == LLAMA_CPP_VERSION
    ):
        return
    wheel_dir = WHEEL_CACHE / f"llama_cpp_python-{LLAMA_CPP_VERSION}-{key}"
    wheels = sorted(wheel_dir.glob("llama_cpp_python-*.whl"))
    if not wheels:
        log(f"building llama-cpp-python {LLAMA_CPP_VERSION} (a few minutes) with: {' '.join(args)}")
        wheel_dir.mkdir(parents=True, exist_ok=True)
        sdist = ensure_sdist(LLAMA_CPP_VERSION, py)
        source = patched_source(sdist, ROOT / ".cache" / "build-src" / key, use_patches, cuda)
        env = dict(os.environ, CMAKE_ARGS=" ".join(args), FORCE_CMAKE="1")
        if cuda:
            env.setdefault("CUDACXX", find_nvcc() or "nvcc")
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        run(
            [
                str(py),
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-cache-dir",
                "-w",
                str(wheel_dir),
                str(source),
            ],
            env=env,
        )
        shutil.rmtree(source.parent, ignore_errors=True)
        (wheel_dir / "cmake_args.json").write_text(json.dumps(want, indent=1))
        wheels = sorted(wheel_dir.glob("llama_cpp_python-*.whl"))
    run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--force-reinstall",
            str(wheels[-1]),
        ]
    )
    run([str(py), "-m", "pip", "install", "--quiet", str(wheels[-1])])  # its own dependencies
    stamp.write_text(json.dumps(want))


def ensure_project(py: Path, extras: str) -> None:
    """Install the project (editable) with its dependencies only when something is missing."""
    stamp = VENV / ".edge_spec_install.json"
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    want = {"pyproject": hashlib.sha256(pyproject).hexdigest(), "extras": extras}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    spec = f"{ROOT}[{extras}]" if extras else str(ROOT)
    # llama-cpp-python is already installed from our own wheel, so pip sees it satisfied.
    run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "-e", spec])
    stamp.write_text(json.dumps(want))


SMOKE = r"""
from edge_spec.backend import smoke_test
from edge_spec.models import resolve
smoke_test(resolve("smollm2-135m-q4_1", progress=False))
"""


def prepare_models(py: Path) -> None:
    """Fetch and derive the default models (a no-op with a fast check when they are ready)."""
    run([str(py), "-m", "edge_spec.cli", "models", "prepare"], stdout=subprocess.DEVNULL)


def smoke(py: Path) -> None:
    """A real decode in a child process: a broken build (e.g. the AMX segfault) dies there."""
    out = subprocess.run([str(py), "-c", SMOKE], capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        log(
            f"SMOKE DECODE FAILED (exit {out.returncode}): the llama-cpp-python build is broken; "
            f"delete {WHEEL_CACHE} and {VENV} to rebuild, or set CMAKE_ARGS"
        )
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extras", default="", help="comma-separated extras, e.g. test")
    ap.add_argument("--print-cmake-args", action="store_true")
    ap.add_argument("--no-models", action="store_true", help="skip model preparation and smoke")
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        default=os.environ.get("EDGE_SPEC_BATCH_INVARIANT") == "1",
        help="build llama.cpp without tinyBLAS: on a CPU, greedy and seeded output is then the "
        "same bit for bit whatever was drafted (F16/Q8_0 targets), but long verifications are "
        "slower (default: $EDGE_SPEC_BATCH_INVARIANT=1, else off)",
    )
    ap.add_argument(
        "--no-patches",
        action="store_true",
        default=os.environ.get("EDGE_SPEC_NO_PATCHES") == "1",
        help="build llama.cpp as released, without scripts/patches/ (to compare, or where a "
        "patch does not apply; default: $EDGE_SPEC_NO_PATCHES=1, else patched)",
    )
    opts = ap.parse_args()
    if opts.print_cmake_args:
        print(" ".join(cmake_args(opts.batch_invariant)))
        return
    py = ensure_venv()
    if installed_version(py, "pip") and not (VENV / ".pip_upgraded").exists():
        run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
        (VENV / ".pip_upgraded").touch()
    ensure_llama_cpp(py, opts.batch_invariant, not opts.no_patches)
    ensure_project(py, opts.extras)
    if not opts.no_models:
        prepare_models(py)
        smoke(py)
    log(f"ready: {py}")


if __name__ == "__main__":
    main()
