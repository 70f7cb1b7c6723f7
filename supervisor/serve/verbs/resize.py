"""``POST /v1/tasks/ID/resize`` ``{"rows": 40, "cols": 120}``: a terminal task's window size
(its programs get SIGWINCH, as at a terminal whose window changed).  409 ``no_tty`` for a task
without one, ``not_running`` for one that is queued or has ended."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Response, json_response
from ..protocol import ApiError, parse_json_body, parse_resize
from ..state import refuse_while_restarting

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request, id: str) -> Response:
    rows, cols = parse_resize(parse_json_body(req.body))
    refuse_while_restarting(d)
    t = await d.find(req.peer, id)
    if t is None:
        await d.find_row(req.peer, id, light=True)  # (404 / 410 if it is none of the caller's)
    if t is not None and t.request.tty is None:
        raise ApiError(409, "no_tty", f"task {id} has no terminal: submit it with \"tty\"")
    handle = None if t is None else t.handle
    if t is None or handle is None or t.outcome is not None or handle.state != "running":
        raise ApiError(409, "not_running", f"task {id} is not running: a terminal is resized "
                       f"while its task runs")
    handle.resize(rows, cols)
    return json_response(200, {"id": id, "rows": rows, "cols": cols})
