"""What the subcommands share: the parser that turns every user error into one line (exit 2), the
flags of the same meaning in generate, chat, serve and bench, and the one place that turns those
flags into an EngineConfig and a GenerationConfig."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from edge_spec.errors import InvalidRequestError
from edge_spec.modes import DRAFT_MODES
from edge_spec.policy.types import DEFAULT_K_MAX

if TYPE_CHECKING:
    from edge_spec.api.config import EngineConfig, GenerationConfig

EXIT_USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the contract for every user error.
        self.exit(EXIT_USER_ERROR, f"edge-spec: error: {message}\n")


def add_subcommand(sub: argparse._SubParsersAction, name: str, summary: str, doc: str | None):
    """A subcommand whose --help shows its one-line summary, then its module's docstring (what
    it does and an example) as the description."""
    return sub.add_parser(
        name,
        help=summary,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_model_arguments(
    parser: argparse.ArgumentParser, target_default: str, draft_help: str | None = None
) -> None:
    """--target/-m, --draft/-md and --draft-mode: which models load and which sources draft."""
    parser.add_argument(
        "--target",
        "-m",
        help=f"target model: manifest name, GGUF path, or a local store's model: "
        f"ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO[/FILE], hf:ORG/REPO[/FILE] "
        f"(`edge-spec models scan` lists them; default: {target_default})",
    )
    parser.add_argument(
        "--draft",
        "-md",
        help=draft_help
        or "draft model, named like the target (default: the manifest pair's draft for a "
        "manifest target, else the best local draft for it, printed with the reason; "
        "'self' derives one from the target)",
    )
    parser.add_argument(
        "--draft-mode",
        choices=DRAFT_MODES,
        default="auto",
        help="auto (default): per step the cost policy picks the learned draft (the target's "
        "head when one was trained, else the model draft), the n-gram lookup over the session, "
        "or a plain step; model, ngram, head: that source or a plain step; self: the draft is "
        "the target less some blocks, derived and chosen on first use; none: the target alone",
    )


def pick_models(
    args: argparse.Namespace, *, chat: bool = False, draft_mode: str = "auto"
) -> tuple[str, str | None, str | None]:
    """(target, draft, why that draft): the manifest pair for manifest names, else the best
    local draft for a target given without one (edge_spec.models.cache.pick_pair). The
    command says why with say_draft() once its models loaded (a user error stays one line)."""
    from edge_spec.models.cache import pick_pair

    target, draft, choice = pick_pair(args.target, args.draft, chat=chat, draft_mode=draft_mode)
    return target, draft, choice.reason if choice is not None else None


def say_draft(why: str | None) -> None:
    """The draft chosen for the target, and why, on stderr (nothing when none was chosen)."""
    import sys

    if why is not None:
        print(f"edge-spec: draft: {why}", file=sys.stderr)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """How the models are loaded: the same flags in generate, chat and serve."""
    parser.add_argument("--ctx-size", "-c", type=int, default=4096, help="context (default 4096)")
    parser.add_argument("--threads", "-t", type=int, default=None, help="CPU threads")
    parser.add_argument(
        "--mem-budget", default=None, help="RAM the models may use, e.g. 2G (default: free RAM)"
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="chatml, gemma, or a Jinja file (default: the model's own; a built-in for its "
        "architecture if it has none)",
    )
    add_fresh_argument(parser)
    add_rpc_argument(parser)


def add_fresh_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start the cost policy from its priors instead of what earlier runs learned on "
        "this machine for these models and settings (what it learns now replaces that)",
    )


def add_rpc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rpc",
        default=None,
        metavar="HOST:PORT[,HOST:PORT]",
        help="put the target's layers on these llama.cpp rpc-servers (edge-spec rpc-server); "
        "the draft stays on this machine",
    )
    parser.add_argument(
        "--rpc-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="with --rpc: the most one call may wait for the servers before the request ends "
        "with an error (a server that went silent; default 120)",
    )


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """--policy, --k, --k-max, --tree-nodes: the same meaning in generate, chat and serve."""
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


def add_sampling_arguments(
    parser: argparse.ArgumentParser,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> None:
    """Sampling flags (llama.cpp's names); the defaults differ between generate and chat."""
    parser.add_argument(
        "--temperature", "--temp", type=float, default=temperature, help="0: greedy (exact)"
    )
    parser.add_argument("--top-k", type=int, default=top_k)
    parser.add_argument("--top-p", type=float, default=top_p)
    parser.add_argument("--min-p", type=float, default=min_p)
    parser.add_argument(
        "--repeat-penalty",
        type=float,
        default=1.0,
        help="divide the logits of the last --repeat-last-n tokens by this (1: off)",
    )
    parser.add_argument("--repeat-last-n", type=int, default=64)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="the same seed, the same text (-1 or none given: a random one, as in llama.cpp)",
    )


