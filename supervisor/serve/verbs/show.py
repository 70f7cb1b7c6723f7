"""``GET /v1/tasks/ID``: state, the request as accepted, and the result once finished."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..daemontask import row_json, row_weight
from ..http import HEAVY_ANSWER, Request, Response, json_response

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request, id: str) -> Response:
    t = await d.find(req.peer, id)
    if t is not None:
        if t.recorded and t.weight > HEAVY_ANSWER:  # (finished: its answer is final)
            return await d.finished_answer(req.peer.uid, t.id, lambda: t.to_json(full=True))
        return json_response(200, t.to_json(full=True, position=d.scheduler.position(t)),
                             t.weight)
    body = await d.recorded_answer(req.peer, id)
    if body is not None:
        return Response(200, body)
    row = await d.find_row(req.peer, id)  # (404, 410, or its answer is small or not final)
    return json_response(200, row_json(row, output_dir=d.output_dir), row_weight(row))
