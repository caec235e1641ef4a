"""Rendering a conversation with the GGUF's own chat template (Jinja2, sandboxed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InvalidRequestError

ROLES = ("system", "user", "assistant", "tool")


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
) -> str:
    """Requires a template (from the GGUF metadata) and messages with a known role and string
    content; returns the prompt text. Raises InvalidRequestError otherwise."""
    if not template:
        raise InvalidRequestError(
            "the target model has no chat template; use generate() with a plain prompt"
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
        raise InvalidRequestError(f"chat template failed to render: {exc}") from exc
