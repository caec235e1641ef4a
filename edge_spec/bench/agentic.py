"""The agentic bench: scripted multi-turn sessions (package data `agentic.json`) run turn by
turn through the chat API, the full history in every request, the way agent frameworks drive
an OpenAI-compatible server.

A session is a system message and a list of turns; a turn is the messages a user, or a tool
(as a user message "Tool output (...)" after the assistant's scripted call), adds before the
assistant answers. Scenarios: a coding agent that reads a file and re-emits it whole after each
edit, a tool loop that quotes tool output, retrieval answers that quote passages, and a chat
that returns to its earlier answers.

Every entry answers the same requests: the history is the target alone's own answers (at
T = 0 every exact strategy produces them anyway), so a turn's request is identical for all.
Each edge_spec strategy drafts within a session of its own per conversation (as the server
does per `prompt_cache_key`), never from another entry's answers; peers get the rendered
request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from edge_spec.bench.runner import TARGET, Run, Strategy, plan_entries
from edge_spec.prompts import Prompt

if TYPE_CHECKING:
    from edge_spec.api import EdgeSpec
    from edge_spec.bench.peers import Peer

SCENARIOS = ("coding_agent", "tool_loop", "retrieval", "chat_recall")
KIND = "agentic"

Message = dict[str, str]


@dataclass(frozen=True)
class Session:
    id: str
    scenario: str
    description: str
    system: str
    turns: tuple[tuple[Message, ...], ...]


def load_sessions(ids: Sequence[str] | None = None) -> list[Session]:
    """The sessions in file order (only `ids`, when given). Raises ValueError on an unknown id
    or a malformed file."""
    sessions = _load()
    if ids is None:
        return list(sessions)
    known = {s.id for s in sessions}
    unknown = sorted(set(ids) - known)
    if unknown:
        raise ValueError(f"unknown agentic sessions {unknown}; known: {sorted(known)}")
    return [s for s in sessions if s.id in ids]


@lru_cache(maxsize=1)
def _load() -> tuple[Session, ...]:
    text = resources.files("edge_spec.bench").joinpath("agentic.json").read_text(encoding="utf-8")
    return parse_sessions(json.loads(text))


def parse_sessions(raw: Any) -> tuple[Session, ...]:
    """Validate a decoded agentic.json: version 1, unique ids, known scenarios, and turns of
    non-empty messages that alternate roles, starting and ending with the user."""
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise ValueError("agentic.json: expected an object with version 1")
    sessions: list[Session] = []
    seen: set[str] = set()
    for item in raw.get("sessions") or []:
        sid = item.get("id")
        if not isinstance(sid, str) or not sid or sid in seen:
            raise ValueError(f"agentic.json: missing or duplicate session id {sid!r}")
        seen.add(sid)
        if item.get("scenario") not in SCENARIOS:
            raise ValueError(f"agentic.json: {sid}: scenario must be one of {SCENARIOS}")
        turns = []
        for turn in item.get("turns") or []:
            roles = [m.get("role") for m in turn]
            if (
                not turn
                or roles[0] != "user"
                or roles[-1] != "user"
                or any(r not in ("user", "assistant") for r in roles)
                or any(a == b for a, b in zip(roles, roles[1:]))
                or any(not isinstance(m.get("content"), str) or not m["content"] for m in turn)
            ):
                raise ValueError(
                    f"agentic.json: {sid}: a turn must alternate non-empty user "
                    "and assistant messages, starting and ending with the user"
                )
            turns.append(tuple({"role": m["role"], "content": m["content"]} for m in turn))
        if not turns:
            raise ValueError(f"agentic.json: {sid}: no turns")
        sessions.append(
            Session(
                sid,
                item["scenario"],
                str(item.get("description", "")),
                str(item.get("system", "")),
                tuple(turns),
            )
        )
    if not sessions:
        raise ValueError("agentic.json: no sessions")
    return tuple(sessions)


def request_messages(session: Session, answers: Sequence[str]) -> list[Message]:
    """The messages of turn len(answers) + 1 (requires fewer answers than turns): the system
    message, each earlier turn followed by its answer, then this turn."""
    messages: list[Message] = [{"role": "system", "content": session.system}]
    messages = messages if session.system else []
    for turn, answer in zip(session.turns, answers):
        messages += [*turn, {"role": "assistant", "content": answer.strip()}]
    return [*messages, *session.turns[len(answers)]]


def run_agentic(
    spec: EdgeSpec,
    sessions: Sequence[Session],
    strategies: Sequence[Strategy],
    *,
    max_tokens: int = 384,
    repeats: int = 1,
    seed: int = 0,
    peers: Sequence[Peer] = (),
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Every session turn by turn at T = 0, every entry on each turn's request (the order
    rotating per turn). Runs are named "<session>/<turn>" with the scenario as category and
    "agentic" as kind, so the bench's report aggregates them like prompts."""
    from edge_spec.sampling.transform import SamplingParams

    plan = plan_entries(strategies, peers)
    runs: list[Run] = []
    spec.generate("Hello", max_tokens=8, draft_mode="none")  # page the weights in
    n_turns = 0
    sampling = SamplingParams(temperature=0.0, seed=seed)
    for repeat in range(repeats):
        for session in sessions:
            answers: list[str] = []  # the target's, the history of every later turn
            for t in range(len(session.turns)):
                messages = request_messages(session, answers)
                text = spec.render_chat(messages)
                prompt = Prompt(
                    f"{session.id}/{t + 1}", session.scenario, KIND, text, tuple(messages)
                )
                order = plan[n_turns % len(plan) :] + plan[: n_turns % len(plan)]
                n_turns += 1
                for entry in order:
                    if isinstance(entry, Strategy):
                        # A session per entry and conversation: what the server keeps per
                        # prompt_cache_key. Never another entry's answers.
                        config = replace(
                            entry.config(max_tokens, sampling),
                            session=f"agentic:{entry.name}:{session.id}:{repeat}",
                        )
                        result = spec.generate(text, config)
                        run = Run.of(prompt, entry, 0.0, repeat, result)
                        if entry is TARGET:
                            answers.append(result.text)
                    else:
                        ids = spec.tokenize(text)
                        peer_result = entry.run(text, ids, max_tokens, 0.0, seed)
                        run = Run.of_peer(prompt, entry.name, 0.0, repeat, peer_result)
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
    return runs


def n_requests(sessions: Sequence[Session]) -> int:
    return sum(len(s.turns) for s in sessions)