def _seed(text: str) -> int | None:
    """llama.cpp's -1 means a random seed, as no seed does here."""
    seed = int(text)
    return None if seed == -1 else seed


_seed.__name__ = "seed"


def add_structured_arguments(parser: argparse.ArgumentParser) -> None:
    """Structured output: --json-schema, --grammar, --tools and --tool-choice."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--json-schema",
        metavar="FILE",
        help="answer with JSON valid under this JSON schema (a file)",
    )
    group.add_argument(
        "--grammar",
        metavar="FILE",
        help="answer in this grammar: GBNF (llama.cpp's, a .gbnf file or one with '::='), "
        "else a Lark grammar (llguidance's, 'start:' first)",
    )
    parser.add_argument(
        "--tools",
        metavar="FILE",
        help="tools the model may call: a JSON file of OpenAI function tools",
    )
    parser.add_argument(
        "--tool-choice",
        default=None,
        metavar="auto|required|none|NAME",
        help="with --tools: auto (default: text or calls), required (at least one call), "
        "none, or a function's name (a call of it)",
    )


def rpc_servers(args: argparse.Namespace) -> tuple[str, ...]:
    """--rpc as EngineConfig.rpc_servers (validated there)."""
    text = getattr(args, "rpc", None)
    return tuple(part.strip() for part in text.split(",")) if text else ()


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig of the flags generate, chat and serve share."""
    from edge_spec.api.config import EngineConfig
    from edge_spec.models.placement import parse_size

    return EngineConfig(
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        mem_budget_bytes=parse_size(args.mem_budget) if args.mem_budget else None,
        chat_template=args.chat_template,
        verify_in_child=True,  # a model file llama.cpp aborts on ends in one line, exit 2
        # A draft the user named drafts in auto, not the target's head.
        use_head=getattr(args, "draft", None) is None,
        rpc_servers=rpc_servers(args),
        rpc_timeout_s=args.rpc_timeout,
        fresh=args.fresh,
    )


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    """The GenerationConfig of the policy and sampling flags (and --stop where the command has
    it)."""
    from edge_spec.api.config import GenerationConfig
    from edge_spec.sampling import SamplingParams

    return GenerationConfig.from_kwargs(
        None,
        max_tokens=args.max_tokens,
        k=args.k,
        k_max=args.k_max,
        tree_nodes=args.tree_nodes,
        policy=args.policy,
        stop=tuple(getattr(args, "stop", None) or ()),
        sampling=SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
            repeat_penalty=args.repeat_penalty,
            repeat_last_n=args.repeat_last_n,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
        ),
        **structured_options(args),
    )


def structured_options(args: argparse.Namespace) -> dict[str, Any]:
    """--json-schema, --grammar, --tools and --tool-choice as GenerationConfig options (files
    read and checked here: a missing file or bad JSON is one line, exit 2)."""
    from edge_spec.constrain.spec import Constraint

    out: dict[str, Any] = {}
    if getattr(args, "json_schema", None):
        out["json_schema"] = _json_file(args.json_schema, "--json-schema")
    if getattr(args, "grammar", None):
        text = _text_file(args.grammar, "--grammar")
        kind = "gbnf" if args.grammar.endswith(".gbnf") or "::=" in text else "lark"
        out["grammar"] = Constraint.grammar(text, kind)
    if getattr(args, "tools", None):
        out["tools"] = _json_file(args.tools, "--tools")
    choice = getattr(args, "tool_choice", None)
    if choice is not None:
        if not out.get("tools"):
            raise InvalidRequestError("--tool-choice needs --tools")
        if choice not in ("auto", "required", "none"):
            choice = {"type": "function", "function": {"name": choice}}
        out["tool_choice"] = choice
    return out


def _text_file(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"{flag}: cannot read {path}: {exc}") from None


def _json_file(path: str, flag: str) -> Any:
    try:
        return json.loads(_text_file(path, flag))
    except ValueError as exc:
        raise InvalidRequestError(f"{flag}: {path} is not valid JSON: {exc}") from None
