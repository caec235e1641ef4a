"""Speculation against the target alone, side by side on this machine: the 48-prompt set (six
categories, completion or chat form) or the agentic sessions, every strategy and peer in one
interleaved run, written as JSON, Markdown and plots.

    edge-spec bench --quick                                   # 12 prompts, the default strategies
    edge-spec bench --chat --strategies auto ngram lcpp-lookup --temperatures 0 0.8
    edge-spec bench --agentic --strategies auto ngram --out bench/results/mine
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from edge_spec.cli.args import add_rpc_argument, add_subcommand, rpc_servers

NAME = "bench"
DEFAULT_STRATEGIES = ("auto", "ngram", "model", "model-k2", "ngram-k4", "model-heuristic")


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = add_subcommand(sub, NAME, "speculation against the target alone, side by side", __doc__)
    bench.add_argument("--target", "-m", help="target model: manifest name or GGUF path")
    bench.add_argument("--draft", "-md", help="draft model: manifest name or GGUF path")
    bench.add_argument("--quick", action="store_true", help="2 prompts per category (CI)")
    add_rpc_argument(bench)
    bench.add_argument("--categories", nargs="+", default=None)
    bench.add_argument(
        "--strategies",
        nargs="+",
        default=list(DEFAULT_STRATEGIES),
        help="target, auto, ngram, model (the cost policy), model-kN, ngram-kN (fixed k), "
        "model-heuristic, ...; "
        "peers: lcpp-lookup[-nNgG] (llama-cpp-python's prompt lookup), cpp-lookup[-kK], "
        "cpp-speculative[-kK] (llama.cpp's C++ examples, see scripts/build_llama_examples.py)",
    )
    bench.add_argument("--temperatures", nargs="+", type=float, default=[0.0])
    bench.add_argument(
        "--max-tokens", type=int, default=None, help="per request (default 64; 384 --agentic)"
    )
    bench.add_argument("--repeats", type=int, default=1)
    bench.add_argument("--chat", action="store_true", help="use the chat form of the prompts")
    bench.add_argument(
        "--agentic",
        action="store_true",
        help="the agentic sessions instead of the prompts: multi-turn, the full history in "
        "every request, T = 0 (--categories picks scenarios)",
    )
    bench.add_argument(
        "--ctx-size", "-c", type=int, default=None, help="default 2048; 4096 with --agentic"
    )
    bench.add_argument("--threads", "-t", type=int, default=None)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", default="bench/results/latest", help="output folder")
    bench.add_argument(
        "--llama-examples",
        default=None,
        help="folder with llama-lookup and llama-speculative-simple (default: the build of "
        "scripts/build_llama_examples.py)",
    )
    bench.add_argument("--no-progress", action="store_true")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge_spec import __version__
    from edge_spec.api import EdgeSpec, EngineConfig
    from edge_spec.backend import llama_build, llama_cpp_version
    from edge_spec.bench.agentic import SCENARIOS, load_sessions, n_requests, run_agentic
    from edge_spec.bench.peers import PeerSetup, is_peer, make_peers
    from edge_spec.bench.report import markdown_table, summarize
    from edge_spec.bench.runner import parse_strategy, peak_rss_bytes, run_bench, timestamp
    from edge_spec.errors import InvalidRequestError
    from edge_spec.models.manifest import choose_pair
    from edge_spec.prompts import load_prompts

    if args.max_tokens is None:
        args.max_tokens = 384 if args.agentic else 64
    if args.ctx_size is None:
        args.ctx_size = 4096 if args.agentic else 2048
    try:
        strategies = [parse_strategy(s) for s in args.strategies if not is_peer(s)]
        peer_names = [s for s in args.strategies if is_peer(s)]
        if args.agentic:
            unknown = sorted(set(args.categories or ()) - set(SCENARIOS))
            if unknown:
                raise ValueError(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}")
            if args.temperatures != [0.0]:
                raise ValueError(
                    "the agentic sessions run at T = 0 (their history is the "
                    "target's greedy answers)"
                )
            sessions = [
                s
                for s in load_sessions()
                if args.categories is None or s.scenario in args.categories
            ]
            prompts = []
        else:
            prompts = load_prompts(quick=args.quick, categories=args.categories)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc
    if args.max_tokens < 1 or args.repeats < 1:
        raise InvalidRequestError("--max-tokens and --repeats must be >= 1")
    # --chat or --agentic without a target: the chat pair (the default pair's has no template).
    chat = args.chat or args.agentic
    target, draft = choose_pair(args.target, args.draft, chat=chat)
    config = EngineConfig(
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        use_head=args.draft is None,
        rpc_servers=rpc_servers(args),
    )
    n_entries = len(strategies) + len(peer_names) + 1
    n_requests_total = n_requests(sessions) if args.agentic else len(prompts)
    n_total = n_requests_total * len(args.temperatures) * args.repeats * n_entries
    with EdgeSpec(target, draft, config=config) as spec:
        setup = PeerSetup(
            spec.target_path,
            spec.draft_path,
            n_ctx=args.ctx_size,
            n_threads=spec.target.n_threads,
            cpp_bin_dir=args.llama_examples,
        )
        peers = make_peers(peer_names, setup)
        bar = tqdm(total=n_total, desc="bench", unit="run", disable=args.no_progress or None)
        common = dict(
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            seed=args.seed,
            peers=peers,
            on_run=lambda run: bar.update(1),
        )
        if args.agentic:
            runs = run_agentic(spec, sessions, strategies, **common)
        else:
            runs = run_bench(
                spec,
                prompts,
                strategies,
                temperatures=args.temperatures,
                chat=args.chat,
                **common,
            )
        bar.close()
        for peer in peers:
            peer.close()
        costs = spec.cost_curve() if any(s.policy == "cost" for s in strategies) else None
        target_path, draft_path = str(spec.target_path), str(spec.draft_path)
    summaries = summarize(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "created": timestamp(),
        "command": "edge-spec " + " ".join(sys.argv[1:]),
        "versions": {
            "edge_spec": __version__,
            "llama_cpp_python": llama_cpp_version(),
            "llama_cpp_build": llama_build(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "target": target_path,
        "draft": draft_path,
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "cost_curve": None
        if costs is None
        else {
            "verify_s": list(costs.verify_s),
            "draft_token_s": costs.draft_token_s,
            "ngram_s": costs.ngram_s,
        },
        "peak_rss_bytes": peak_rss_bytes(),
        "summaries": [s.to_dict() for s in summaries],
        "runs": [r.to_dict() for r in runs],
    }
    (out / "results.json").write_text(json.dumps(record, indent=1))
    tables = [markdown_table(summaries, t) for t in args.temperatures]
    (out / "results.md").write_text("\n\n".join(tables) + "\n")
    print("\n\n".join(tables))
    print(f"\nwrote {out / 'results.json'} and {out / 'results.md'}")
    if not args.no_plots:
        from edge_spec.bench.plots import write_plots

        for path in write_plots(summaries, out):
            print(f"wrote {path}")
    return 0
