"""The FastAPI app: OpenAI's /v1/models, /v1/completions, /v1/chat/completions and /v1/responses,
Anthropic's /v1/messages (JSON or SSE) and its count_tokens, Ollama's /api routes (JSON or
newline-delimited), llama-server's /tokenize, /detokenize and /apply-template, plus /health
and /metrics. One worker thread owns the models (see worker.py); handlers only parse, queue,
wait and format."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from sse_starlette import EventSourceResponse

from edge_spec.api import EdgeSpec
from edge_spec.drafts.ngram import SCOPE_SEP
from edge_spec.server import choices, tokens_api
from edge_spec.server import responses as out
from edge_spec.server.errors import api_error, install_error_handlers, read_json
from edge_spec.server.messages_api import MessageShape, parse_messages
from edge_spec.server.metrics import (
    CLIENT_CLOSED,
    CONTENT_TYPE,
    RequestMetricsMiddleware,
    ServerMetrics,
)
from edge_spec.server.ollama_api import add_ollama_routes, served_name
from edge_spec.server.responses_api import ResponseShape, ResponseStore, parse_responses
from edge_spec.server.schemas import (
    APIError,
    ParsedRequest,
    RequestLimits,
    parse_chat,
    parse_completion,
)
from edge_spec.server.worker import Job, QueueFullError, UnavailableError, Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    model_ids: tuple[str, ...]  # the first is listed by /v1/models; requests may use any
    limits: RequestLimits
    api_key: str | None = None  # one key (api_keys: several); none: no authentication
    max_queue: int = 64
    max_request_bytes: int = 1 << 20
    model_details: Mapping[str, Any] = field(default_factory=dict)
    api_keys: tuple[str, ...] = ()
    # A request waiting longer than this for the worker is answered 503 with Retry-After.
    queue_timeout_s: float | None = 300.0
    # Mixed into each key's session names: a client can neither address nor guess the
    # sessions of another key. Fresh per process.
    session_secret: bytes = field(default_factory=lambda: os.urandom(16), repr=False)

    def __post_init__(self) -> None:
        if not self.model_ids:
            raise ValueError("a server needs at least one model id")
        if self.max_queue < 1 or self.max_request_bytes < 1:
            raise ValueError("max_queue and max_request_bytes must be >= 1")
        if self.queue_timeout_s is not None and self.queue_timeout_s <= 0:
            raise ValueError("queue_timeout_s must be > 0 (None: no limit)")
        keys = tuple(dict.fromkeys((*self.api_keys, *([self.api_key] if self.api_key else []))))
        if any(not k for k in keys):
            raise ValueError("an API key may not be empty")
        object.__setattr__(self, "api_keys", keys)

    def scope(self, key: str | None) -> str:
        """The session namespace of a caller: one per API key, never guessable from outside."""
        if key is None:
            return "open"
        return hmac.new(self.session_secret, key.encode(), "sha256").hexdigest()[:16]


def create_app(
    config: ServerConfig,
    load: Callable[[], EdgeSpec],
    *,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """An app whose worker thread calls `load()` at startup (answering 503 until it returns) and
    closes the EdgeSpec at shutdown. `on_fatal` is called if loading fails."""
    metrics = ServerMetrics(
        {
            "queue_depth": ("Requests waiting for the worker.", lambda: worker.queue_depth),
            "requests_running": ("Generations running now (0 or 1).", lambda: worker.busy),
            "rpc_server_lost": (
                "1 once an rpc-server holding the target was lost (restart to reconnect).",
                lambda: float(worker.state == "rpc_lost"),
            ),
        }
    )
    worker = Worker(load, max_queue=config.max_queue, metrics=metrics, on_fatal=on_fatal)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(worker.stop)

    app = FastAPI(
        title="edge-spec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.worker, app.state.metrics = worker, metrics
    install_error_handlers(app)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)

    def caller_key(request: Request) -> str | None:
        """The API key a request presents (`Authorization: Bearer`, or Anthropic's
        `x-api-key`), if it is one of the server's (None otherwise)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            token = request.headers.get("x-api-key", "")
            if not token:
                return None
        given = token.strip().encode()
        matches = [k for k in config.api_keys if hmac.compare_digest(given, k.encode())]
        return matches[0] if matches else None

    async def require_key(request: Request) -> None:
        key = caller_key(request) if config.api_keys else None
        if config.api_keys and key is None:
            raise APIError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>' "
                "(or 'x-api-key: <key>')",
                code="invalid_api_key",
            )
        request.state.session_scope = config.scope(key)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        """Ready or not, to anyone; what went wrong only to a caller with a valid key."""
        state = worker.state
        body: dict[str, Any] = {"status": "ok" if state == "ready" else "unavailable"}
        if config.api_keys and caller_key(request) is not None:
            body.update(state=state, queue_depth=worker.queue_depth)
            if state in ("rpc_lost", "failed"):
                body["error"] = str(worker.load_error)
        return JSONResponse(body, status_code=200 if state == "ready" else 503)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> PlainTextResponse:
        """What Ollama's clients probe before their first request."""
        return PlainTextResponse("edge-spec is running")

    secured = APIRouter(dependencies=[Depends(require_key)])

    @secured.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    @secured.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        card = out.model_card(config.model_ids[0], started, dict(config.model_details))
        return {"object": "list", "data": [card]}

    @secured.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        _check_model(config, model_id)
        return out.model_card(model_id, started, dict(config.model_details))

    @secured.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_json(request, config.max_request_bytes)
        return await _serve(request, worker, config, parse_completion(body, config.limits))

    @secured.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_json(request, config.max_request_bytes)
        return await _serve(request, worker, config, parse_chat(body, config.limits))

    stored = ResponseStore()

    @secured.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        body = await read_json(request, config.max_request_bytes)
        scope = request.state.session_scope
        previous = body.get("previous_response_id") if isinstance(body, Mapping) else None
        history = stored.conversation(scope, previous) if isinstance(previous, str) else []
        req, echo = parse_responses(body, config.limits, history)
        env = out.Envelope(chat=True, model=req.model, id=f"resp_{uuid.uuid4().hex}")

        def remember(turn: list[dict[str, Any]]) -> None:
            stored.put(scope, env.id, echo.previous_response_id, turn)

        keep = remember if echo.store else None
        shape = ResponseShape(env, echo, tools=req.config.tool_mode != "none", remember=keep)
        return await _serve(request, worker, config, req, shape)

    @secured.post("/v1/messages")
    async def create_message(request: Request) -> Response:
        body = await read_json(request, config.max_request_bytes)
        req = parse_messages(body, config.limits)
        env = out.Envelope(chat=True, model=req.model, id=f"msg_{uuid.uuid4().hex}")
        return await _serve(
            request, worker, config, req, MessageShape(env, tools=req.config.tool_mode != "none")
        )

    async def at_once(run: Callable[[EdgeSpec], dict[str, Any]]) -> JSONResponse:
        """A token utility's answer, computed beside whatever generation runs (errors: the
        app's handlers)."""
        return JSONResponse(await asyncio.to_thread(worker.with_spec, run))

    @secured.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request) -> JSONResponse:
        body = await read_json(request, config.max_request_bytes)
        return await at_once(tokens_api.count_tokens(body, config.limits))

    @secured.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        return await at_once(
            tokens_api.tokenize(await read_json(request, config.max_request_bytes))
        )

    @secured.get("/tokenizer_info")
    async def tokenizer_info() -> JSONResponse:
        return await at_once(tokens_api.tokenizer_info)

    @secured.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await read_json(request, config.max_request_bytes)
        return await at_once(tokens_api.detokenize(body))

    @secured.post("/apply-template")
    async def apply_template(request: Request) -> JSONResponse:
        body = await read_json(request, config.max_request_bytes)
        return await at_once(tokens_api.apply_template(body, config.limits, config.model_ids[0]))

    async def serve_ollama(request: Request, req: ParsedRequest, shape: Any) -> Response:
        return await _serve(request, worker, config, req, shape)

    add_ollama_routes(
        secured,
        model_ids=config.model_ids,
        limits=config.limits,
        max_request_bytes=config.max_request_bytes,
        worker=worker,
        serve=serve_ollama,
        check_model=lambda model: _check_model(config, model),
    )
    app.include_router(secured)
    return app


