"""``POST /v1/tasks/ID/stdin[?eof=true]``: bytes for a task submitted with ``"stdin": "pipe"``.

The body is written as it is (any bytes); the answer comes once the task has taken them (the
pipe's back-pressure), so a client never races ahead of the task.  ``eof=true`` closes its
stdin after the bytes.  A queued task's request waits until it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Response, json_response
from ..protocol import ApiError, query_bool
from ..state import refuse_while_restarting

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request, id: str) -> Response:
    eof = query_bool(req.query, "eof")
    refuse_while_restarting(d)
    t = await d.find(req.peer, id)
    if t is None:
        await d.find_row(req.peer, id, light=True)  # 404 if not theirs
        raise _finished(id)
    if t.request.stdin != "pipe" and not (t.request.tty is not None
                                          and t.request.stdin_data is None):
        raise ApiError(409, "no_stdin_pipe", f"task {id} was not submitted with \"stdin\": "
                       f"\"pipe\"; its stdin is fixed", "stdin")
    await t.started.wait()
    handle = t.handle
    if handle is None or t.outcome is not None or handle.state != "running":
        raise _finished(id)
    queued = False
    try:
        if req.body:
            await handle.write_stdin(req.body)
            queued = True
        if eof:
            handle.close_stdin()
    except BrokenPipeError:
        # the task ended, or closed its stdin, while this request waited (an independent
        # attack raced stdin against the end: each was a 500 and a traceback in root's log)
        ended = t.outcome is not None or handle.state != "running"
        what = (f"these {len(req.body)} bytes were queued, but may not have been read"
                if queued else "nothing of this request was written")
        raise (ApiError(409, "finished", f"task {id} ended meanwhile; its stdin is closed: "
                        f"{what}") if ended else
               ApiError(409, "stdin_closed", f"task {id}'s stdin is closed (the task closed "
                        f"it, or an earlier request sent eof=true): {what}", "stdin")) from None
    return json_response(200, {"id": id, "written": len(req.body), "eof": eof})


def _finished(task_id: str) -> ApiError:
    return ApiError(409, "finished", f"task {task_id} has finished; its stdin is closed")
