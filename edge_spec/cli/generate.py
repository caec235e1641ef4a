"""Generate one answer speculatively, stream it, and report how it was drafted and verified.

edge-spec generate "The history of the bicycle begins"          # the default pair
edge-spec generate --chat "Write a haiku about rain."            # the chat pair, templated
edge-spec generate --draft-mode none "..."                       # the target alone
edge-spec generate --json --temperature 0.8 --seed 1 "..."       # one JSON object
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from edge_spec.cli.args import (
    add_engine_arguments,
    add_model_arguments,
    add_policy_arguments,
    add_sampling_arguments,
    add_structured_arguments,
    add_subcommand,
    engine_config,
    generation_config,
    pick_models,
    say_draft,
)
from edge_spec.errors import InvalidRequestError

NAME = "generate"


def add_parser(sub: argparse._SubParsersAction) -> None:
    gen = add_subcommand(
        sub, NAME, "generate text speculatively and report its statistics", __doc__
    )
    gen.add_argument("prompt", nargs="?", help="the prompt (default: read --prompt-file or stdin)")
    gen.add_argument(
        "-p",
        "--prompt",
        dest="prompt_text",
        metavar="TEXT",
        help="the prompt, as llama.cpp's tools take it (instead of the argument)",
    )
    gen.add_argument("--prompt-file", help="read the prompt from this file")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as one user message through the chat template",
    )
    add_model_arguments(gen, "the default pair's; with --chat the chat pair's")
    add_policy_arguments(gen)
    gen.add_argument("--max-tokens", "-n", type=int, default=128)
    add_sampling_arguments(gen)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_structured_arguments(gen)
    add_engine_arguments(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument(
        "--logprobs",
        type=int,
        metavar="N",
        help="with --json: each token's logprob under the target and its N likeliest (0-20)",
    )


def run(args: argparse.Namespace) -> int:
    from edge_spec.api import EdgeSpec

    prompt = _read_prompt(args)
    # --draft is ignored by the draft-free modes, so one command line switches between them;
    # --chat without a target takes the chat pair (the default pair's target is a base model).
    target, draft, why = pick_models(args, chat=args.chat, draft_mode=args.draft_mode)
    config = generation_config(args)
    if args.logprobs is not None:
        if not args.json:
            raise InvalidRequestError("--logprobs needs --json (they are printed in it)")
        config = replace(config, logprobs=args.logprobs)
    with EdgeSpec(target, draft, draft_mode=args.draft_mode, config=engine_config(args)) as spec:
        say_draft(why)
        if args.chat:
            prompt = spec.render_chat([{"role": "user", "content": prompt}], config.tools)
        if args.json:
            result = spec.generate(prompt, config)
            out = result.to_dict()
            if why is not None:
                out["draft_choice"] = why
            print(json.dumps(out, indent=2))
            return 0
        result = None
        for delta in spec.stream(prompt, config):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            result = delta.result
        sys.stdout.write("\n")
    assert result is not None
    print(summary(result), file=sys.stderr)
    return 0


def _read_prompt(args: argparse.Namespace) -> str:
    given = [args.prompt is not None, args.prompt_text is not None, bool(args.prompt_file)]
    if sum(given) > 1:
        raise InvalidRequestError(
            "give the prompt one way: as an argument, with --prompt or with --prompt-file"
        )
    if args.prompt_text is not None:
        return str(args.prompt_text)
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


def summary(result: object) -> str:
    """The statistics block printed after a streamed answer."""
    from edge_spec.api import GenerationResult

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
            *_structured_lines(result),
        ]
    )


def _structured_lines(result: Any) -> list[str]:
    """What a constrained answer adds: its tool calls, and the grammar's state and cost."""
    lines = [f"tool call: {c.name} {c.arguments}" for c in result.tool_calls]
    if result.constraint_complete is not None:
        s = result.stats
        per_token_ms = 1e3 * s.constraint_s / max(s.n_generated, 1)
        forced = s.accepted_by_source.get("grammar", 0)
        lines.append(
            f"grammar: {'complete' if result.constraint_complete else 'INCOMPLETE (cut short)'}"
            f", {forced} forced tokens accepted, masks {per_token_ms:.3f} ms per token"
        )
    return lines
