"""llama.cpp's RPC backend: the target's layers on other machines' `rpc-server`s.

llama.cpp aborts the whole process when an endpoint does not parse, cannot be reached or does
not answer its handshake, so every endpoint is checked here first: its syntax, a TCP connect
and the RPC hello (protocol version), each within a timeout. Only then is the server added to
llama.cpp's device registry (once per endpoint for the life of the process). A model loaded
with `devices=rpc_devices(...)` puts its offloaded layers there; one loaded with
`devices=local_devices()` stays on this machine (the draft), whatever is registered.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import socket
import struct
import threading
import time
from dataclasses import dataclass

import llama_cpp
from llama_cpp._ggml import libggml

from edge_spec.errors import InvalidRequestError, RpcError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
# The most one llama.cpp call on an RPC model may wait for its servers (set_call_timeout):
# a server that stops answering without closing its connection otherwise blocks until the
# kernel gives up on the socket (minutes).
CALL_TIMEOUT_S = 120.0
# The protocol of the vendored ggml-rpc (ggml-rpc.h, transport.h): HELLO is command 14, its
# request 24 capability bytes, its answer major, minor, patch, padding and 24 bytes.
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
RPC_PROTO_MAJOR, RPC_PROTO_MINOR = 7, 0
GGML_BACKEND_DEVICE_TYPE_CPU = 0

_lock = threading.Lock()
_added: dict[str, list[int]] = {}  # endpoint -> its device handles, once per process


@dataclass(frozen=True)
class RpcEndpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_endpoints(text: str) -> tuple[RpcEndpoint, ...]:
    """HOST:PORT[,HOST:PORT...]; raises InvalidRequestError. llama.cpp splits an endpoint at
    its first colon, so hosts are names or IPv4 addresses."""
    endpoints = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.partition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequestError(
                f"an RPC server is HOST:PORT (a name or an IPv4 address), got {item!r}"
            )
        endpoints.append(RpcEndpoint(host, int(port)))
    if len(set(endpoints)) != len(endpoints):
        raise InvalidRequestError(f"--rpc names a server twice: {text!r}")
    if len(endpoints) > 16:  # GGML_RPC_MAX_SERVERS
        raise InvalidRequestError(f"--rpc takes at most 16 servers, got {len(endpoints)}")
    return tuple(endpoints)


def supports_rpc() -> bool:
    return bool(llama_cpp.llama_supports_rpc())


def check_server(endpoint: RpcEndpoint, timeout_s: float = CONNECT_TIMEOUT_S) -> tuple[int, ...]:
    """Connects and says HELLO as llama.cpp would; the server's protocol version. Raises
    RpcError with the reason instead of letting llama.cpp abort on it."""
    request = struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE)
    answer_size = 4 + RPC_CONN_CAPS_SIZE
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s) as sock:
            sock.sendall(request)
            data = b""
            while len(data) < 8 + answer_size:
                chunk = sock.recv(8 + answer_size - len(data))
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        reason = f"no answer in {timeout_s:.0f} s" if isinstance(exc, TimeoutError) else exc
        raise RpcError(f"cannot reach rpc-server {endpoint}: {reason}") from None
    if len(data) < 8 + answer_size or struct.unpack("<Q", data[:8])[0] != answer_size:
        raise RpcError(f"{endpoint} did not answer as an rpc-server (wrong handshake)")
    major, minor, patch = data[8], data[9], data[10]
    if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
        raise RpcError(
            f"rpc-server {endpoint} speaks protocol {major}.{minor}.{patch}, this llama.cpp "
            f"{RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: run an rpc-server of the same llama.cpp"
        )
    return major, minor, patch


def wait_for_server(endpoint: RpcEndpoint, timeout_s: float = 60.0) -> None:
    """Until an rpc-server that is starting answers check_server; its last RpcError once
    timeout_s has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check_server(endpoint, timeout_s=2)
            return
        except RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# ggml's device registry (libggml); the RPC backend's own functions come through its registry.
_fn = libggml
_fn.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
_fn.ggml_backend_reg_by_name.restype = ctypes.c_void_p
_fn.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_fn.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
_fn.ggml_backend_register.argtypes = [ctypes.c_void_p]
_fn.ggml_backend_register.restype = None
_fn.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
_fn.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
_fn.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_fn.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
_fn.ggml_backend_dev_count.argtypes = []
_fn.ggml_backend_dev_count.restype = ctypes.c_size_t
_fn.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
_fn.ggml_backend_dev_get.restype = ctypes.c_void_p
_fn.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
_fn.ggml_backend_dev_type.restype = ctypes.c_int
_fn.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
_fn.ggml_backend_dev_name.restype = ctypes.c_char_p
_fn.ggml_backend_dev_memory.argtypes = [
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
]
_fn.ggml_backend_dev_memory.restype = None
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)

_local: list[int] | None = None  # the devices registered before any RPC server


def local_devices() -> list[int]:
    """This machine's offload devices (GPUs), as registered before any RPC server was added."""
    global _local
    with _lock:
        if _local is None:
            _local = _offload_devices()
        return list(_local)


