"""The bench from outside the process, as users meet edge_spec: every run as its own
`edge-spec generate --json` process (`--fresh-processes`: a one-shot CLI call, loading and a
cold policy included), or every request through an `edge-spec serve` of each entry's own with the
official openai client (`--via-server`: HTTP, the template and the server's queue included).

Entries are interleaved as in the in-process bench (the order rotating from prompt to prompt),
and the target alone runs twice ("target" and "none"): two processes or two servers of the same
thing, whose ratio is the noise floor of comparing separate instances.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from edge_spec.bench.agentic import KIND, Session, request_messages
from edge_spec.bench.runner import COMPLETION_STOPS, Run, Strategy, plan_entries
from edge_spec.decode.stats import GenerationStats
from edge_spec.errors import EdgeSpecError
from edge_spec.prompts import Prompt

log = logging.getLogger(__name__)

SERVER_START_TIMEOUT_S = 600.0  # a first start may prepare models and profile the device


@dataclass(frozen=True)
class Setup:
    """What every process or server loads (names or paths, as the CLI takes them)."""

    target: str
    draft: str | None
    n_ctx: int
    n_threads: int | None = None
    fresh: bool = False  # each process or server starts its policy from the priors


def strategy_flags(strategy: Strategy) -> list[str]:
    """The CLI flags that run `strategy` (shared by generate and serve)."""
    flags = ["--draft-mode", strategy.draft_mode]
    if strategy.draft_mode == "none":
        return flags
    flags += ["--policy", strategy.policy, "--k-max", str(strategy.k_max)]
    if strategy.k is not None:
        flags += ["--k", str(strategy.k)]
    if strategy.tree_nodes is not None:
        flags += ["--tree-nodes", str(strategy.tree_nodes)]
    return flags


def _setup_flags(setup: Setup, strategy: Strategy) -> list[str]:
    flags = ["--target", setup.target, "--ctx-size", str(setup.n_ctx)]
    if setup.draft and strategy.draft_mode in ("auto", "model"):
        flags += ["--draft", setup.draft]
    if setup.n_threads:
        flags += ["--threads", str(setup.n_threads)]
    if setup.fresh:
        flags.append("--fresh")
    return flags


def edge_spec_command() -> list[str]:
    return [sys.executable, "-m", "edge_spec.cli"]


# ---- fresh processes -------------------------------------------------------------------------


def run_fresh_processes(
    setup: Setup,
    prompts: Sequence[Prompt],
    strategies: Sequence[Strategy],
    *,
    chat: bool,
    temperatures: Sequence[float] = (0.0,),
    max_tokens: int = 64,
    repeats: int = 1,
    seed: int = 0,
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Every (prompt, entry, temperature) as its own `edge-spec generate --json` process:
    decode rate from the statistics it prints, wall time of the whole process beside it."""
    plan = plan_entries(strategies, ())
    runs: list[Run] = []
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            order = plan[i % len(plan) :] + plan[: i % len(plan)]
            for temperature in temperatures:
                for entry in order:
                    assert isinstance(entry, Strategy)
                    command = [
                        *edge_spec_command(),
                        "generate",
                        "--json",
                        "-n",
                        str(max_tokens),
                        "--temperature",
                        str(temperature),
                        "--seed",
                        str(seed + 1000 * repeat + i),
                        *_setup_flags(setup, entry),
                        *strategy_flags(entry),
                    ]
                    text = prompt.messages[-1]["content"] if chat else prompt.completion
                    if chat:
                        command.append("--chat")
                    else:
                        command += [f"--stop={stop}" for stop in COMPLETION_STOPS]
                    t0 = time.perf_counter()
                    done = subprocess.run(
                        [*command, "--", text], capture_output=True, text=True, check=False
                    )
                    wall_s = time.perf_counter() - t0
                    if done.returncode != 0:
                        error = done.stderr.strip()[-300:]
                        raise EdgeSpecError(f"edge-spec generate ({entry.name}) failed: {error}")
                    out = json.loads(done.stdout)
                    stats = GenerationStats.from_dict(out["stats"])
                    run = Run.of_stats(
                        prompt,
                        entry.name,
                        temperature,
                        repeat,
                        stats,
                        out["finish_reason"],
                        tuple(out["token_ids"]),
                        wall_s=wall_s,
                    )
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
    return runs


