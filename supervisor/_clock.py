"""Times across a hand-over: trio's clock is each process's own, the monotonic clock is the
machine's (seconds since boot, the same for every process)."""

from __future__ import annotations

import math
import time

import trio

__all__ = ["HandOverClock"]


class HandOverClock:
    """trio time <-> monotonic seconds, both read once: ``out`` for the JSON a hand-over
    carries (None for no time, or none due), ``back`` on the other side (None: never)."""

    def __init__(self) -> None:
        self.trio, self.mono = trio.current_time(), time.monotonic()

    def out(self, t: float | None) -> float | None:
        return None if t is None or math.isinf(t) else t - self.trio + self.mono

    def back(self, t: float | None) -> float:
        return math.inf if t is None else t - self.mono + self.trio

    def back_or_none(self, t: float | None) -> float | None:
        return None if t is None else t - self.mono + self.trio
