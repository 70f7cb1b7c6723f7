"""``GET /v1/tasks[?state=running&limit=100&session=ID&before=ID]``: the caller's tasks,
newest first (root: all); ``session``: that session's commands only; ``before``: only tasks
older than that id (the next page: the last id of a full one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http import Request, Response
from ..protocol import MAX_ID_DIGITS, STATES, canonical_id, invalid, query_int, shown

if TYPE_CHECKING:
    from ..state import Daemon

_RECORDED_STATE = {"queued": "queued", "starting": "starting", "running": "running",
                   "stopping": "running", "finished": "finished"}


MAX_LIST = 1000  # tasks per listing (each entry's argv cut short: daemontask.py)


async def handle(d: Daemon, req: Request) -> Response:
    state = req.query.get("state")
    if state is not None and state not in STATES:
        raise invalid("state", f"?state= must be one of {', '.join(STATES)}, got {state!r}")
    limit = query_int(req.query, "limit", 100, 1, MAX_LIST)
    session = req.query.get("session")
    if session is not None and not canonical_id(session):
        raise invalid("session", f"?session= must be a session id (a number without leading "
                                 f"zeros, at most {MAX_ID_DIGITS} digits), got {shown(session)}")
    before = query_int(req.query, "before", 2**62, 1)
    peer = req.peer
    # each entry is JSON text (its command's listed JSON spliced in as kept, a finished
    # task's whole entry made once): a listing of a thousand long commands is a join of
    # texts on the event loop, not their decoding and encoding
    out: list[tuple[int, str]] = []
    for t in reversed(d.tasks.values()):  # ids are made in order: newest last
        if int(t.id) < before and peer.may_see(t.uid) and (
                state is None or t.live_state == state) and (
                session is None or t.session == session):
            out.append((int(t.id), t.entry(d.scheduler.position(t))))
            if len(out) == limit:
                break
    # and the tasks no longer held in memory: older ones, and finished ones of large requests
    # (dropped at once: newer than some held, they were missing from the top of the page)
    async with d.shares.reading(peer.uid):
        rows = await d.records.list_entries(None if peer.is_root else peer.uid,
                                            None if state is None else _RECORDED_STATE[state],
                                            limit, session, before)
    out += [(seq, entry) for seq, entry in rows if str(seq) not in d.tasks]
    out.sort(reverse=True)
    body = ",".join([entry for _, entry in out[:limit]])
    return Response(200, ('{"tasks":[' + body + "]}\n").encode())
