"""A task as the daemon holds it, and its life: queued -> running -> finished, one record.

Order of a life (:func:`run_task`, one trio task per started task):

1. The dispatcher took it from the queue (or it was stopped while queued: then it runs
   ``sup.start`` in an already-cancelled scope, and the core records it as ``cancelled``,
   never started).
2. ``sup.start(spec, task_status=...)`` runs the core's life in this trio task; the core hands
   the ``TaskHandle`` over once the process runs (:class:`_Started`), and the start row is
   written then.
3. The result comes back: the end row is written (the result JSON as the core made it), and
   only then do waiters, followers and event subscribers see the task finished.

Only the library's public API is used: ``sup.start``, ``TaskHandle.stop/wait/subscribe/pid``,
``TaskResult.to_dict()``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import trio

from .protocol import SubmitRequest, exit_status

if TYPE_CHECKING:
    from .. import TaskHandle, TaskResult, TaskSpec
    from .daemon import Daemon

__all__ = ["DaemonTask", "row_json", "run_task"]

log = logging.getLogger(__name__)


class DaemonTask:
    """One accepted task.  ``id`` is the record's (never reused); ``leaf`` is the core's."""

    __slots__ = ("created_at", "done", "ended_at", "exit_status", "gid", "handle", "id", "kept",
                 "outcome", "output", "peer_pid", "pid", "request", "result_json", "spec",
                 "started", "started_at", "state", "stop_force", "stop_requests", "uid")

    def __init__(self, task_id: str, uid: int, gid: int, peer_pid: int,
                 request: SubmitRequest, spec: TaskSpec, output: str, created_at: float) -> None:
        self.id = task_id
        self.uid = uid
        self.gid = gid
        self.peer_pid = peer_pid
        self.request = request
        self.spec = spec
        self.output = output  # stdout's file; stderr's is output + ".stderr"
        self.created_at = created_at
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.state = "queued"
        self.handle: TaskHandle | None = None
        self.pid: int | None = None
        self.outcome: str | None = None  # once finished
        # per stream once finished: (total bytes, the kept tail if the file was capped)
        self.kept: dict[str, tuple[int, bytes]] = {}
        self.result_json: dict[str, Any] | None = None
        self.exit_status: int | None = None
        self.started = trio.Event()  # the core handed a handle over (or never will)
        self.done = trio.Event()  # the end record is written
        self.stop_requests = 0  # asked before a handle existed
        self.stop_force = False

    @property
    def live_state(self) -> str:
        if self.handle is not None and self.outcome is None:
            return self.handle.state
        return self.state

    def to_json(self, *, full: bool, position: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "state": self.live_state, "argv": list(self.request.argv),
            "uid": self.uid, "gid": self.gid, "name": self.request.name,
            "created_at": self.created_at, "started_at": self.started_at,
            "ended_at": self.ended_at,
            "pid": self.pid,
            "outcome": self.outcome,
            "exit_status": self.exit_status,
        }
        if position is not None:
            out["queue_position"] = position
        if full:
            out["spec"] = self.request.to_json()
            out["result"] = self.result_json
        return out

    def stop(self, force: bool) -> bool:
        """Ask the running task to stop (graceful; again or ``force``: kill)."""
        if self.outcome is not None:
            return False
        if self.handle is None:
            self.stop_requests += 1
            self.stop_force = self.stop_force or force
            return True
        return self.handle.stop(force=force)


def row_json(row: dict[str, Any], *, full: bool) -> dict[str, Any]:
    """A task the daemon no longer holds in memory, from its record."""
    r = row.get("result")
    spec = row["spec"]
    assert r is None or isinstance(r, dict)
    out: dict[str, Any] = {
        "id": row["id"], "state": row["state"], "argv": spec["argv"], "uid": row["uid"],
        "gid": row["gid"], "name": row["name"], "created_at": row["created_at"],
        "started_at": row["started_at"], "ended_at": row["ended_at"], "pid": row["pid"],
        "outcome": row["outcome"], "exit_status": row["exit_status"],
    }
    if full:
        out["spec"] = spec
        out["result"] = r
    return out


class _Started:
    """The ``task_status`` handed to ``sup.start``: the core calls ``started(handle)`` once
    the process runs, or once it is known that it never will."""

    def __init__(self, daemon: Daemon, task: DaemonTask) -> None:
        self.daemon = daemon
        self.task = task

    def started(self, value: Any = None) -> None:
        t, d = self.task, self.daemon
        handle: TaskHandle = value
        t.handle = handle
        t.started.set()
        if handle.state != "running":
            return  # it never ran (stopped first, or the spawn failed): the end record says so
        t.pid = handle.pid
        t.state = "running"
        t.started_at = time.time()
        for i in range(t.stop_requests):  # asked while it was being started
            handle.stop(force=t.stop_force and i == t.stop_requests - 1)
        d.publish(t, "running")
        d.nursery.start_soon(d.records.started, t.id, t.started_at, handle.pid, handle.id)


async def run_task(d: Daemon, t: DaemonTask, *, never_start: bool = False) -> None:
    """The task's whole life in the daemon (see the module docstring)."""
    status = _Started(d, t)
    t.state = "starting"
    try:
        with trio.CancelScope() as scope:
            if never_start or t.stop_requests or d.draining:
                scope.cancel()  # the core's own never-started record
            result = await d.sup.start(t.spec, task_status=status)
    except Exception as e:
        # the core refused or failed (a bug, or a state nobody planned for): this task ends
        # with a record that says so; the daemon and the other tasks go on
        log.exception("task %s: the supervisor failed it", t.id)
        await _record_failure(d, t, e)
        return
    finally:
        if not never_start:
            d.scheduler.finished(t.uid)
            d.dispatch()
    await _take_result(d, t, result)


