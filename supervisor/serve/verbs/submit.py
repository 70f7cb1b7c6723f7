"""``POST /v1/tasks``: accept a task (201), or say why not (400/403/409/410/429/503).

Order: the body's shape (protocol), the meaning (the core's TaskSpec and property parser), the
idempotency key (a retried request gets the first task back, 200), the queue's limits (429),
then the accept record (SQLite, fsynced), and only then the task is queued and the answer
sent.  When the task can start at once (nothing queued, room to run), its slot is taken before
the record is written and the accept row says "starting": the one fsync covers both.  If the
record cannot be written, nothing was accepted: 503 ``records_unavailable`` with the reason.
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from ..http import Request, Response, json_response
from ..life import accepted
from ..peers import Peer, PeerGone, rlimits_of
from ..protocol import ApiError, SubmitRequest, parse_json_body, parse_submit
from ..records import RecordsError
from ..task import DaemonTask

if TYPE_CHECKING:
    from ..state import Daemon


HEAVY = 64 << 10  # a body above this is parsed in a worker thread, one per uid at a time


async def handle(d: Daemon, req: Request) -> Response:
    if len(req.body) <= HEAVY:
        r = parse_submit(parse_json_body(req.body))
    else:
        # tens of milliseconds of parsing for a MiB: off the event loop, and one at a time
        # per uid, so that one tenant's large submissions delay only its own
        async with d.heavy_lock(req.peer.uid):
            r = await trio.to_thread.run_sync(_parse, req.body)
    if d.handing_over:
        raise ApiError(503, "restarting", "the daemon is restarting (systemctl restart): "
                       "nothing was accepted; retry in a moment (the clients do)")
    if d.draining:
        raise ApiError(503, "shutting_down", "the daemon is shutting down and accepts no new "
                       "tasks; retry once it is back")
    if r.idempotency_key is not None:
        earlier = await _earlier(d, req.peer, r)
        if earlier is not None:
            return json_response(200, earlier)
    rlimits = None if req.peer.is_root else _rlimits_of(req.peer)
    if len(req.body) <= HEAVY:
        spec = d.spec_for(req.peer, r, rlimits=rlimits)
    else:
        async with d.heavy_lock(req.peer.uid):
            spec = await trio.to_thread.run_sync(
                functools.partial(d.spec_for, req.peer, r, rlimits=rlimits))
    d.scheduler.admit(req.peer.uid, len(req.body))
    key = None if r.idempotency_key is None else (req.peer.uid, r.idempotency_key)
    if key is not None:
        d.keys[key] = ""  # reserved: a concurrent retry is told to retry in a moment
    reserved = d.scheduler.reserve(req.peer.uid)
    try:
        task_id = await d.records.accept(_row(d, req.peer, r, reserved, rlimits))
    except BaseException as e:
        if key is not None:
            d.keys.pop(key, None)
        if reserved:
            d.scheduler.finished(req.peer.uid)
        if isinstance(e, RecordsError):
            raise ApiError(503, "records_unavailable", f"nothing was accepted: {e}") from None
        raise
    output = os.path.join(d.output_dir, task_id)
    spec = spec.from_call(spec, {"log_file": output})
    t = DaemonTask(task_id, req.peer.uid, req.peer.gid, req.peer.pid, r, spec, output,
                   time.time(), req.peer.groups, size=len(req.body))
    accepted(d, t, reserved=reserved)
    return json_response(201, {"id": t.id, "state": t.state})


async def _earlier(d: Daemon, peer: Peer, r: SubmitRequest) -> dict[str, Any] | None:
    """The task an earlier request with this key made (409 if it asked for another thing;
    410 if it has expired)."""
    assert r.idempotency_key is not None
    task_id = d.keys.get((peer.uid, r.idempotency_key))
    if task_id == "":
        raise ApiError(409, "in_progress", f"a request with idempotency_key "
                       f"{r.idempotency_key!r} is being accepted right now; retry in a moment",
                       "idempotency_key")
    if task_id is not None and task_id in d.tasks:
        t = d.tasks[task_id]
        spec = t.request.to_json()
        state = t.live_state
    else:
        row = await d.records.find_key(peer.uid, r.idempotency_key)
        if row is None:
            return None
        if row["state"] == "expired":
            raise ApiError(410, "expired", f"idempotency_key {r.idempotency_key!r} was used "
                           f"for task {row['id']}, which has expired (its record was removed "
                           f"by retention); use a new key for a new task", "idempotency_key")
        task_id, spec, state = row["id"], row["spec"], row["state"]
    if spec != r.to_json():
        raise ApiError(409, "idempotency_conflict", f"idempotency_key "
                       f"{r.idempotency_key!r} was used for task {task_id} with another "
                       f"request; use a new key for a new task", "idempotency_key")
    return {"id": task_id, "state": state, "existing": True}


def _parse(body: bytes) -> SubmitRequest:
    return parse_submit(parse_json_body(body))


def _rlimits_of(peer: Peer) -> dict[str, tuple[int, int]]:
    """The submitter's resource limits, its task's ceiling (403 if they cannot be read)."""
    try:
        return rlimits_of(peer)
    except PeerGone as e:
        raise ApiError(403, "forbidden", f"{e}: a task of a non-root submitter gets no more "
                       f"than its submitter has, and corral reads that from the process that "
                       f"connected; submit from a process that waits for the answer") from None


def _row(d: Daemon, peer: Peer, r: SubmitRequest, starting: bool,
         rlimits: dict[str, tuple[int, int]] | None) -> dict[str, Any]:
    return {"uid": peer.uid, "gid": peer.gid, "peer_pid": peer.pid, "groups": list(peer.groups),
            "name": r.name, "idempotency_key": r.idempotency_key, "spec": r.to_json(),
            "state": "starting" if starting else "queued",
            "run": d.run if starting else None, "created_at": time.time(),
            "rlimits": rlimits}
