"""``POST /v1/tasks``: accept a task (201), or say why not (400/403/409/410/429/503).  With
``"wait": "30s"``: answered when the task ends (200, with its result) or when the bound passes
(202: still running, with its output so far), whichever is first; the task goes on.

Order: the body's shape (protocol), the meaning (the core's TaskSpec and property parser), the
idempotency key (a retried request gets the first task back, 200), the queue's limits (429),
then the accept record (SQLite, fsynced), and only then the task is queued and the answer
sent.  When the task can start at once (nothing queued, room to run), its slot is taken before
the record is written and the accept row says "starting": the one fsync covers both.  If the
record cannot be written, nothing was accepted: 503 ``records_unavailable`` with the reason.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import trio

from ..daemontask import STREAMS, DaemonTask, listed_command, stream_path
from ..dispatch import accepted
from ..http import Later, Request, Response, json_response
from ..peers import Peer, PeerGone, rlimits_of
from ..protocol import (
    ApiError,
    SubmitRequest,
    body_work,
    dumps_in_slices,
    dumps_value_in_slices,
    parse_json_body,
    parse_submit,
    pop_wait,
    sorted_in_slices,
)
from ..records import RecordsError
from ..rows import ENV_APART, env_apart, limits_bytes
from ..sessions import env_weight

if TYPE_CHECKING:
    from ... import TaskSpec
    from ..state import Daemon


async def handle(d: Daemon, req: Request) -> Response | Later:
    # (tens of milliseconds of parsing for a MiB: off the event loop, and one at a time per
    # uid, so that one tenant's large submissions delay only its own)
    r, wait = await d.off_loop(req.peer.uid, body_work(req.body), _parse, req.body)
    earlier, t = await accept(d, req.peer, r, len(req.body))
    if earlier is not None:
        return json_response(200, earlier, len(req.body))
    assert t is not None
    if wait is None:
        return json_response(201, {"id": t.id, "state": t.state})
    return Later(lambda: answer_after(d, t, wait, req.received))


async def accept(d: Daemon, peer: Peer, r: SubmitRequest, size: int,
                 ) -> tuple[dict[str, Any] | None, DaemonTask | None]:
    """Accept ``r`` of ``peer``'s (``size``: its body's bytes): (None, the new task), or (the
    task an earlier request with its idempotency key made, None).  ApiError if refused."""
    if d.handing_over:
        raise ApiError(503, "restarting", "the daemon is restarting (systemctl restart): "
                       "nothing was accepted; retry in a moment (the clients do)")
    if d.draining:
        raise ApiError(503, "shutting_down", "the daemon is shutting down and accepts no new "
                       "tasks; retry once it is back")
    if r.idempotency_key is not None:
        earlier = await _earlier(d, peer, r, size)
        if earlier is not None:
            return earlier, None
    rlimits = None if peer.is_root else _rlimits_of(peer)
    spec, text = await d.off_loop(peer.uid, r.work(size), _prepare, d, peer, r, rlimits)
    # (its size is what its accept writes: the request as kept, escapes and all, and what
    # the exec of a session adds to its body; counted as its body, a tenant's requests of
    # emoji filled a state disk at three times what its ledger said, refusing everyone)
    size = max(size, kept_bytes(text, rlimits))
    d.scheduler.admit(peer.uid, size)
    try:
        return None, await _accept_admitted(d, peer, r, size, spec, text, rlimits)
    finally:
        d.scheduler.admitted(peer.uid, size)


async def _accept_admitted(d: Daemon, peer: Peer, r: SubmitRequest, size: int,
                           spec: TaskSpec, text: tuple[str, tuple[str, str] | None],
                           rlimits: dict[str, tuple[int, int]] | None) -> DaemonTask:
    """:func:`accept`'s record and queueing, once the scheduler admitted it."""
    key = None if r.idempotency_key is None else (peer.uid, r.idempotency_key)
    if key is not None:
        d.keys[key] = ""  # reserved: a concurrent retry is told to retry in a moment
        d.key_filter.add(*key)  # (before its row: a key written is never told "no")
    cost = d.disk.worst(size)
    reserved = d.room.fits(peer.uid, cost) and d.scheduler.reserve(peer.uid)
    if reserved:
        d.room.take(peer.uid, cost)
    try:
        task_id = await d.records.accept(_row(d, peer, r, text, reserved, rlimits))
    except BaseException as e:
        if key is not None:
            d.keys.pop(key, None)
        if reserved:
            d.scheduler.finished(peer.uid)
            d.room.give(peer.uid, cost)
        if isinstance(e, RecordsError):
            raise ApiError(503, "records_unavailable", f"nothing was accepted: {e}") from None
        raise
    output = os.path.join(d.output_dir, task_id)
    with trio.CancelScope(shield=True):  # (recorded: it is queued, whatever the caller does)
        spec = await d.off_loop(peer.uid, r.work(size), spec.from_call, spec,
                                {"log_file": output})
    t = DaemonTask(task_id, peer.uid, peer.gid, peer.pid, r, spec, output, time.time(),
                   peer.groups, size=size)
    t.holds = cost if reserved else 0
    t.limits_bytes = limits_bytes(rlimits)
    accepted(d, t, reserved=reserved)
    return t


