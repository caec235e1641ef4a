"""An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/responses,
/v1/models, /metrics, Anthropic's /v1/messages and Ollama's /api/chat and /api/generate) on
one pair, speculating on every request. Needs the server extra (pip install
'edge-spec[server]'); nothing of it is imported until the command runs.

    edge-spec serve                                     # the chat pair on 127.0.0.1:8080
    edge-spec serve -m smollm2-135m-f16 --port 9000 --api-key secret
    # then: OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="-"): client.chat.completions,
    # client.completions or client.responses, streamed or not;
    # or ollama.Client(host="http://127.0.0.1:8080"): client.chat, client.generate
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace

from edge_spec.cli.args import (
    add_engine_arguments,
    add_model_arguments,
    add_policy_arguments,
    add_subcommand,
    pick_models,
    say_draft,
)
from edge_spec.cli.args import engine_config as cli_engine_config
from edge_spec.errors import EdgeSpecError, InvalidRequestError
from edge_spec.modes import SELF

log = logging.getLogger(__name__)

NAME = "serve"
INSTALL_HINT = "the server extra is not installed: pip install 'edge-spec[server]'"


def add_parser(sub: argparse._SubParsersAction) -> None:
    serve = add_subcommand(
        sub, NAME, "an OpenAI-compatible HTTP server (the server extra)", __doc__
    )
    add_model_arguments(serve, "the chat pair's")
    add_policy_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health and /; repeat it for "
        "several clients, whose conversations (prompt_cache_key) are then kept apart, each "
        "within its own session limits (default: $EDGE_SPEC_API_KEY, comma-separated; unset: "
        "no authentication)",
    )
    serve.add_argument(
        "--queue-timeout",
        type=float,
        default=300.0,
        help="seconds a request may wait for the worker before a 503 with Retry-After "
        "(default 300; 0: no limit)",
    )
    add_engine_arguments(serve)
    serve.add_argument(
        "--ngram-session-tokens",
        type=int,
        default=8192,
        help="per conversation (requests sharing a prompt_cache_key), draft from up to this "
        "many tokens of its earlier requests (default 8192; 0: off). A request without one "
        "drafts from its own text only, so no client's text reaches another's drafts",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=16,
        help="conversations kept per API key (its least recent dropped)",
    )
    serve.add_argument(
        "--ngram-session-mib",
        type=float,
        default=64.0,
        help="memory the conversations of one API key may hold in n-gram indexes, estimated from "
        "above (default 64 MiB; the least recently used conversations are dropped first)",
    )

    serve.add_argument("--max-queue", type=int, default=64, help="requests that may wait (429)")
    serve.add_argument(
        "--max-tokens-limit", type=int, default=2048, help="largest max_tokens a request may ask"
    )
    serve.add_argument(
        "--max-request-bytes", type=int, default=1 << 20, help="largest request body (413)"
    )
    serve.add_argument(
        "--model-alias", default=None, help="the model id /v1/models lists (default: target name)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise EdgeSpecError(INSTALL_HINT) from exc
    from edge_spec.api import EdgeSpec, GenerationConfig
    from edge_spec.models.cache import resolve
    from edge_spec.models.stores import is_store_name
    from edge_spec.server.app import ServerConfig, create_app
    from edge_spec.server.schemas import RequestLimits

    for name in ("port", "max_queue", "max_tokens_limit", "max_request_bytes", "max_sessions"):
        if getattr(args, name) < (0 if name == "port" else 1):
            raise InvalidRequestError(f"--{name.replace('_', '-')} is out of range")
    if args.queue_timeout < 0:
        raise InvalidRequestError("--queue-timeout must be >= 0 (0: no limit)")
    keys = args.api_key or os.environ.get("EDGE_SPEC_API_KEY", "").split(",")
    api_keys = tuple(dict.fromkeys(k.strip() for k in keys if k and k.strip()))
    # A server's first client is a chat: with no model flags, the chat pair.
    target_name, draft_name, draft_choice = pick_models(args, chat=True, draft_mode=args.draft_mode)
    target_path = resolve(target_name)  # fetches a missing manifest model before binding
    draft_path = resolve(draft_name) if draft_name and draft_name != SELF else draft_name
    engine_config = replace(
        cli_engine_config(args),
        ngram_session_tokens=args.ngram_session_tokens,
        max_sessions=args.max_sessions,
        ngram_session_bytes=int(args.ngram_session_mib * 2**20),
    )
    # No session unless a request names one (prompt_cache_key).
    base = GenerationConfig(
        k=args.k, k_max=args.k_max, tree_nodes=args.tree_nodes, policy=args.policy, session=None
    )
    # A manifest name is its file's stem; a path is listed by its stem but accepted as given.
    # A store's name (ollama:..., whose file is a sha256 blob) is listed as given.
    listed = target_name if is_store_name(target_name) else target_path.stem
    ids = [args.model_alias, listed, target_name]
    config = ServerConfig(
        model_ids=tuple(dict.fromkeys(i for i in ids if i)),
        limits=RequestLimits(base, args.max_tokens_limit, args.draft_mode),
        api_keys=api_keys,
        queue_timeout_s=args.queue_timeout or None,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
        model_details={
            "target": str(target_path),
            "draft": str(draft_path) if draft_path else None,
            "draft_choice": draft_choice,
            "draft_mode": args.draft_mode,
            "policy": args.policy,
            "k": args.k,
            "k_max": args.k_max,
            "tree_nodes": args.tree_nodes,
            "n_ctx": args.ctx_size,
        },
    )

    def load() -> EdgeSpec:
        spec = EdgeSpec(target_path, draft_path, draft_mode=args.draft_mode, config=engine_config)
        spec.draft  # noqa: B018 - a server lives long: its draft loads now, not in a request
        say_draft(draft_choice)
        return spec

    failures: list[BaseException] = []

    def on_fatal(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    app = create_app(config, load, on_fatal=on_fatal)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="info" if args.verbose else "warning",
            timeout_graceful_shutdown=5,
        )
    )
    if args.host not in ("127.0.0.1", "localhost", "::1") and not config.api_keys:
        print(
            f"edge-spec: warning: serving on {args.host} without --api-key: anyone who can reach "
            "this port can use it",
            file=sys.stderr,
        )
    print(
        f"edge-spec: serving {config.model_ids[0]} at http://{args.host}:{args.port}/v1 for "
        f"OpenAI's clients, http://{args.host}:{args.port} for Ollama's "
        f"(draft {draft_name or '-'}, {args.draft_mode}); loading the models",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    if failures:
        exc = failures[0]
        raise exc if isinstance(exc, EdgeSpecError) else EdgeSpecError(str(exc))
    return 0