async def _take_result(d: Daemon, t: DaemonTask, result: TaskResult) -> None:
    t.started.set()
    t.outcome = str(result.outcome)
    for name, out in (("stdout", result.output_stdout), ("stderr", result.output_stderr)):
        tail = out.tail if out.log_truncated else b""
        t.kept[name] = (out.total, tail)
        if tail:
            _write_tail(t.output if name == "stdout" else t.output + ".stderr", tail)
    t.result_json = result.to_dict()
    t.exit_status = exit_status_of(result)
    t.ended_at = result.ended_at
    t.started_at = result.started_at
    await _write_end(d, t, str(result.outcome), result.started_at)


async def _write_end(d: Daemon, t: DaemonTask, outcome: str, started_at: float | None) -> None:
    """The end record (shielded: it is written whatever else happens), then the task is
    finished for waiters, followers and subscribers."""
    assert t.result_json is not None and t.ended_at is not None and t.exit_status is not None
    with trio.CancelScope(shield=True):
        try:
            await d.records.ended(t.id, outcome, t.exit_status, started_at, t.ended_at,
                                  t.result_json)
        except Exception:
            log.exception("task %s: writing its end record failed", t.id)
    t.state = "finished"
    t.handle = None  # the core's handle is done with: let it go
    t.done.set()
    d.task_finished(t)


async def _record_failure(d: Daemon, t: DaemonTask, error: Exception) -> None:
    """The core's record if it made one before failing; else the daemon's own minimal one,
    outcome ``lost``."""
    if t.handle is not None and t.handle.result is not None:
        await _take_result(d, t, t.handle.result)
        return
    t.started.set()
    t.outcome = "lost"
    t.ended_at = time.time()
    t.exit_status = 125
    t.result_json = {"outcome": "lost", "started": t.started_at is not None,
                     "daemon_error": f"corral serve could not run this task (a bug; see the "
                                     f"daemon's log): {error!r}"}
    await _write_end(d, t, "lost", t.started_at)


def exit_status_of(result: TaskResult) -> int:
    """What ``corral run`` would exit with for ``result`` (read from the object: the JSON
    format is the core's to document, and is passed through untouched)."""
    stop = result.stop
    return exit_status(str(result.outcome), result.exit_code, result.signal,
                       result.error_step, result.error_errno,
                       None if stop is None else str(stop.reason))


def _write_tail(path: str, tail: bytes) -> None:
    """The kept tail of a stream whose file hit the cap, beside it (``<file>.tail``), so that
    the last bytes outlive the task's place in memory.  At most the tail size (48 KiB)."""
    try:
        with open(path + ".tail", "wb") as f:
            f.write(tail)
    except OSError as e:
        log.warning("keeping the output tail at %s.tail: %s", path, e)
