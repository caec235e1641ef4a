"""List the manifest's models and whether they are ready, fetch and derive them into the cache
($EDGE_SPEC_CACHE, default ~/.cache/edge_spec), or list the GGUF models already on this machine
(Ollama, LM Studio, the Hugging Face cache, llama.cpp's cache, $EDGE_SPEC_MODEL_PATH) by the
names --target/--draft take.

    edge-spec models list
    edge-spec models prepare              # the default set: both pairs
    edge-spec models prepare --all
    edge-spec models scan                 # every local GGUF, one line each
    edge-spec models scan --json
    edge-spec models scan --drafts-for ollama:llama3.2:3b
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
    scan = msub.add_parser(
        "scan", help="list the GGUF models in Ollama, LM Studio, Hugging Face and llama.cpp stores"
    )
    scan.add_argument("--json", action="store_true", help="one JSON list instead of lines")
    scan.add_argument(
        "--drafts-for",
        metavar="TARGET",
        help="rank the local models that could draft for TARGET (size, vocabulary, measured "
        "cost where a device profile exists)",
    )


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
    if args.models_command == "scan":
        return _scan(args)
    paths = models.prepare(args.names or None, all=args.all, force=args.force, progress=True)
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


def _scan(args: argparse.Namespace) -> int:
    import json

    from edge_spec.errors import ModelFileError
    from edge_spec.models import draft_choice, stores
    from edge_spec.models.cache import resolve

    if args.drafts_for:
        target = resolve(args.drafts_for)
        ranked = draft_choice.rank_drafts(target)
        rows = [dict(c.to_dict(), measured_c=_measured_c(target, c.found.path)) for c in ranked]
        if args.json:
            print(json.dumps({"target": str(target), "drafts": rows}, indent=1))
            return 0
        if not rows:
            print(draft_choice.choose_draft(target).reason)
            return 0
        for i, row in enumerate(rows, 1):
            cost = f", measured c {row['measured_c']:.2f}" if row["measured_c"] else ""
            print(f"{i}. {row['name']}  ({row['reason']}{cost})")
        return 0
    rows = []
    for found in draft_choice.local_models():
        row: dict = {"name": found.name, "store": found.store, "path": str(found.path)}
        try:
            row.update(stores.model_facts(found.path).to_dict())
        except ModelFileError as exc:
            row["error"] = str(exc)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no GGUF models found in the Ollama, LM Studio, Hugging Face or llama.cpp stores")
        return 0
    for row in rows:
        if "error" in row:
            print(f"{row['name']}  INVALID: {row['error']}")
            continue
        template = "chat" if row["chat_template"] else "no-template"
        print(
            f"{row['name']}  {row['architecture']} {row['n_params'] / 1e9:.2f}B "
            f"{row['size_bytes'] / 2**20:.0f} MiB {row['quantization']} "
            f"ctx {row['n_ctx_train']} vocab {row['vocab']} {template}  {row['path']}"
        )
    return 0


def _measured_c(target, draft) -> float | None:
    """The draft's one-token cost over the target's from a device profile measured here for
    this pair, where there is one (nothing is measured)."""
    from edge_spec.device.profile import load_profile, profile_path
    from edge_spec.errors import EdgeSpecError

    try:
        path = profile_path(target, draft)
        if not path.is_file():
            return None
        profile = load_profile(path)
    except (EdgeSpecError, OSError):
        return None
    if profile.draft is None or not profile.target.verify_s:
        return None
    return profile.draft.verify_s[0] / profile.target.verify_s[0]