async def _serve(
    request: Request,
    worker: Worker,
    config: ServerConfig,
    req: ParsedRequest,
    shape: out.Shape | None = None,
) -> Response:
    """Queue the generation, wait for its first event (errors found at the start, such as a
    prompt longer than the context, still get their HTTP status), then answer JSON or SSE in
    the request's shape (chat or completion by default)."""
    _check_model(config, req.model)
    if req.config.session is not None:  # a conversation: within the caller's key only
        scope = getattr(request.state, "session_scope", "open")
        req = replace(
            req, config=replace(req.config, session=scoped_session(scope, req.config.session))
        )
    starts = choices.starts(req)
    if shape is None:
        env = out.Envelope(chat=req.messages is not None, model=req.model)
        tools = req.config.tool_mode != "none"
        shape = out.ChatShape(env, req.include_usage, tools, len(starts), req.n)
    job = Job(starts, asyncio.get_running_loop())
    try:
        worker.submit(job)
    except QueueFullError:
        raise APIError(
            429,
            f"the server's queue is full ({config.max_queue} waiting); retry later",
            type="rate_limit_error",
            code="queue_full",
        ) from None
    except UnavailableError as exc:
        raise api_error(exc) from None
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        event = await _first_event(job, config.queue_timeout_s)
        if req.stream and event[0] == "delta":
            watcher.cancel()  # from here on the streamed response watches the connection
            sse = _sse(job, event, shape.events(), shape.param, len(starts))
            if getattr(shape, "ndjson", False):  # Ollama's: one JSON object per line
                return StreamingResponse(sse, media_type="application/x-ndjson")
            return EventSourceResponse(sse, sep="\n", ping=15)
        results = []
        while event[0] == "delta":
            if event[1].result is not None:
                results.append(event[1].result)
                if len(results) == len(starts):
                    break
            event = await job.events.get()
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()
    kind, payload = event
    if kind == "delta":
        return JSONResponse(shape.body(*results))
    if kind == "cancelled":
        return Response(status_code=CLIENT_CLOSED)  # nobody is listening; counted as such
    raise api_error(payload, shape.param)


