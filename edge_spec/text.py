"""Turning token bytes into text deltas: never split a UTF-8 character, never leak the start of
a stop string that may still complete."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextAssembler:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(stop)
        self.text = ""  # everything decoded so far (cut at a stop string once one matched)
        self._emitted = 0  # how much of self.text was handed out
        self.stopped = False

    def feed(self, data: bytes) -> bool:
        """Adds a token's bytes; returns True when a stop string has now appeared (the text is
        cut just before it)."""
        if self.stopped:
            return True
        search_from = max(self._emitted - max((len(s) for s in self._stop), default=0), 0)
        self.text += self._decoder.decode(data)
        for stop in self._stop:
            at = self.text.find(stop, search_from)
            if at != -1:
                self.text = self.text[:at]
                self.stopped = True
        return self.stopped

    def take_ready(self) -> str:
        """Text that can be emitted now: all of it except a suffix that could be the start of
        a stop string."""
        end = len(self.text) - self._held_back()
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out

    def finish(self) -> str:
        """The rest, including a dangling incomplete UTF-8 sequence (as U+FFFD)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out

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
