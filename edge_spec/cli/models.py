"""List the manifest's models and whether they are ready, or fetch and derive them into the cache
($EDGE_SPEC_CACHE, default ~/.cache/edge_spec).

    edge-spec models list
    edge-spec models prepare              # the default set: both pairs
    edge-spec models prepare --all
"""

from __future__ import annotations

import argparse

from edge_spec.cli.args import Parser, add_subcommand

NAME = "models"


def add_parser(sub: argparse._SubParsersAction) -> None:
    models = add_subcommand(sub, NAME, "list or prepare the registry models", __doc__)
    msub = models.add_subparsers(dest="models_command", required=True, parser_class=Parser)
    msub.add_parser("list", help="show the manifest's models and whether they are ready")
    prep = msub.add_parser("prepare", help="fetch and derive models into the cache")
    prep.add_argument("names", nargs="*", help="model names (default: the default set)")
    prep.add_argument("--all", action="store_true", help="every model in the manifest")
    prep.add_argument("--force", action="store_true", help="rebuild even if present")


def run(args: argparse.Namespace) -> int:
    from edge_spec import models

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
