"""Train or show the draft head of a target: a small network on the target's own hidden states
that drafts for it (EAGLE-style), self-distilled on this machine from the target's answers and
saved in the model cache, where `--draft-mode auto` and `head` find it. Needs the train extra
(pip install 'edge-spec[train]').

    edge-spec head train -m smollm2-135m-f16 --minutes 30
    edge-spec head show -m smollm2-135m-f16
"""

from __future__ import annotations

import argparse
import json
import sys

from edge_spec.cli.args import add_subcommand
from edge_spec.errors import InvalidRequestError

NAME = "head"


def add_parser(sub: argparse._SubParsersAction) -> None:
    head = add_subcommand(sub, NAME, "train or show the draft head for a target", __doc__)
    hsub = head.add_subparsers(dest="head_command", required=True, parser_class=type(head))
    train = hsub.add_parser(
        "train",
        help="self-distil a draft head from the target on this machine (needs edge-spec[train])",
    )
    train.add_argument("--target", "-m", required=True, help="manifest name or GGUF path")
    train.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="wall-time budget, collection included (default 30); rerun to resume",
    )
    train.add_argument(
        "--tokens",
        type=int,
        default=2_000_000,
        help="stop collecting after this many training rows (default: the time budget decides)",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", "-t", type=int, default=None)
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    show = hsub.add_parser("show", help="what the target's head was trained on and measured")
    show.add_argument("--target", "-m", required=True, help="manifest name or GGUF path")


def run(args: argparse.Namespace) -> int:
    from edge_spec.models import resolve
    from edge_spec.models.heads import find_head, load_info

    target = resolve(args.target)
    if args.head_command == "show":
        directory = find_head(target)
        if directory is None:
            raise InvalidRequestError(
                f"no draft head for {target.name}: edge-spec head train -m {args.target}"
            )
        print(json.dumps(load_info(directory).trained, indent=2))
        return 0
    if args.minutes <= 0 or args.tokens <= 0:
        raise InvalidRequestError("--minutes and --tokens must be positive")
    try:
        import onnx  # noqa: F401
    except ImportError as exc:
        raise InvalidRequestError(
            "training a head needs the onnx package: pip install 'edge-spec[train]'"
        ) from exc
    from tqdm import tqdm

    from edge_spec.headtrain.run import train_head

    bars: dict[str, tqdm] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in bars:
            for bar in bars.values():
                bar.close()
            unit = "rows" if stage == "collect" else "steps"
            total_shown = None if stage == "collect" else total
            bars[stage] = tqdm(total=total_shown, desc=stage, unit=unit, file=sys.stderr)
        bar = bars[stage]
        bar.update(done - bar.n)

    try:
        report = train_head(
            target,
            minutes=args.minutes,
            max_rows=args.tokens,
            seed=args.seed,
            n_threads=args.threads,
            progress=progress,
        )
    finally:
        for bar in bars.values():
            bar.close()
    if args.json:
        from edge_spec.headtrain.run import report_dict

        print(json.dumps(report_dict(report), indent=2))
        return 0
    eagle = report.eagle
    print(f"head for {target.name}: {report.head_dir}")
    if not report.exported:
        print("  (this run measured worse than the head already there, which was kept)")
    print(
        f"data: {report.n_train_rows} training rows in {report.collect_s:.0f} s; "
        f"trained {report.steps} steps in {report.train_s:.0f} s; total {report.total_s:.0f} s"
    )
    print(f"held-out topics, {eagle.n_rows} rows, greedy acceptance per draft position:")
    print("  position     " + " ".join(f"{j + 1:>6}" for j in range(len(eagle.conditional))))
    print("  conditional  " + " ".join(f"{a:6.3f}" for a in eagle.conditional))
    print("  cumulative   " + " ".join(f"{a:6.3f}" for a in eagle.cumulative))
    print(
        f"  top-3 at position 1: {eagle.top3_first:.3f}; Medusa-style baseline at position 1: "
        f"{report.medusa_first:.3f}; reduced vocabulary covers {report.vocab_coverage:.1%}"
    )
    return 0
