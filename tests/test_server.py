"""The OpenAI-compatible server.

Pure parts first (request validation, response shapes checked against the openai package's own
types, the Prometheus text, the worker's queue with a scripted stand-in for EdgeSpec), then a
real `edge-spec serve` process on 127.0.0.1 with the SmolLM2 pair, driven by the official openai
client: every endpoint (completions, chat, responses) with and without streaming, 8 concurrent
clients x 25 requests against the same requests run one after another, a disconnect in
mid-stream, errors, and authentication.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from results import made_up_result

from edge_spec import __version__
from edge_spec.api import GenerationConfig, GenerationResult, TextDelta
from edge_spec.errors import ModelFileError
from edge_spec.server import responses as out
from edge_spec.server.app import ServerConfig, create_app
from edge_spec.server.metrics import ServerMetrics
from edge_spec.server.schemas import APIError, RequestLimits, parse_chat, parse_completion
from edge_spec.server.worker import Job, QueueFullError, UnavailableError, Worker

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = pytest.mark.xdist_group("server")

API_KEY = "test-key-123"
MODEL_ALIAS = "smollm2-chat"
LIMITS = RequestLimits(GenerationConfig(k=3, k_max=6), max_tokens_limit=256)

# ---- request validation ----------------------------------------------------------------------


def test_completion_request_becomes_a_generation_config() -> None:
    req = parse_completion(
        {
            "model": "m",
            "prompt": ["Hello"],
            "max_tokens": 12,
            "temperature": 0,
            "top_p": 0.9,
            "seed": 7,
            "stop": "\n",
            "top_k": 40,
            "min_p": 0.05,
            "speculative": False,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "user": "someone",
        },
        LIMITS,
    )
    assert req.prompts == ("Hello",) and req.messages is None
    assert req.stream and req.include_usage
    cfg = req.config
    assert (cfg.max_tokens, cfg.stop, cfg.draft_mode, cfg.k, cfg.k_max) == (
        12,
        ("\n",),
        "none",
        3,
        6,
    )
    s = cfg.sampling
    assert (s.temperature, s.top_p, s.seed, s.top_k, s.min_p) == (0.0, 0.9, 7, 40, 0.05)


def test_a_prompt_of_token_ids_is_taken_as_it_is() -> None:
    """OpenAI's completions take prompts as token ids too (benchmark clients send them)."""
    for prompt in ([1, 2, 3], [[1, 2, 3]]):
        assert parse_completion({"model": "m", "prompt": prompt}, LIMITS).prompts == ((1, 2, 3),)


def test_several_prompts_and_n_answers_each_become_choices_in_openais_order() -> None:
    body = {"model": "m", "prompt": ["a", [7, 8]], "n": 3, "seed": 5, "max_tokens": 0}
    req = parse_completion(body, LIMITS)
    assert req.config.max_tokens == 0  # a completion may only score its prompt
    choices = req.choices()
    assert [p for p, _ in choices] == ["a"] * 3 + [(7, 8)] * 3
    assert [c.sampling.seed for _, c in choices] == [5, 6, 7] * 2  # each answer reproducible
    unseeded = parse_completion({**body, "seed": None}, LIMITS).choices()
    assert {c.sampling.seed for _, c in unseeded} == {None}  # fresh entropy for each
    # Only an echo with logprobs scores the prompt (the echoed text of token ids is their
    # text, detokenized).
    assert req.config.prompt_logprobs is None
    for echo in ({"echo": True, "logprobs": 2}, {"echo": True, "logprobs": 2, "prompt": "a"}):
        assert parse_completion({**body, **echo}, LIMITS).config.prompt_logprobs == 2
    for echo in ({"echo": True}, {"echo": True, "prompt": "a"}):
        assert parse_completion({**body, **echo}, LIMITS).config.prompt_logprobs is None
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    assert [p for p, _ in parse_chat(chat, LIMITS).choices()] == [None, None]


def test_defaults_follow_openai() -> None:
    completion = parse_completion({"model": "m", "prompt": "x"}, LIMITS)
    assert completion.config.max_tokens == 16  # OpenAI's completions default
    assert completion.config.sampling.temperature == 1.0
    assert completion.config.draft_mode is None  # the server's own mode
    assert not completion.stream
    chat = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        LIMITS,
    )
    assert chat.messages == ({"role": "user", "content": "hi"},)
    assert chat.config.max_tokens == LIMITS.max_tokens_limit
    chat = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5},
        LIMITS,
    )
    assert chat.config.max_tokens == 5
    # No session unless the request names a conversation with OpenAI's prompt_cache_key.
    assert chat.config.session is None
    keyed = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "c1"},
        LIMITS,
    )
    assert keyed.config.session == "prompt_cache_key:c1"
    with pytest.raises(APIError) as err:
        parse_completion({"model": "m", "prompt": "x", "prompt_cache_key": ""}, LIMITS)
    assert err.value.body()["error"]["param"] == "prompt_cache_key"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": [[]]}, "prompt"),
        ({"model": "m", "prompt": [1, -2, 3]}, "prompt"),
        ({"model": "m", "prompt": [[1, 2], [-3]]}, "prompt"),
        ({"model": "m", "prompt": [1, "two"]}, "prompt"),
        ({"model": "m", "prompt": ["x"] * 129}, "prompt"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "n": 17}, "n"),
        ({"model": "m", "prompt": "x", "n": True}, "n"),
        ({"model": "m", "prompt": "x", "echo": "yes"}, "echo"),
        ({"model": "m", "prompt": "x", "best_of": 2}, "best_of"),
        ({"model": "m", "prompt": "x", "logprobs": 6}, "logprobs"),
        ({"model": "m", "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"model": "m", "prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
        ({"model": "m", "prompt": "x", "repeat_penalty": 0}, "repeat_penalty"),
        ({"model": "m", "prompt": "x", "repeat_last_n": -1}, "repeat_last_n"),
        ({"model": "m", "prompt": "x", "max_tokens": 257}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 1.5}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "x", "temperature": -0.1}, "temperature"),
        ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),
        ({"model": "m", "prompt": "x", "min_p": 1.5}, "min_p"),
        ({"model": "m", "prompt": "x", "seed": -1}, "seed"),
        ({"model": "m", "prompt": "x", "stop": [""]}, "stop"),
        ({"model": "m", "prompt": "x", "stop": ["s"] * 17}, "stop"),
        (
            {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ({"model": "m", "prompt": "x", "draft_mode": "model"}, "draft_mode"),
        ({"model": "m", "prompt": "x", "speculative": "no"}, "speculative"),
        ({"model": "m", "prompt": "x", "frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_completion_requests_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_completion(body, LIMITS)
    assert err.value.status == 400 and err.value.param == param
    assert err.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "messages",
    [[], "hi", [{"role": "wizard", "content": "x"}], [{"role": "user", "content": None}], [3]],
)
def test_bad_chat_messages(messages: Any) -> None:
    with pytest.raises(APIError) as err:
        parse_chat({"model": "m", "messages": messages}, LIMITS)
    assert err.value.status == 400 and err.value.param.startswith("messages")
    with pytest.raises(APIError):
        parse_chat(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, LIMITS
        )


def test_a_developer_message_is_a_system_message() -> None:
    """OpenAI's newer clients send the app's instructions as role "developer" (llama.cpp maps it
    to "system" too)."""
    parsed = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
        },
        LIMITS,
    )
    assert [m["role"] for m in parsed.messages] == ["system", "user"]


# ---- response shapes -------------------------------------------------------------------------


def _result(text: str, finish: str) -> GenerationResult:
    return made_up_result(text, finish)


@pytest.mark.parametrize(
    ("ours", "openai_reason"),
    [("eos", "stop"), ("stop", "stop"), ("length", "length"), ("context", "length")],
)
def test_bodies_parse_as_the_openai_types(ours: str, openai_reason: str) -> None:
    result = _result("Hi there", ours)
    completion = Completion.model_validate(out.full_body(out.Envelope(False, "m"), result))
    assert completion.choices[0].text == "Hi there"
    assert completion.choices[0].finish_reason == openai_reason
    assert completion.usage is not None and completion.usage.total_tokens == 5
    assert completion.model_extra["edge_spec"]["draft_mode"] == "model"
    chat = ChatCompletion.model_validate(out.full_body(out.Envelope(True, "m"), result))
    assert chat.choices[0].message.content == "Hi there" and chat.id.startswith("chatcmpl-")
    env = out.Envelope(True, "m")
    chunks = [
        out.first_chunk(env),
        out.text_chunk(env, "Hi"),
        *out.final_chunks(env, " there", result),
        out.usage_chunk(env, result),
    ]
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parsed if p.choices) == "Hi there"
    assert parsed[-2].choices[0].finish_reason == openai_reason
    assert parsed[-1].choices == [] and parsed[-1].usage.completion_tokens == 2
    assert len({p.id for p in parsed}) == 1
    # Several answers: one choice each, in order; usage counts each prompt once (n per prompt).
    two = Completion.model_validate(
        out.full_body(out.Envelope(False, "m"), result, _result("Ho", ours), n=2)
    )
    assert [(c.index, c.text) for c in two.choices] == [(0, "Hi there"), (1, "Ho")]
    assert two.usage is not None and two.usage.prompt_tokens == 3
    assert two.usage.completion_tokens == 4
    assert len(two.model_extra["edge_spec"]["choices"]) == 2


