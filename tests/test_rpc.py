"""A target spread over llama.cpp rpc-servers (edge-spec rpc-server, --rpc): endpoints checked
in Python before llama.cpp sees them (it aborts the process on a server it cannot use), and,
over loopback with two real servers, the target's layers remote and its greedy output the
local target's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from edge_spec.backend.rpc import (
    RpcError,
    check_server,
    parse_endpoints,
    supports_rpc,
    wait_for_server,
)
from edge_spec.errors import InvalidRequestError

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = pytest.mark.xdist_group("rpc")

PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n",
    "List the days of the week: Monday, Tuesday,",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_endpoints_parse_or_say_what_is_wrong() -> None:
    (one, two) = parse_endpoints("127.0.0.1:50052, gpu-box:50053")
    assert (one.host, one.port, two.host, two.port) == ("127.0.0.1", 50052, "gpu-box", 50053)
    assert one.is_loopback and not two.is_loopback
    for bad in ("127.0.0.1", ":50052", "host:port", "host:0", "host:70000", "a:1,a:1", "::1:5"):
        with pytest.raises(InvalidRequestError):
            parse_endpoints(bad)


def test_an_unreachable_server_is_an_error_not_an_abort() -> None:
    with pytest.raises(RpcError, match="cannot reach rpc-server 127.0.0.1:"):
        check_server(parse_endpoints(f"127.0.0.1:{free_port()}")[0], timeout_s=2)


def test_a_port_that_is_not_an_rpc_server_is_refused() -> None:
    """Something else listening (it answers garbage, or nothing): refused within the timeout."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(RpcError, match="did not answer as an rpc-server"):
        check_server(parse_endpoints(f"127.0.0.1:{port}")[0], timeout_s=5)
    server.close()


def test_cli_with_an_unreachable_server_exits_2_with_one_line() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_spec.cli",
            "generate",
            "--rpc",
            f"127.0.0.1:{free_port()}",
            "--max-tokens",
            "4",
            "Hello",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr
    reason = "cannot reach rpc-server" if supports_rpc() else "built without the RPC backend"
    assert run.stderr.count("\n") == 1 and reason in run.stderr


needs_rpc = pytest.mark.skipif(not supports_rpc(), reason="llama.cpp built without GGML_RPC")