def any_added() -> bool:
    """Whether an rpc-server joined llama.cpp's registry in this process: from then on a model
    loaded without a device list would use it too."""
    return bool(_added)


def _offload_devices() -> list[int]:
    """Non-CPU devices that are not rpc-servers (whose devices report themselves as GPUs; one
    added earlier in this process, say by a test, is not this machine's)."""
    return [
        dev
        for dev in (_fn.ggml_backend_dev_get(i) for i in range(_fn.ggml_backend_dev_count()))
        if _fn.ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU
        and not (_fn.ggml_backend_dev_name(dev) or b"").startswith(b"RPC")
    ]


def local_device_types() -> list[int]:
    """ggml_backend_dev_type of each of local_devices()."""
    return [int(_fn.ggml_backend_dev_type(dev)) for dev in local_devices()]


def rpc_devices(endpoints: tuple[RpcEndpoint, ...]) -> list[int]:
    """The servers' devices, each server checked first and added to llama.cpp once."""
    if not supports_rpc():
        raise RpcError(
            "this llama.cpp was built without the RPC backend: rerun scripts/bootstrap.py "
            "(it builds with -DGGML_RPC=ON)"
        )
    local_devices()  # what is local is fixed before the first server joins
    install_abort_guard()
    devices: list[int] = []
    for endpoint in endpoints:
        with _lock:
            known = _added.get(str(endpoint))
        if known is None:
            check_server(endpoint)
            known = _add_server(endpoint)
            with _lock:
                _added[str(endpoint)] = known
        devices += known
    return devices


def _add_server(endpoint: RpcEndpoint) -> list[int]:
    reg = _fn.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("llama.cpp has no RPC backend registered")
    address = _fn.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise RpcError("llama.cpp's RPC backend lacks ggml_backend_rpc_add_server")
    # Adding a server connects to it: guarded like any call that reaches one.
    server_reg = call_guarded(_ADD_SERVER(address), str(endpoint).encode())
    if not server_reg:
        raise RpcError(f"llama.cpp could not add rpc-server {endpoint}")
    _fn.ggml_backend_register(server_reg)
    devices = [
        _fn.ggml_backend_reg_dev_get(server_reg, i)
        for i in range(_fn.ggml_backend_reg_dev_count(server_reg))
    ]
    log.info("rpc-server %s: %d device(s)", endpoint, len(devices))
    return devices


def device_memory(devices: list[int]) -> list[tuple[str, int, int]]:
    """(name, free_bytes, total_bytes) of each device, as its backend reports them."""
    out = []
    for dev in devices:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        # An RPC device asks its server: guarded (a local device answers at once either way).
        call_guarded(_fn.ggml_backend_dev_memory, dev, ctypes.byref(free), ctypes.byref(total))
        out.append((_fn.ggml_backend_dev_name(dev).decode(), int(free.value), int(total.value)))
    return out