# ---- Prometheus text -------------------------------------------------------------------------


def _parse_prometheus(text: str) -> dict[str, float]:
    """Check the exposition format line by line; returns {series: value}."""
    series: dict[str, float] = {}
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            typed[name] = kind
            continue
        match = re.fullmatch(
            r'([a-z_]+)(\{[a-z_]+="[^"\\]*"(?:,[a-z_]+="[^"\\]*")*\})? (\S+)', line
        )
        assert match, f"not a valid sample line: {line!r}"
        name = match.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"{name} has no TYPE line"
        series[name + (match.group(2) or "")] = float(match.group(3))
    return series


def test_metrics_text_is_valid_prometheus() -> None:
    metrics = ServerMetrics({"queue_depth": ("Waiting.", lambda: 3)})
    metrics.requests.labels(endpoint="/v1/completions", status="200").inc()
    metrics.requests.labels(endpoint='we"ird\\path', status="400").inc()
    metrics.drafted.inc(10)
    metrics.accepted.inc(4)
    for seconds in (0.01, 0.3, 0.3, 1000.0):
        metrics.duration.labels(endpoint="/v1/completions").observe(seconds)
    text = metrics.render()
    assert 'endpoint="we\\"ird\\\\path"' in text
    values = _parse_prometheus(text.replace('we\\"ird\\\\path', "weird"))
    assert values['edge_spec_requests_total{endpoint="/v1/completions",status="200"}'] == 1
    assert values["edge_spec_acceptance_rate"] == 0.4
    assert values["edge_spec_queue_depth"] == 3
    prefix = 'edge_spec_request_duration_seconds_bucket{endpoint="/v1/completions",le='
    buckets = [(k, v) for k, v in values.items() if k.startswith(prefix)]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets must be cumulative"
    assert values[prefix + '"0.05"}'] == 1 and values[prefix + '"0.5"}'] == 3
    assert values[prefix + '"+Inf"}'] == 4
    assert values['edge_spec_request_duration_seconds_count{endpoint="/v1/completions"}'] == 4
    assert values['edge_spec_request_duration_seconds_sum{endpoint="/v1/completions"}'] == 1000.61


# ---- the worker, with a scripted stand-in for EdgeSpec (queue logic only) ---------------------


class _ScriptedSpec:
    """Yields one delta per `step` event; records which prompts ran, in order."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.step = threading.Semaphore(0)
        self.closed = False

    def stream(self, prompt: str, config: GenerationConfig) -> Iterator[TextDelta]:
        self.ran.append(prompt)
        for i in range(config.max_tokens):
            self.step.acquire()
            yield TextDelta(f"{prompt}{i} ", (i,))
        yield TextDelta("", (), "length", _result(prompt, "length"))

    def close(self) -> None:
        self.closed = True


def test_worker_runs_jobs_one_at_a_time_in_order_and_cancels_within_a_step() -> None:
    spec = _ScriptedSpec()
    loop = asyncio.new_event_loop()
    worker = Worker(lambda: spec, max_queue=2, metrics=ServerMetrics())  # type: ignore[arg-type,return-value]
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while worker.state != "ready" and time.monotonic() < deadline:
            time.sleep(0.01)
        jobs = [
            Job(lambda s, p=p: s.stream(p, GenerationConfig(max_tokens=50)), loop) for p in "abc"
        ]
        for job in jobs:
            worker.submit(job)  # a runs; b and c wait
            while job is jobs[0] and not spec.ran:
                time.sleep(0.01)
        with pytest.raises(QueueFullError):
            worker.submit(Job(lambda s: s.stream("d", GenerationConfig()), loop))
        jobs[1].cancel()  # b leaves while queued: never started
        spec.step.release(2)
        jobs[0].cancel()  # a is cancelled after its current step
        spec.step.release(1)
        while len(spec.ran) < 2:
            time.sleep(0.01)
        spec.step.release(60)
        while worker.busy or worker.queue_depth:
            time.sleep(0.01)
        assert spec.ran == ["a", "c"]
        events_a = _drain(loop, jobs[0])
        assert [kind for kind, _ in events_a][-1] == "cancelled"
        assert sum(kind == "delta" for kind, _ in events_a) <= 3
        assert _drain(loop, jobs[1]) == [("cancelled", None)]
        assert _drain(loop, jobs[2])[-1][1].finish_reason == "length"
    finally:
        worker.stop()
        loop.close()
    assert spec.closed


def _drain(loop: asyncio.AbstractEventLoop, job: Job) -> list[tuple[str, Any]]:
    loop.run_until_complete(asyncio.sleep(0))  # run the call_soon_threadsafe callbacks
    events = []
    while not job.events.empty():
        events.append(job.events.get_nowait())
    return events


def test_app_answers_503_while_loading_and_reports_a_failed_load() -> None:
    from fastapi.testclient import TestClient

    release = threading.Event()
    fatal: list[BaseException] = []

    def load() -> Any:
        release.wait(10)
        raise ModelFileError("no such model")

    config = ServerConfig(model_ids=("m",), limits=LIMITS, api_key=API_KEY)
    app = create_app(config, load, on_fatal=fatal.append)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with TestClient(app) as client:
        health = client.get("/health")  # no key needed, and no internals without one
        assert health.status_code == 503 and health.json() == {"status": "unavailable"}
        assert client.get("/health", headers=auth).json()["state"] == "loading"
        assert client.get("/v1/models").status_code == 401
        busy = client.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers=auth)
        assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_error"
        release.set()
        deadline = time.monotonic() + 10
        while not fatal and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.get("/health").json() == {"status": "unavailable"}
        detailed = client.get("/health", headers=auth).json()
        assert detailed["state"] == "failed" and "no such model" in detailed["error"]
    assert isinstance(fatal[0], ModelFileError)


class _RecordingSpec(_ScriptedSpec):
    """Records each request's config; answers at once (or holds until `step` is released)."""

    def __init__(self, hold: bool = False) -> None:
        super().__init__()
        self.configs: list[GenerationConfig] = []
        self.hold = hold

    def stream(self, prompt: str, config: GenerationConfig) -> Iterator[TextDelta]:
        self.configs.append(config)
        if self.hold:
            self.step.acquire()
        yield TextDelta("ok", (1,), "length", _result("ok", "length"))

    def stream_chat(self, messages: Any, config: GenerationConfig) -> Iterator[TextDelta]:
        return self.stream("chat", config)


def test_a_request_waiting_past_the_queue_timeout_gets_503_with_retry_after() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    spec = _RecordingSpec(hold=True)
    config = ServerConfig(model_ids=("m",), limits=LIMITS, queue_timeout_s=0.5)
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    with TestClient(create_app(config, lambda: spec)) as client:  # type: ignore[arg-type,return-value]
        while client.get("/health").status_code != 200:
            time.sleep(0.01)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, "/v1/completions", json=body)  # holds the worker
            while not spec.configs:
                time.sleep(0.01)
            waited = client.post("/v1/completions", json=body)
            assert waited.status_code == 503 and waited.headers["retry-after"] == "5"
            assert waited.json()["error"]["code"] == "queue_timeout"
            spec.step.release(5)
            assert first.result().status_code == 200  # the one the worker took finished
        assert len(spec.configs) == 1  # the expired one never ran


