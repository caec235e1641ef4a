"""The one thread that owns the EdgeSpec: it loads the pair, then runs queued generations one at
a time in arrival order (EdgeSpec is not thread-safe, and one pair has one KV cache).

Each job reports back to the event loop through an asyncio.Queue of events:
("delta", TextDelta) per decode step (the last one carries the result), or ("error", exc), or
("cancelled", None). A job may generate several answers (OpenAI's n, or several prompts), one
after another: each ends with the delta that carries its result. A job is cancelled by setting
its flag from any thread; the worker looks at the flag before starting and after every step,
then closes the generator, which releases the EdgeSpec's lock, so a cancelled generation stops
within one step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from edge_spec.api import EdgeSpec, TextDelta
from edge_spec.errors import EdgeSpecError, RpcError
from edge_spec.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

State = Literal["loading", "ready", "stopping", "failed", "rpc_lost"]
StartFn = Callable[[EdgeSpec], Iterator[TextDelta]]


class QueueFullError(Exception):
    """Every slot of the bounded queue is taken."""


class UnavailableError(Exception):
    """The worker is loading, stopping, or failed to load."""


class Job:
    """One request: each of `starts` (or the one start) builds a generation's delta iterator
    on the worker thread, the next once the one before has its result."""

    def __init__(
        self, starts: StartFn | Sequence[StartFn], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.starts: tuple[StartFn, ...] = (starts,) if callable(starts) else tuple(starts)
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._loop = loop
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self.started = False
        self.t_queued = time.perf_counter()

    def cancel(self) -> None:
        self._cancelled.set()

    def begin(self) -> bool:
        """The worker takes the job: False if it was cancelled (or expired) first."""
        with self._lock:
            if self._cancelled.is_set():
                return False
            self.started = True
            return True

    def expire(self) -> bool:
        """Give up on a job still waiting in the queue: True if it had not started (it never
        will), False if the worker took it first."""
        with self._lock:
            if self.started:
                return False
            self._cancelled.set()
            return True

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def emit(self, kind: str, payload: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class Worker:
    def __init__(
        self,
        load: Callable[[], EdgeSpec],
        *,
        max_queue: int,
        metrics: ServerMetrics,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._load = load
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._metrics = metrics
        self._on_fatal = on_fatal
        self._state_lock = threading.Lock()
        self._state: State = "loading"
        self._running: Job | None = None
        self.spec: EdgeSpec | None = None
        self._spec_lock = threading.Lock()  # with_spec's calls against close
        self.load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="edge-spec-worker", daemon=True)

    @property
    def state(self) -> State:
        return self._state

    @property
    def queue_depth(self) -> int:
        """Jobs waiting, not counting the one running."""
        return self._queue.qsize()

    @property
    def busy(self) -> int:
        return int(self._running is not None)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; raises UnavailableError unless ready, QueueFullError when full."""
        with self._state_lock:
            if self._state != "ready":
                raise UnavailableError(self._state)
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise QueueFullError from None

    def with_spec(self, fn: Callable[[EdgeSpec], Any]) -> Any:
        """fn(spec) now, on the caller's thread, beside whatever generation runs: for what
        only reads the vocabulary and the template (tokenizing, rendering a chat). Raises
        UnavailableError unless the models are loaded."""
        with self._spec_lock:
            if self._state != "ready" or self.spec is None:
                raise UnavailableError(self._state)
            return fn(self.spec)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Refuse new jobs, cancel the queued and the running one, wait for the thread."""
        with self._state_lock:
            if self._state != "failed":
                self._state = "stopping"
        running = self._running
        if running is not None:
            running.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            job.emit("error", UnavailableError("stopping"))
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("the worker did not stop within %.0f s", timeout_s)

    # ---- the thread --------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self.spec = self._load()
        except BaseException as exc:  # noqa: BLE001 - reported, and the server shuts down
            # With on_fatal the caller reports it (the CLI: one line); otherwise it is logged.
            log.log(logging.INFO if self._on_fatal else logging.ERROR, "loading failed: %s", exc)
            self.load_error = exc
            with self._state_lock:
                self._state = "failed"
            if self._on_fatal is not None:
                self._on_fatal(exc)
            return
        with self._state_lock:
            if self._state == "loading":
                self._state = "ready"
        log.info("models loaded; serving")
        try:
            while self._state == "ready":
                try:
                    job = self._queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                self._run(job)
        finally:
            with self._spec_lock:
                self.spec.close()
                self.spec = None

    def _run(self, job: Job) -> None:
        # _running is set before the state is read, and stop() sets the state before it reads
        # _running: whichever runs first, a job taken while the server stops is never run.
        self._running = job
        if self._state != "ready":
            self._running = None
            job.emit("error", UnavailableError("stopping"))
            return
        if not job.begin():  # the client left, or its queue time ran out, while it waited
            self._running = None
            self._metrics.cancelled.inc()
            job.emit("cancelled")
            return
        assert self.spec is not None
        try:
            for i, start in enumerate(job.starts):
                if i and job.cancelled:  # between two answers
                    self._metrics.cancelled.inc()
                    job.emit("cancelled")
                    return
                if not self._generate(job, start, timed=i == 0):
                    return
        finally:
            self._running = None

    def _generate(self, job: Job, start: StartFn, timed: bool) -> bool:
        """Run one generation of the job, emitting its deltas; False if it ended without a
        result (cancelled or failed, and reported as such). `timed`: its first token counts
        as the request's."""
        assert self.spec is not None
        deltas: Iterator[TextDelta] | None = None
        n_generated = 0
        first = timed
        try:
            deltas = start(self.spec)
            for delta in deltas:
                n_generated += len(delta.token_ids)
                if first and (delta.token_ids or delta.result is not None):
                    self._metrics.ttft.observe(time.perf_counter() - job.t_queued)
                    first = False
                job.emit("delta", delta)
                if delta.result is not None:
                    self._record(delta)
                    return True
                if job.cancelled:
                    log.info("generation cancelled after %d tokens", n_generated)
                    self._metrics.cancelled.inc()
                    self._metrics.completion_tokens.inc(n_generated)
                    job.emit("cancelled")
                    return False
            raise RuntimeError("a generation ended without its result")
        except Exception as exc:  # noqa: BLE001 - every failure goes back to its request
            if not isinstance(exc, EdgeSpecError):
                log.exception("generation failed")
            if isinstance(exc, RpcError):
                # The target's rpc-server is gone and llama.cpp cannot reconnect in-process:
                # health says so (503) and new requests are refused until a restart.
                with self._state_lock:
                    if self._state == "ready":
                        self._state = "rpc_lost"
                        self.load_error = exc
            job.emit("error", exc)
            return False
        finally:
            if deltas is not None and hasattr(deltas, "close"):
                deltas.close()  # runs the generator's finally blocks: releases the lock

    def _record(self, delta: TextDelta) -> None:
        result = delta.result
        assert result is not None
        m = self._metrics
        m.prompt_tokens.inc(len(result.prompt_token_ids))
        m.completion_tokens.inc(len(result.token_ids))
        m.drafted.inc(result.stats.n_drafted)
        m.accepted.inc(result.stats.n_accepted)
