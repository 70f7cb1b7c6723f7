"""What was running when corral had to kill: a snapshot of the leaf, taken just before.

An agent (or a person) reading a killed task's record wants to know what hung.  Before each
``cgroup.kill``, the subtree is frozen (so that it stops changing), each process is recorded
(pid, parent, state, name, command line, CPU time), and only then killed.  The kill works on a
frozen cgroup (SIGKILL takes a frozen process out of the freezer), so the freeze is never
undone: a thaw would only wake the dying once more.
"""

from __future__ import annotations

from cgroupfs import Cgroup, CgroupError

from ._procfs import read_cmdline, read_stat
from ._result import KillSnapshot, SnapshotProcess

__all__ = ["SNAPSHOT_MAX", "take_snapshot"]

SNAPSHOT_MAX = 32  # processes recorded; the rest are counted


def take_snapshot(leaf: Cgroup, after_s: float) -> KillSnapshot | None:
    """Record ``leaf``'s processes, then freeze its subtree; None if it has none (or is gone).
    Each process's state, parent, name and CPU time are read before the freeze, in one read
    of /proc/PID/stat (a frozen process reads as sleeping, whatever it was doing); the freeze
    then holds command lines still, and anything forked meanwhile is counted.  The caller
    kills it next, frozen (``cgroup.kill`` needs no thaw)."""
    try:
        pids = [pid for listed in leaf.procs_tree().values() for pid in listed]
        stats = {pid: read_stat(pid) for pid in pids[:SNAPSHOT_MAX]}
        leaf.freeze()
        later = sum(len(listed) for listed in leaf.procs_tree().values())
    except CgroupError:
        return None
    if not pids:
        return None
    processes = []
    for pid, stat in stats.items():
        if stat is None:
            continue  # gone meanwhile
        state, ppid, cpu, comm = stat
        processes.append(SnapshotProcess(pid, ppid, state, comm, read_cmdline(pid),
                                         round(cpu, 2)))
    # not recorded: those past the cap, and those forked between the listing and the freeze
    more = max(0, len(pids) - SNAPSHOT_MAX) + max(0, later - len(pids))
    return KillSnapshot(round(after_s, 6), tuple(processes), more)
