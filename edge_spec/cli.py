"""edge-spec: the command line. Thin: parse, call the library, print. User errors exit 2 with
one line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .errors import EdgeSpecError, RpcError
from .modes import DRAFT_MODES
from .policy import DEFAULT_K_MAX

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the contract for every user error.
        self.exit(EXIT_USER_ERROR, f"edge-spec: error: {message}\n")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """How the models are loaded: the same flags in generate, chat and serve."""
    parser.add_argument("--ctx-size", "-c", type=int, default=4096)
    parser.add_argument("--threads", "-t", type=int, default=None)
    parser.add_argument(
        "--mem-budget", default=None, help="RAM the models may use, e.g. 2G (default: free RAM)"
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="chatml, gemma, or a Jinja file (default: the model's own; a built-in for its "
        "architecture if it has none)",
    )
    add_rpc_argument(parser)


def add_rpc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rpc",
        default=None,
        metavar="HOST:PORT[,HOST:PORT]",
        help="put the target's layers on these llama.cpp rpc-servers (edge-spec rpc-server); "
        "the draft stays on this machine",
    )


def rpc_servers(args: argparse.Namespace) -> tuple[str, ...]:
    """--rpc as EngineConfig.rpc_servers (validated there)."""
    text = getattr(args, "rpc", None)
    return tuple(part.strip() for part in text.split(",")) if text else ()


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """--policy, --k, --k-max: the same meaning in generate, chat and serve."""
    parser.add_argument(
        "--policy",
        choices=("fixed", "heuristic", "cost"),
        default=None,
        help="how k is chosen per step (default: cost, in every draft mode; fixed when --k "
        "is given)",
    )
    parser.add_argument(
        "--k", type=int, default=None, help="a fixed draft length (implies --policy fixed)"
    )
    parser.add_argument(
        "--k-max", type=int, default=DEFAULT_K_MAX, help="cap for the adaptive policies"
    )
    parser.add_argument(
        "--tree-nodes",
        type=int,
        default=None,
        help="token trees: the most branch tokens a draft may add (an n-gram draft where the "
        "session went on several ways, a draft head its runner-up candidates; default: up to "
        "8 while they pay under the cost policy, none under the others; 0: chains only)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edge-spec", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log llama.cpp and debug")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate text speculatively and report its statistics")
    gen.add_argument("prompt", nargs="?", help="the prompt (default: read --prompt-file or stdin)")
    gen.add_argument("--prompt-file", help="read the prompt from this file")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as one user message through the chat template",
    )
    gen.add_argument(
        "--target",
        "-m",
        help="target model: manifest name or GGUF path (default: the default pair; with --chat "
        "the chat pair)",
    )
    gen.add_argument("--draft", "-md", help="draft model: manifest name or GGUF path")
    gen.add_argument(
        "--draft-mode",
        choices=DRAFT_MODES,
        default="auto",
        help="auto: per step the policy picks the learned draft (the target's head when one "
        "was trained, else the model draft), n-gram lookup or none (default); "
        "self: the draft is the target less some blocks, derived and chosen on first use "
        "(--draft self does the same under auto); head: the target's draft head "
        "(edge-spec head train)",
    )
    add_policy_arguments(gen)
    gen.add_argument("--max-tokens", "-n", type=int, default=128)
    gen.add_argument("--temperature", "--temp", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_engine_arguments(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object")

    from .bench.command import add_bench_parser
    from .chat_terminal import add_chat_parser
    from .device import add_profile_parser
    from .headtrain.command import add_head_parser
    from .server.command import add_serve_parser
    from .simulate.command import add_simulate_parser

    add_chat_parser(sub)
    add_profile_parser(sub)
    add_simulate_parser(sub)
    add_bench_parser(sub)
    add_serve_parser(sub)
    add_head_parser(sub)

    rpc = sub.add_parser(
        "rpc-server", help="serve this machine's GPU or CPU to a target spread over machines"
    )
    rpc.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    rpc.add_argument("--port", "-p", type=int, default=50052)
    rpc.add_argument("--threads", "-t", type=int, default=None, help="CPU threads")
    rpc.add_argument(
        "--mem",
        help="memory each device offers clients, e.g. 2G (default: what it reports free); "
        "clients place layers by it, it is not enforced",
    )

    models = sub.add_parser("models", help="list or prepare the registry models")
    msub = models.add_subparsers(dest="models_command", required=True, parser_class=_Parser)
    msub.add_parser("list", help="show the manifest's models and whether they are ready")
    prep = msub.add_parser("prepare", help="fetch and derive models into the cache")
    prep.add_argument("names", nargs="*", help="model names (default: the default set)")
    prep.add_argument("--all", action="store_true", help="every model in the manifest")
    prep.add_argument("--force", action="store_true", help="rebuild even if present")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "chat":
            from .chat_terminal import run_chat

            return run_chat(args)
        if args.command == "profile":
            from .device import run_profile

            return run_profile(args)
        if args.command == "simulate":
            from .simulate.command import run_simulate

            return run_simulate(args)
        if args.command == "bench":
            from .bench.command import run_bench_command

            return run_bench_command(args)
        if args.command == "serve":
            from .server.command import run_serve

            return run_serve(args)
        if args.command == "rpc-server":
            return _rpc_server(args)
        if args.command == "head":
            from .headtrain.command import run_head

            return run_head(args)
        return _models(args)
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


def _generate(args: argparse.Namespace) -> int:
    from .api import EdgeSpec, GenerationConfig
    from .models import choose_pair
    from .sampling import SamplingParams

    prompt = _read_prompt(args)
    # --draft is ignored by the draft-free modes, so one command line switches between them;
    # --chat without a target takes the chat pair (the default pair's target is a base model).
    target, draft = choose_pair(args.target, args.draft, chat=args.chat, draft_mode=args.draft_mode)
    config = GenerationConfig(
        max_tokens=args.max_tokens,
        k=args.k,
        k_max=args.k_max,
        tree_nodes=args.tree_nodes,
        policy=args.policy,
        stop=tuple(args.stop),
        sampling=SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
        ),
    )
    with EdgeSpec(target, draft, draft_mode=args.draft_mode, config=engine_config(args)) as spec:
        if args.chat:
            prompt = spec.render_chat([{"role": "user", "content": prompt}])
        if args.json:
            result = spec.generate(prompt, config)
            print(json.dumps(result.to_dict(), indent=2))
            return 0
        result = None
        for delta in spec.stream(prompt, config):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            result = delta.result
        sys.stdout.write("\n")
    assert result is not None
    print(_summary(result), file=sys.stderr)
    return 0


def engine_config(args: argparse.Namespace) -> Any:
    """The EngineConfig of the flags generate, chat and serve share."""
    from .api import EngineConfig
    from .placement import parse_size

    return EngineConfig(
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        mem_budget_bytes=parse_size(args.mem_budget) if args.mem_budget else None,
        chat_template=args.chat_template,
        verify_in_child=True,  # a model file llama.cpp aborts on ends in one line, exit 2
        # A draft the user named drafts in auto, not the target's head.
        use_head=getattr(args, "draft", None) is None,
        rpc_servers=rpc_servers(args),
    )


def _rpc_server(args: argparse.Namespace) -> int:
    """llama.cpp's RPC server in this process until Ctrl-C or SIGTERM (exit 0)."""
    import signal
    import threading

    from .backend import default_threads
    from .backend.rpc import parse_endpoints, serve_forever
    from .errors import InvalidRequestError
    from .placement import parse_size

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


