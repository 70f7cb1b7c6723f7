"""``GET /v1/tasks/ID``: state, the request as accepted, and the result once finished."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..daemontask import row_json
from ..http import Request, Response, json_response

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request, id: str) -> Response:
    t = d.find(req.peer, id)
    if t is not None:
        return json_response(200, t.to_json(full=True, position=d.scheduler.position(t)))
    return json_response(200, row_json(await d.find_row(req.peer, id),
                                       output_dir=d.output_dir))
