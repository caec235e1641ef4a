"""Turning token bytes into text deltas: never split a UTF-8 character, never leak the start of
a stop string that may still complete, and remember which characters came from accepted draft
tokens (a terminal marks them)."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

Span = tuple[str, bool]  # a run of text, and whether it came from accepted draft tokens


class TextAssembler:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(stop)
        self.text = ""  # everything decoded so far (cut at a stop string once one matched)
        self._drafted = bytearray()  # per character of text: 1 if an accepted draft gave it
        self._emitted = 0  # how much of self.text was handed out
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, data: bytes, from_draft: bool = False) -> bool:
        """Adds a token's bytes; returns True when a stop string has now appeared (the text is
        cut just before it). A character completed by this token counts as from_draft."""
        if self.stopped:
            return True
        search_from = max(self._emitted - max((len(s) for s in self._stop), default=0), 0)
        piece = self._decoder.decode(data)
        self.text += piece
        self._drafted += bytes([from_draft]) * len(piece)
        for stop in self._stop:
            at = self.text.find(stop, search_from)
            if at != -1:
                self.text = self.text[:at]
                del self._drafted[at:]
                self.stopped = True
                self.matched = stop
        return self.stopped

    def take_ready(self) -> str:
        """Text that can be emitted now: all of it except a suffix that could be the start of
        a stop string."""
        return "".join(text for text, _ in self.take_ready_spans())

    def take_ready_spans(self) -> list[Span]:
        """take_ready, as runs of text with whether each came from accepted drafts."""
        end = len(self.text) - self._held_back()
        if end <= self._emitted:
            return []
        return self._spans(end)

    def finish(self) -> str:
        """The rest, including a dangling incomplete UTF-8 sequence (as U+FFFD)."""
        return "".join(text for text, _ in self.finish_spans())

    def finish_spans(self) -> list[Span]:
        if not self.stopped:
            tail = self._decoder.decode(b"", final=True)
            self.text += tail
            self._drafted += bytes(len(tail))
        return self._spans(len(self.text))

    def _spans(self, end: int) -> list[Span]:
        spans: list[Span] = []
        start = self._emitted
        while start < end:
            flag = self._drafted[start]
            stop = start + 1
            while stop < end and self._drafted[stop] == flag:
                stop += 1
            spans.append((self.text[start:stop], bool(flag)))
            start = stop
        self._emitted = end
        return spans

    def _held_back(self) -> int:
        if self.stopped:
            return 0
        longest = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