def test_a_job_taken_while_the_worker_stops_never_runs() -> None:
    """stop() sets the state before it reads the running job; the worker sets the running job
    before it reads the state: whichever comes first, the job is refused, not run."""
    spec = _RecordingSpec()
    loop = asyncio.new_event_loop()
    worker = Worker(lambda: spec, max_queue=2, metrics=ServerMetrics())  # type: ignore[arg-type,return-value]
    worker.spec = spec  # type: ignore[assignment]
    job = Job(lambda s: s.stream("x", GenerationConfig()), loop)
    worker._state = "stopping"  # stop() got there first
    worker._run(job)
    events = _drain(loop, job)
    assert spec.configs == [] and events[0][0] == "error"
    assert isinstance(events[0][1], UnavailableError)
    loop.close()


def test_conversations_are_kept_apart_per_api_key() -> None:
    from fastapi.testclient import TestClient

    from edge_spec.drafts.ngram import SCOPE_SEP

    spec = _RecordingSpec()
    config = ServerConfig(model_ids=("m",), limits=LIMITS, api_keys=("key-a", "key-b"))
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": messages, "max_tokens": 2, "prompt_cache_key": "conv-1"}
    with TestClient(create_app(config, lambda: spec)) as client:  # type: ignore[arg-type,return-value]
        while client.get("/health").status_code != 200:
            time.sleep(0.01)
        for key in ("key-a", "key-b", "key-a"):
            auth = {"Authorization": f"Bearer {key}"}
            assert client.post("/v1/chat/completions", json=body, headers=auth).status_code == 200
        no_session = {k: v for k, v in body.items() if k != "prompt_cache_key"}
        auth = {"Authorization": "Bearer key-b"}
        client.post("/v1/chat/completions", json=no_session, headers=auth)
    a1, b1, a2, plain = (c.session for c in spec.configs)
    assert a1 == a2 and a1 != b1 and plain is None  # one namespace per key
    assert a1.endswith("conv-1") and SCOPE_SEP in a1 and "key-a" not in a1


def test_session_limits_hold_per_scope_so_one_key_cannot_push_out_another() -> None:
    from edge_spec.drafts import NgramDraft
    from edge_spec.drafts.ngram import SCOPE_SEP

    ngram = NgramDraft(session_tokens=64, max_sessions=2)
    ngram.select(f"b{SCOPE_SEP}mine")
    ngram.begin([1, 2, 3])
    for i in range(10):  # another key churns through many conversations
        ngram.select(f"a{SCOPE_SEP}conv-{i}")
    kept = list(ngram._sessions)
    assert f"b{SCOPE_SEP}mine" in kept
    assert [s for s in kept if s.startswith("a")] == [f"a{SCOPE_SEP}conv-8", f"a{SCOPE_SEP}conv-9"]


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("store", False, True),
        ("store", True, False),
        ("service_tier", "auto", True),
        ("service_tier", "flex", False),
        ("user", "user-42", True),
        ("user", 5, False),
        ("metadata", {"team": "a"}, True),
        ("metadata", {"n": 1}, False),
        ("metadata", {str(i): "x" for i in range(17)}, False),
        ("logprobs", True, True),
        ("presence_penalty", -0.5, True),
        ("frequency_penalty", 1.5, True),
        ("repeat_penalty", 1.1, True),
        ("logit_bias", {"42": -100, "7": 5.5}, True),
        ("logit_bias", {"x": 1}, False),
        ("logit_bias", {"42": 101}, False),
        ("logprobs", 1, False),
        ("top_logprobs", 3, False),  # only beside logprobs: true
        ("max_tokens", 0, False),  # an answer of no tokens is a completion's (scoring) only
        ("n", 2, True),
        ("n", 17, False),
    ],
)
def test_openai_fields_are_honoured_or_refused(field: str, value: Any, accepted: bool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    if accepted:
        parse_chat(body, LIMITS)
    else:
        with pytest.raises(APIError) as err:
            parse_chat(body, LIMITS)
        assert err.value.status == 400 and err.value.param == field


def test_serve_without_the_extra_exits_2_with_the_install_hint() -> None:
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from edge_spec.cli import main\n"
        "sys.exit(main(['serve']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "edge-spec: error: the server extra is not installed: pip install 'edge-spec[server]'"
    ]


# ---- a live server ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """`edge-spec serve` in a child process on 127.0.0.1, ready when /health says so."""

    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        cmd = [sys.executable, "-m", "edge_spec.cli", "serve", "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self._log = log_path.open("w")
        env = {k: v for k, v in os.environ.items() if k != "EDGE_SPEC_API_KEY"}
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        self.states_seen = self._wait_ready(timeout_s=600)

    def _wait_ready(self, timeout_s: float) -> set[str]:
        seen: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                health = httpx.get(self.url + "/health", timeout=5)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            seen.add(f"{health.status_code} {health.json()['status']}")
            if health.status_code == 200:
                return seen
            time.sleep(0.2)
        raise RuntimeError("server not ready in time")

    def client(self, **kwargs: Any) -> openai.OpenAI:
        options: dict[str, Any] = {
            "api_key": self.api_key or "unused",
            "max_retries": 0,
            "timeout": 300,
        }
        options.update(kwargs)
        return openai.OpenAI(base_url=self.url + "/v1", **options)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=self.headers(), timeout=30).text
        return _parse_prometheus(text)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()


