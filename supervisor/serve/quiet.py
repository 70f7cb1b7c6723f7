"""Lines a tenant can make the daemon log, at most once a minute per key, the rest counted.

A tenant that found a request answered 500 repeated it 534 times a second: 1.5 MB of root's
log in 3 s, journald's rate limit dropping the daemon's own lines; a completion target failing
every event made a line per event per try (an independent attack, each).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import trio

__all__ = ["Quiet"]


class Quiet:
    """Lines logged per key (a uid, a kind of failure) at most once every ``gap`` seconds of
    trio's clock; the ones held back are counted, and said with the next
    (``" (N more{whose} since the last one logged)"``)."""

    def __init__(self, gap: float = 60.0, whose: str = "") -> None:
        self.gap = gap
        self.whose = whose
        self.last: dict[Hashable, float] = {}
        self.held: dict[Hashable, int] = {}

    def say(self, key: Hashable, emit: Callable[..., None], message: str, *args: Any) -> None:
        """``emit(message, *args)`` (``log.exception`` in an ``except`` block, say), unless
        ``key`` was said less than ``gap`` ago."""
        now = trio.current_time()
        if now - self.last.get(key, -self.gap) < self.gap:
            self.held[key] = self.held.get(key, 0) + 1
            return
        if len(self.last) > 4096:
            self.last = {k: t for k, t in self.last.items() if now - t < self.gap}
        self.last[key] = now
        held = self.held.pop(key, 0)
        emit(message + (f" ({held} more{self.whose} since the last one logged)" if held else ""),
             *args)
