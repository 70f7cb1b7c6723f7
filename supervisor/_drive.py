"""A running task's driver: its main process, its leaf and its stop, as named states.

::

    RUNNING --stop requested, or the main exited leaving processes--> TERM
    TERM    --grace over, or a kill made due------------------------> KILL
    any     --the main has exited and the leaf (with its subtree) is empty--> DONE

Each state is entered by one function (``_enter_*``) that sends what that state sends and arms
exactly one deadline; the loop (:meth:`Driver.run`) only waits and dispatches.  It waits for one
thing at a time: the main process's pidfd while it lives, then the leaf emptying (inotify), with
the state's deadline, and a waker scope that a stop request cancels.

- RUNNING: deadline = the time limit.  Reaching it is the supervisor's own stop request.
- TERM: the stop signal (and SIGCONT, so a stopped process sees it) to every process of the
  subtree, and to the main process through its pidfd wherever it went; deadline = the grace's
  end (or the next repeat of the stop signal).  A TERM without a stop request is the cleanup of
  what the main process left behind: same steps, no stop record.
- KILL: ``cgroup.kill`` (and SIGKILL to an escaped main process's pidfd); deadline = a bound
  after which the cleanup is reported incomplete.

The caller's cancellation is a graceful stop request (by the caller); the waits after it are
shielded, and the ``Cancelled`` is kept in :attr:`Driver.pending` for the task's life to raise
once the task has its record.  KeyboardInterrupt never arrives here: trio delivers it to the main
task only, and a task's life never runs in it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Callable

import trio

from cgroupfs import Cgroup, CgroupError, CgroupNotFound

from ._procfs import read_cgroup, read_comm, read_state
from ._result import EscapedProcess, ProcessInfo, StopReason
from ._stop import StopState, signal_tree
from ._watch import CgroupWatcher

__all__ = ["DONE", "KILL", "RUNNING", "TERM", "Driver"]

log = logging.getLogger(__name__)

RUNNING, TERM, KILL, DONE = "running", "term", "kill", "done"
KILL_TIMEOUT = 30.0  # after cgroup.kill: how long before we call the cleanup incomplete
_TRACKED = 256  # processes seen in a stop or leftover pass, kept (as pidfds) to check escapes


class Driver:
    """Drives one spawned task from RUNNING to DONE; what it found stays on it for the record.

    ``leaf_view`` is the leaf's path as /proc/PID/cgroup shows it (None: unknown here), used to
    tell whether the main process died inside its leaf.
    """

    __slots__ = ("deadline", "escaped", "exited_at", "grace_end", "killed_tree", "leaf",
                 "leaf_view", "leftovers", "limit_at", "notes", "on_stopping", "pending",
                 "phase", "pid", "pidfd", "problems", "repeat_at", "seen", "signalled_tree",
                 "spec_grace", "spec_repeat", "status", "stop", "watcher")

    def __init__(self, leaf: Cgroup, pid: int, pidfd: int, stop: StopState,
                 watcher: CgroupWatcher, *, limit_at: float, grace: float,
                 repeat: float | None, leaf_view: str | None,
                 on_stopping: Callable[[], None]) -> None:
        self.leaf, self.pid, self.pidfd, self.stop, self.watcher = leaf, pid, pidfd, stop, watcher
        self.on_stopping = on_stopping  # called once: the main exited, or a stop began
        self.limit_at, self.spec_grace, self.spec_repeat = limit_at, grace, repeat
        self.leaf_view = leaf_view
        self.phase = RUNNING
        self.deadline = limit_at
        self.grace_end = self.repeat_at = math.inf
        self.status: os.waitid_result | None = None
        self.exited_at = 0.0
        self.leftovers: dict[int, ProcessInfo] = {}
        self.escaped: dict[int, EscapedProcess] = {}
        self.seen: dict[int, int] = {}  # pid -> pidfd
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.signalled_tree = self.killed_tree = False
        self.pending: trio.Cancelled | None = None

    def _leave_running(self) -> None:
        if self.phase == RUNNING:
            self.on_stopping()

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Drive to DONE.  Raises only for our own bugs (the caller kills the leaf then)."""
        try:
            # (nothing to step before the first wait: the spawn had no checkpoint, so no stop
            # request and no deadline can have come; an exit already shows on the pidfd)
            while True:
                await self._wait()
                self._step(trio.current_time())
                if self.phase == DONE:
                    break
            self._check_seen()
        finally:
            self.stop.finish()
            for pidfd in self.seen.values():
                os.close(pidfd)
            self.seen.clear()

    async def _wait(self) -> None:
        try:
            with trio.CancelScope(deadline=self.deadline, shield=self.pending is not None) as w:
                self.stop.waker = w
                if self.status is None:
                    await trio.lowlevel.wait_readable(self.pidfd)
                else:
                    await self.watcher.wait_empty(self.leaf)
        except trio.Cancelled as exc:
            # the caller's scope: a graceful stop now, the Cancelled once the record exists
            self.pending = exc
            self.stop.request(StopReason.CANCEL, by_caller=True)
        finally:
            self.stop.waker = None

    def _step(self, now: float) -> None:
        """What happened since the last wait, then the current state's rule."""
        if self.status is None and _exited_nowait(self.pidfd):
            self._on_main_exit(now)
        if self.status is not None and not self._populated():
            self.phase = DONE
        elif self.phase == RUNNING:
            self._step_running(now)
        elif self.phase == TERM:
            self._step_term(now)
        elif self.phase == KILL and now >= self.deadline:
            self._step_kill_overdue()

    def _step_running(self, now: float) -> None:
        if self.status is None and self.stop.reason is None and now >= self.limit_at:
            self.stop.request(StopReason.TIME_LIMIT, by_caller=False)
        if self.stop.reason is not None or self.status is not None:
            self._enter_term(now)

    def _step_term(self, now: float) -> None:
        if self.stop.kill_now or now >= self.grace_end:
            self._enter_kill(now)
        elif now >= self.repeat_at:
            self._send((self.stop.signal, signal.SIGCONT))
            self.repeat_at = now + (self.spec_repeat or math.inf)
            self.deadline = min(self.grace_end, self.repeat_at)

    def _step_kill_overdue(self) -> None:
        self.problems.append(f"the leaf did not empty within {KILL_TIMEOUT:.0f}s of cgroup.kill")
        # the main process itself may be stuck (D state): keep waiting for it
        self.phase = DONE if self.status is not None else KILL
        self.deadline = math.inf

    # ---- the states ------------------------------------------------------------------------

    def _enter_term(self, now: float) -> None:
        """The stop signal to the subtree (a stop, or the cleanup of leftovers)."""
        if self.spec_grace <= 0 or self.stop.kill_now:
            self._enter_kill(now)
            return
        main_alive = self._main_alive()
        self._leave_running()
        self._send((self.stop.signal, signal.SIGCONT))
        if self.stop.reason is not None:
            self.stop.mark("signalled", main_alive=main_alive)
        self.signalled_tree = True
        self.phase = TERM
        self.grace_end = now + self.spec_grace
        self.repeat_at = now + self.spec_repeat if self.spec_repeat else math.inf
        self.deadline = min(self.grace_end, self.repeat_at)

    def _enter_kill(self, now: float) -> None:
        """cgroup.kill; SIGKILL to the main process's pidfd if it left its leaf."""
        main_alive = self._main_alive()
        self._leave_running()
        self._thaw()
        if self.status is not None:
            self._record_leftovers()  # what appeared since, named as it is now
        try:
            self.leaf.kill()
        except CgroupNotFound:
            pass  # the leaf itself was removed: nothing in it to kill
        if main_alive and self.pid in self.escaped:
            _pidfd_signal(self.pidfd, signal.SIGKILL)
        if self.stop.reason is not None:
            if self.spec_grace <= 0 and self.stop.kill_because is None:
                self.stop.kill_because = "no_grace"
            self.stop.mark("killed", main_alive=main_alive)
        self.killed_tree = True
        self.phase = KILL
        self.deadline = now + KILL_TIMEOUT

    # ---- what the states do ------------------------------------------------------------------

    def _send(self, signals: tuple[int, ...]) -> None:
        """``signals`` to every process of the subtree, and to the main process wherever it
        is; after the main's exit, what is found is recorded as leftovers (named as now)."""
        self._thaw()
        try:
            found = signal_tree(self.leaf, signals, self.pid,
                                self.seen if len(self.seen) < _TRACKED else None)
        except CgroupNotFound:
            return
        if self.status is None and not found.main_listed and self._main_alive():
            self._escaped_main()
            for sig in signals:
                _pidfd_signal(self.pidfd, sig)
        if self.status is not None:
            for p in found.processes:
                self.leftovers[p.pid] = p

    def _thaw(self) -> None:
        """A task may freeze its own leaf (or a sub-cgroup): thaw it so signals land."""
        try:
            thawed = self.leaf.thaw_tree()
        except CgroupError:
            return
        if thawed:
            where = ", ".join(os.path.join(self.leaf.path, r) if r != "." else self.leaf.path
                              for r in thawed)
            self.notes.append(f"the task had frozen {where}; corral thawed it to stop it")

    def _on_main_exit(self, now: float) -> None:
        # A zombie keeps the cgroup it died in: did it die inside its leaf?
        where = read_cgroup(self.pid)
        if where is not None and self.leaf_view is not None and not _inside(where,
                                                                              self.leaf_view):
            self._escaped_main(where)
        self.status = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        self.exited_at = now
        self._leave_running()
        if self.pid in self.escaped:
            e = self.escaped[self.pid]
            killed = self.status is not None and self.status.si_status == signal.SIGKILL \
                and self.killed_tree
            self.escaped[self.pid] = EscapedProcess(e.pid, e.comm, e.cgroup,
                                                    "killed" if killed else "exited")
        if self.phase != KILL and self._populated():
            # (after a kill, what is still listed is dying with the main process, not left
            # behind by it)
            self._record_leftovers()

    def _record_leftovers(self) -> None:
        try:
            tree = self.leaf.procs_tree()
        except CgroupError:
            return
        for pids in tree.values():
            for pid in pids:
                self.leftovers[pid] = ProcessInfo(pid, read_comm(pid))
                if len(self.seen) < _TRACKED and pid not in self.seen:
                    try:
                        self.seen[pid] = os.pidfd_open(pid)
                    except ProcessLookupError:
                        pass

    def _escaped_main(self, where: str | None = None) -> None:
        if self.pid not in self.escaped:
            self.escaped[self.pid] = EscapedProcess(
                self.pid, read_comm(self.pid), where or read_cgroup(self.pid), "running")

    def _check_seen(self) -> None:
        """The leaf is empty: a process we saw in it that still lives outside it has left it.
        It was the task's: kill it through its pidfd, and say so.  (A zombie waiting for its
        new parent to reap it still answers signal 0, but it died inside: not an escape.)"""
        for pid, pidfd in self.seen.items():
            if pid in self.escaped or not _pidfd_signal(pidfd, 0):
                continue
            where = read_cgroup(pid)
            if where is None or read_state(pid) == "Z" or (
                    self.leaf_view is not None and _inside(where, self.leaf_view)):
                continue
            comm = read_comm(pid)
            killed = _pidfd_signal(pidfd, signal.SIGKILL)
            self.escaped[pid] = EscapedProcess(pid, comm, where, "killed" if killed else "exited")

    def _main_alive(self) -> bool:
        return self.status is None and not _exited_nowait(self.pidfd)

    def _populated(self) -> bool:
        try:
            return self.leaf.is_populated()
        except CgroupNotFound:
            return False


def _inside(where: str, leaf_view: str) -> bool:
    return where == leaf_view or where.startswith(leaf_view.rstrip("/") + "/")


def _exited_nowait(pidfd: int) -> bool:
    """Has the process exited (reaped or not)?  Leaves it to be reaped."""
    try:
        return os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # already reaped


def _pidfd_signal(pidfd: int, sig: int) -> bool:
    """Send ``sig`` through ``pidfd``; False if the process is gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True
