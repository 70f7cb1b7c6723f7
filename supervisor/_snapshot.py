"""What was running when corral had to kill: a snapshot of the leaf, taken just before.

An agent (or a person) reading a killed task's record wants to know what hung.  Before each
``cgroup.kill``, the subtree is frozen (so that it stops changing), each process is recorded
(pid, parent, state, name, command line, CPU time), and only then killed; the kill works on a
frozen cgroup, and the freeze is undone after it so the dying can exit.
"""

from __future__ import annotations

from cgroupfs import Cgroup, CgroupError

from ._procfs import read_cmdline, read_comm, read_stat
from ._result import KillSnapshot, SnapshotProcess

__all__ = ["SNAPSHOT_MAX", "take_snapshot"]

SNAPSHOT_MAX = 32  # processes recorded; the rest are counted


def take_snapshot(leaf: Cgroup, after_s: float) -> KillSnapshot | None:
    """Freeze ``leaf``'s subtree and record its processes; None if it has none (or is gone).
    The caller kills it next and thaws it after (``leaf.thaw_tree()``)."""
    try:
        leaf.freeze()
        pids = [pid for listed in leaf.procs_tree().values() for pid in listed]
    except CgroupError:
        return None
    if not pids:
        return None
    processes = []
    for pid in pids[:SNAPSHOT_MAX]:
        stat = read_stat(pid)
        if stat is None:
            continue  # gone meanwhile
        state, ppid, cpu = stat
        processes.append(SnapshotProcess(pid, ppid, state, read_comm(pid), read_cmdline(pid),
                                         round(cpu, 2)))
    return KillSnapshot(round(after_s, 6), tuple(processes), max(0, len(pids) - SNAPSHOT_MAX))
