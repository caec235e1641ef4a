"""Rendering a conversation with a chat template (Jinja2, sandboxed): the GGUF's own, one the
user names, or -- for a model that has none, as llama.cpp falls back -- a built-in one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidRequestError

ROLES = ("system", "user", "assistant", "tool")

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
) -> str:
    """Requires a template and messages with a known role and string content; returns the
    prompt text. Raises InvalidRequestError otherwise, naming the fix when the template itself
    fails."""
    if not template:
        raise InvalidRequestError(
            "the target model has no chat template: pass one with --chat-template "
            f"({', '.join(BUILTIN_TEMPLATES)} or a Jinja file), or send a plain prompt"
        )
    if isinstance(messages, (str, bytes)) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {role, content}")
    clean: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"message {i} is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise InvalidRequestError(f"message {i} has unknown role {role!r}")
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {i} content must be a string")
        clean.append({"role": role, "content": content})

    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise InvalidRequestError(f"chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=clean,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateError as exc:
        raise InvalidRequestError(
            f"the chat template failed to render ({exc}); pass a working one with "
            f"--chat-template ({', '.join(BUILTIN_TEMPLATES)} or a Jinja file), or send a "
            "plain prompt"
        ) from exc