@pytest.fixture(scope="session")
def servers() -> Iterator[tuple[str, str]]:
    """Two `edge-spec rpc-server`s on loopback, one thread each."""
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "edge_spec.cli", "rpc-server", "--port", str(p), "-t", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in ports
    ]
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    for endpoint in endpoints:
        wait_for_server(parse_endpoints(endpoint)[0])
    yield endpoints[0], endpoints[1]
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.models
@needs_rpc
def test_rpc_server_refuses_a_port_in_use(servers) -> None:
    port = servers[0].split(":")[1]
    run = subprocess.run(
        [sys.executable, "-m", "edge_spec.cli", "rpc-server", "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "cannot listen on" in run.stderr.splitlines()[-1]


@pytest.mark.models
@needs_rpc
def test_mem_caps_what_a_server_offers_and_the_planner_refuses_what_does_not_fit(
    target_path,
) -> None:
    """`rpc-server --mem 64M`: its device reports 64 MiB free and total to clients, and a
    target whose layers need more is refused before llama.cpp loads it (exit 2, one line)."""
    from edge_spec.backend.rpc import device_memory, rpc_devices

    port = free_port()
    cmd = [sys.executable, "-m", "edge_spec.cli", "rpc-server", "--port", str(port), "-t", "1"]
    server = subprocess.Popen(
        [*cmd, "--mem", "64M"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        endpoint = f"127.0.0.1:{port}"
        wait_for_server(parse_endpoints(endpoint)[0])
        reported = device_memory(rpc_devices(parse_endpoints(endpoint)))
        assert [(free, total) for _, free, total in reported] == [(64 << 20, 64 << 20)]
        run = subprocess.run(
            [sys.executable, "-m", "edge_spec.cli", "generate", "-m", str(target_path)]
            + ["--rpc", endpoint, "--max-tokens", "4", "Hello"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 2, run.stderr
        assert run.stderr.count("\n") == 1 and "report 64 MiB free" in run.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
    bad = subprocess.run([*cmd, "--mem", "lots"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot read a memory size" in bad.stderr


@pytest.mark.models
@needs_rpc
def test_greedy_over_two_rpc_servers_equals_the_local_target(
    servers, target_path, draft_path
) -> None:
    from edge_spec import EdgeSpec, EngineConfig, GenerationConfig

    config = GenerationConfig(max_tokens=24)
    prompts = PROMPTS[:1]  # three modes, over the servers (each token is a network round)
    with EdgeSpec(target_path, draft_path, config=EngineConfig(n_ctx=512)) as local:
        expected = {p: local.generate(p, config, draft_mode="none").token_ids for p in prompts}
    remote_cfg = EngineConfig(n_ctx=512, rpc_servers=servers)
    with EdgeSpec(target_path, draft_path, config=remote_cfg) as remote:
        assert remote.placement.remote_needed_bytes > 0
        drafted = 0
        for prompt in prompts:
            for mode in ("none", "auto", "model"):
                result = remote.generate(prompt, config, draft_mode=mode)
                assert result.token_ids == expected[prompt], (prompt, mode)
                drafted += result.stats.n_drafted
        assert drafted > 0


@pytest.mark.models
@needs_rpc
def test_a_server_killed_mid_generation_ends_the_request_with_one_clear_line(
    target_path, draft_path
) -> None:
    """The CLI streams a long answer over two servers; one is killed once text flows: the
    command ends within two minutes with exit 2 and one line, no traceback, no abort."""
    ports = [free_port(), free_port()]
    servers = [
        subprocess.Popen(
            [sys.executable, "-m", "edge_spec.cli", "rpc-server", "--port", str(p), "-t", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    try:
        for p in ports:
            wait_for_server(parse_endpoints(f"127.0.0.1:{p}")[0])
        client = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edge_spec.cli",
                "generate",
                "--rpc",
                endpoints,
                "--max-tokens",
                "4000",
                "--draft-mode",
                "none",
                "Count from one to one thousand in words: one, two, three, four,",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # text as it is generated
        )
        assert client.stdout is not None
        assert client.stdout.read(8), "no text streamed before the kill"
        servers[1].kill()
        killed = time.monotonic()
        _, stderr = client.communicate(timeout=120)
        took_s = time.monotonic() - killed
    finally:
        for server in servers:
            server.kill()
            server.wait()
    text = stderr.decode()
    assert client.returncode == 2, text
    assert text.count("\n") == 1 and "rpc-server was lost" in text, text
    assert "Traceback" not in text and took_s < 120


def test_the_delay_proxy_adds_its_delay_to_each_round_trip_and_keeps_the_bytes() -> None:
    from edge_spec.bench.delay_proxy import DelayProxy

    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = server.accept()
        while data := conn.recv(1 << 16):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=echo, daemon=True).start()
    with DelayProxy(server.getsockname()[:2], delay_s=0.005) as proxy:
        host, port = proxy.endpoint.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            took = []
            for i in range(5):
                payload = bytes([i]) * 1000
                start = time.perf_counter()
                sock.sendall(payload)
                got = b""
                while len(got) < len(payload):
                    got += sock.recv(1 << 16)
                took.append(time.perf_counter() - start)
                assert got == payload
    server.close()
    assert min(took) >= 0.005


class NetNs:
    """A network namespace joined to this one by a veth pair (10.77.x.1 here, 10.77.x.2 there),
    with `tc netem` delay on both ends where the kernel has it. Needs root and iproute2."""

    def __init__(self, index: int, delay_ms: float) -> None:
        self.name, self.index, self.delay_ms = f"edge_spec_t{index}", index, delay_ms
        self.host_ip, self.ns_ip = f"10.77.{index}.1", f"10.77.{index}.2"
        self.netem = False

    def __enter__(self) -> NetNs:
        n, i = self.name, self.index
        steps = [
            f"ip netns add {n}",
            f"ip link add es_h{i} type veth peer name es_n{i}",
            f"ip link set es_n{i} netns {n}",
            f"ip addr add {self.host_ip}/24 dev es_h{i}",
            f"ip link set es_h{i} up",
            f"ip netns exec {n} ip addr add {self.ns_ip}/24 dev es_n{i}",
            f"ip netns exec {n} ip link set es_n{i} up",
            f"ip netns exec {n} ip link set lo up",
        ]
        for step in steps:
            run = subprocess.run(step.split(), capture_output=True, text=True)
            if run.returncode != 0:
                self.__exit__()
                pytest.skip(f"cannot make a network namespace here: {step}: {run.stderr.strip()}")
        if self.delay_ms:
            half = f"{self.delay_ms / 2:g}ms"
            a = subprocess.run(
                f"tc qdisc add dev es_h{i} root netem delay {half}".split(), capture_output=True
            )
            b = subprocess.run(
                f"ip netns exec {n} tc qdisc add dev es_n{i} root netem delay {half}".split(),
                capture_output=True,
            )
            self.netem = a.returncode == 0 and b.returncode == 0
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(f"ip link del es_h{self.index}".split(), capture_output=True)
        subprocess.run(f"ip netns del {self.name}".split(), capture_output=True)


@pytest.mark.models
@needs_rpc
@pytest.mark.parametrize("delay_ms", [5])  # no delay: the loopback test above
def test_greedy_through_a_network_namespace_equals_the_local_target(
    delay_ms, target_path, draft_path
) -> None:
    """The rpc-server in its own network namespace, reached over a veth pair; the added round
    trip from netem where the kernel has it, else from the delay proxy (this machine's kernel
    has no sch_netem): the greedy output is still the local target's."""
    import shutil

    from edge_spec import EdgeSpec, EngineConfig, GenerationConfig
    from edge_spec.bench.delay_proxy import DelayProxy

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    config = GenerationConfig(max_tokens=24)
    with EdgeSpec(target_path, draft_path, config=EngineConfig(n_ctx=512)) as local:
        expected = local.generate(PROMPTS[0], config, draft_mode="none").token_ids
    with NetNs(3 + delay_ms, delay_ms) as ns:
        port = 50052
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns.name,
                sys.executable,
                "-m",
                "edge_spec.cli",
                "rpc-server",
                "--host",
                ns.ns_ip,
                "--port",
                str(port),
                "-t",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            endpoint = parse_endpoints(f"{ns.ns_ip}:{port}")[0]
            wait_for_server(endpoint)
            with ExitStack() as stack:
                address = str(endpoint)
                if delay_ms and not ns.netem:
                    proxy = DelayProxy((ns.ns_ip, port), delay_ms / 1000)
                    address = stack.enter_context(proxy).endpoint
                cfg = EngineConfig(n_ctx=512, rpc_servers=(address,))
                with EdgeSpec(target_path, draft_path, config=cfg) as remote:
                    # auto at a fixed k: drafts every step, and no device profile is measured
                    # over the delayed link (the two-server test covers the cost policy).
                    for mode, k in (("none", None), ("auto", 2)):
                        got = remote.generate(PROMPTS[0], config, draft_mode=mode, k=k).token_ids
                        assert got == expected, mode
        finally:
            server.terminate()
            server.wait(30)


@pytest.mark.models
@needs_rpc
def test_llama_cpps_own_rpc_server_binary_serves_the_target_too(target_path, draft_path) -> None:
    """scripts/build_llama_examples.py also builds llama.cpp's ggml-rpc-server (for machines
    without edge_spec): the target on it gives the local target's greedy output."""
    from edge_spec import EdgeSpec, EngineConfig, GenerationConfig
    from edge_spec.bench.cpp_peers import default_bin_dir

    bin_dir = default_bin_dir()
    if bin_dir is None or not (bin_dir / "ggml-rpc-server").is_file():
        pytest.skip("llama.cpp's binaries not built: python3 scripts/build_llama_examples.py")
    port = free_port()
    server = subprocess.Popen(
        [str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"127.0.0.1:{port}"
        wait_for_server(parse_endpoints(endpoint)[0])
        config = GenerationConfig(max_tokens=24)
        with EdgeSpec(target_path, draft_path, config=EngineConfig(n_ctx=512)) as local:
            expected = local.generate(PROMPTS[2], config, draft_mode="none").token_ids
        cfg = EngineConfig(n_ctx=512, rpc_servers=(endpoint,))
        with EdgeSpec(target_path, draft_path, config=cfg) as remote:
            assert remote.generate(PROMPTS[2], config, draft_mode="auto").token_ids == expected
    finally:
        server.terminate()
        server.wait(30)


def test_a_guarded_call_raises_its_own_error_and_a_silent_server_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Python error inside a guarded call is itself, not a lost server; a call that waits past
    the timeout (a server that stopped answering) ends with one RpcError, and the servers count
    as lost from then on."""
    from edge_spec.backend import rpc

    def broken() -> None:
        raise KeyError("not an RPC failure")

    with pytest.raises(KeyError):
        rpc.call_guarded(broken)
    assert rpc.lost() is None
    monkeypatch.setattr(rpc, "CALL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(rpc, "_lost", threading.Event())  # this process's real state untouched
    monkeypatch.setattr(rpc, "_lost_message", [])
    with pytest.raises(RpcError, match="did not answer within"):
        rpc.call_guarded(time.sleep, 3)
    assert "no answer within" in (rpc.lost() or "")
    with pytest.raises(InvalidRequestError):
        rpc.set_call_timeout(0)