@pytest.fixture(scope="session")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The chat-capable SmolLM2 pair, a model draft with a fixed k (no device profile needed),
    authentication on, small limits so that the limits can be hit. One thread: llama.cpp's
    threads spin-wait for each other and crawl when a shared 2-core machine is oversubscribed."""
    from edge_spec.models.cache import resolve

    draft = resolve("smollm2-135m-q4_0", progress=False)
    args = [
        "-m",
        str(smollm2_path),
        "-md",
        str(draft),
        "--draft-mode",
        "model",
        "--policy",
        "fixed",
    ]
    args += ["--k", "3", "--ctx-size", "1024", "--threads", "1", "--model-alias", MODEL_ALIAS]
    args += ["--max-tokens-limit", "600", "--max-request-bytes", "65536", "--max-queue", "32"]
    live = LiveServer(args, tmp_path_factory.mktemp("server") / "serve.log", api_key=API_KEY)
    yield live
    live.stop()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: exit status -SIGTERM.
    assert live.proc.returncode == -signal.SIGTERM
    assert "Traceback" not in live.log_path.read_text()


models = pytest.mark.models


@models
def test_health_and_models(server: LiveServer) -> None:
    assert server.states_seen <= {"503 unavailable", "200 ok"}
    listed = server.client().models.list()
    assert [m.id for m in listed.data] == [MODEL_ALIAS]
    assert listed.data[0].model_extra["edge_spec"]["draft_mode"] == "model"
    assert server.client().models.retrieve("smollm2-135m-f16").id == "smollm2-135m-f16"


@models
def test_completion_with_stats_and_usage(server: LiveServer) -> None:
    client = server.client()
    prompt = "List the days of the week: Monday, Tuesday,"
    done = client.completions.create(model=MODEL_ALIAS, prompt=prompt, max_tokens=16, temperature=0)
    assert done.object == "text_completion" and done.model == MODEL_ALIAS
    choice = done.choices[0]
    assert choice.finish_reason == "length" and choice.text.strip()
    assert done.usage.completion_tokens == 16 and done.usage.prompt_tokens > 5
    assert done.usage.total_tokens == done.usage.prompt_tokens + 16
    stats = done.model_extra["edge_spec"]
    assert stats["draft_mode"] == "model" and stats["n_drafted"] > 0
    assert 0 <= stats["n_accepted"] <= stats["n_drafted"] and stats["tokens_per_s"] > 0
    assert stats["acceptance_rate"] == pytest.approx(stats["n_accepted"] / stats["n_drafted"])

    # Speculation off per request: no drafts, and (greedy) the very same text.
    plain = client.completions.create(
        model="smollm2-135m-f16",
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        extra_body={"speculative": False},
    )
    assert plain.model_extra["edge_spec"]["n_drafted"] == 0
    assert plain.model_extra["edge_spec"]["draft_mode"] == "none"
    assert plain.choices[0].text == choice.text

    # A prompt of token ids, as benchmark clients send it.
    ids = client.completions.create(model=MODEL_ALIAS, prompt=[1, 504, 3458], max_tokens=4)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 4

    # A stop string ends the text before it; OpenAI reports "stop".
    word = choice.text.split(",")[1]
    stopped = client.completions.create(
        model=MODEL_ALIAS, prompt=prompt, max_tokens=16, temperature=0, stop=[word]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == choice.text[: choice.text.index(word)]

    # Same seed, same sampled text.
    sampled = [
        client.completions.create(
            model=MODEL_ALIAS, prompt="Once upon a time", max_tokens=12, temperature=0.9, seed=5
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


@models
def test_completion_stream(server: LiveServer) -> None:
    client = server.client()
    prompt = "The three primary colors are"
    whole = client.completions.create(
        model=MODEL_ALIAS, prompt=prompt, max_tokens=20, temperature=0
    )
    chunks = list(
        client.completions.create(
            model=MODEL_ALIAS,
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) > 3 and len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["edge_spec"]["n_drafted"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


@models
def test_chat_uses_the_template_and_streams(server: LiveServer) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "Say hello in one word."}]
    done = client.chat.completions.create(
        model=MODEL_ALIAS, messages=messages, max_tokens=48, temperature=0
    )
    assert done.object == "chat.completion"
    message = done.choices[0].message
    assert message.role == "assistant" and message.content.strip()
    assert "<|im_end|>" not in message.content
    assert done.choices[0].finish_reason == "stop"  # the template's end token: our "eos"
    assert done.model_extra["edge_spec"]["finish_reason"] == "eos"
    assert done.usage.prompt_tokens > 10  # the system prompt the template adds

    stream = client.chat.completions.create(
        model=MODEL_ALIAS, messages=messages, max_tokens=48, temperature=0, stream=True
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)  # usage only when include_usage asks


PROMPT_TOPICS = [
    "the moon",
    "bread",
    "rivers",
    "the violin",
    "volcanoes",
    "honeybees",
    "glass",
    "chess",
    "the desert",
    "lighthouses",
    "tea",
    "snow",
    "bridges",
    "owls",
    "paper",
    "the ocean",
    "clocks",
    "mushrooms",
    "trains",
    "copper",
    "thunder",
    "maps",
    "cotton",
    "whales",
    "salt",
]


N_MIXED = 6  # requests each concurrent client sends, in its own order


def _request(client: openai.OpenAI, i: int) -> tuple[str, str, int]:
    """Request i (alternating completion and chat), greedy and short."""
    topic = PROMPT_TOPICS[i]
    if i % 2:
        done = client.chat.completions.create(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": f"Tell me one fact about {topic}."}],
            max_tokens=8,
            temperature=0,
        )
        return (
            done.choices[0].message.content,
            done.choices[0].finish_reason,
            done.usage.completion_tokens,
        )
    completion = client.completions.create(
        model=MODEL_ALIAS, prompt=f"A short note about {topic}:", max_tokens=8, temperature=0
    )
    return (
        completion.choices[0].text,
        completion.choices[0].finish_reason,
        completion.usage.completion_tokens,
    )


@models
def test_eight_concurrent_clients_match_sequential_results(server: LiveServer) -> None:
    """Each client sends all N_MIXED requests in its own order, so every request runs after a
    different one than in the sequential run: any state leaking between requests (KV cache,
    RNG, policy, stop strings) would change a greedy output."""
    n = N_MIXED
    sequential = {i: _request(server.client(), i) for i in range(n)}
    assert all(text for text, _, _ in sequential.values())

    def client_run(c: int) -> list[tuple[int, tuple[str, str, int]]]:
        client = server.client()
        order = [(c * 3 + j) % n for j in range(n)]
        if c % 2:
            order.reverse()
        return [(i, _request(client, i)) for i in order]

    depths: list[float] = []
    running = threading.Event()
    running.set()

    def sample_queue() -> None:  # evidence that the requests really overlapped
        while running.is_set():
            depths.append(server.metrics()["edge_spec_queue_depth"])
            time.sleep(0.2)

    sampler = threading.Thread(target=sample_queue)
    sampler.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            runs = list(pool.map(client_run, range(8)))
    finally:
        running.clear()
        sampler.join()
    assert max(depths) >= 2
    answers = [answer for run in runs for answer in run]
    assert len(answers) == 8 * n
    mismatches = [(i, got, sequential[i]) for i, got in answers if got != sequential[i]]
    assert not mismatches, mismatches[:3]
    values = server.metrics()
    assert values["edge_spec_queue_depth"] == 0 and values["edge_spec_requests_running"] == 0


@models
@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels_the_generation_and_frees_the_server(
    server: LiveServer, stream: bool
) -> None:
    before = server.metrics()
    body = {
        "model": MODEL_ALIAS,
        "prompt": "Count: 1, 2, 3, 4, 5,",  # greedy: counts on for all 600 tokens
        "max_tokens": 600,
        "temperature": 0,
        "stream": stream,
    }
    url = server.url + "/v1/completions"
    if stream:
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", url, json=body, headers=server.headers()) as response:
                assert response.status_code == 200
                n_chunks = 0
                for line in response.iter_lines():
                    n_chunks += line.startswith("data: {")
                    if n_chunks == 2:
                        break  # leaving the block closes the connection in mid-stream
    else:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            httpx.post(
                url, json=body, headers=server.headers(), timeout=httpx.Timeout(60, read=0.5)
            )
    deadline = time.monotonic() + 120
    while True:
        after = server.metrics()
        if (
            after["edge_spec_requests_cancelled_total"]
            > before["edge_spec_requests_cancelled_total"]
        ):
            break
        assert time.monotonic() < deadline, "the generation was never cancelled"
        time.sleep(0.05)
    generated = (
        after["edge_spec_completion_tokens_total"] - before["edge_spec_completion_tokens_total"]
    )
    assert 0 < generated < 600  # stopped early, not run to max_tokens
    key = 'edge_spec_requests_total{endpoint="/v1/completions",status="499"}'
    assert after.get(key, 0) == before.get(key, 0) + 1
    # The next request is served at once (nothing queued behind a zombie generation).
    done = server.client().completions.create(
        model=MODEL_ALIAS, prompt="Hi", max_tokens=3, temperature=0
    )
    assert done.usage.completion_tokens == 3
    assert server.metrics()["edge_spec_requests_running"] == 0


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    return exc.response.json()["error"]


@models
def test_errors_have_the_openai_shape_and_status(server: LiveServer) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="gpt-4o", prompt="Hi", max_tokens=3)
    assert _error(unknown.value)["code"] == "model_not_found"
    for bad in ({"temperature": -1}, {"top_p": 2}, {"n": 0}, {"max_tokens": 601}, {"stop": [""]}):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=MODEL_ALIAS, prompt="Hi", **{"max_tokens": 3, **bad})
        assert _error(err.value)["param"] == next(iter(bad)), bad
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL_ALIAS, messages=[{"role": "wizard", "content": "x"}]
        )
    with pytest.raises(openai.APIStatusError) as too_long:
        client.completions.create(model=MODEL_ALIAS, prompt="hello " * 1500, max_tokens=3)
    assert too_long.value.status_code == 413
    assert _error(too_long.value)["code"] == "context_length_exceeded"
    with pytest.raises(openai.APIStatusError) as too_long_chat:  # found before the stream opens
        client.chat.completions.create(
            model=MODEL_ALIAS, messages=[{"role": "user", "content": "hello " * 1500}], stream=True
        )
    assert too_long_chat.value.status_code == 413
    assert _error(too_long_chat.value)["param"] == "messages"

    headers = {**server.headers(), "Content-Type": "application/json"}
    malformed = httpx.post(
        server.url + "/v1/completions", content=b'{"model": "x", "prompt": ', headers=headers
    )
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    oversized = httpx.post(
        server.url + "/v1/completions",
        content=json.dumps({"model": MODEL_ALIAS, "prompt": "a" * 70_000}).encode(),
        headers=headers,
    )
    assert oversized.status_code == 413 and oversized.json()["error"]["code"] == "request_too_large"
    route = httpx.get(server.url + "/v1/engines", headers=headers)
    assert route.status_code == 404 and "error" in route.json()
    # After all that, still serving.
    assert client.completions.create(
        model=MODEL_ALIAS, prompt="Hi", max_tokens=2, temperature=0
    ).choices


@models
def test_authentication_on(server: LiveServer) -> None:
    for key in ("wrong-key", ""):
        with pytest.raises(openai.AuthenticationError) as err:
            server.client(
                api_key=key or "x", default_headers={} if key else {"Authorization": ""}
            ).models.list()
        assert _error(err.value)["code"] == "invalid_api_key"
    for path in ("/metrics", "/v1/models", "/api/tags", "/api/version", "/api/pull"):
        assert httpx.get(server.url + path).status_code == 401
    for path in ("/v1/completions", "/api/chat", "/api/generate"):
        assert httpx.post(server.url + path, json={}).status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200  # open: whether it runs
    assert httpx.get(server.url + "/").text == "edge-spec is running"  # Ollama's clients' probe
    assert httpx.get(server.url + "/metrics", headers=server.headers()).status_code == 200


@models
def test_authentication_off_and_a_full_queue(smollm2_path: Path, tmp_path: Path) -> None:
    """A second server: no key, n-gram drafting, room for one waiting request, and a chat
    template that would loop for ten billion steps: chats get a 400 within its bound while
    completions are still served."""
    runaway = tmp_path / "runaway.jinja"
    runaway.write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    args = [
        "-m",
        str(smollm2_path),
        "--draft-mode",
        "ngram",
        "--policy",
        "fixed",
        "--ctx-size",
        "512",
        "--chat-template",
        str(runaway),
    ]
    args += ["--threads", "1", "--max-queue", "1", "--max-tokens-limit", "400"]
    live = LiveServer(args, tmp_path / "serve.log")
    try:
        client = live.client(api_key="anything")
        assert client.models.list().data[0].id == "smollm2-135m-f16"
        assert httpx.get(live.url + "/metrics").status_code == 200
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError, match="chat template failed to render"):
            client.chat.completions.create(
                model="smollm2-135m-f16", messages=[{"role": "user", "content": "Hi"}]
            )
        assert time.monotonic() - started < 30
        done = client.completions.create(
            model="smollm2-135m-f16", prompt="Hi", max_tokens=3, temperature=0
        )
        assert done.model_extra["edge_spec"]["draft_mode"] == "ngram"

        # One generation running, one waiting: the third is refused with 429 at once.
        long = {
            "model": "smollm2-135m-f16",
            "prompt": "Count: 1, 2, 3,",
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        }
        with httpx.Client(timeout=120) as http, ThreadPoolExecutor(1) as pool:
            with http.stream("POST", live.url + "/v1/completions", json=long) as running:
                lines = running.iter_lines()  # kept: dropping it would close the connection
                next(lines)  # the first chunk: it runs
                waiting = pool.submit(
                    httpx.post,
                    live.url + "/v1/completions",
                    json={**long, "stream": False, "max_tokens": 2},
                    timeout=120,
                )
                deadline = time.monotonic() + 60
                while live.metrics()["edge_spec_queue_depth"] < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                with pytest.raises(openai.RateLimitError) as full:
                    client.completions.create(model="smollm2-135m-f16", prompt="Hi", max_tokens=2)
                assert _error(full.value)["code"] == "queue_full"
            assert waiting.result().status_code == 200  # served once the stream was dropped
    finally:
        live.stop()


@models
def test_the_default_serve_chats_plain_streaming_and_concurrently(tmp_path: Path) -> None:
    """`edge-spec serve` with no model flags: the chat pair in auto mode (the device profile is
    measured on first use), answering the official client's chat plainly, streamed, and four
    identical requests at once with one answer. A conversation named by prompt_cache_key
    drafts from its earlier requests; a request without one does not."""
    live = LiveServer(["--threads", "1"], tmp_path / "serve.log")
    try:
        client = live.client(api_key="unused")
        model = client.models.list().data[0].id
        assert model == "smollm2-135m-f16"
        messages = [{"role": "user", "content": "Name three planets of the solar system."}]
        ask = {"model": model, "messages": messages, "max_tokens": 40, "temperature": 0}
        done = client.chat.completions.create(**ask)
        answer = done.choices[0].message.content
        assert answer.strip() and done.model_extra["edge_spec"]["draft_mode"] == "auto"
        stream = client.chat.completions.create(**ask, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer
        with ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(
                    lambda _: client.chat.completions.create(**ask).choices[0].message.content,
                    range(4),
                )
            )
        assert answers == [answer] * 4

        # The second request of a conversation drafts its answer from the first one's.
        keyed = [
            client.chat.completions.create(**ask, extra_body={"prompt_cache_key": "conv-1"})
            for _ in range(2)
        ]
        assert [k.choices[0].message.content for k in keyed] == [answer, answer]
        accepted = [k.model_extra["edge_spec"]["n_accepted"] for k in keyed]
        assert (
            accepted[1] > accepted[0] and accepted[1] > done.model_extra["edge_spec"]["n_accepted"]
        )
    finally:
        live.stop()


# ---- request fuzzing -------------------------------------------------------------------------

_WEIRD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Z", "C")), max_size=40
)
_WEIRD_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _WEIRD_TEXT,
)
_WEIRD = st.recursive(
    _WEIRD_SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_WEIRD_TEXT, inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = (
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "n",
    "logprobs",
    "prompt_cache_key",
    "stream_options",
    "input",
    "instructions",
    "max_output_tokens",
    "text",
    "tools",
    "top_logprobs",
    "include",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "system",
    "stop_sequences",
    "tool_choice",
    "options",  # Ollama's
    "format",
    "raw",
    "think",
    "keep_alive",
    "images",
    "context",
    "template",
)


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A route and a body: a JSON object whose fields hold anything (valid values, wrong types,
    huge and negative numbers, control characters, NUL, deep nesting), or raw bytes that are
    not valid UTF-8 or not JSON at all."""
    routes = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"]
    routes += ["/api/chat", "/api/generate"]
    route = draw(st.sampled_from(routes))
    kind = draw(st.sampled_from(["fields", "fields", "fields", "raw", "deep"]))
    if kind == "raw":
        return route, draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.integers(min_value=50, max_value=5000))
        return route, ("[" * depth + "]" * depth).encode()
    body: dict[str, Any] = {"model": draw(st.sampled_from([MODEL_ALIAS, "", "x\x00y"]))}
    for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=6, unique=True)):
        body[name] = draw(_WEIRD)
    responses = route == "/v1/responses"
    if draw(st.booleans()):  # a well-formed core, so that the generation path is reached too
        text = draw(_WEIRD_TEXT) or "Hi"
        if responses:
            body.setdefault("input", text)
        elif route in ("/v1/completions", "/api/generate"):
            body.setdefault("prompt", text)
        else:
            body.setdefault("messages", [{"role": "user", "content": text}])
    # Valid requests must stay short: generation is real.
    if route.startswith("/api/"):  # Ollama's: the limit is an option, and it streams by default
        options = body.setdefault("options", {})
        if isinstance(options, dict):
            options["num_predict"] = 2
    else:
        limit = "max_output_tokens" if responses else "max_tokens"
        if isinstance(body.get(limit), int) and 0 < body[limit] <= 600:
            body[limit] = min(body[limit], 3)
        body.setdefault(limit, 2)
    raw = json.dumps(body, allow_nan=True).encode()
    if draw(st.booleans()):  # invalid UTF-8 inside a string
        raw = raw.replace(b'"Hi"', b'"H\xff\xfei"', 1)
    return route, raw


