"""Rendering a conversation with a chat template (Jinja2, sandboxed): the GGUF's own, one the
user names, or -- for a model that has none, as llama.cpp falls back -- a built-in one.

A template comes with the model file, so it is untrusted code: it runs in Jinja's immutable
sandbox (no attribute escapes), and within bounds -- at most RENDER_STEPS loop iterations,
calls and attribute reads, RENDER_SECONDS of time, and an output of RENDER_OUTPUT_CHARS plus
the messages' own size -- so that a template that loops for billions of iterations, recurses
or multiplies strings is one clear error, not a held worker.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_spec.errors import InvalidRequestError

ROLES = ("system", "user", "assistant", "tool")
# OpenAI's newer clients send the app's instructions as "developer"; templates know "system"
# (llama.cpp maps it the same way, PR 20215).
ROLE_ALIASES = {"developer": "system"}

# llama.cpp's fallback (common/chat.cpp, CHATML_TEMPLATE_SRC), for a model with no template.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's turn format (its vocabulary has <start_of_turn> / <end_of_turn> as control tokens,
# base models included); Gemma has no system role: the system text opens the first user turn.
# No BOS here: tokenizing the prompt adds the model's BOS.
GEMMA = (
    "{% set first = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set first.system = message['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + first.system + message['content'] + '<end_of_turn>\n' }}"
    "{% set first.system = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
BUILTIN_TEMPLATES = {"chatml": CHATML, "gemma": GEMMA}
RENDER_STEPS = 1_000_000
RENDER_SECONDS = 2.0
RENDER_OUTPUT_CHARS = 1 << 20


@dataclass(frozen=True)
class ChatTemplate:
    """The template a model's chats are rendered with, and where it came from: "model" (the
    GGUF's own), "user" (--chat-template) or "fallback" (the model has none)."""

    source: str
    text: str
    name: str  # a built-in's name, "file", or "gguf"

    def describe(self) -> str:
        return {"model": "the model's own", "user": f"given ({self.name})"}.get(
            self.source, f"built-in {self.name} (the model has none)"
        )


def choose_template(
    override: str | None, model_template: str | None, architecture: str
) -> ChatTemplate:
    """The user's template (a built-in name or a file of Jinja) over the model's own; for a
    model without one, the built-in for its architecture (Gemma's turns for gemma*, else
    ChatML, llama.cpp's fallback). Raises InvalidRequestError for an unreadable file."""
    if override:
        if override in BUILTIN_TEMPLATES:
            return ChatTemplate("user", BUILTIN_TEMPLATES[override], override)
        path = Path(override)
        try:
            return ChatTemplate("user", path.read_text(encoding="utf-8"), "file")
        except (OSError, UnicodeDecodeError) as exc:
            names = ", ".join(BUILTIN_TEMPLATES)
            raise InvalidRequestError(
                f"--chat-template must be one of {names} or a readable Jinja file: {override}"
            ) from exc
    if model_template:
        return ChatTemplate("model", model_template, "gguf")
    name = "gemma" if architecture.startswith("gemma") else "chatml"
    return ChatTemplate("fallback", BUILTIN_TEMPLATES[name], name)


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Requires a template and messages with a known role and string content (an assistant's
    may be empty beside its tool_calls); returns the prompt text. tools, and the messages'
    tool_calls, tool_call_id and name, go to templates that render tools themselves. Raises
    InvalidRequestError otherwise, naming the fix when the template itself fails."""
    if not template:
        raise InvalidRequestError(
            "the target model has no chat template: pass one with --chat-template "
            f"({', '.join(BUILTIN_TEMPLATES)} or a Jinja file), or send a plain prompt"
        )
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {role, content}")
    clean: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"message {i} is not an object")
        role, content = message.get("role"), message.get("content")
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise InvalidRequestError(f"message {i} has unknown role {role!r}")
        if content is None and message.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {i} content must be a string")
        item: dict[str, Any] = {"role": role, "content": content}
        for key in ("tool_calls", "tool_call_id", "name"):
            if message.get(key) is not None:
                item[key] = message[key]
        clean.append(item)

    from jinja2 import TemplateError

    def raise_exception(message: str) -> None:
        raise InvalidRequestError(f"chat template refused the messages: {message}")

    max_chars = RENDER_OUTPUT_CHARS + 4 * sum(len(m["content"]) for m in clean)
    env = _bounded_environment()
    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.template_class.from_code(env, _compiled(template), env.make_globals(None))
        chunks = compiled.generate(
            messages=clean,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **({"tools": list(tools)} if tools else {}),
        )
        return _joined(chunks, max_chars)
    except (TemplateError, RecursionError, MemoryError, OverflowError, _Runaway) as exc:
        raise InvalidRequestError(
            f"the chat template failed to render ({exc}); pass a working one with "
            f"--chat-template ({', '.join(BUILTIN_TEMPLATES)} or a Jinja file), or send a "
            "plain prompt"
        ) from exc
    except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as exc:
        raise InvalidRequestError(f"the chat template failed to render: {exc!r}") from exc


class _Runaway(Exception):
    """A template past its work, time or output bound."""


def _joined(chunks: Iterator[str], max_chars: int) -> str:
    out: list[str] = []
    n = 0
    for chunk in chunks:
        n += len(chunk)
        if n > max_chars:
            raise _Runaway(f"its output passed {max_chars} characters")
        out.append(chunk)
    return "".join(out)


@functools.lru_cache(maxsize=32)
def _compiled(template: str) -> Any:
    """The template's compiled code, kept: compiling a chat template took 4 ms (SmolLM2's
    ChatML, on this 2-core machine), paid on every chat request before. Every bounded
    environment compiles alike (same options, same sandbox), so one's code runs in another;
    each render still gets its own environment and budget."""
    return _bounded_environment().compile(template)


def _bounded_environment() -> Any:
    """An immutable sandbox whose every call, attribute or item read, loop step over range()
    and string or list product is counted against one budget (steps and seconds)."""
    return _bounded_class()()


@functools.lru_cache(maxsize=1)
def _bounded_class() -> type:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        intercepted_binops = frozenset(["*", "**"])

        def __init__(self) -> None:
            super().__init__(trim_blocks=True, lstrip_blocks=True)
            self.steps = 0
            self.deadline = time.perf_counter() + RENDER_SECONDS
            self.globals["range"] = self._range

        def tick(self, n: int = 1) -> None:
            self.steps += n
            if self.steps > RENDER_STEPS:
                raise _Runaway(f"it took more than {RENDER_STEPS} steps")
            if self.steps % 1024 < n and time.perf_counter() > self.deadline:
                raise _Runaway(f"it ran longer than {RENDER_SECONDS:g} s")

        def _range(self, *args: int) -> Iterator[int]:
            for i in range(*args):
                self.tick()
                yield i

        def call(self, context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
            self.tick()
            return super().call(context, obj, *args, **kwargs)

        def getattr(self, obj: Any, attribute: str) -> Any:
            self.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            self.tick()
            return super().getitem(obj, argument)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**":
                if isinstance(right, int) and abs(right) > 64:
                    raise _Runaway(f"a power of {right}")
                return left**right
            size = 1
            for side, other in ((left, right), (right, left)):
                if isinstance(side, int) and hasattr(other, "__len__"):
                    size = side * len(other)
            self.tick(max(size, 1))
            if size > RENDER_OUTPUT_CHARS:
                raise _Runaway(f"a product of {size} items")
            return left * right

    return Bounded
