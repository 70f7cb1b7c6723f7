"""``GET /v1/tasks/ID/wait?timeout=30s``: a long poll for the result.

200 with the task (its ``result`` included) once it has finished and its record is written;
202 with its state if ``timeout`` passes first.  At most 1 hour per request: wait again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from ..daemontask import row_json, row_weight
from ..http import HEAVY_ANSWER, Request, Response, json_response
from ..protocol import wait_duration

if TYPE_CHECKING:
    from ..state import Daemon


def _timeout(text: str | None) -> float:
    return 30.0 if text is None else wait_duration(text, "timeout")


async def handle(d: Daemon, req: Request, id: str) -> Response:
    timeout = _timeout(req.query.get("timeout"))
    t = await d.find(req.peer, id)
    if t is None:
        body = await d.recorded_answer(req.peer, id)
        if body is not None:
            return Response(200, body)
        row = await d.find_row(req.peer, id)  # (as show's)
        return json_response(200 if row["state"] == "finished" else 202,
                             row_json(row, output_dir=d.output_dir), row_weight(row))
    with trio.move_on_after(timeout):
        await t.done.wait()
    if t.done.is_set():
        if t.recorded and t.weight > HEAVY_ANSWER:
            return await d.finished_answer(req.peer.uid, t.id, lambda: t.to_json(full=True))
        return json_response(200, t.to_json(full=True), t.weight)
    return json_response(202, t.to_json(full=False, position=d.scheduler.position(t)))
