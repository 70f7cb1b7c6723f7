"""Which processes were the task's, and which of them got out: leftovers and escapes.

A task's processes live in its leaf.  Two things need more than the leaf's ``cgroup.procs``:

- **leftovers**: what the main process left behind when it exited, named as they were when
  they were stopped, including any that appeared while they were being stopped;
- **escapes**: a process of the task found outside its leaf.  A zombie keeps the cgroup it
  died in, so the main process's ``/proc/PID/cgroup`` at its exit says where it died.  Every
  other process seen in the leaf (by a stop or leftover pass, or by the sampler) is
  remembered by its (pid, start time), up to ``TRACKED`` of each: that names one process for
  good and holds no fd (a thousand held tasks, or one stopping with thousands of processes,
  must not run the supervisor out of fds); once the leaf is empty, one still alive outside it
  has left.  It is opened as a pidfd only to be checked once more and killed.

Only a task that can write to the cgroup tree can leave its leaf (root with cgroupfs
writable); ``ProtectControlGroups=`` and ``User=`` prevent it.  A process that leaves before
it is ever listed is seen if it is the main process, or if it holds one of the task's pipes
once the leaf is empty (:meth:`Tracker.holders_of`: the pipe that stays open is the proof);
one that holds neither is invisible, and only those two properties prevent it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from cgroupfs import Cgroup, CgroupError, NoCgroup2Error, own_cgroup

from ._procfs import read_cgroup, read_comm, read_start, read_state
from ._result import EscapedProcess, ProcessInfo

__all__ = ["TRACKED", "Tracker", "leave_leaf", "pidfd_signal", "remember_home"]

TRACKED = 256  # processes remembered per task and per way of seeing them, to check escapes


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
    """One task's leftovers, escapes and the processes seen in its leaf.
    ``leaf_view`` is the leaf as /proc/PID/cgroup names it (None: unknown here)."""

    __slots__ = ("escaped", "leaf", "leaf_view", "leftovers", "main_pid", "sampled", "seen")

    def __init__(self, leaf: Cgroup, main_pid: int, leaf_view: str | None) -> None:
        self.leaf = leaf
        self.main_pid = main_pid
        self.leaf_view = leaf_view
        self.leftovers: dict[int, ProcessInfo] = {}
        self.escaped: dict[int, EscapedProcess] = {}
        self.seen: dict[int, int] = {}  # pid -> start time: signalled, or listed at a stop
        self.sampled: dict[int, int] | None = None  # pid -> start time (made when needed)

    def export(self) -> dict[str, Any]:
        """What a hand-over carries of it (JSON): leftovers, escapes, the processes seen."""
        return {"leftovers": [[p.pid, p.comm] for p in self.leftovers.values()],
                "escaped": [[e.pid, e.comm, e.cgroup, e.ended] for e in self.escaped.values()],
                "seen": [[pid, start] for pid, start in self.seen.items()]}

    def restore(self, s: dict[str, Any]) -> None:
        """Take up where :meth:`export` left (``seen`` is missing from what an older corral
        exported: then only escapes after the adoption are seen)."""
        self.leftovers = {pid: ProcessInfo(pid, comm) for pid, comm in s["leftovers"]}
        self.escaped = {e[0]: EscapedProcess(*e) for e in s["escaped"]}
        self.seen = {pid: start for pid, start in s.get("seen", ())}

    def keep(self) -> dict[int, int] | None:
        """Where ``signal_tree`` notes the processes it signalled (None once full)."""
        return self.seen if len(self.seen) < TRACKED else None

    def note(self, pids: list[int]) -> None:
        """The sampler saw ``pids`` in the leaf: remember each by its start time."""
        sampled, ours = self.sampled, os.getpid()
        for pid in pids:
            if sampled is None:
                sampled = self.sampled = {}
            if pid not in sampled and pid != self.main_pid and len(sampled) < TRACKED \
                    and pid != ours:
                start = read_start(pid)
                if start is not None:
                    sampled[pid] = start

    def track(self, pids: list[int]) -> None:
        """Remember each of ``pids`` not remembered yet (they are in the leaf now)."""
        seen, ours = self.seen, os.getpid()
        for pid in pids:
            if pid not in seen and len(seen) < TRACKED and pid != ours:
                start = read_start(pid)
                if start is not None:
                    seen[pid] = start

    def record_leftovers(self) -> None:
        """Everything in the subtree now is a leftover, named as it is now."""
        try:
            tree = self.leaf.procs_tree()
        except CgroupError:
            return
        ours = os.getpid()
        pids = [pid for listed in tree.values() for pid in listed if pid != ours]
        for pid in pids:
            self.leftovers[pid] = ProcessInfo(pid, read_comm(pid))
        self.track(pids)

    def main_exiting(self, cgroup_id: int | None = None) -> None:
        """The main process has exited, unreaped: where did it die?  ``cgroup_id``: its
        cgroup's id as its pidfd tells (None: unknown); the leaf's own settles it at once."""
        if cgroup_id is not None and cgroup_id == self._leaf_id():
            return
        where = read_cgroup(self.main_pid)
        if where is not None and self.leaf_view is not None and not inside(where,
                                                                           self.leaf_view):
            self.main_escaped(where)

    def _leaf_id(self) -> int | None:
        """The leaf's cgroup id: its directory's inode number (None: not to be had)."""
        try:
            return os.fstat(self.leaf.fd).st_ino
        except (OSError, ValueError):
            return None

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
        It was the task's: kill it, and say so.  The same pid with the same start time is the
        same process; it is opened as a pidfd (and checked again) only to kill it.  (A zombie
        waiting for its new parent to reap it has a start time too, but it died inside: not
        an escape.)"""
        for remembered in (self.seen, self.sampled or {}):
            for pid, start in remembered.items():
                if pid in self.escaped or read_start(pid) != start:
                    continue
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:  # gone (ESRCH); or out of fds: then by pid, checked again
                    pidfd = -1
                try:
                    if read_start(pid) == start:  # (a pidfd holds this very process)
                        self._escape(pid, pidfd)
                finally:
                    if pidfd >= 0:
                        os.close(pidfd)

    def _escape(self, pid: int, pidfd: int) -> None:
        where = read_cgroup(pid)
        if where is None or read_state(pid) == "Z" or (
                self.leaf_view is not None and inside(where, self.leaf_view)):
            return
        comm = read_comm(pid)
        killed = pidfd_signal(pidfd, signal.SIGKILL) if pidfd >= 0 else _kill(pid)
        self.escaped[pid] = EscapedProcess(pid, comm, where, "killed" if killed else "exited")


    def holders_of(self, links: set[str], ago: float, uid: int) -> list[str]:
        """The leaf is empty, and pipes of the task (``links``: ``pipe:[inode]``) are still
        held open: by processes outside the leaf.  Each one that started after the task's
        spawn (``ago`` seconds ago) and runs as the task's ``uid`` (any, for a root task) is
        the task's: a child that left before corral ever listed it (root, cgroupfs
        writable).  It is killed through a pidfd, checked again, and recorded escaped.  One
        that started before, or runs as another user (the task passed its pipe to someone
        else's process: corral must not kill that on the task's say-so), is named, not
        killed.  Returns what the record's cleanup says of them all.  A scan of /proc
        (blocking: run it in a thread); rare, as escapes are."""
        found = []
        born_after = _ticks_since_boot(ago)
        for pid in _holders(links):
            start = read_start(pid)
            if start is None or pid in self.escaped:
                continue
            where = read_cgroup(pid)
            comm = read_comm(pid)
            owner = _uid_of(pid)
            if start < born_after or (uid != 0 and owner != uid):
                why = "started before the task" if start < born_after else \
                    f"runs as uid {owner}, not the task's"
                found.append(f"{comm}[{pid}] in {where} ({why}: left as it is)")
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone
            try:
                if read_start(pid) != start:
                    continue
                self._escape(pid, pidfd)
            finally:
                os.close(pidfd)
            escaped = self.escaped.get(pid)
            if escaped is not None:
                found.append(f"{comm}[{pid}] in {where} ({escaped.ended})")
        return found