async def answer_after(d: Daemon, t: DaemonTask, wait: float, since: float, *,
                       env_left_out: int | None = None) -> Response:
    """The answer of a request with a ``wait`` bound: 200 with the task and its result if it
    ends within ``wait`` seconds of ``since`` (trio's clock: when the request came); else 202
    with its state and its output so far (the task goes on: nothing is stopped; its session
    may run its next command meanwhile).  ``env_left_out``: the task's spec leaves out its
    environment, which its client did not send, and which weighs that (a session's command:
    the session's, a MiB of it sent back with every ``true`` took a third of the event loop
    of a tenant running many; ``GET /v1/tasks/{id}`` has it)."""
    with trio.move_on_at(since + wait):
        await t.done.wait()
    if t.done.is_set():
        body = t.to_json(full=True)
        if env_left_out is None or body["spec"].pop("env", None) is None:
            return json_response(200, body, t.weight)
        # (weighed as it was sent: walked again here, 3,000 variables held the loop 1 ms)
        return json_response(200, body, max(0, t.weight - env_left_out))
    t.handed_back = True  # (a session's next command may start: this one goes on beside it)
    so_far = await trio.to_thread.run_sync(output_so_far, t.output)
    return json_response(202, {**t.to_json(full=False, position=d.scheduler.position(t)),
                               "output": so_far})


async def _earlier(d: Daemon, peer: Peer, r: SubmitRequest, size: int,
                   ) -> dict[str, Any] | None:
    """The task an earlier request with this key made (409 if it asked for another thing;
    410 if it has expired).  One no longer in memory is compared as its record keeps it,
    by SQLite (``rows.keyed``): ``r`` made into that text costs what its acceptance would,
    off the loop if large, and its record is not decoded (a tenant's MiB command sent again
    and again with its key had its row decoded each time, holding the GIL 10-20 ms a call:
    another tenant's p99 55-78 ms, an independent attack)."""
    key = r.idempotency_key
    assert key is not None
    task_id = d.keys.get((peer.uid, key))
    if task_id == "":
        raise ApiError(409, "in_progress", f"a request with idempotency_key {key!r} is being "
                       f"accepted right now; retry in a moment", "idempotency_key")
    if task_id is not None and task_id in d.tasks:
        t = d.tasks[task_id]
        if t.request.to_json() != r.to_json():
            raise _conflict(key, t.id)
        return {"id": t.id, "state": t.live_state, "existing": True}
    if not d.key_filter.may_hold(peer.uid, key):
        return None  # (never taken: no read of the records)
    text, env = await d.off_loop(peer.uid, r.work(size), request_text, peer.uid, r)
    async with d.shares.reading(peer.uid):
        row = await d.records.keyed(peer.uid, key, text, None if env is None else env[0])
        if row is not None and row["state"] != "expired" and not row["same"] and not row["long"]:
            # (a short record written otherwise: an older corral's, compared as values)
            row = await d.records.find_key(peer.uid, key)
            if row is not None and row["state"] != "expired":
                row["same"] = row["spec"] == r.to_json()
    if row is None:
        return None
    if row["state"] == "expired":
        raise ApiError(410, "expired", f"idempotency_key {key!r} was used for task "
                       f"{row['id']}, which has expired (its record was removed by retention); "
                       f"use a new key for a new task", "idempotency_key")
    if not row["same"]:
        raise _conflict(key, row["id"])
    return {"id": row["id"], "state": row["state"], "existing": True}


