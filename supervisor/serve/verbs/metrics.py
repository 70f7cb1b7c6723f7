"""``GET /metrics``: Prometheus text format, for root and ``--metrics-group`` only.

Its counts are daemon-wide (every tenant's submissions, outcomes, requests, connections): a
tenant learns from them how busy the others are, so it is not a tenant's to read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Response
from ..metrics import CONTENT_TYPE
from ..protocol import ApiError

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request) -> Response:
    gid, peer = d.config.metrics_gid, req.peer
    if not (peer.is_root or (gid is not None and (peer.gid == gid or gid in peer.groups))):
        raise ApiError(403, "forbidden", f"GET /metrics counts every tenant's tasks, and is "
                       f"root's (uid {peer.uid}); start corral serve with --metrics-group "
                       f"GROUP to let that group's members read it")
    return Response(200, d.metrics.render(), CONTENT_TYPE)
