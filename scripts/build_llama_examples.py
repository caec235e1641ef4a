#!/usr/bin/env python3
"""Build llama.cpp's own `llama-lookup` and `llama-speculative-simple` as benchmark peers, and
its `ggml-rpc-server` (the rpc-server binary, for machines that lend memory without edge_spec).

Standard library only. The source is the `vendor/llama.cpp` tree of the llama-cpp-python sdist
of the version installed in `.venv` (else the version bootstrap pins), with the same patches
(scripts/patches/), so the peers run the same llama.cpp as edge_spec. The CPU/GPU flags are
bootstrap's own `cmake_args()` (imported, not copied: GGML_NATIVE=OFF, the CPU's real
features, AMX off). The two binaries land in
`.cache/llama-examples/<version>-<args hash>/bin/` beside a stamp, so a rerun is a no-op; the
bin folder is the only thing printed on stdout. `edge_spec.bench.cpp_peers` finds them there
(or through EDGE_SPEC_LLAMA_EXAMPLES).

    python3 scripts/build_llama_examples.py [--jobs 2] [--sdist FILE.tar.gz] [--force]
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
OUT_DIR = CACHE / "llama-examples"
TARGETS = ("llama-lookup", "llama-speculative-simple", "ggml-rpc-server")
STAMP_NAME = "stamp.json"

# The examples link llama + llama-common statically; nothing else of the tree is needed.
EXAMPLE_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # tools/rpc (GGML_RPC is on in bootstrap's flags); one target built
    "-DLLAMA_BUILD_APP=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
]


def log(msg: str) -> None:
    print(f"[build_llama_examples] {msg}", file=sys.stderr, flush=True)


def load_bootstrap() -> ModuleType:
    """scripts/bootstrap.py as a module (it has no import-time side effects)."""
    path = ROOT / "scripts" / "bootstrap.py"
    spec = importlib.util.spec_from_file_location("edge_spec_bootstrap", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llama_cpp_version(bootstrap: ModuleType) -> str:
    """The version installed in the venv (what edge_spec really runs), else bootstrap's pin."""
    py = bootstrap.venv_python()
    installed = bootstrap.installed_version(py, "llama_cpp_python") if py.exists() else None
    pinned = bootstrap.LLAMA_CPP_VERSION
    if installed and installed != pinned:
        log(f"venv has llama-cpp-python {installed}, bootstrap pins {pinned}: using {installed}")
    return installed or pinned


def ensure_sdist(bootstrap: ModuleType, version: str, given: Path | None, pip_python: Path) -> Path:
    """The sdist tarball: --sdist, else bootstrap's (.cache/sdist/, else `pip download`)."""
    if given is not None:
        if not given.is_file():
            raise SystemExit(f"--sdist {given}: no such file")
        return given
    return bootstrap.ensure_sdist(version, pip_python)


def extract_llama_cpp(bootstrap: ModuleType, sdist: Path, version: str) -> Path:
    """Extract only vendor/llama.cpp (once per version and patch set) and apply the project's
    patches to it, as bootstrap does for edge_spec's own build; returns its folder."""
    top = f"llama_cpp_python-{version}"
    dest = OUT_DIR / "src" / top
    src = dest / "vendor" / "llama.cpp"
    done = dest / ".extracted"
    marker = f"{sdist.name} {bootstrap.patches_key()}"
    if done.is_file() and done.read_text() == marker:
        return src
    shutil.rmtree(dest, ignore_errors=True)
    prefix = f"{top}/vendor/llama.cpp/"
    unused = (prefix + "models/", prefix + "docs/")  # test vocabularies and docs: 110 MB
    log(f"extracting {prefix} from {sdist}")
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix) and not m.name.startswith(unused)
        ]
        if not members:
            raise SystemExit(f"{sdist} has no {prefix}")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest.parent, members=members, **kwargs)
    bootstrap.apply_patches(src)
    done.write_text(marker)
    return src


def check_targets(src: Path) -> None:
    """Fail early, with the real names, if this llama.cpp renamed an example target."""
    files = [*(src / "examples").glob("*/CMakeLists.txt"), src / "tools" / "rpc" / "CMakeLists.txt"]
    text = "\n".join(p.read_text() for p in files if p.is_file())
    missing = [t for t in TARGETS if f"set(TARGET {t})" not in text]
    if missing:
        raise SystemExit(f"{src}/examples and tools/rpc define no target {missing}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", "-j", type=int, default=2, help="parallel compile jobs (default 2)")
    ap.add_argument("--sdist", type=Path, help="a llama_cpp_python-<version>.tar.gz to use")
    ap.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    opts = ap.parse_args()

    bootstrap = load_bootstrap()
    version = llama_cpp_version(bootstrap)
    args = bootstrap.cmake_args() + EXAMPLE_ARGS
    patched = bootstrap.patches_key()
    key = bootstrap.build_key(args, patched)
    out = OUT_DIR / f"{version}-{key}"
    bin_dir, stamp = out / "bin", out / STAMP_NAME
    want = {"version": version, "cmake_args": args, "targets": list(TARGETS), "patches": patched}

    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two concurrent runs would share one build folder
        if not opts.force and stamp.is_file() and all((bin_dir / t).is_file() for t in TARGETS):
            have = json.loads(stamp.read_text())
            if {k: have.get(k) for k in want} == want:
                log(f"up to date ({stamp})")
                print(bin_dir)
                return

        if shutil.which("cmake") is None:
            raise SystemExit("cmake not found on PATH (CMake >= 3.14 and a C++17 compiler needed)")
        venv_py = bootstrap.venv_python()
        pip_python = venv_py if venv_py.exists() else Path(sys.executable)
        sdist = ensure_sdist(bootstrap, version, opts.sdist, pip_python)
        src = extract_llama_cpp(bootstrap, sdist, version)
        check_targets(src)
        build = out / "build"
        started = time.monotonic()
        configure = ["cmake", "-S", str(src), "-B", str(build), *args]
        log("$ " + " ".join(configure))
        subprocess.run(configure, check=True, stdout=sys.stderr)
        compile_cmd = ["cmake", "--build", str(build), "--config", "Release", "-j", str(opts.jobs)]
        compile_cmd += ["--target", *TARGETS]
        log("$ " + " ".join(compile_cmd))
        subprocess.run(compile_cmd, check=True, stdout=sys.stderr)
        build_s = time.monotonic() - started

        bin_dir.mkdir(exist_ok=True)
        for target in TARGETS:
            tmp = bin_dir / f".{target}.tmp"
            shutil.copy2(build / "bin" / target, tmp)
            os.replace(tmp, bin_dir / target)
        record = dict(want, sdist=sdist.name, build_s=round(build_s, 1), built=time.ctime())
        tmp = out / f".{STAMP_NAME}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, stamp)
        log(f"built {', '.join(TARGETS)} in {build_s:.0f} s")
    print(bin_dir)


if __name__ == "__main__":
    main()