def _read_prompt(args: argparse.Namespace) -> str:
    from .errors import InvalidRequestError

    if args.prompt is not None and args.prompt_file:
        raise InvalidRequestError("give the prompt either as an argument or with --prompt-file")
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise InvalidRequestError(
                f"cannot read prompt file: {exc.strerror}: {args.prompt_file}"
            ) from exc
    if args.prompt is not None:
        return str(args.prompt)
    text = "" if sys.stdin.isatty() else sys.stdin.read()
    if not text:
        raise InvalidRequestError("no prompt: pass one as an argument, --prompt-file or stdin")
    return text


def _summary(result: object) -> str:
    from .api import GenerationResult

    assert isinstance(result, GenerationResult)
    s = result.stats
    per_pos = " ".join(f"{r:.2f}" for r in s.acceptance_per_position) or "-"
    sources = ", ".join(f"{name} {n}" for name, n in sorted(s.steps_by_source.items()))
    return "\n".join(
        [
            f"--- {result.draft_mode} draft, {result.policy} policy, "
            f"finish: {result.finish_reason}",
            f"target {result.target}",
            f"draft  {result.draft or '-'}"
            + (
                " (another vocabulary: drafts translated)"
                if result.draft_vocab == "translated"
                else ""
            ),
            f"tokens: {s.n_prompt_tokens} prompt, {s.n_generated} generated in {s.n_steps} steps "
            f"({s.tokens_per_step:.2f} per target pass)",
            f"drafted {s.n_drafted}, accepted {s.n_accepted} "
            f"(rate {s.acceptance_rate:.2f}; per position {per_pos})",
            f"steps by source: {sources}; k chosen (k=0,1,..): {list(s.k_chosen)}",
            f"speed: {s.tokens_per_s:.1f} tokens/s, "
            f"first token {s.time_to_first_token_s * 1e3:.0f} ms",
            f"time: prefill {s.prefill_s:.3f}s, draft {s.draft_s:.3f}s, verify {s.verify_s:.3f}s, "
            f"other {s.other_s:.3f}s",
        ]
    )


def _models(args: argparse.Namespace) -> int:
    from . import models

    if args.models_command == "list":
        default_target, default_draft = models.default_pair()
        print(f"cache: {models.models_dir()}")
        for status in models.list_models():
            entry = status.entry
            state = "ready" if status.verified else ("present" if status.present else "missing")
            role = {default_target: " (default target)", default_draft: " (default draft)"}
            source = (
                f"from {entry.derived_from} as {entry.ftype}"
                if entry.derived_from
                else "PyPI " + ", ".join(entry.pypi)
            )
            print(
                f"{entry.name:<22} {state:<8} {entry.size_bytes / 2**20:7.1f} MiB  "
                f"{source}{role.get(entry.name, '')}"
            )
        return 0
    paths = models.prepare(args.names or None, all=args.all, force=args.force, progress=True)
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