@models
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=list(HealthCheck),  # a loaded 2-core machine generates slowly
    derandomize=True,
)
@given(request=_bodies())
def test_fuzzed_request_bodies_get_a_4xx_or_an_answer_never_a_500(
    server: LiveServer, request: tuple[str, bytes]
) -> None:
    route, raw = request
    headers = {**server.headers(), "Content-Type": "application/json"}
    response = httpx.post(server.url + route, content=raw, headers=headers, timeout=120)
    assert response.status_code < 500, (response.status_code, response.text[:300], raw[:300])
    if response.status_code >= 400:
        assert "error" in response.json(), response.text[:300]


@models
def test_the_server_still_serves_after_the_fuzzing(server: LiveServer) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert (
        server.client()
        .completions.create(model=MODEL_ALIAS, prompt="Hi", max_tokens=2, temperature=0)
        .choices
    )


# ---- structured output and tool calls through the official openai client --------------------

PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@models
def test_schema_answers_are_valid_and_the_same_with_speculation_on_and_off(
    server: LiveServer,
) -> None:
    import jsonschema

    client = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    for card in ("Bob is 41 years old.", "Chen Wei, aged 45, manages the Shenzhen office."):
        texts = []
        for speculative in (True, False):
            done = client.chat.completions.create(
                model=MODEL_ALIAS,
                messages=[{"role": "user", "content": f"Extract the person as JSON: {card}"}],
                response_format=fmt,
                temperature=0,
                max_tokens=48,
                extra_body={"speculative": speculative},
            )
            texts.append(done.choices[0].message.content)
            jsonschema.validate(json.loads(texts[-1]), PERSON_SCHEMA)
            stats = done.model_extra["edge_spec"]
            assert stats["constraint_complete"] is True
        assert texts[0] == texts[1]
        assert stats["accepted_by_source"] == {}  # speculation off: nothing drafted