# ---- through edge-spec serve -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_healthy(url: str, server: subprocess.Popen[Any], timeout_s: float) -> bool:
    """Wait for `edge-spec serve` at url to answer /health with 200: True once it does, False
    if the process exits first or timeout_s passes."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.3)


@contextmanager
def running_server(options: Sequence[str]) -> Iterator[tuple[str, Any, str]]:
    """`edge-spec serve` with these options on a free 127.0.0.1 port, once /health answers:
    (its URL, an openai client for it, the model it serves). Stopped on exit."""
    import openai

    port = free_port()
    command = [*edge_spec_command(), "serve", "--port", str(port), *options]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_healthy(url, server, SERVER_START_TIMEOUT_S):
            err = server.stderr.read().decode(errors="replace") if server.stderr else ""
            raise EdgeSpecError(f"edge-spec serve {' '.join(options)} did not start: {err}")
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=900)
        yield url, client, client.models.list().data[0].id
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@dataclass
class _Served:
    strategy: Strategy
    client: Any
    model: str

    @property
    def name(self) -> str:
        return self.strategy.name


def _ask(
    served: _Served,
    prompt: str | list[dict[str, Any]],
    max_tokens: int,
    sampling: dict,
    options: dict | None = None,
):
    """One request; (completion tokens, text, finish reason, the server's statistics, wall,
    the answer's tool calls)."""
    t0 = time.perf_counter()
    calls: list[Any] = []
    if isinstance(prompt, str):
        done = served.client.completions.create(
            model=served.model, prompt=prompt, max_tokens=max_tokens, **sampling
        )
        text = done.choices[0].text
    else:
        done = served.client.chat.completions.create(
            model=served.model,
            messages=prompt,
            max_tokens=max_tokens,
            **sampling,
            **(options or {}),
        )
        message = done.choices[0].message
        text = message.content or ""
        calls = list(message.tool_calls or ())
    wall_s = time.perf_counter() - t0
    stats = done.model_extra.get("edge_spec", {}) if done.model_extra else {}
    return done.usage.completion_tokens, text, done.choices[0].finish_reason, stats, wall_s, calls


def _structured_via_servers(served, tasks, max_tokens, repeats, seed, emit) -> list[Run]:
    """The structured tasks (bench/structured.py) through each entry's server."""
    from edge_spec.bench.structured import run_structured
    from edge_spec.constrain.tools import ToolCall

    def answer(s: _Served, prompt: Prompt, messages: list, options: dict, repeat: int):
        got = _ask(s, messages, max_tokens, {"temperature": 0, "seed": seed}, options)
        calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in got[5]]
        run = _served_run(prompt, s.strategy.name, 0.0, repeat, got, 0)
        return run, got[1] or None, calls

    return run_structured(tasks, served, answer, repeats=repeats, on_run=emit)


def _served_run(
    prompt: Prompt, name: str, temperature: float, repeat: int, answer: tuple, n_prompt: int
) -> Run:
    """A request seen from the client: its wall time is its decode time (prefill, HTTP and
    the queue included), so the summaries' ratios are end-to-end."""
    n_tokens, _, finish, stats, wall_s, _ = answer
    return Run(
        prompt.id,
        prompt.category,
        prompt.kind,
        name,
        temperature,
        repeat,
        n_prompt,
        n_tokens,
        wall_s,
        n_tokens / wall_s if wall_s > 0 else 0.0,
        int(stats.get("n_steps", 0)),
        int(stats.get("n_drafted", 0)),
        int(stats.get("n_accepted", 0)),
        (),
        (),
        dict(stats.get("steps_by_source", {})),
        (),
        0.0,
        0.0,
        0.0,
        0.0,
        str(finish),
        (),
        wall_s=wall_s,
    )


def run_via_server(
    setup: Setup,
    prompts: Sequence[Prompt],
    strategies: Sequence[Strategy],
    *,
    chat: bool,
    temperatures: Sequence[float] = (0.0,),
    max_tokens: int = 64,
    repeats: int = 1,
    seed: int = 0,
    sessions: Sequence[Session] = (),
    tasks: Sequence[Any] = (),
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Every entry behind an `edge-spec serve` of its own, all started first; each request
    timed at the client. With sessions (the agentic bench), each session turn by turn with
    the full history, as an agent framework sends it (no prompt_cache_key), the history being
    the target alone's own answers; otherwise the prompts (chat messages or completions)."""
    plan = plan_entries(strategies, ())
    runs: list[Run] = []
    with ExitStack() as stack:
        served = []
        for entry in plan:
            assert isinstance(entry, Strategy)
            options = [*_setup_flags(setup, entry), *strategy_flags(entry)]
            _, client, model = stack.enter_context(running_server(options))
            served.append(_Served(entry, client, model))
        for s in served:  # a first request pages the weights in
            _ask(s, [{"role": "user", "content": "Hi"}], 8, {"temperature": 0})

        def emit(run: Run) -> None:
            runs.append(run)
            if on_run is not None:
                on_run(run)

        if tasks:
            return _structured_via_servers(served, tasks, max_tokens, repeats, seed, emit)
        n = 0
        for repeat in range(repeats):
            if sessions:
                for session in sessions:
                    answers: list[str] = []
                    for t in range(len(session.turns)):
                        messages = request_messages(session, answers)
                        prompt = Prompt(
                            f"{session.id}/{t + 1}", session.scenario, KIND, "", tuple(messages)
                        )
                        order = served[n % len(served) :] + served[: n % len(served)]
                        n += 1
                        for s in order:
                            answer = _ask(s, messages, max_tokens, {"temperature": 0, "seed": seed})
                            if s.strategy.name == "target":
                                answers.append(answer[1])
                            emit(_served_run(prompt, s.strategy.name, 0.0, repeat, answer, 0))
                continue
            for i, prompt in enumerate(prompts):
                order = served[i % len(served) :] + served[: i % len(served)]
                request = list(prompt.messages) if chat else prompt.completion
                for temperature in temperatures:
                    sampling = {"temperature": temperature, "seed": seed + 1000 * repeat + i}
                    for s in order:
                        answer = _ask(s, request, max_tokens, sampling)
                        emit(_served_run(prompt, s.strategy.name, temperature, repeat, answer, 0))
    return runs
