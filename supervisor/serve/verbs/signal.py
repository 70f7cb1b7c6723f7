"""``POST /v1/tasks/ID/signal`` ``{"signal": "INT"}``: a signal to a running task, not a stop.

INT, QUIT, HUP, TERM, USR1, USR2, WINCH or CONT (KILL and STOP are ``stop {"force": true}``
and pause), to every process of the task's tree, or, for a terminal task, to its terminal's
foreground process group (INT and QUIT as the keys would, the others to that group's
processes), the tree walked in steps.  The task's record lists every signal sent (``signals``:
which, when, to what, by which uid).  409 ``not_running`` for a task that is
queued or has ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Response, json_response
from ..protocol import ApiError, parse_json_body, parse_signal
from ..state import refuse_while_restarting

if TYPE_CHECKING:
    from ..state import Daemon


async def handle(d: Daemon, req: Request, id: str) -> Response:
    name = parse_signal(parse_json_body(req.body))
    refuse_while_restarting(d)
    t = await d.find(req.peer, id)
    if t is None:
        await d.find_row(req.peer, id, light=True)  # (404 / 410 if it is none of the caller's)
    handle = None if t is None else t.handle
    # (the tree walked in steps, each paced: a tenant's task may have thousands of processes;
    # its walks one at a time, and a bounded number of all uids': Shares.walking)
    delivered = False
    if t is not None and handle is not None:
        async with d.shares.walking(req.peer.uid):
            delivered = await handle.deliver_signal(name, by=f"uid {req.peer.uid}", pause=(
                lambda reached: d.shares.signalled(req.peer.uid, reached)))
    if not delivered:
        state = "finished" if t is None else t.live_state
        raise ApiError(409, "not_running", f"task {id} is {state}: a signal goes to a running "
                       f"task only (a queued one is stopped with POST /v1/tasks/{id}/stop)")
    assert t is not None and handle is not None
    return json_response(200, {"id": t.id, "signal": f"SIG{name}",
                               "to": "foreground" if handle.spec.tty else "tree"})