@models
def test_the_responses_api_through_the_openai_client(server: LiveServer) -> None:
    """client.responses: the answer is the chat completion's (same conversation, greedy),
    streamed as typed events adding up to it; a required call comes back as a function_call
    item whose output, sent back as input, gets an answer; text.format constrains."""
    client = server.client()
    ask = "Say 'The quick brown fox jumps over the lazy dog.' exactly."
    options: dict[str, Any] = dict(model=MODEL_ALIAS, temperature=0)
    done = client.responses.create(
        input=ask, instructions="You are terse.", max_output_tokens=24, **options
    )
    chat = client.chat.completions.create(
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": ask},
        ],
        max_tokens=24,
        **options,
    )
    assert done.output_text == chat.choices[0].message.content and done.output_text
    assert done.usage is not None and done.usage.input_tokens == chat.usage.prompt_tokens
    # The same prompt again: its KV prefix was kept from the request before.
    assert chat.usage.prompt_tokens_details.cached_tokens > 0
    assert done.model_extra["edge_spec"]["n_drafted"] > 0
    events = list(
        client.responses.create(
            input=ask, instructions="You are terse.", max_output_tokens=24, stream=True, **options
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == done.output_text
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text == done.output_text

    weather = {"type": "function", **WEATHER_TOOL["function"]}
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.responses.create(
        input=asked, tools=[weather], tool_choice="required", max_output_tokens=48, **options
    )
    calls = [item for item in called.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    assert "city" in json.loads(calls[0].arguments)
    replay = [item.model_dump(exclude_none=True) for item in called.output]
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}
    answer = client.responses.create(
        input=[*asked, *replay, result], tools=[weather], max_output_tokens=24, **options
    )
    assert answer.status in ("completed", "incomplete") and answer.output

    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA}}
    person = client.responses.create(
        input="Alice Martin is 34.", text=fmt, max_output_tokens=48, **options
    )
    assert set(json.loads(person.output_text)) == {"name", "age"}
    # A stored response continued by previous_response_id: the chat of the whole conversation.
    first = client.responses.create(input="My name is Ada.", max_output_tokens=12, **options)
    second = client.responses.create(
        input="What is my name?", previous_response_id=first.id, max_output_tokens=12, **options
    )
    whole = client.chat.completions.create(
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_tokens=12,
        **options,
    )
    assert second.output_text == whole.choices[0].message.content
    assert second.previous_response_id == first.id
    unstored = client.responses.create(input=ask, store=False, max_output_tokens=4, **options)
    for unknown in ("resp_1", unstored.id):
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(input=ask, previous_response_id=unknown, **options)
        assert missing.value.body["param"] == "previous_response_id"


@models
def test_logprobs_through_the_openai_client(server: LiveServer) -> None:
    """Chat's logprobs/top_logprobs, the completions' logprobs and the Responses API's
    include come back in OpenAI's shapes, one per token, the same streamed as not (up to
    batching noise)."""
    client = server.client()
    ask = [{"role": "user", "content": "Name three colors."}]
    options: dict[str, Any] = dict(model=MODEL_ALIAS, temperature=0, max_tokens=12)
    done = client.chat.completions.create(messages=ask, logprobs=True, top_logprobs=2, **options)
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens
    assert "".join(t.token for t in content) == done.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)
    chunks = list(
        client.chat.completions.create(
            messages=ask, logprobs=True, top_logprobs=2, stream=True, **options
        )
    )
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert _same_logprobs(streamed, content)
    assert client.chat.completions.create(messages=ask, **options).choices[0].logprobs is None

    legacy = client.completions.create(prompt="One, two, three,", logprobs=3, **options)
    scored = legacy.choices[0].logprobs
    assert len(scored.tokens) == len(scored.token_logprobs) == legacy.usage.completion_tokens
    assert all(len(top) == 3 for top in scored.top_logprobs)
    assert scored.text_offset[0] == 0 and "".join(scored.tokens) == legacy.choices[0].text

    response = client.responses.create(
        model=MODEL_ALIAS,
        input=ask,
        temperature=0,
        max_output_tokens=12,
        include=["message.output_text.logprobs"],
        top_logprobs=1,
    )
    text = response.output[0].content[0]
    assert _same_logprobs(text.logprobs, content)