def _conflict(key: str, task_id: str) -> ApiError:
    return ApiError(409, "idempotency_conflict", f"idempotency_key {key!r} was used for task "
                    f"{task_id} with another request; use a new key for a new task",
                    "idempotency_key")


def _parse(body: bytes) -> tuple[SubmitRequest, float | None]:
    obj = parse_json_body(body)
    wait = pop_wait(obj)
    return parse_submit(obj), wait


SO_FAR = 8 << 10  # bytes of head and of tail of each stream an answer at the wait bound has


def output_so_far(stdout_path: str) -> dict[str, Any]:
    """What a running task printed so far, per stream: ``total_bytes``, its first and last
    :data:`SO_FAR` bytes as text (``head``, ``tail``) and how many bytes lie between them
    (``dropped_bytes``: read them with GET /v1/tasks/ID/output?offset=N); blocking."""
    out = {}
    for stream in STREAMS:
        try:
            with open(stream_path(stdout_path, stream), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(min(size, SO_FAR))
                tail_from = max(len(head), size - SO_FAR)
                tail = os.pread(f.fileno(), size - tail_from, tail_from)
        except FileNotFoundError:
            size, head, tail, tail_from = 0, b"", b"", 0
        out[stream] = {"total_bytes": size, "head": head.decode("utf-8", "replace"),
                       "tail": tail.decode("utf-8", "replace"),
                       "dropped_bytes": tail_from - len(head), "tail_offset": tail_from}
    return out


def _rlimits_of(peer: Peer) -> dict[str, tuple[int, int]]:
    """The submitter's resource limits, its task's ceiling (403 if they cannot be read)."""
    try:
        return rlimits_of(peer)
    except PeerGone as e:
        raise ApiError(403, "forbidden", f"{e}: a task of a non-root submitter gets no more "
                       f"than its submitter has, and corral reads that from the process that "
                       f"connected; submit from a process that waits for the answer") from None


def _prepare(d: Daemon, peer: Peer, r: SubmitRequest, rlimits: dict[str, tuple[int, int]] | None,
             ) -> tuple[TaskSpec, tuple[str, tuple[str, str] | None]]:
    """The TaskSpec ``r`` makes for ``peer`` (ApiError if refused) and ``r`` as its record
    keeps it: its JSON text, and its environment apart from it if large (``rows.env_apart``:
    kept once for every request naming the same, as a session's commands do); the costly part
    of an acceptance, made here (in a worker thread for a large request) and not in the
    records' thread, which every uid's writes share."""
    return d.spec_for(peer, r, rlimits=rlimits), request_text(peer.uid, r)


def request_text(uid: int, r: SubmitRequest) -> tuple[str, tuple[str, str] | None]:
    """``r`` of ``uid``'s as its record keeps it: its JSON text, and its environment apart
    from it if large (``rows.env_apart``: its hash, its text)."""
    obj = r.to_json()
    if env_weight(r.env) < ENV_APART:
        return dumps_in_slices(obj), None
    # (its variables in order: a shell lists the same environment in another order from one
    # command to the next, and the same one is kept once)
    env = env_apart(uid, dumps_value_in_slices(sorted_in_slices(obj.pop("env"))))
    return dumps_in_slices(obj), env


def kept_bytes(text: tuple[str, tuple[str, str] | None],
               rlimits: dict[str, tuple[int, int]] | None) -> int:
    """What a new task's accept writes of its request (``_prepare``'s text, and its
    environment if apart) and of its submitter's limits."""
    spec, env = text
    return len(spec) + (0 if env is None else len(env[1])) + limits_bytes(rlimits)


def _row(d: Daemon, peer: Peer, r: SubmitRequest, text: tuple[str, tuple[str, str] | None],
         starting: bool, rlimits: dict[str, tuple[int, int]] | None) -> dict[str, Any]:
    return {"uid": peer.uid, "gid": peer.gid, "peer_pid": peer.pid, "groups": list(peer.groups),
            "name": r.name, "idempotency_key": r.idempotency_key, "spec": text[0],
            "env": text[1],
            "listed": listed_command(r),
            "session": None if r.session is None else int(r.session["id"]),
            "state": "starting" if starting else "queued",
            "run": d.run if starting else None, "created_at": time.time(),
            "rlimits": rlimits}
