"""State changes of tasks, for ``GET /v1/events`` subscribers.

Each subscriber has a bounded buffer: a subscriber that does not keep up loses the oldest
events, and its next frame says how many (``{"dropped": N}``); it never grows the daemon's
memory.  A subscriber sees the events of its own uid's tasks (root: every task).

What a tenant's subscriptions cost the daemon is bounded by the tenant: a uid holds at most
:data:`PER_UID` of them (root: any), an event is encoded once whoever sees it, and reaches
only its own uid's subscribers and root's.  (A tenant's 250 unread subscriptions and its own
flood of tasks made the loop encode every event 250 times: another tenant's requests took
seven times as long.)
"""

from __future__ import annotations

import collections
import json
from typing import Any

import trio

from .peers import Peer
from .protocol import ApiError

__all__ = ["BUFFER", "PER_UID", "EventHub", "Subscription"]

BUFFER = 1024  # events a subscriber may fall behind by (then the oldest are dropped)
PER_UID = 16  # subscriptions a uid may hold at once (one sees every event of its tasks)


class Subscription:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.queue: collections.deque[bytes] = collections.deque(maxlen=BUFFER)
        self.dropped = 0
        self._wake = trio.Event()

    def push(self, line: bytes) -> None:
        if len(self.queue) == BUFFER:
            self.dropped += 1
        self.queue.append(line)
        self._wake.set()

    async def next_batch(self) -> bytes:
        """Wait for events; returns their lines (after a ``dropped`` line if some were)."""
        while not self.queue and not self.dropped:
            await self._wake.wait()
            self._wake = trio.Event()
        out = b"".join(self.queue)
        if self.dropped:
            out = b'{"dropped":%d}\n' % self.dropped + out
            self.dropped = 0
        self.queue.clear()
        return out


class EventHub:
    def __init__(self) -> None:
        self._of: dict[int, set[Subscription]] = {}  # uid -> its subscriptions (root's: all)

    def publish(self, uid: int, event: dict[str, Any]) -> None:
        """``event`` of a task of ``uid``: to that uid's subscribers and root's, encoded
        once."""
        mine, root = self._of.get(uid, ()), self._of.get(0, ()) if uid != 0 else ()
        if not mine and not root:
            return
        line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        for sub in (*mine, *root):
            sub.push(line)

    def open(self, peer: Peer) -> Subscription:
        """A subscription of ``peer``'s, until :meth:`close`; 429 ``too_many_streams`` when
        its uid holds :data:`PER_UID` already."""
        held = self._of.get(peer.uid, set())
        if len(held) >= PER_UID and not peer.is_root:
            raise ApiError(429, "too_many_streams", f"uid {peer.uid} holds {len(held)} event "
                           f"streams (GET /v1/events), the most one uid may hold; each sees "
                           f"every event of your tasks: share one, or close one first")
        sub = Subscription(peer)
        self._of.setdefault(peer.uid, set()).add(sub)
        return sub

    def close(self, sub: Subscription) -> None:
        held = self._of.get(sub.peer.uid, set())
        held.discard(sub)
        if not held:
            self._of.pop(sub.peer.uid, None)

    def held_by(self, uid: int) -> int:
        return len(self._of.get(uid, ()))

    def __len__(self) -> int:
        return sum(len(s) for s in self._of.values())