def _holders(links: set[str]) -> list[int]:
    """Processes (not ours) with an fd that /proc names as one of ``links``."""
    ours, holders = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == ours:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in links:
                    holders.append(int(name))
                    break
            except OSError:
                continue
    return holders


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _ticks_since_boot(ago: float) -> int:
    """The moment ``ago`` seconds ago as /proc/PID/stat's start times count it (clock ticks
    since boot, CLOCK_BOOTTIME), one tick early (their resolution)."""
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ago
    return max(0, int(since_boot * os.sysconf("SC_CLK_TCK")) - 1)


# ---- our own process, moved into a leaf -------------------------------------------------

_HOME: list[str] = []  # the cgroup our process lives in (filesystem path), once known


def remember_home() -> None:
    """Note the cgroup our process lives in now (at a supervisor's start, after placement)."""
    try:
        _HOME[:] = [own_cgroup()]
    except (NoCgroup2Error, OSError):
        _HOME.clear()


def leave_leaf(leaf: Cgroup, leaf_view: str | None) -> tuple[str | None, bool]:
    """A task that can write the cgroup tree (root, without isolation) may move corral's own
    process into its leaf, where the leaf's freeze, kill or sweep would reach corral itself.
    Called before any of those: if we are in the leaf (or below), move back home.  Returns
    the note for the record (None: we were not there) and whether we are still inside (the
    move failed: the caller must then spare us, e.g. signal by pid instead of cgroup.kill)."""
    ours = os.getpid()
    if leaf_view is not None:
        where = read_cgroup(ours)
        if where is None or not inside(where, leaf_view):
            return None, False
    else:
        try:
            if not any(ours in listed for listed in leaf.procs_tree().values()):
                return None, False
        except CgroupError:
            return None, False
    what = f"a process of the task moved corral's own process (pid {ours}) into {leaf.path}"
    if not _HOME:
        return f"{what}; corral found no cgroup of its own to go back to", True
    try:
        fd = os.open(os.path.join(_HOME[0], "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(ours).encode())
        finally:
            os.close(fd)
    except OSError as e:
        return f"{what}; corral could not move back to {_HOME[0]}: {e.strerror}", True
    return f"{what}; corral moved itself back to {_HOME[0]}", False


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
