"""Stored responses, for `previous_response_id`: a response made with `store` (OpenAI's
default) keeps its turn -- the request's input items as chat messages and its answer -- with a
link to the response it continued, so that a request naming it as `previous_response_id` gets
the whole conversation without sending it again. Kept in memory only, per API key (a client
can neither read nor name another key's responses), the least recently used first out past
MAX_RESPONSES or MAX_BYTES; a conversation one of whose turns went out is answered 404, as a
response that does not exist."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from edge_spec.server.schemas import APIError

MAX_RESPONSES = 1024
MAX_BYTES = 64 << 20
MAX_TURNS = 4096  # a chain longer than this is refused (it would not fit a context anyway)

Messages = tuple[dict[str, Any], ...]


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._turns: OrderedDict[tuple[str, str], tuple[str | None, Messages, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, scope: str, response_id: str, previous: str | None, turn: Sequence[dict]) -> None:
        """Keep a response's turn (its input and answer as chat messages) after `previous`."""
        messages = tuple(dict(m) for m in turn)
        size = len(json.dumps(messages, ensure_ascii=False))
        with self._lock:
            self._turns[scope, response_id] = (previous, messages, size)
            self._bytes += size
            while len(self._turns) > self.max_responses or self._bytes > self.max_bytes:
                _, (_, _, dropped) = self._turns.popitem(last=False)
                self._bytes -= dropped

    def conversation(self, scope: str, response_id: str) -> list[dict[str, Any]]:
        """The messages of a stored response's conversation, oldest turn first (each turn used
        again becomes the most recently used); raises APIError(404) if it or a turn before it
        is not (or no longer) stored."""
        turns: list[Messages] = []
        with self._lock:
            at: str | None = response_id
            while at is not None:
                entry = self._turns.get((scope, at))
                if entry is None or len(turns) >= MAX_TURNS:
                    raise APIError(
                        404,
                        f"Previous response with id {response_id!r} not found"
                        + ("" if at == response_id else " (part of its conversation expired)"),
                        param="previous_response_id",
                        code="previous_response_not_found",
                    )
                self._turns.move_to_end((scope, at))
                turns.append(entry[1])
                at = entry[0]
        return [dict(m) for turn in reversed(turns) for m in turn]
