"""``GET /v1/events``: NDJSON, one line per state change of the caller's tasks (root: all).

``{"id", "state", "uid", "at"[, "outcome"]}``; ``{"dropped": N}`` when the client fell more
than a buffer behind (the oldest events went).  The first line is ``{"subscribed": true}``, so
a client knows that nothing after it is missed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..http import Request, Send, Streaming

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request) -> Streaming:
    async def produce(send: Send) -> None:
        with d.hub.subscribe(req.peer) as sub:
            await send(b'{"subscribed":true}\n')
            while True:
                batch = await sub.next_batch()
                await send(b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n"
                                    for e in batch))

    return Streaming(200, produce)