@models
def test_n_answers_several_prompts_and_echo_through_the_openai_client(server: LiveServer) -> None:
    """n answers per prompt and several prompts come back as choices in OpenAI's order, each
    the answer its own request gives (choice j of a seeded prompt draws with seed + j), also
    streamed; echo puts the prompt (text and logprobs, the first null) before the answer, and
    with max_tokens 0 scores a batch of token-id prompts as lm-evaluation-harness asks."""
    client = server.client()
    sampled: dict[str, Any] = dict(model=MODEL_ALIAS, max_tokens=10, temperature=0.9)
    three = client.completions.create(prompt="Once upon a time", n=3, seed=11, **sampled)
    assert [c.index for c in three.choices] == [0, 1, 2]
    alone = [
        client.completions.create(prompt="Once upon a time", seed=seed, **sampled)
        for seed in (11, 12, 13)
    ]
    assert [c.text for c in three.choices] == [a.choices[0].text for a in alone]
    assert len({a.choices[0].text for a in alone}) > 1
    assert three.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt counted once
    assert three.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert len(three.model_extra["edge_spec"]["choices"]) == 3

    greedy: dict[str, Any] = dict(model=MODEL_ALIAS, max_tokens=8, temperature=0)
    prompts = ["The capital of France is", "Water boils at"]
    both = client.completions.create(prompt=prompts, **greedy)
    singles = [client.completions.create(prompt=p, **greedy).choices[0].text for p in prompts]
    assert [c.text for c in both.choices] == singles
    chunks = list(client.completions.create(prompt=prompts, n=2, stream=True, **greedy))
    streamed = ["", "", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [singles[0], singles[0], singles[1], singles[1]]
    ask = [{"role": "user", "content": "Say hello."}]
    chat = client.chat.completions.create(messages=ask, n=2, **greedy)
    one = client.chat.completions.create(messages=ask, **greedy).choices[0].message.content
    assert [c.message.content for c in chat.choices] == [one, one]
    chat_chunks = list(
        client.chat.completions.create(
            messages=ask, n=2, stream=True, stream_options={"include_usage": True}, **greedy
        )
    )
    by_index = ["", ""]
    for chunk in chat_chunks:
        for choice in chunk.choices:
            by_index[choice.index] += choice.delta.content or ""
    assert by_index == [one, one]
    assert chat_chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    prompt = "One, two, three,"
    plain = client.completions.create(prompt=prompt, logprobs=2, **greedy).choices[0]
    echoed = client.completions.create(prompt=prompt, logprobs=2, echo=True, **greedy).choices[0]
    assert echoed.text == prompt + plain.text
    scored = echoed.logprobs
    n_prompt = len(scored.tokens) - len(plain.logprobs.tokens)
    assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in scored.token_logprobs[1:])
    assert "".join(scored.tokens) == echoed.text
    assert scored.text_offset == [
        len("".join(scored.tokens[:i])) for i in range(len(scored.tokens))
    ]
    assert all(
        abs(a - b) < 0.05
        for a, b in zip(scored.token_logprobs[n_prompt:], plain.logprobs.token_logprobs)
    )
    ids = [[504, 2365, 282, 4649, 314], [504, 2365, 282]]  # "The capital of France is", a prefix
    batch = client.completions.create(
        model=MODEL_ALIAS, prompt=ids, echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    first, prefix = (c.logprobs for c in batch.choices)
    assert len(first.token_logprobs) == 5 and len(prefix.token_logprobs) == 3
    assert first.token_logprobs[0] is None and batch.usage.completion_tokens == 0
    assert all(
        abs(a - b) < 0.05 for a, b in zip(first.token_logprobs[1:3], prefix.token_logprobs[1:])
    )
    for lps, tops in zip(first.token_logprobs[1:], first.top_logprobs[1:]):
        assert len(tops) == 1 and max(tops.values()) >= lps  # lm-eval's is_greedy reads these
    assert batch.choices[0].text == "".join(first.tokens)
    unscored = client.completions.create(
        model=MODEL_ALIAS, prompt=ids, echo=True, max_tokens=0, temperature=0
    )
    assert [c.text for c in unscored.choices] == [c.text for c in batch.choices]
    assert all(c.logprobs is None for c in unscored.choices)


@models
def test_llama_servers_token_routes(server: LiveServer) -> None:
    """/tokenize, /detokenize and /apply-template answer as llama-server's do, at once, also
    while a generation runs: the template's text is the prompt a chat request is charged for,
    tokens round-trip to their text, and bad ids or fields are 400s."""
    headers = server.headers()
    ask = [{"role": "user", "content": "Name a color."}]
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        prompt = http.post("/apply-template", json={"messages": ask}).json()["prompt"]
        assert "Name a color." in prompt
        ids = http.post("/tokenize", json={"content": prompt, "add_special": True}).json()
        chat = server.client().chat.completions.create(
            model=MODEL_ALIAS, messages=ask, max_tokens=2, temperature=0
        )
        assert len(ids["tokens"]) == chat.usage.prompt_tokens
        text = "Grüße, 東京! "
        plain = http.post("/tokenize", json={"content": text}).json()["tokens"]
        assert http.post("/detokenize", json={"tokens": plain}).json()["content"] == text
        pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()
        assert [p["id"] for p in pieces["tokens"]] == plain
        joined = b"".join(
            p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
            for p in pieces["tokens"]
        )
        assert joined.decode() == text
        with ThreadPoolExecutor(1) as pool:  # beside a running generation
            running = pool.submit(
                server.client().completions.create,
                model=MODEL_ALIAS, prompt="Once upon a time", max_tokens=48, temperature=0,
            )  # fmt: skip
            for _ in range(20):
                assert http.post("/tokenize", json={"content": text}).json()["tokens"] == plain
            assert running.result().usage.completion_tokens > 0
        for path, body, param in (
            ("/detokenize", {"tokens": [10**9]}, "tokens"),
            ("/detokenize", {"tokens": [-1]}, "tokens"),
            ("/detokenize", {"tokens": "12"}, "tokens"),
            ("/tokenize", {"content": 5}, "content"),
            ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
            ("/tokenize", {"content": "x", "extra": 1}, "extra"),
            ("/apply-template", {"messages": []}, "messages"),
        ):
            answer = http.post(path, json=body)
            assert answer.status_code == 400, (path, body, answer.text)
            assert answer.json()["error"]["param"] == param
        assert httpx.post(f"{server.url}/tokenize", json={"content": "x"}).status_code == 401


@models
def test_lm_evaluation_harness_requests(server: LiveServer) -> None:
    """lm-evaluation-harness's local-completions, as it talks to a server: its remote tokenizer
    (/tokenizer_info, vLLM's /tokenize and /detokenize), then loglikelihood requests (a batch of
    context + continuation token ids, echo, logprobs 1, max_tokens 1) read as it reads them:
    token_logprobs[ctxlen:-1] are the continuation's, and is_greedy holds exactly when the
    continuation is the greedy answer -- also where the greedy answer ends with the
    end-of-generation token, which the last entry then is."""
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=120) as http:
        info = http.get("/tokenizer_info").json()
        assert info["eos_token"] and "chat_template" in info

        def encode(text: str) -> list[int]:
            body = {"prompt": text, "add_special_tokens": False}
            return http.post("/tokenize", json=body).json()["tokens"]

        assert (
            http.post("/detokenize", json={"tokens": encode("Paris")}).json()["prompt"] == "Paris"
        )
        ask = "What is 2+2? Answer with a number only."
        chat = f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n"
        greedy = http.post(
            "/v1/completions",
            json={"model": MODEL_ALIAS, "prompt": chat, "max_tokens": 40, "temperature": 0},
        ).json()
        assert greedy["edge_spec"]["finish_reason"] == "eos"  # a whole answer
        answer = greedy["choices"][0]["text"]
        fact = "The capital of France is"
        alone = http.post(
            "/v1/completions",
            json={"model": MODEL_ALIAS, "prompt": fact, "max_tokens": 2, "temperature": 0},
        ).json()["choices"][0]["text"]
        cases = [(chat, answer, True), (fact, alone, True), (fact, " a banana", False)]
        prompts, ctxlens = [], []
        for context, continuation, _ in cases:
            ctx, whole = encode(context), encode(context + continuation)
            assert whole[: len(ctx)] == ctx
            prompts.append(whole)
            ctxlens.append(len(ctx))
        payload = {"model": MODEL_ALIAS, "prompt": prompts, "temperature": 0, "max_tokens": 1}
        payload.update(logprobs=1, seed=1234, echo=True)
        out = http.post("/v1/completions", json=payload).json()
    choices = sorted(out["choices"], key=lambda c: c["index"])
    for choice, ctxlen, whole, (_, _, is_greedy) in zip(choices, ctxlens, prompts, cases):
        scored = choice["logprobs"]
        assert len(scored["token_logprobs"]) == len(whole) + 1  # the prompt, then one token
        continuation = scored["token_logprobs"][ctxlen:-1]
        tops = scored["top_logprobs"][ctxlen:-1]
        assert len(continuation) == len(whole) - ctxlen and all(lp < 0 for lp in continuation)
        assert all(lp == max(top.values()) for lp, top in zip(continuation, tops)) == is_greedy
    assert choices[0]["logprobs"]["tokens"][-1] in ("", info["eos_token"])


def _same_logprobs(got: list[Any], expected: list[Any]) -> bool:
    """The same tokens with the same logprobs, up to llama.cpp's batching noise: another
    request's rows come from other batches (a prompt prefix kept in the cache, other drafts)."""
    return [t.token for t in got] == [t.token for t in expected] and all(
        abs(a.logprob - b.logprob) < 0.05 for a, b in zip(got, expected)
    )


