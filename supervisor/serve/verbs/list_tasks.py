"""``GET /v1/tasks[?state=running&limit=100&session=ID&before=ID]``: the caller's tasks,
newest first (root: all); ``session``: that session's commands only; ``before``: only tasks
older than that id (the next page: the last id of a full one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..daemontask import listed_row_json
from ..http import Request, Response, json_response
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
    out: list[dict[str, Any]] = []
    for t in reversed(d.tasks.values()):  # ids are made in order: newest last
        if int(t.id) < before and peer.may_see(t.uid) and (
                state is None or t.live_state == state) and (
                session is None or t.session == session):
            out.append(t.to_json(full=False, position=d.scheduler.position(t)))
            if len(out) == limit:
                break
    # and the tasks no longer held in memory: older ones, and finished ones of large requests
    # (dropped at once: newer than some held, they were missing from the top of the page)
    async with d.shares.reading(peer.uid):
        rows = await d.records.list_rows(None if peer.is_root else peer.uid,
                                         None if state is None else _RECORDED_STATE[state],
                                         limit, session, before)
    out += [listed_row_json(r) for r in rows if r["id"] not in d.tasks]
    out.sort(key=lambda e: int(e["id"]), reverse=True)
    return json_response(200, {"tasks": out[:limit]})
