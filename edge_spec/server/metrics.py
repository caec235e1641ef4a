"""The server's Prometheus metrics, kept by prometheus_client in a registry of their own (so two
apps in one process never share counters). RequestMetricsMiddleware counts and times every HTTP
request."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds; a request on a CPU takes from tens of milliseconds to minutes.
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models")
ENDPOINTS += ("/v1/messages", "/api/chat", "/api/generate", "/metrics", "/health")
CLIENT_CLOSED = 499  # nginx's code for "the client closed the connection before the answer"

# The *_created series double every counter's lines and say nothing a scraper needs here.
disable_created_metrics()


class ServerMetrics:
    """Everything /metrics exposes. Gauges read the worker through callbacks."""

    def __init__(self, gauges: Mapping[str, tuple[str, Callable[[], float]]] = ()) -> None:
        p = "edge_spec_"
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            p + "requests",
            "HTTP requests by endpoint and status.",
            ("endpoint", "status"),
            registry=registry,
        )
        self.cancelled = Counter(
            p + "requests_cancelled",
            "Generations stopped because the client went away.",
            registry=registry,
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens", "Prompt tokens of finished generations.", registry=registry
        )
        self.completion_tokens = Counter(
            p + "completion_tokens",
            "Tokens generated (cancelled requests included).",
            registry=registry,
        )
        self.drafted = Counter(p + "drafted_tokens", "Draft tokens proposed.", registry=registry)
        self.accepted = Counter(
            p + "accepted_tokens", "Draft tokens the target accepted.", registry=registry
        )
        Gauge(
            p + "acceptance_rate",
            "Accepted over drafted tokens since start (0 before anything was drafted).",
            registry=registry,
        ).set_function(self._acceptance)
        for name, (text, read) in dict(gauges).items():
            Gauge(p + name, text, registry=registry).set_function(read)
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Time from receiving a request to its last byte, by endpoint.",
            ("endpoint",),
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Time from queueing a generation to its first token (queue wait included).",
            buckets=TTFT_BUCKETS_S,
            registry=registry,
        )

    def value(self, name: str, **labels: str) -> float:
        """The current value of one series (0 if it has none yet)."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def _acceptance(self) -> float:
        drafted = self.value("edge_spec_drafted_tokens_total")
        return self.value("edge_spec_accepted_tokens_total") / drafted if drafted else 0.0

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


class RequestMetricsMiddleware:
    """ASGI middleware: count each request by endpoint and status and time it to its last byte
    (for a stream, the end of the stream). A response that never finished counts as 499."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = (
            path
            if path in ENDPOINTS
            else ("/v1/models" if path.startswith("/v1/models/") else "other")
        )
        status, complete = [CLIENT_CLOSED], [False]
        t0 = time.perf_counter()

        async def tracking_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                complete[0] = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            status[0], complete[0] = 500, True  # answered by Starlette's outermost handler
            raise
        finally:
            code = str(status[0]) if complete[0] else str(CLIENT_CLOSED)
            self.metrics.requests.labels(endpoint=endpoint, status=code).inc()
            self.metrics.duration.labels(endpoint=endpoint).observe(time.perf_counter() - t0)
