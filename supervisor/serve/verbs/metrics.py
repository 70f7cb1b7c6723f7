"""``GET /metrics``: Prometheus text format."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Response
from ..metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request) -> Response:
    return Response(200, d.metrics.render(), CONTENT_TYPE)