def device_list(devices: list[int]) -> ctypes.Array:
    """A NULL-terminated array for llama_model_params.devices (keep it alive over the load)."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


_START_SERVER = ctypes.CFUNCTYPE(
    None,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_void_p),
)
_fn.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
_fn.ggml_backend_dev_by_type.restype = ctypes.c_void_p


# ggml's device struct (ggml-backend-impl.h of the vendored llama.cpp): an interface of 15
# function pointers, get_memory the third, then the registry and the context.
_DEVICE_IFACE = (
    "get_name",
    "get_description",
    "get_memory",
    "get_type",
    "get_props",
    "init_backend",
    "get_buffer_type",
    "get_host_buffer_type",
    "buffer_from_host_ptr",
    "supports_op",
    "supports_buft",
    "offload_op",
    "event_new",
    "event_free",
    "event_synchronize",
)


class _Device(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (*_DEVICE_IFACE, "reg", "context")]


_GET_MEMORY = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_capped: list[object] = []  # the callbacks llama.cpp holds pointers to


def cap_device_memory(dev: int, mem_bytes: int) -> None:
    """Device `dev` reports at most mem_bytes free and total from now on, in this process: what
    an rpc-server offers its clients, who place layers by it (the rpc-server binary's old -m).
    Not a limit on what a client may allocate. The server asks the device of the backend it
    created, so the device itself is patched (its interface lives in writable memory: the CPU
    device is a static, GPU devices are allocated); the serving process does nothing else."""
    device = _Device.from_address(dev)
    get_memory = _GET_MEMORY(device.get_memory)

    def capped(this: int, free: ctypes._Pointer, total: ctypes._Pointer) -> None:
        get_memory(this, free, total)
        free[0], total[0] = min(free[0], mem_bytes), min(total[0], mem_bytes)

    callback = _GET_MEMORY(capped)
    _capped.extend((get_memory, callback))
    device.get_memory = ctypes.cast(callback, ctypes.c_void_p).value


def serve_forever(endpoint: RpcEndpoint, n_threads: int, mem_bytes: int | None = None) -> None:
    """This process becomes an rpc-server at endpoint, with llama.cpp's own server code (the
    one its `rpc-server` binary runs): this machine's GPUs, else its CPU, each reporting at most
    mem_bytes where given. Blocks; llama.cpp serves one client at a time. Raises RpcError when
    it cannot start."""
    if not supports_rpc():
        raise RpcError("this llama.cpp was built without the RPC backend: rerun bootstrap")
    try:  # llama.cpp only prints "Failed to create server socket": say why first
        with socket.create_server((endpoint.host, endpoint.port)):
            pass
    except OSError as exc:
        raise RpcError(f"cannot listen on {endpoint}: {exc.strerror or exc}") from None
    devices = local_devices()
    if not devices:
        cpu = _fn.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
        devices = [cpu] if cpu else []
    if not devices:
        raise RpcError("llama.cpp reports no device to serve")
    if mem_bytes is not None:
        for dev in devices:
            cap_device_memory(dev, mem_bytes)
    reg = _fn.ggml_backend_reg_by_name(b"RPC")
    address = _fn.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server")
    if not address:
        raise RpcError("llama.cpp's RPC backend lacks ggml_backend_rpc_start_server")
    array = (ctypes.c_void_p * len(devices))(*devices)
    log.info("rpc-server on %s: %s", endpoint, device_memory(devices))
    _START_SERVER(address)(str(endpoint).encode(), None, n_threads, len(devices), array)
    raise RpcError(f"the rpc-server on {endpoint} stopped (see llama.cpp's message above)")


# ---- a server lost mid-generation ------------------------------------------------------------
# ggml-rpc's client aborts the process when a server stops answering (RPC_STATUS_ASSERT ->
# GGML_ABORT -> abort()), from its dispatcher thread, while the thread that called llama.cpp
# waits for that message's answer. ggml calls an abort callback first: ours records the loss and
# parks the dispatcher thread for good, so abort() is never reached, and llama.cpp calls on an
# RPC model run in a helper thread that the caller stops waiting for once the loss is recorded.
# The model is dead from then on (its memory stays allocated: freeing it would talk to the lost
# server); the process, and a server around it, go on.

RPC_LOST_MARKER = "RPC server"  # "Remote RPC server crashed or returned malformed response"
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_fn.ggml_set_abort_callback.argtypes = [ctypes.c_void_p]
_fn.ggml_set_abort_callback.restype = ctypes.c_void_p
_lost = threading.Event()
_lost_message: list[str] = []
_guard_installed = False


@_ABORT_CALLBACK
def _on_abort(message: bytes) -> None:
    text = message.decode("utf-8", "replace")
    if RPC_LOST_MARKER not in text or threading.current_thread() is threading.main_thread():
        log.error("llama.cpp aborts: %s", text)
        return  # abort() follows, as without the callback
    _lost_message.append(text.split(": ", 1)[-1])
    _lost.set()
    log.info("an rpc-server was lost: %s", text)  # the request's RpcError says it to the user
    while True:  # park llama.cpp's RPC dispatcher thread: abort() must not run
        threading.Event().wait(3600)


def install_abort_guard() -> None:
    global _guard_installed
    with _lock:
        if not _guard_installed:
            _fn.ggml_set_abort_callback(ctypes.cast(_on_abort, ctypes.c_void_p))
            _guard_installed = True


def lost() -> str | None:
    """Why an rpc-server was lost, if one was (for health reports)."""
    return _lost_message[0] if _lost.is_set() else None


def set_call_timeout(seconds: float) -> None:
    """The most one guarded call may wait (--rpc-timeout); past it the servers count as lost."""
    global CALL_TIMEOUT_S
    if not seconds > 0:
        raise InvalidRequestError(f"the RPC call timeout must be > 0 seconds, got {seconds}")
    CALL_TIMEOUT_S = float(seconds)


def call_guarded(fn, *args):  # type: ignore[no-untyped-def]
    """fn(*args) (a llama.cpp call that may talk to rpc-servers) in a helper thread; RpcError as
    soon as an rpc-server is lost, or once CALL_TIMEOUT_S pass without an answer (a server that
    went silent), instead of waiting for an answer that will never come. An exception fn
    raises is raised as itself."""
    if _lost.is_set():
        raise RpcError(f"an rpc-server was lost ({lost()}): restart edge-spec once it is back")
    result: list = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as itself
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="llama-rpc-call", daemon=True).start()
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while not done.wait(0.05):
        if _lost.is_set():
            raise RpcError(
                f"an rpc-server was lost mid-generation ({lost()}): this request ends here; "
                "restart edge-spec once the server is back"
            )
        if time.monotonic() > deadline:
            # The call still waits inside llama.cpp, holding the model: it cannot be used again.
            _lost_message.append(f"no answer within {CALL_TIMEOUT_S:.0f} s (--rpc-timeout)")
            _lost.set()
            raise RpcError(
                f"an rpc-server did not answer within {CALL_TIMEOUT_S:.0f} s: this request "
                "ends here; restart edge-spec once the server answers again"
            )
    if failure:
        raise failure[0]
    return result[0]
