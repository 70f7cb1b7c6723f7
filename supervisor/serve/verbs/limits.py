"""``GET /v1/limits``: what a caller may ask for, so an agent host can tell its model.

Default and ceiling time limits, the controllers enabled for tasks (which resource limits
work here), the supported properties, the caller's quotas and what it uses of them, and how
much of each stream a task's output file keeps here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..events import PER_UID
from ..http import Request, Response, json_response

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request) -> Response:
    from ...syntax import SUPPORTED

    q = d.scheduler.limits  # (the queued bytes as the state filesystem allows)
    running, queued = d.scheduler.counts(req.peer.uid)
    return json_response(200, {
        "default_time_limit": d.sup.default_time_limit,
        "max_time_limit": d.sup.max_time_limit,
        "controllers": sorted(d.sup.controllers),
        "properties": list(SUPPORTED),
        "stdin_pipe": d.stdin_pipes,
        "uid": req.peer.uid,
        "quotas": {"max_running": q.max_running_per_uid, "max_queued": q.max_queued_per_uid,
                   "max_queued_bytes": q.max_queued_bytes_per_uid,
                   "max_connections": d.config.max_connections_per_uid,
                   "max_body_bytes_in_flight": d.shares.body_bytes,
                   "max_event_streams": PER_UID,
                   "running": running, "queued": queued,
                   "connections": d.shares.connections_of(req.peer.uid),
                   "event_streams": d.hub.held_by(req.peer.uid)},
        "daemon": {"max_running": q.max_running, "max_queued": q.max_queued,
                   "max_queued_bytes": q.max_queued_bytes,
                   "max_connections": d.config.max_connections,
                   "first_task_slots": q.kept_free,
                   "running": d.scheduler.total_running, "queued": d.scheduler.total_queued},
        "max_body_bytes": d.config.http.max_body,
        "output_cap_bytes": d.disk.stream_cap,
    })
