"""One stop per task: none -> requested(reason) -> signalled -> killed -> gone, only ever harder.

The first request fixes the reason.  A later request never restarts the grace: it escalates
(skips what is left of the grace and kills now).  A request after the task has ended changes
nothing and says so (``request`` returns False).  The escalation itself lives in the task runner;
this module holds the state and the one place that signals a leaf.
"""

from __future__ import annotations

import logging
import os
import signal

import trio

from cgroupfs import Cgroup

from ._result import StopReason, StopRecord

__all__ = ["StopState", "signal_leaf"]

log = logging.getLogger(__name__)

LEVELS = ("none", "requested", "signalled", "killed", "gone")


class StopState:
    """The stop state of one task.  Times are ``trio.current_time()`` values."""

    __slots__ = ("forced", "killed_at", "landed", "level", "reason", "requested_at", "signal",
                 "signalled_at", "signalled_leaf", "waker")

    def __init__(self) -> None:
        self.reason: StopReason | None = None
        self.level = "none"
        self.requested_at: float | None = None
        self.signalled_at: float | None = None
        self.killed_at: float | None = None
        self.forced = False
        self.landed = False  # the stop signal or kill reached the main process while it lived
        self.signalled_leaf = False  # the stop signal went to the leaf (a stop, or leftovers)
        self.signal = int(signal.SIGTERM)
        # the scope the task's driver (or queue) is waiting in: a request cancels it
        self.waker: trio.CancelScope | None = None

    def request(self, reason: StopReason, *, force: bool = False) -> bool:
        """Ask for a stop; True when this changed anything.

        The first call fixes ``reason``; any later call, forced or not, escalates to a kill.
        """
        if self.level == "gone":
            return False
        if self.reason is None:
            self.reason = reason
            self.requested_at = trio.current_time()
            if self.level == "none":
                self.level = "requested"
            if force:
                self._force()
            self._wake()
            return True
        if self.forced:
            return False
        self._force()
        return True

    def _force(self) -> None:
        self.forced = True  # kill now: skip the rest of the grace
        self._wake()

    def _wake(self) -> None:
        if self.waker is not None:
            self.waker.cancel()

    def mark(self, level: str) -> None:
        """Record that escalation reached ``level`` (never lowers it)."""
        if LEVELS.index(level) > LEVELS.index(self.level):
            self.level = level
            now = trio.current_time()
            if level == "signalled" and self.signalled_at is None:
                self.signalled_at = now
            elif level == "killed" and self.killed_at is None:
                self.killed_at = now

    def record(self, t0: float) -> StopRecord | None:
        """The result's view, times relative to ``t0`` (the task's start)."""
        if self.reason is None or self.requested_at is None:
            return None
        level = ("killed" if self.killed_at is not None else
                 "signalled" if self.signalled_at is not None else "requested")

        def rel(t: float | None) -> float | None:
            return None if t is None else max(0.0, round(t - t0, 6))

        return StopRecord(reason=self.reason, level=level,
                          requested_at=rel(self.requested_at) or 0.0, signal=self.signal,
                          signalled_at=rel(self.signalled_at), killed_at=rel(self.killed_at),
                          forced=self.forced)


_CHUNK = 128  # pidfds held at once: far below RLIMIT_NOFILE's usual 1024


def signal_leaf(leaf: Cgroup, sig: int) -> int:
    """Send ``sig`` to every process in ``leaf``; returns how many were signalled.

    Never by bare pid: listed pids are opened as pidfds (a chunk at a time), the leaf is listed
    again, and only pidfds whose pid is still listed get the signal.  A pidfd holds the process
    it was opened on: if that process died and its pid went to someone else in the meantime,
    the send reaches the dead one (a no-op), never the newcomer.  Anything that arrives in the
    leaf meanwhile is caught by the next pass or by cgroup.kill.
    """
    pids = leaf.procs()
    sent = 0
    for start in range(0, len(pids), _CHUNK):
        fds: dict[int, int] = {}
        try:
            for pid in pids[start:start + _CHUNK]:
                try:
                    fds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
            still = set(leaf.procs())
            for pid, pidfd in fds.items():
                if pid in still:
                    try:
                        signal.pidfd_send_signal(pidfd, sig)
                        sent += 1
                    except ProcessLookupError:
                        pass
        finally:
            for pidfd in fds.values():
                os.close(pidfd)
    return sent
