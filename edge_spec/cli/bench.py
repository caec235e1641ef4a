"""Speculation against the target alone, side by side on this machine: the 48-prompt set (six
categories, completion or chat form) or the agentic sessions, every strategy and peer in one
interleaved run, written as JSON, Markdown and plots.

    edge-spec bench --quick                                   # 12 prompts, the default strategies
    edge-spec bench --chat --strategies auto ngram lcpp-lookup --temperatures 0 0.8
    edge-spec bench --agentic --strategies auto ngram --out bench/results/mine
    edge-spec bench --prompt-set copy --fresh-processes --strategies auto ngram
    edge-spec bench --chat --via-server --strategies auto       # through edge-spec serve

Every run also runs the target alone twice ("target", "none"): every speedup is against the
first, prompt by prompt, and the second is the run's noise floor, what an entry exactly as
fast as the target alone measures. results.md judges each entry's per-prompt ratios against it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge_spec.cli.args import (
    add_fresh_argument,
    add_rpc_argument,
    add_subcommand,
    pick_models,
    rpc_servers,
    say_draft,
)

NAME = "bench"
DEFAULT_STRATEGIES = ("auto", "ngram", "model", "model-k2", "ngram-k4", "model-heuristic")


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = add_subcommand(sub, NAME, "speculation against the target alone, side by side", __doc__)
    bench.add_argument("--target", "-m", help="target model: manifest name or GGUF path")
    bench.add_argument("--draft", "-md", help="draft model: manifest name or GGUF path")
    bench.add_argument(
        "--prompt-set",
        default="bench",
        metavar="SET",
        help="bench: 48 prompts in six categories (default); copy, copy-2: answers that "
        "re-emit what the prompt holds; or a .json file of your own prompts in their format "
        "(edge_spec/prompt_sets/copy.json is a short example)",
    )
    bench.add_argument("--quick", action="store_true", help="2 prompts per category (CI)")
    add_fresh_argument(bench)
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
        "--structured",
        action="store_true",
        help="the structured tasks instead of the prompts: extraction to JSON schemas and "
        "tool-calling agent loops, T = 0 (--categories: extraction, tool_loop; peers: lcpp, "
        "lcpp-lookup[-nNgG] get the same grammar as GBNF)",
    )
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
    where = bench.add_mutually_exclusive_group()
    where.add_argument(
        "--fresh-processes",
        action="store_true",
        help="every run as its own `edge-spec generate` process, as a one-shot user runs it "
        "(decode rate and the process's wall time)",
    )
    where.add_argument(
        "--via-server",
        action="store_true",
        help="every entry behind an `edge-spec serve` of its own, each request timed at the "
        "openai client (end to end: prefill and HTTP included)",
    )
    bench.add_argument("--no-progress", action="store_true")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge_spec.bench.agentic import SCENARIOS, load_sessions, n_requests
    from edge_spec.bench.peers import is_peer
    from edge_spec.bench.results import write_results
    from edge_spec.bench.runner import parse_strategy, plan_entries
    from edge_spec.errors import InvalidRequestError
    from edge_spec.prompts import load_prompts

    if args.max_tokens is None:
        args.max_tokens = 384 if args.agentic else 256 if args.structured else 64
    if args.ctx_size is None:
        args.ctx_size = 4096 if args.agentic else 2048
    outside = args.fresh_processes or args.via_server
    try:
        strategies = [parse_strategy(s) for s in args.strategies if not is_peer(s)]
        peer_names = [s for s in args.strategies if is_peer(s)]
        if args.fresh_processes and args.via_server:
            raise ValueError("--fresh-processes and --via-server: choose one")
        if outside and (peer_names or args.rpc):
            raise ValueError(
                "the peers and --rpc run in this process only: "
                "not with --fresh-processes or --via-server"
            )
        if args.fresh_processes and args.agentic:
            raise ValueError("--agentic runs in this process or --via-server")
        sessions = []
        prompts = []
        tasks = []
        if args.structured:
            from edge_spec.bench.structured import load_tasks

            if args.agentic or args.fresh_processes or args.temperatures != [0.0]:
                raise ValueError("--structured runs at T = 0, in this process or --via-server")
            tasks = load_tasks(args.categories)
        elif args.agentic:
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
        else:
            prompts = load_prompts(
                quick=args.quick, categories=args.categories, prompt_set=args.prompt_set
            )
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc
    if args.max_tokens < 1 or args.repeats < 1:
        raise InvalidRequestError("--max-tokens and --repeats must be >= 1")
    # --chat, --agentic or --structured without a target: the chat pair (the default pair's
    # has no template).
    chat = args.chat or args.agentic or args.structured
    target, draft, why = pick_models(args, chat=chat)
    say_draft(why)
    n_entries = len(plan_entries(strategies, [])) + len(peer_names)
    n_requests_total = n_requests(sessions) if args.agentic else len(prompts) + len(tasks)
    n_total = n_requests_total * len(args.temperatures) * args.repeats * n_entries
    bar = tqdm(total=n_total, desc="bench", unit="run", disable=args.no_progress or None)
    common = dict(
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        seed=args.seed,
        on_run=lambda run: bar.update(1),
    )
    costs = None
    if outside:
        from edge_spec.bench.outside import Setup, run_fresh_processes, run_via_server
        from edge_spec.models import resolve

        setup = Setup(
            str(resolve(target)),
            str(resolve(draft)) if draft else None,
            args.ctx_size,
            args.threads,
            fresh=args.fresh,
        )
        if args.fresh_processes:
            runs = run_fresh_processes(
                setup, prompts, strategies, chat=chat, temperatures=args.temperatures, **common
            )
        else:
            runs = run_via_server(
                setup,
                prompts,
                strategies,
                chat=chat,
                temperatures=args.temperatures,
                sessions=sessions,
                tasks=tasks,
                **common,
            )
        target_path, draft_path = setup.target, setup.draft
    else:
        runs, costs, target_path, draft_path = _in_process(
            args, target, draft, strategies, peer_names, prompts, sessions, tasks, common
        )
    bar.close()
    text, files = write_results(
        Path(args.out),
        runs,
        command="edge-spec " + " ".join(sys.argv[1:]),
        target=target_path,
        draft=draft_path,
        settings={k: v for k, v in vars(args).items() if k != "func"},
        temperatures=args.temperatures,
        costs=costs,
        sessions=args.agentic,
        plots=not args.no_plots,
    )
    print(text)
    for path in files:
        print(f"wrote {path}")
    return 0


def _in_process(args, target, draft, strategies, peer_names, prompts, sessions, tasks, common):
    """The bench in this process: one EdgeSpec, every entry on it (the peers beside it)."""
    from edge_spec.api import EdgeSpec, EngineConfig
    from edge_spec.bench.agentic import run_agentic
    from edge_spec.bench.peers import PeerSetup, make_peers
    from edge_spec.bench.runner import run_bench

    config = EngineConfig(
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        # A named draft drafts in auto, not the target's head (as in generate and serve), unless
        # the run asks for the head by name: then both are loaded and auto may use either (the
        # Python API's default, use_head=True).
        use_head=args.draft is None or any(s.draft_mode == "head" for s in strategies),
        rpc_servers=rpc_servers(args),
        rpc_timeout_s=args.rpc_timeout,
        fresh=args.fresh,
    )
    with EdgeSpec(target, draft, config=config) as spec:
        setup = PeerSetup(
            spec.target_path,
            spec.draft_path,
            n_ctx=args.ctx_size,
            n_threads=spec.target.n_threads,
            cpp_bin_dir=args.llama_examples,
        )
        peers = make_peers(peer_names, setup)
        try:
            if args.structured:
                from edge_spec.bench.structured import run_structured_in_process

                runs = run_structured_in_process(spec, tasks, strategies, peers=peers, **common)
            elif args.agentic:
                runs = run_agentic(spec, sessions, strategies, peers=peers, **common)
            else:
                runs = run_bench(
                    spec,
                    prompts,
                    strategies,
                    temperatures=args.temperatures,
                    chat=args.chat,
                    peers=peers,
                    **common,
                )
        finally:
            for peer in peers:
                peer.close()
        costs = spec.cost_curve() if any(s.policy == "cost" for s in strategies) else None
        return runs, costs, str(spec.target_path), str(spec.draft_path)
