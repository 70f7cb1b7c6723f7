"""Which processes were the task's, and which of them got out: leftovers and escapes.

A task's processes live in its leaf.  Two things need more than the leaf's ``cgroup.procs``:

- **leftovers**: what the main process left behind when it exited, named as they were when
  they were stopped, including any that appeared while they were being stopped;
- **escapes**: a process of the task found outside its leaf.  A zombie keeps the cgroup it
  died in, so the main process's ``/proc/PID/cgroup`` at its exit says where it died.  Every
  other process seen in the leaf is remembered: as a pidfd when a stop or leftover pass sees
  it (up to ``TRACKED``), as its (pid, start time) when the sampler does (which holds no fd:
  a thousand held tasks must not hold a thousand more fds); once the leaf is empty, one still
  alive outside it has left.

Only a task that can write to the cgroup tree can leave its leaf (root with cgroupfs
writable); ``ProtectControlGroups=`` and ``User=`` prevent it.  A process that leaves before
it is ever listed is seen only if it is the main process.
"""

from __future__ import annotations

import os
import signal

from cgroupfs import Cgroup, CgroupError

from ._procfs import read_cgroup, read_comm, read_start, read_state
from ._result import EscapedProcess, ProcessInfo

__all__ = ["TRACKED", "Tracker", "pidfd_signal"]

TRACKED = 256  # processes kept as pidfds per task, to check escapes


def pidfd_signal(pidfd: int, sig: int) -> bool:
    """Send ``sig`` through ``pidfd``; False if the process is gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True


def inside(where: str, leaf_view: str) -> bool:
    """Is cgroup ``where`` (as /proc/PID/cgroup names it) the leaf or below it?"""
    return where == leaf_view or where.startswith(leaf_view.rstrip("/") + "/")


class Tracker:
    """One task's leftovers, escapes and the pidfds of the processes seen in its leaf.
    ``leaf_view`` is the leaf as /proc/PID/cgroup names it (None: unknown here)."""

    __slots__ = ("escaped", "leaf", "leaf_view", "leftovers", "main_pid", "sampled", "seen")

    def __init__(self, leaf: Cgroup, main_pid: int, leaf_view: str | None) -> None:
        self.leaf = leaf
        self.main_pid = main_pid
        self.leaf_view = leaf_view
        self.leftovers: dict[int, ProcessInfo] = {}
        self.escaped: dict[int, EscapedProcess] = {}
        self.seen: dict[int, int] = {}  # pid -> pidfd
        self.sampled: dict[int, int] | None = None  # pid -> start time (made when needed)

    def keep(self) -> dict[int, int] | None:
        """Where ``signal_tree`` may put the pidfds it opened (None once full)."""
        return self.seen if len(self.seen) < TRACKED else None

    def note(self, pids: list[int]) -> None:
        """The sampler saw ``pids`` in the leaf: remember each by its start time."""
        sampled = self.sampled
        for pid in pids:
            if sampled is None:
                sampled = self.sampled = {}
            if pid not in sampled and pid != self.main_pid and len(sampled) < TRACKED:
                start = read_start(pid)
                if start is not None:
                    sampled[pid] = start

    def track(self, pids: list[int]) -> None:
        """Keep a pidfd of each of ``pids`` not kept yet (they are in the leaf now)."""
        for pid in pids:
            if pid not in self.seen and len(self.seen) < TRACKED:
                try:
                    self.seen[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    pass

    def record_leftovers(self) -> None:
        """Everything in the subtree now is a leftover, named as it is now."""
        try:
            tree = self.leaf.procs_tree()
        except CgroupError:
            return
        pids = [pid for listed in tree.values() for pid in listed]
        for pid in pids:
            self.leftovers[pid] = ProcessInfo(pid, read_comm(pid))
        self.track(pids)

    def main_exiting(self) -> None:
        """The main process has exited, unreaped: where did it die?"""
        where = read_cgroup(self.main_pid)
        if where is not None and self.leaf_view is not None and not inside(where,
                                                                           self.leaf_view):
            self.main_escaped(where)

    def main_escaped(self, where: str | None = None) -> None:
        if self.main_pid not in self.escaped:
            self.escaped[self.main_pid] = EscapedProcess(
                self.main_pid, read_comm(self.main_pid), where or read_cgroup(self.main_pid),
                "running")

    def main_ended(self, killed: bool) -> None:
        e = self.escaped.get(self.main_pid)
        if e is not None:
            self.escaped[e.pid] = EscapedProcess(e.pid, e.comm, e.cgroup,
                                                 "killed" if killed else "exited")

    def check_seen(self) -> None:
        """The leaf is empty: a process seen in it that still lives outside it has left it.
        It was the task's: kill it through its pidfd, and say so.  (A zombie waiting for its
        new parent to reap it still answers signal 0, but it died inside: not an escape.)"""
        for pid, pidfd in self.seen.items():
            if pid not in self.escaped and pidfd_signal(pidfd, 0):
                self._escape(pid, pidfd)
        self.check_sampled()

    def check_sampled(self) -> None:
        """Like :meth:`check_seen`, for the processes the sampler saw: the same pid with the
        same start time is the same process; it is opened as a pidfd (and checked again) only
        to kill it."""
        for pid, start in (self.sampled or {}).items():
            if pid in self.escaped or pid in self.seen or read_start(pid) != start:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                if read_start(pid) == start:  # the pidfd holds this very process
                    self._escape(pid, pidfd)
            finally:
                os.close(pidfd)

    def _escape(self, pid: int, pidfd: int) -> None:
        where = read_cgroup(pid)
        if where is None or read_state(pid) == "Z" or (
                self.leaf_view is not None and inside(where, self.leaf_view)):
            return
        comm = read_comm(pid)
        killed = pidfd_signal(pidfd, signal.SIGKILL)
        self.escaped[pid] = EscapedProcess(pid, comm, where, "killed" if killed else "exited")

    def close(self) -> None:
        for pidfd in self.seen.values():
            os.close(pidfd)
        self.seen.clear()
