"""A task as the daemon holds it (the data; its life is ``life.py``), and a recorded row's JSON.

States as clients see them: ``queued -> starting -> running -> stopping -> finished``.  What
the records say at each step is in ``records.py``; what a restart does with each is in
``recover.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from .protocol import SubmitRequest

if TYPE_CHECKING:
    from .. import TaskHandle, TaskSpec

__all__ = ["DaemonTask", "row_json"]


class DaemonTask:
    """One accepted task.  ``id`` is the record's (never reused) and the core's leaf name."""

    __slots__ = ("created_at", "done", "ended_at", "exit_status", "gid", "groups", "handle",
                 "id", "kept", "outcome", "output", "peer_pid", "pid", "recorded", "request",
                 "result_json", "spec", "started", "started_at", "state", "stop_force",
                 "stop_requests", "uid")

    def __init__(self, task_id: str, uid: int, gid: int, peer_pid: int,
                 request: SubmitRequest, spec: TaskSpec | None, output: str, created_at: float,
                 groups: tuple[int, ...] = ()) -> None:
        self.id = task_id
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.peer_pid = peer_pid
        self.request = request
        self.spec = spec  # None: not to be started here (lost, or adopted)
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
        self.done = trio.Event()  # finished: the result is known (and recorded, see below)
        self.recorded = False  # the end row is on disk (False while a failed write retries)
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
        if self.outcome is not None and not self.recorded:
            out["record"] = "pending"  # its end row could not be written yet (retried)
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
