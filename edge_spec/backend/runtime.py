"""llama.cpp itself: its log routed to Python logging (errors kept for our messages), one
backend initialisation, what the build can do, and the quantizer."""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

# On a failed GGML_ASSERT ggml prints a debugger backtrace (attaching gdb can take minutes);
# one line of llama.cpp's own is what a user should see. Read at abort time.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")
# A CUDA build with scripts/patches/cuda/ gives a token the same logits whatever batch verifies
# it (docs/gpu.md); stock builds ignore the variable, GGML_CUDA_BATCH_INVARIANT=0 turns it off.
# ggml reads it once, at the first CUDA op, which follows this import.
os.environ.setdefault("GGML_CUDA_BATCH_INVARIANT", "1")

import llama_cpp  # noqa: E402

from edge_spec.errors import InvalidRequestError, ModelFileError
from edge_spec.gguf.validate import validate_gguf

log = logging.getLogger(__name__)
llama_log = logging.getLogger("edge_spec.llama_cpp")


# ggml log levels: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5. Everything goes to debug
# logging (load chatter, expected quantizer fallbacks); errors are also kept so that the exception
# we raise can say what llama.cpp objected to.
GGML_LOG_ERROR = 4
_recent_errors: collections.deque[str] = collections.deque(maxlen=4)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace").rstrip()
    if level == GGML_LOG_ERROR:
        _recent_errors.append(message)
    llama_log.debug("%s", message)


def _llama_error(default: str) -> str:
    """The first error llama.cpp logged since the last call (its root cause), or default."""
    reason = _recent_errors[0] if _recent_errors else default
    _recent_errors.clear()
    return reason.split(": ", 1)[-1] if reason.startswith("llama_") else reason


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
_init_lock = threading.Lock()
_backend_ready = False


def _ensure_backend() -> None:
    global _backend_ready
    with _init_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


FTYPES = {
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
}


# ggml_backend_dev_type: CPU 0, GPU 1, IGPU 2, ACCEL 3.
_GPU_DEVICE_TYPES = (1, 2)


def supports_gpu_offload() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to. llama.cpp's own
    llama_supports_gpu_offload() also says yes for a build with the RPC backend, whose servers
    are other machines (backend.rpc): those are asked for explicitly."""
    if not llama_cpp.llama_supports_gpu_offload():
        return False
    from edge_spec.backend.rpc import local_device_types  # rpc-servers' devices say GPU too

    return any(t in _GPU_DEVICE_TYPES for t in local_device_types())


def llama_cpp_version() -> str:
    return str(getattr(llama_cpp, "__version__", "unknown"))


def llama_build() -> str:
    """What the installed llama.cpp was compiled with, as llama.cpp reports it: backends and CPU
    features, e.g. "CPU : SSE3 = 1 | ... | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1". Two builds
    of one version with other flags (no AVX-512, tinyBLAS off, CUDA) decode at other speeds."""
    _ensure_backend()
    text = (llama_cpp.llama_print_system_info() or b"").decode("utf-8", "replace")
    return " ".join(text.split()).strip(" |")


def llama_library_paths() -> list[Path]:
    """The native libraries llama-cpp-python loads (its lib/ folder: llama.cpp and ggml).
    llama_build() names the flags, not the code: the project's own patches to llama.cpp
    (scripts/patches/) change what a batch costs without changing it."""
    lib = Path(llama_cpp.__file__).resolve().parent / "lib"
    if not lib.is_dir():
        return []
    return [
        path
        for path in sorted(lib.iterdir())
        if path.is_file() and any(ext in path.name for ext in (".so", ".dylib", ".dll"))
    ]


def cuda_batch_invariant() -> int | None:
    """Whether this process's CUDA backend gives a token the same logits in any verify batch, as
    a CUDA build carrying scripts/patches/cuda/ reports GGML_CUDA_BATCH_INVARIANT: 0 off, 1 on,
    2 on with quantized weights through mul_mat_q; None without a CUDA library or the patch.
    Looked up through the libllama llama-cpp-python loaded, which searches the libraries it
    depends on: the ggml-cuda that decodes, not a second copy opened by file name (a `pip
    --target` install copies each library's symlinks as files)."""
    report = getattr(llama_cpp.llama_cpp._lib, "ggml_backend_cuda_batch_invariant", None)
    if report is None:
        return None
    report.restype, report.argtypes = ctypes.c_int, []
    return int(report())


def exported_std_symbols(path: Path) -> int | None:
    """How many C++ standard-library symbols a native library exports: its defined dynamic
    symbols whose demangled names hold std:: or __gnu_cxx:: (read with binutils' `nm -D -C`;
    None where nm is missing or cannot read it). Exported, they can bind to another extension's
    copies loaded first; the build keeps them local (scripts/bootstrap.py: EXPORTS_MAP)."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    out = subprocess.run(
        [nm, "-D", "-C", "--defined-only", str(path)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        return None
    return sum("std::" in line or "__gnu_cxx::" in line for line in out.stdout.splitlines())


def quantize(
    src: Path, dst: Path, ftype: str, n_threads: int | None = None, pure: bool = False
) -> None:
    """Requires a loadable GGUF at src; writes dst converted to ftype (requantizing is allowed).
    pure: every tensor in ftype (llama-quantize --pure), the embeddings too."""
    validate_gguf(src)
    if ftype not in FTYPES:
        raise InvalidRequestError(f"unknown ftype {ftype!r}; choose from {sorted(FTYPES)}")
    _ensure_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    params.pure = pure
    params.nthread = n_threads or os.cpu_count() or 1
    _recent_errors.clear()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        reason = _llama_error(f"code {rc}")
        raise ModelFileError(f"llama_model_quantize failed for {src} -> {ftype}: {reason}")


def default_threads() -> int:
    """$EDGE_SPEC_THREADS where set (a positive integer), else physical cores where psutil
    knows them, else logical CPUs: decode is bandwidth-bound and hyper-threads only add
    contention."""
    configured = os.environ.get("EDGE_SPEC_THREADS", "").strip()
    if configured:
        try:
            return max(1, int(configured))
        except ValueError:
            log.warning("ignoring EDGE_SPEC_THREADS=%r: not an integer", configured)
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil is a dependency, but never fail on this
        n = None
    return max(1, n or os.cpu_count() or 1)
