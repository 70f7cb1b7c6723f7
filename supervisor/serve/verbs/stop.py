"""``POST /v1/tasks/ID/stop`` ``{"force": false}``: idempotent.

A queued task is taken out of the queue and never starts (its record says ``cancelled``,
not started).  A running one gets a graceful stop; a second request (or ``force``) kills it
now.  A finished task is left as it is (``changed: false``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dispatch import stop_queued
from ..http import Request, Response, json_response
from ..protocol import parse_json_body, parse_stop
from ..state import refuse_while_restarting

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request, id: str) -> Response:
    force = parse_stop(parse_json_body(req.body) if req.body.strip() else {})
    refuse_while_restarting(d)
    t = await d.find(req.peer, id)
    if t is None:
        row = await d.find_row(req.peer, id, light=True)
        return json_response(200, {"id": id, "state": row["state"], "changed": False})
    changed = stop_queued(d, t) or t.stop(force)
    return json_response(200, {"id": t.id, "state": t.live_state, "changed": changed})
