"""Replay recorded acceptance traces against device profiles (bundled
Jetson, Apple, desktop-GPU and CPU curves, or one measured here) with every k policy, and print
what each would make of them. Projections, not measurements: the traces hold what the models
accepted; the device curves say what each step would cost there.

    edge-spec simulate                                   # the bundled traces, every profile
    edge-spec simulate --profiles jetson-agx-orin-mmq --policies cost fixed-model
"""

from __future__ import annotations

import argparse
import json

from edge_spec.cli.args import add_subcommand
from edge_spec.simulate.curves import list_profiles
from edge_spec.simulate.report import format_report, run_report
from edge_spec.simulate.traces import DEFAULT_TRACES

NAME = "simulate"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    sim = add_subcommand(
        sub, NAME, "replay acceptance traces against device profiles, every policy", __doc__
    )
    sim.add_argument(
        "traces",
        nargs="*",
        help=f"trace files or folders (default: {DEFAULT_TRACES})",
    )
    sim.add_argument(
        "--profiles",
        nargs="+",
        default=None,
        help="device profile names or JSON files (default: all bundled: "
        + ", ".join(list_profiles())
        + ")",
    )
    sim.add_argument(
        "--policies",
        nargs="+",
        default=None,
        help="policy names or prefixes, e.g. cost heuristic fixed-ngram (default: all)",
    )
    sim.add_argument("--k-max", type=int, default=8)
    sim.add_argument(
        "--draft-c",
        default="profile",
        help="the model draft's cost ratio c on every device: 'profile' (each profile's own, "
        "the default; for draft-head traces the recorded one), 'trace' (the one measured when "
        "the traces were recorded) or a number",
    )
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    return sim


def run(args: argparse.Namespace) -> int:
    data = run_report(
        args.traces or [str(DEFAULT_TRACES)], args.profiles, args.policies, args.k_max, args.draft_c
    )
    print(json.dumps(data, indent=1) if args.json else format_report(data))
    return 0
