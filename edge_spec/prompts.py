"""The benchmark prompt sets (package data, `prompt_sets/<name>.json`): "bench", six
Spec-Bench-like categories of eight prompts; "copy" and "copy-2", answers that re-emit text the
prompt holds (the second set written after the first had been measured, neither tuned on);
or any JSON file in the same format, by path (`edge-spec bench --prompt-set my-prompts.json`).

Every prompt comes in two forms: `completion`, plain text that a base model continues (few-shot
where a bare instruction would fail), and `messages`, a chat for instruct models whose last turn
is the user's. Categories are "input_reusing" (the answer repeats much of the prompt, where n-gram
drafts shine) or "generative".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

CATEGORY_KINDS = ("input_reusing", "generative")
MESSAGE_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. `reference` is a hand-written answer (for checks, never fed in)."""

    id: str
    category: str
    kind: str  # "input_reusing" or "generative", from the category
    completion: str
    messages: tuple[dict[str, str], ...] = field(hash=False)
    quick: bool = False
    reference: str = ""


PROMPT_SETS = ("bench", "copy", "copy-2")


def load_prompts(
    quick: bool = False, categories: Sequence[str] | None = None, prompt_set: str = "bench"
) -> list[Prompt]:
    """The prompts of a set in file order; `quick` keeps the CI subset (2 per category in the
    bench set), `categories` keeps those categories. Raises ValueError on an unknown set or
    category name or a malformed file."""
    prompts, known = _load(prompt_set)
    if categories is not None:
        unknown = sorted(set(categories) - set(known))
        if unknown:
            raise ValueError(f"unknown prompt categories {unknown}; known: {sorted(known)}")
    return [
        p
        for p in prompts
        if (not quick or p.quick) and (categories is None or p.category in categories)
    ]


def categories(prompt_set: str = "bench") -> dict[str, str]:
    """Category name -> kind ("input_reusing" or "generative"), in file order."""
    return {name: kind for name, (kind, _) in _load(prompt_set)[1].items()}


def category_descriptions(prompt_set: str = "bench") -> dict[str, str]:
    """Category name -> one-line description."""
    return {name: desc for name, (_, desc) in _load(prompt_set)[1].items()}


@lru_cache(maxsize=8)
def _load(prompt_set: str) -> tuple[tuple[Prompt, ...], dict[str, tuple[str, str]]]:
    """A set by name (package data), or a JSON file of the same format by path."""
    if prompt_set in PROMPT_SETS:
        name = f"{prompt_set}.json"
        files = resources.files("edge_spec").joinpath("prompt_sets", name)
        return parse_prompts(json.loads(files.read_text(encoding="utf-8")))
    if not prompt_set.endswith(".json"):
        raise ValueError(
            f"unknown prompt set {prompt_set!r}; known: {', '.join(PROMPT_SETS)}, or a .json "
            "file in their format"
        )
    try:
        raw = json.loads(Path(prompt_set).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read prompt set {prompt_set}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ValueError(f"prompt set {prompt_set} is not JSON: {exc}") from exc
    return parse_prompts(raw)


def parse_prompts(raw: Any) -> tuple[tuple[Prompt, ...], dict[str, tuple[str, str]]]:
    """Validate a decoded prompt set file. Returns (prompts, {category: (kind, description)}).
    Raises ValueError on a bad version, unknown category or kind, duplicate id, empty text, or
    messages that are not role/content pairs ending with the user."""
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise ValueError("prompt set: expected an object with version 1")
    known: dict[str, tuple[str, str]] = {}
    for name, info in _require(raw, "categories", dict, "file").items():
        kind = _require(info, "kind", str, f"category {name!r}")
        if kind not in CATEGORY_KINDS:
            raise ValueError(f"prompt set: category {name!r} has unknown kind {kind!r}")
        known[name] = (kind, str(info.get("description", "")))
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for item in _require(raw, "prompts", list, "file"):
        pid = _require(item, "id", str, "prompt")
        where = f"prompt {pid!r}"
        if not pid.strip() or pid in seen:
            raise ValueError(f"prompt set: empty or duplicate id {pid!r}")
        seen.add(pid)
        category = _require(item, "category", str, where)
        if category not in known:
            raise ValueError(f"prompt set: {where} has unknown category {category!r}")
        completion = _require(item, "completion", str, where)
        if not completion.strip():
            raise ValueError(f"prompt set: {where} has an empty completion")
        messages = tuple(_message(m, where) for m in _require(item, "messages", list, where))
        if not messages or messages[-1]["role"] != "user":
            raise ValueError(f"prompt set: {where} messages must end with a user turn")
        quick = item.get("quick", False)
        reference = item.get("reference", "")
        if not isinstance(quick, bool) or not isinstance(reference, str):
            raise ValueError(f"prompt set: {where} has a non-bool quick or non-str reference")
        kind = known[category][0]
        prompts.append(Prompt(pid, category, kind, completion, messages, quick, reference))
    return tuple(prompts), known


def _message(raw: Any, where: str) -> dict[str, str]:
    role = _require(raw, "role", str, where)
    content = _require(raw, "content", str, where)
    if role not in MESSAGE_ROLES or not content.strip():
        raise ValueError(f"prompt set: {where} has a bad message (role {role!r} or empty text)")
    return {"role": role, "content": content}


def _require(raw: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(raw, dict) or not isinstance(raw.get(key), kind):
        raise ValueError(f"prompt set: {where} needs {key!r} of type {kind.__name__}")
    return raw[key]
