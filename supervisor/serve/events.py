"""State changes of tasks, for ``GET /v1/events`` subscribers.

Each subscriber has a bounded buffer: a subscriber that does not keep up loses the oldest
events, and its next frame says how many (``{"dropped": N}``); it never grows the daemon's
memory.  A subscriber sees the events of its own uid's tasks (root: every task).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from .peers import Peer

__all__ = ["EventHub", "Subscription"]

BUFFER = 1024


class Subscription:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.queue: collections.deque[dict[str, Any]] = collections.deque(maxlen=BUFFER)
        self.dropped = 0
        self._wake = trio.Event()

    def push(self, event: dict[str, Any]) -> None:
        if len(self.queue) == BUFFER:
            self.dropped += 1
        self.queue.append(event)
        self._wake.set()

    async def next_batch(self) -> list[dict[str, Any]]:
        """Wait for events; returns them (with a ``dropped`` frame first if some were)."""
        while not self.queue and not self.dropped:
            await self._wake.wait()
            self._wake = trio.Event()
        out: list[dict[str, Any]] = []
        if self.dropped:
            out.append({"dropped": self.dropped})
            self.dropped = 0
        out.extend(self.queue)
        self.queue.clear()
        return out


class EventHub:
    def __init__(self) -> None:
        self._subs: set[Subscription] = set()

    def publish(self, uid: int, event: dict[str, Any]) -> None:
        for sub in self._subs:
            if sub.peer.may_see(uid):
                sub.push(event)

    @contextmanager
    def subscribe(self, peer: Peer) -> Iterator[Subscription]:
        sub = Subscription(peer)
        self._subs.add(sub)
        try:
            yield sub
        finally:
            self._subs.discard(sub)

    def __len__(self) -> int:
        return len(self._subs)
