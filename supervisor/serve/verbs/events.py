"""``GET /v1/events``: NDJSON, one line per state change of the caller's tasks (root: all).

``{"id", "state", "uid", "at"[, "outcome"]}``; ``{"dropped": N}`` when the client fell more
than a buffer behind (the oldest events went).  The first line is ``{"subscribed": true}``, so
a client knows that nothing after it is missed.  A uid holds at most ``events.PER_UID`` of
them at once (429 ``too_many_streams``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Send, Streaming

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request) -> Streaming:
    sub = d.hub.open(req.peer)  # (429 here, before the stream's status is sent)

    async def produce(send: Send) -> None:
        await send(b'{"subscribed":true}\n')
        while True:
            await send(await sub.next_batch())

    return Streaming(200, produce, release=lambda: d.hub.close(sub))
