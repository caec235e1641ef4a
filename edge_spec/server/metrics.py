"""Prometheus text exposition (format 0.0.4), written by hand: a few counters, gauges and
histograms need no client library. Safe to update from the worker thread and the event loop.
RequestMetricsMiddleware counts and times every HTTP request."""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; a request on a CPU takes from tens of milliseconds to minutes.
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Labels = tuple[tuple[str, str], ...]
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/metrics", "/health")
CLIENT_CLOSED = 499  # nginx's code for "the client closed the connection before the answer"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: Labels = ()) -> str:
    pairs = labels + extra
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class _Family:
    def __init__(self, name: str, help_text: str, kind: str) -> None:
        self.name, self.help_text, self.kind = name, help_text, kind
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    def __init__(self, name: str, help_text: str, labelled: bool = False) -> None:
        super().__init__(name, help_text, "counter")
        self._values: dict[Labels, float] = {} if labelled else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(tuple(sorted(labels.items())), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            values = dict(self._values)
        return [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(values.items())]


class Gauge(_Family):
    """A value read when the metrics are scraped."""

    def __init__(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        super().__init__(name, help_text, "gauge")
        self._read = read

    def lines(self) -> list[str]:
        return [f"{self.name} {_number(self._read())}"]


class Histogram(_Family):
    def __init__(self, name: str, help_text: str, buckets: Iterable[float]) -> None:
        super().__init__(name, help_text, "histogram")
        self.buckets = tuple(sorted(buckets))
        # per label set: [count per bucket (non-cumulative) + overflow, sum]
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            counts, total = self._series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            counts[bisect.bisect_left(self.buckets, value)] += 1  # le is inclusive
            total[0] += value

    def lines(self) -> list[str]:
        with self._lock:
            series = {k: (list(c), t[0]) for k, (c, t) in self._series.items()}
        out: list[str] = []
        for key, (counts, total) in sorted(series.items()):
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts):
                running += n
                le = (("le", _number(bound)),)
                out.append(f"{self.name}_bucket{_labels(key, le)} {running}")
            out.append(f"{self.name}_sum{_labels(key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(key)} {running}")
        return out


class ServerMetrics:
    """Everything /metrics exposes. Gauges read the worker through callbacks."""

    def __init__(self, gauges: Mapping[str, tuple[str, Callable[[], float]]] = ()) -> None:
        p = "edge_spec_"
        self.requests = Counter(
            p + "requests_total", "HTTP requests by endpoint and status.", labelled=True
        )
        self.cancelled = Counter(
            p + "requests_cancelled_total", "Generations stopped because the client went away."
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "Prompt tokens of finished generations."
        )
        self.completion_tokens = Counter(
            p + "completion_tokens_total", "Tokens generated (cancelled requests included)."
        )
        self.drafted = Counter(p + "drafted_tokens_total", "Draft tokens proposed.")
        self.accepted = Counter(p + "accepted_tokens_total", "Draft tokens the target accepted.")
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Time from receiving a request to its last byte, by endpoint.",
            DURATION_BUCKETS_S,
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Time from queueing a generation to its first token (queue wait included).",
            TTFT_BUCKETS_S,
        )
        acceptance = Gauge(
            p + "acceptance_rate",
            "Accepted over drafted tokens since start (0 before anything was drafted).",
            lambda: self.accepted.value() / self.drafted.value() if self.drafted.value() else 0.0,
        )
        self._families: list[Counter | Gauge | Histogram] = [
            self.requests,
            self.cancelled,
            self.prompt_tokens,
            self.completion_tokens,
            self.drafted,
            self.accepted,
            acceptance,
            *(Gauge(p + name, text, read) for name, (text, read) in dict(gauges).items()),
            self.duration,
            self.ttft,
        ]

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families:
            lines += family.header() + family.lines()
        return "\n".join(lines) + "\n"


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
            self.metrics.requests.inc(endpoint=endpoint, status=code)
            self.metrics.duration.observe(time.perf_counter() - t0, endpoint=endpoint)