@models
def test_the_messages_api_through_anthropics_client(server: LiveServer) -> None:
    """Anthropic's client (x-api-key): the message is the chat completion's (same
    conversation, greedy), streamed as events adding up to it; a forced tool_use block whose
    tool_result gets an answer; a stop sequence named; errors in Anthropic's shape."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key=server.api_key, max_retries=0)
    ask = "Say 'The quick brown fox jumps over the lazy dog.' exactly."
    greedy = {"temperature": 0}  # an extension: the current API sends none
    options: dict[str, Any] = dict(model=MODEL_ALIAS, max_tokens=24, extra_body=greedy)
    turn = [{"role": "user", "content": ask}]
    done = client.messages.create(system="You are terse.", messages=turn, **options)
    chat = server.client().chat.completions.create(
        model=MODEL_ALIAS,
        messages=[{"role": "system", "content": "You are terse."}, *turn],
        max_tokens=24,
        temperature=0,
    )
    assert done.content[0].text == chat.choices[0].message.content
    assert done.usage.input_tokens == chat.usage.prompt_tokens
    assert done.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(system="You are terse.", messages=turn, **options) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == done.content[0].text == final.content[0].text

    weather = WEATHER_TOOL["function"]
    tools = [{"name": weather["name"], "input_schema": weather["parameters"]}]
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    one_call = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    called = client.messages.create(
        model=MODEL_ALIAS, max_tokens=48, extra_body=greedy, messages=asked, tools=tools,
        tool_choice=one_call,
    )  # fmt: skip
    uses = [b for b in called.content if b.type == "tool_use"]
    assert called.stop_reason == "tool_use" and uses and "city" in uses[0].input
    history = [
        *asked,
        {"role": "assistant", "content": [b.model_dump() for b in called.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}],
        },
    ]
    answer = client.messages.create(messages=history, tools=tools, **options)
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # count_tokens: the input tokens the same request is charged (with tools, a history).
    for system, messages, with_tools in (("You are terse.", turn, False), (None, history, True)):
        extra = {"tools": tools} if with_tools else {}
        extra.update({"system": system} if system else {})
        counted = client.messages.count_tokens(model=MODEL_ALIAS, messages=messages, **extra)
        charged = client.messages.create(messages=messages, **extra, **options).usage
        assert counted.input_tokens == charged.input_tokens

    word = done.content[0].text.split()[2]
    stopped = client.messages.create(messages=turn, stop_sequences=[word], **options)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            messages=turn, thinking={"type": "enabled", "budget_tokens": 1024}, **options
        )
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            messages=turn, **options
        )


@models
def test_ollamas_api_through_ollamas_client(server: LiveServer) -> None:
    """Ollama's own client: /api/chat is the chat completion of the same conversation (greedy),
    streamed as lines adding up to it; /api/generate is the same turn, or with raw the plain
    completion; `format` with a schema as pydantic writes one (no additionalProperties) holds
    the answer to the declared fields; a tool result named by tool_name gets an answer; the
    listings name the served model and context; errors come in Ollama's shape."""
    import ollama

    client = ollama.Client(host=server.url, headers=server.headers(), timeout=300)
    ask = [{"role": "user", "content": "Say 'The quick brown fox jumps over the lazy dog.'"}]
    greedy = {"temperature": 0, "num_predict": 24}
    done = client.chat(model=MODEL_ALIAS, messages=ask, options=greedy, stream=False)
    chat = server.client().chat.completions.create(
        model=MODEL_ALIAS, messages=ask, max_tokens=24, temperature=0
    )
    assert done.message.content == chat.choices[0].message.content
    assert done.prompt_eval_count == chat.usage.prompt_tokens
    assert done.eval_count == chat.usage.completion_tokens
    assert done.done_reason == {"length": "length"}.get(chat.choices[0].finish_reason, "stop")
    lines = list(client.chat(model=MODEL_ALIAS, messages=ask, options=greedy, stream=True))
    assert "".join(line.message.content or "" for line in lines) == done.message.content
    assert [line.done for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1].eval_count == done.eval_count and (lines[-1].eval_duration or 0) > 0
    tagged = MODEL_ALIAS + ":latest"  # Ollama's names carry a tag
    turn = client.generate(model=tagged, prompt=ask[0]["content"], options=greedy, stream=False)
    assert turn.response == done.message.content and turn.model == tagged
    again = server.client().chat.completions.create(
        model=tagged, messages=ask, max_tokens=24, temperature=0
    )  # Ollama's names on the OpenAI routes too
    assert again.choices[0].message.content == done.message.content
    start = "The capital of France is"
    raw = client.generate(model=MODEL_ALIAS, prompt=start, raw=True, options=greedy)
    plain = server.client().completions.create(
        model=MODEL_ALIAS, prompt=start, max_tokens=24, temperature=0
    )
    assert raw.response == plain.choices[0].text

    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    told = [{"role": "user", "content": "Alice Martin is 34. Reply in JSON."}]
    answer = client.chat(
        model=MODEL_ALIAS, messages=told, format=person, options={"temperature": 0}
    )
    assert answer.done_reason == "stop"  # it ends at the object's close, not at max_tokens
    assert set(json.loads(answer.message.content or "")) == {"name", "age"}
    called = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [called]},
        {"role": "tool", "content": '{"temp_c": 21, "sky": "sunny"}', "tool_name": "get_weather"},
    ]
    reply = client.chat(model=MODEL_ALIAS, messages=history, tools=[WEATHER_TOOL], options=greedy)
    assert reply.done and (reply.message.content or reply.message.tool_calls)

    [listed] = client.list().models
    assert listed.model == MODEL_ALIAS and listed.details and listed.details.format == "gguf"
    shown = client.show(tagged)
    assert shown.parameters == "num_ctx 1024" and "tools" in (shown.capabilities or [])
    assert client.ps().models[0].context_length == 1024
    version = httpx.get(server.url + "/api/version", headers=server.headers(), timeout=30)
    assert version.json() == {"version": __version__}
    assert client.chat(model=MODEL_ALIAS, messages=[]).done_reason == "load"

    for bad, status in (
        ({"model": "llama3.2"}, 404),
        ({"options": {"mirostat": 2}}, 400),
        ({"think": True}, 400),
        ({"format": {"type": "nonsense"}}, 400),
    ):
        request = {"model": MODEL_ALIAS, "messages": ask, **bad}
        with pytest.raises(ollama.ResponseError) as err:
            client.chat(**request)
        assert err.value.status_code == status and err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3.2")
    assert err.value.status_code == 404 and "not served here" in err.value.error
    stranger = ollama.Client(host=server.url, headers={"Authorization": "Bearer wrong"})
    with pytest.raises(ollama.ResponseError) as err:
        stranger.chat(model=MODEL_ALIAS, messages=ask)
    assert err.value.status_code == 401


@models
def test_an_ollama_stream_left_early_cancels_the_generation(server: LiveServer) -> None:
    before = server.metrics()
    body = {
        "model": MODEL_ALIAS,
        "prompt": "Count: 1, 2, 3, 4, 5,",  # greedy: counts on for all 600 tokens
        "raw": True,
        "options": {"temperature": 0, "num_predict": 600},
    }
    with httpx.Client(timeout=120) as http:
        url = server.url + "/api/generate"
        with http.stream("POST", url, json=body, headers=server.headers()) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            for n_lines, line in enumerate(response.iter_lines(), 1):
                assert not json.loads(line)["done"]
                if n_lines == 2:
                    break  # leaving the block closes the connection in mid-stream
    deadline = time.monotonic() + 120
    cancelled = "edge_spec_requests_cancelled_total"
    while server.metrics()[cancelled] == before[cancelled]:
        assert time.monotonic() < deadline, "the generation was never cancelled"
        time.sleep(0.05)
    after = server.metrics()
    generated = (
        after["edge_spec_completion_tokens_total"] - before["edge_spec_completion_tokens_total"]
    )
    assert 0 < generated < 600


@models
def test_tool_calls_round_trip_through_the_openai_client(server: LiveServer) -> None:
    """A required call comes back as message.tool_calls (finish_reason tool_calls), streamed
    as tool_call deltas the client assembles; its result as a tool message gets an answer."""
    client = server.client()
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    options = dict(tools=[WEATHER_TOOL], temperature=0, max_tokens=48, parallel_tool_calls=False)
    done = client.chat.completions.create(
        model=MODEL_ALIAS, messages=ask, tool_choice="required", **options
    )
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    named = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ALIAS, messages=ask, tool_choice=named, stream=True, **options
        )
    )
    streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in streamed] == ["get_weather"]
    assert streamed[0].function.arguments == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    history = [
        *ask,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21, "sky": "sunny"}'},
    ]
    answer = client.chat.completions.create(model=MODEL_ALIAS, messages=history, **options)
    assert answer.choices[0].finish_reason in ("stop", "tool_calls", "length")


@models
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
            "schema",
        ),  # noqa: E501
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "x"}},
            },
            "tool_choice",
        ),  # noqa: E501
        ({"grammar": "root ::= ("}, "grammar"),
        ({"grammar": 'root ::= "a"', "json_schema": {}}, "grammar"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_schemas_grammars_and_tools_get_a_400_naming_them(
    server: LiveServer, extra: dict, named: str
) -> None:
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "hi"}], **extra}
    response = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers=server.headers(), timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert named in (error["param"] or "") + error["message"].replace("JSON schema", "schema")
