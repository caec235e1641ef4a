"""The structured category of the bench (`edge-spec bench --structured`): extraction of a text
into its JSON schema, and tool-calling agent loops -- a request with tools, the call, the tool's
result quoted back, the next call or the final answer -- every entry answering the same
requests, whose history is the constrained target alone's own answers (at T = 0 every exact
entry writes them anyway). Package data: structured.json."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from edge_spec.bench.runner import TARGET, Run, Strategy, plan_entries
from edge_spec.prompts import Prompt

KIND = "structured"
CATEGORIES = ("extraction", "tool_loop")
MAX_LOOP_TURNS = 3  # a loop ends at its answer without calls, or after this many requests


@dataclass(frozen=True)
class Task:
    id: str
    category: str  # "extraction" or "tool_loop"
    request: str  # the user's message
    schema: dict[str, Any] | None = None  # extraction: the answer's JSON schema
    tools: tuple[dict[str, Any], ...] = ()  # tool loops: OpenAI function tools
    results: tuple[tuple[str, str], ...] = ()  # each tool's canned result

    def options(self, turn: int) -> dict[str, Any]:
        """The request's structured options: the schema, or the tools (a call required on the
        first request of a loop, the model's choice after it)."""
        if self.schema is not None:
            fmt = {"name": "answer", "schema": self.schema, "strict": True}
            return {"response_format": {"type": "json_schema", "json_schema": fmt}}
        return {"tools": list(self.tools), "tool_choice": "required" if turn == 0 else "auto"}

    def follow_up(
        self, messages: list[dict[str, Any]], content: str | None, calls: Sequence[Any]
    ) -> list[dict[str, Any]] | None:
        """The next request's messages after an answer with these calls (None: the loop is
        over): the answer, then each call's canned result as a tool message."""
        if self.category != "tool_loop" or not calls:
            return None
        results = dict(self.results)
        reply = {
            "role": "assistant",
            "content": content,
            "tool_calls": [c.to_dict() for c in calls],
        }
        tool_messages = [
            {"role": "tool", "tool_call_id": c.id, "content": results.get(c.name, "{}")}
            for c in calls
        ]
        return [*messages, reply, *tool_messages]


def load_tasks(categories: Sequence[str] | None = None) -> list[Task]:
    unknown = sorted(set(categories or ()) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"unknown structured categories {unknown}; known: {list(CATEGORIES)}")
    return [t for t in _load() if categories is None or t.category in categories]


@lru_cache(maxsize=1)
def _load() -> tuple[Task, ...]:
    text = resources.files("edge_spec.bench").joinpath("structured.json").read_text("utf-8")
    raw = json.loads(text)
    tasks = [Task(t["id"], "extraction", t["text"], schema=t["schema"]) for t in raw["extraction"]]
    for t in raw["tool_loops"]:
        results = tuple(sorted(t["results"].items()))
        tasks.append(
            Task(t["id"], "tool_loop", t["user"], tools=tuple(t["tools"]), results=results)
        )
    return tuple(tasks)


# An entry's answer to one request: (the Run it is recorded as, the answer's text outside
# tool calls, its calls).
Answer = Callable[[Any, Prompt, list[dict[str, Any]], dict[str, Any], int], tuple[Run, Any, Any]]


def run_structured(
    tasks: Sequence[Task],
    entries: Sequence[Any],
    answer: Answer,
    *,
    repeats: int = 1,
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Every task's requests, every entry on each (the order rotating from request to
    request); a loop's next request follows the target alone's answer."""
    runs: list[Run] = []
    n = 0
    for repeat in range(repeats):
        for task in tasks:
            messages: list[dict[str, Any]] | None = [{"role": "user", "content": task.request}]
            turn = 0
            while messages is not None and turn < MAX_LOOP_TURNS:
                prompt = Prompt(f"{task.id}/{turn + 1}", task.category, KIND, "", tuple(messages))
                order = list(entries[n % len(entries) :]) + list(entries[: n % len(entries)])
                n += 1
                following = None
                for entry in order:
                    run, content, calls = answer(
                        entry, prompt, messages, task.options(turn), repeat
                    )
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
                    if getattr(entry, "name", None) == TARGET.name:
                        following = task.follow_up(messages, content, calls)
                messages, turn = following, turn + 1
    return runs


def run_structured_in_process(
    spec: Any,
    tasks: Sequence[Task],
    strategies: Sequence[Strategy],
    *,
    max_tokens: int = 256,
    repeats: int = 1,
    seed: int = 0,
    peers: Sequence[Any] = (),
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """The structured tasks on one EdgeSpec (the peers beside it, on the same prompt text and
    the same constraint as GBNF), T = 0."""
    from edge_spec.backend.peer import gbnf_of
    from edge_spec.constrain.spec import parse_tools
    from edge_spec.sampling import SamplingParams

    spec.generate("Hello", max_tokens=8, draft_mode="none")  # page the weights in
    sampling = SamplingParams(temperature=0.0, seed=seed)

    def answer(entry: Any, prompt: Prompt, messages: list, options: dict, repeat: int):
        tools = parse_tools(options.get("tools"))
        text = spec.render_chat(messages, tools)
        if isinstance(entry, Strategy):
            config = entry.config(max_tokens, sampling)
            result = spec.generate(text, config, session=None, **options)
            run = Run.of(prompt, entry, 0.0, repeat, result)
            return run, result.content, result.tool_calls
        grammar = (
            gbnf_of(options, spec.call_format) if options.get("tool_choice") != "auto" else None
        )
        ids = spec.tokenize(text)
        peer_result = entry.run(text, ids, max_tokens, 0.0, seed, grammar=grammar)
        return Run.of_peer(prompt, entry.name, 0.0, repeat, peer_result), None, ()

    return run_structured(
        tasks, plan_entries(strategies, peers), answer, repeats=repeats, on_run=on_run
    )
