"""An interactive chat in the terminal, on any pair (the chat pair by default).

Multi-turn history goes through the target's chat template; answers stream as they are
verified, with the text that came from accepted drafts marked in colour; each turn ends with a
one-line summary (speed, drafted/accepted, which sources drafted). Ctrl-C stops the answer and
keeps the conversation, Ctrl-D leaves; the oldest turns are dropped, with a notice, when the
history no longer fits the context. All output goes through one `Terminal` (colour only on a
terminal, and never with --no-color or NO_COLOR).

    edge-spec chat
    edge-spec chat --system "Answer in one sentence." --temperature 0
    edge-spec chat -m ~/models/qwen2.5-0.5b-instruct-q8_0.gguf --draft-mode ngram
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

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
from edge_spec.errors import EdgeSpecError

HELP = """commands:
  /help    this text
  /reset   forget the conversation (and the drafting session built from it)
  /stats   totals for this session: tokens, speed, drafted and accepted per source
  /exit    leave (as does Ctrl-D)
keys: Ctrl-C stops the answer being written; a line ending in \\ continues on the next.
marked text came from accepted draft tokens (verified by the target, so it is the target's)."""

# ANSI styles: accepted-draft text, notices, the per-turn summary.
DRAFTED, NOTICE, DIM, RESET = "\033[36m", "\033[33m", "\033[2m", "\033[0m"
DEFAULT_MAX_TOKENS = 512
NAME = "chat"


def add_parser(sub: argparse._SubParsersAction) -> None:
    chat = add_subcommand(sub, NAME, "an interactive chat in the terminal", __doc__)
    add_model_arguments(chat, "the chat pair's")
    add_policy_arguments(chat)
    add_engine_arguments(chat)
    chat.add_argument("--system", default=None, help="a system message opening the chat")
    chat.add_argument("--max-tokens", "-n", type=int, default=DEFAULT_MAX_TOKENS)
    # llama.cpp's sampling defaults: what a chat user of llama-cli gets.
    add_sampling_arguments(chat, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    add_structured_arguments(chat)
    chat.add_argument("--no-color", action="store_true", help="never colour the output")


def run(args: argparse.Namespace) -> int:
    from edge_spec.api import EdgeSpec

    config = generation_config(args)
    target, draft, why = pick_models(args, chat=True, draft_mode=args.draft_mode)
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:  # pragma: no cover - not on every platform
        pass
    if sys.stdin.isatty():
        # An interactive chat answers Ctrl-C even when it was started with SIGINT ignored (a
        # background job of a non-interactive shell, `(nohup ... &)`): Python then installs no
        # KeyboardInterrupt handler of its own.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    term = Terminal(sys.stdout, color=_wants_color(sys.stdout, args.no_color))
    term.notice(f"loading {target}" + (f" with draft {draft}" if draft else ""))
    with EdgeSpec(target, draft, draft_mode=args.draft_mode, config=engine_config(args)) as spec:
        spec.draft  # noqa: B018 - a session lives long: its draft loads now, not in an answer
        say_draft(why)
        session = ChatSession(spec, config, term, system=args.system)
        term.notice(session.banner())
        return session.loop()


def _wants_color(stream: TextIO, no_color: bool) -> bool:
    return not no_color and not os.environ.get("NO_COLOR") and stream.isatty()


class Terminal:
    """Where the chat writes: answers (drafted runs marked), notices and summaries."""

    def __init__(self, out: TextIO, color: bool) -> None:
        self.out, self.color = out, color

    def _styled(self, text: str, style: str) -> str:
        return f"{style}{text}{RESET}" if self.color and text else text

    def answer(self, spans: Any) -> None:
        for text, from_draft in spans:
            self.out.write(self._styled(text, DRAFTED) if from_draft else text)
        self.out.flush()

    def notice(self, text: str) -> None:
        self.out.write(self._styled(f"[{text}]", NOTICE) + "\n")
        self.out.flush()

    def summary(self, text: str) -> None:
        self.out.write(self._styled(f"[{text}]", DIM) + "\n")
        self.out.flush()

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()


@dataclass
class Totals:
    turns: int = 0
    generated: int = 0
    decode_s: float = 0.0
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)

    def add(self, stats: Any) -> None:
        self.turns += 1
        self.generated += stats.n_generated
        self.decode_s += stats.total_s - stats.prefill_s
        for name, n in stats.drafted_by_source.items():
            self.drafted[name] = self.drafted.get(name, 0) + n
        for name, n in stats.accepted_by_source.items():
            self.accepted[name] = self.accepted.get(name, 0) + n


class ChatSession:
    """One conversation on one EdgeSpec: the history, the turn loop and the commands."""

    def __init__(self, spec: Any, config: Any, term: Terminal, system: str | None = None) -> None:
        self.spec, self.config, self.term = spec, config, term
        self.system = [{"role": "system", "content": system}] if system else []
        self.history: list[dict[str, str]] = []
        self.totals = Totals()
        self.n_prompt = 0  # tokens of the last prompt: how full the context is

    def banner(self) -> str:
        spec = self.spec
        draft = spec.draft_path.stem if spec.draft_path else "none"
        return (
            f"edge-spec chat: {spec.target_path.stem}, draft {draft} ({spec.default_draft_mode}), "
            f"chat template {spec.chat_template.describe()}, context {spec.target.n_ctx}; "
            "/help for commands, Ctrl-C stops an answer, Ctrl-D exits"
        )

    def loop(self) -> int:
        while True:
            try:
                text = self._read()
            except EOFError:  # Ctrl-D
                self.term.line()
                return 0
            except KeyboardInterrupt:  # Ctrl-C at the prompt: nothing to stop
                self.term.line()
                self.term.notice("Ctrl-D exits")
                continue
            if not text.strip():
                continue
            if text.strip().startswith("/"):
                if self.command(text.strip()) == "exit":
                    return 0
                continue
            self.turn(text)

    def _read(self) -> str:
        lines = [input("> ")]
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            lines.append(input(". "))
        return "\n".join(lines)

    def command(self, text: str) -> str | None:
        name = text.split()[0]
        if name in ("/exit", "/quit"):
            return "exit"
        if name == "/help":
            self.term.line(HELP)
        elif name == "/reset":
            self.history.clear()
            self.spec.clear_session()
            self.term.notice("the conversation is forgotten")
        elif name == "/stats":
            self.term.line(self.stats())
        else:
            self.term.notice(f"unknown command {name}; /help lists them")
        return None

    def stats(self) -> str:
        t = self.totals
        drafted, accepted = sum(t.drafted.values()), sum(t.accepted.values())
        speed = t.generated / t.decode_s if t.decode_s else 0.0
        rate = f"{accepted / drafted:.2f}" if drafted else "-"
        return "\n".join(
            [
                f"turns: {t.turns}, tokens generated: {t.generated}, {speed:.1f} tokens/s",
                f"drafted {drafted}, accepted {accepted} (acceptance {rate}); "
                + _by_source(t.drafted, t.accepted),
                f"context: {self.n_prompt} of {self.spec.target.n_ctx} tokens in the last prompt; "
                f"{len(self.history) // 2} turns kept",
            ]
        )

    def turn(self, text: str | None) -> None:
        """One exchange (text None: the answer after tool results). Ctrl-C anywhere in it
        (fitting the history included) stops it between two decode steps, so the engine and
        both KV caches stay consistent. An answer that calls tools asks for each call's
        result, then goes on."""
        pieces: list[str] = []
        result = None
        with _sigint_flag() as interrupted:
            asked = [] if text is None else [{"role": "user", "content": text}]
            messages = self._fit([*self.history, *asked])
            if messages is None:
                return
            if interrupted():
                self.term.notice("stopped before the answer began")
                return
            stream = self.spec.stream_chat(messages, self.config)
            try:
                for delta in stream:
                    if interrupted():
                        break
                    self.term.answer(delta.spans)
                    pieces.append(delta.text)
                    result = delta.result
            except EdgeSpecError as exc:
                self.term.line()
                self.term.notice(f"error: {exc}")
                return
            finally:
                stream.close()
        self.term.line()
        answer = "".join(pieces)
        if result is None and not answer:
            self.term.notice("stopped before the answer began")
            return
        reply: dict[str, Any] = {"role": "assistant", "content": answer}
        if result is not None and result.tool_calls:
            reply = {
                "role": "assistant",
                "content": result.content or "",
                "tool_calls": [call.to_dict() for call in result.tool_calls],
            }
        self.history = [*messages[len(self.system) :], reply]
        if result is None:
            self.term.notice(
                f"stopped; the partial answer ({len(''.join(pieces))} characters) is kept"
            )
            return
        self.totals.add(result.stats)
        self.n_prompt = result.stats.n_prompt_tokens
        self.term.summary(_turn_summary(result))
        if result.tool_calls:
            self._tool_results(result.tool_calls)

    def _tool_results(self, calls: Any) -> None:
        """Each call's result, typed by the user (this terminal runs no tools), then the
        model's next answer. Ctrl-D or an empty line skips the rest."""
        for call in calls:
            self.term.notice(f"tool call {call.name} {call.arguments}")
            try:
                value = input("tool result> ")
            except (EOFError, KeyboardInterrupt):
                self.term.line()
                value = ""
            if not value.strip():
                self.term.notice("no result given: the conversation waits for your message")
                return
            self.history.append({"role": "tool", "tool_call_id": call.id, "content": value})
        self.turn(None)

    def _fit(self, turns: list[dict[str, str]]) -> list[dict[str, str]] | None:
        """The system message and the most recent turns that fit the context with room for an
        answer; the oldest turns are dropped with a notice. None (with a notice) when even the
        new message alone does not fit."""
        n_ctx = self.spec.target.n_ctx
        room = min(self.config.max_tokens, n_ctx // 2)
        dropped = 0
        while True:
            messages = [*self.system, *turns]
            prompt = self.spec.render_chat(messages, self.config.tools)
            n_prompt = len(self.spec.tokenize(prompt))
            if n_prompt + room <= n_ctx or (len(turns) == 1 and n_prompt < n_ctx - 16):
                break
            if len(turns) == 1:
                self.term.notice(
                    f"that message is {n_prompt} tokens, too long for the context of {n_ctx}; "
                    "not sent"
                )
                return None
            turns = turns[2:] if turns[0]["role"] == "user" and len(turns) > 2 else turns[1:]
            dropped += 1
        if dropped:
            self.history = turns[:-1]
            self.term.notice(
                f"dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to fit the "
                f"context of {n_ctx} tokens"
            )
        return messages


def _turn_summary(result: Any) -> str:
    s = result.stats
    parts = [f"{s.n_generated} tokens, {s.tokens_per_s:.1f} tok/s"]
    if s.n_drafted:
        parts.append(
            f"drafted {s.n_drafted}, accepted {s.n_accepted} ({s.acceptance_rate:.2f}); "
            + _by_source(s.drafted_by_source, s.accepted_by_source)
        )
    else:
        parts.append("no drafts")
    if result.finish_reason not in ("eos", "stop"):
        parts.append(f"finish: {result.finish_reason}")
    return " · ".join(parts)


def _by_source(drafted: dict[str, int], accepted: dict[str, int]) -> str:
    if not drafted:
        return "no source drafted"
    return ", ".join(f"{name} {accepted.get(name, 0)}/{n}" for name, n in sorted(drafted.items()))


@contextmanager
def _sigint_flag() -> Iterator[Any]:
    """While generating, Ctrl-C sets a flag instead of raising: the answer stops after the
    current step, with the engine and both KV caches in a consistent state."""
    hit = [False]

    def on_sigint(signum: int, frame: Any) -> None:
        hit[0] = True

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: Ctrl-C keeps its default meaning
        yield lambda: False
        return
    try:
        yield lambda: hit[0]
    finally:
        signal.signal(signal.SIGINT, previous)
