"""Serve this machine's GPU or CPU to a target spread over machines (llama.cpp's rpc-server, in
this process until Ctrl-C or SIGTERM). llama.cpp's RPC protocol has no authentication: listen
on loopback or a network you trust.

    edge-spec rpc-server --port 50052                         # on the machine lending memory
    edge-spec generate --rpc 192.168.1.20:50052 "..."         # on the machine that drafts
"""

from __future__ import annotations

import argparse
import sys

from edge_spec.cli.args import add_subcommand

NAME = "rpc-server"


def add_parser(sub: argparse._SubParsersAction) -> None:
    rpc = add_subcommand(
        sub, NAME, "serve this machine's GPU or CPU to a target spread over machines", __doc__
    )
    rpc.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    rpc.add_argument("--port", "-p", type=int, default=50052)
    rpc.add_argument("--threads", "-t", type=int, default=None, help="CPU threads")
    rpc.add_argument(
        "--mem",
        help="memory each device offers clients, e.g. 2G (default: what it reports free); "
        "clients place layers by it, it is not enforced",
    )


def run(args: argparse.Namespace) -> int:
    """llama.cpp's RPC server in this process until Ctrl-C or SIGTERM (exit 0)."""
    import signal
    import threading

    from edge_spec.backend import default_threads
    from edge_spec.backend.rpc import parse_endpoints, serve_forever
    from edge_spec.errors import InvalidRequestError
    from edge_spec.models.placement import parse_size

    if args.threads is not None and args.threads < 1:
        raise InvalidRequestError(f"--threads must be >= 1, got {args.threads}")
    mem_bytes = parse_size(args.mem) if args.mem is not None else None
    if mem_bytes is not None and mem_bytes < 1 << 20:
        raise InvalidRequestError(f"--mem must be at least 1M, got {args.mem!r}")
    (endpoint,) = parse_endpoints(f"{args.host}:{args.port}")
    if not endpoint.is_loopback:
        print(
            f"edge-spec: warning: listening on {endpoint}: llama.cpp's RPC protocol has no "
            "authentication or encryption; anyone who can reach this port can run work on this "
            "machine and read its memory. Use it only on a network you trust.",
            file=sys.stderr,
        )
    failure: list[BaseException] = []
    stopped = threading.Event()

    def serve() -> None:
        try:
            serve_forever(endpoint, args.threads or default_threads(), mem_bytes)
        except BaseException as exc:  # handed to the main thread
            failure.append(exc)
        stopped.set()

    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    threading.Thread(target=serve, name="rpc-server", daemon=True).start()
    print(f"edge-spec: rpc-server listening on {endpoint} (Ctrl-C stops it)", file=sys.stderr)
    try:
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        return 0
    if failure:
        raise failure[0]
    return 0
