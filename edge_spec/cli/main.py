"""edge-spec: speculative decoding on GGUF models through llama.cpp, on this machine.

A small draft (a draft model, the session's own text, a head on the target, or the target less
some blocks) proposes tokens; the target checks them in one batched pass, so the output is the
target's own, faster where drafting pays. A cost policy measured on this device decides every
step whether it does.

    edge-spec chat                                  # talk to the chat pair
    edge-spec generate "The history of the bicycle begins"
    edge-spec serve                                 # an OpenAI-compatible server
    edge-spec bench --quick                         # what pays on this machine

User errors exit with code 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from edge_spec.cli import bench, chat, generate, head, models, profile, rpc, serve, simulate
from edge_spec.cli.args import EXIT_USER_ERROR, Parser
from edge_spec.errors import EdgeSpecError, RpcError

# In the order --help lists them.
COMMANDS = (generate, chat, serve, bench, profile, simulate, head, models, rpc)


def build_parser() -> argparse.ArgumentParser:
    from edge_spec import __version__

    parser = Parser(
        prog="edge-spec",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"edge-spec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log llama.cpp and debug")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    run = {command.NAME: command.run for command in COMMANDS}[args.command]
    try:
        return run(args)
    except EdgeSpecError as exc:
        print(f"edge-spec: error: {exc}", file=sys.stderr)
        if isinstance(exc, RpcError) and "was lost" in str(exc):
            # llama.cpp's RPC client is wedged (its dispatcher parked, a call never answered):
            # its exit-time destructors would wait on them, so leave without running them.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_USER_ERROR)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