async def _first_event(job: Job, timeout_s: float | None) -> tuple[str, Any]:
    """The job's first event; 503 (Retry-After) if it waited in the queue past timeout_s. Once
    the worker has taken it, a long prefill is waited for."""
    while True:
        wait = None if timeout_s is None or job.started else timeout_s
        try:
            return await asyncio.wait_for(job.events.get(), wait)
        except asyncio.TimeoutError:
            if job.expire():
                raise APIError(
                    503,
                    f"the request waited {timeout_s:.0f} s for the worker; retry later",
                    type="server_error",
                    code="queue_timeout",
                    headers={"Retry-After": "5"},
                ) from None


def scoped_session(scope: str, session: str) -> str:
    """A request's session name within its caller's namespace (drafts.ngram.SCOPE_SEP): per-key
    limits apply within it, and no other key can reach it."""
    return f"{scope}{SCOPE_SEP}{session}"


async def _sse(
    job: Job, first: tuple[str, Any], events: out.Events, param: str, n_choices: int = 1
) -> AsyncIterator[Any]:
    """The events of one streamed response (of its n_choices answers, one after another), in
    its shape's format. Cancelled by sse-starlette when the client goes away; the finally
    block then tells the worker to stop after the current step."""
    finished = False
    n_results = 0
    try:
        for event in events.opening():
            yield event
        kind, payload = first
        while True:
            if kind == "cancelled":
                return
            if kind == "error":  # after the first event: the status line has gone already
                for event in events.error(api_error(payload, param).body()):
                    yield event
                return
            if payload.result is not None:
                for event in events.final(payload.text, payload.result, payload.logprobs):
                    yield event
                n_results += 1
                if n_results == n_choices:
                    finished = True
                    return
            else:
                for event in events.delta(payload.text, payload.logprobs):
                    yield event
            kind, payload = await job.events.get()
    finally:
        if not finished:
            job.cancel()


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """While a request waits in the queue or runs without streaming, watch its connection."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            log.info("client disconnected; cancelling its generation")
            job.cancel()
            return


def _check_model(config: ServerConfig, model: str) -> None:
    """Any route takes the served model's ids, and Ollama's names for it (served_name)."""
    if served_name(model, config.model_ids) not in config.model_ids:
        raise APIError(
            404,
            f"The model {model!r} does not exist; this server serves "
            + ", ".join(repr(m) for m in config.model_ids),
            param="model",
            code="model_not_found",
        )
