"""Isolation as a stranger tries it: a root task with ProtectControlGroups=yes and without
CAP_SYS_ADMIN must not get a process out of its leaf, and if it does, the record must say so."""

from __future__ import annotations

import os

from rt_util import alive, cgroup_of, procs

import supervisor

PROTECTED = [("ProtectControlGroups", "yes"), ("CapabilityBoundingSet", "~CAP_SYS_ADMIN")]


async def test_protected_cgroupfs_refuses_a_write_to_cgroup_procs(scratch: str) -> None:
    """Held: the plain way out (echo $$ > cgroup.procs) meets a read-only cgroupfs."""
    iso = supervisor.Isolation.from_properties(PROTECTED)
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup:
        r = await sup.run(["sh", "-c", f"echo $$ > {scratch}/cgroup.procs && echo escaped"],
                          isolation=iso, time_limit="20s")
    assert b"escaped" not in r.stdout and b"Read-only file system" in r.stderr
    assert not r.containment.broken and r.cleanup == "clean"
    assert procs(scratch) == []


async def test_protected_cgroupfs_stops_clone_into_cgroup(scratch: str, intocg: str) -> None:
    """The kernel checks CLONE_INTO_CGROUP with inode_permission() on the target's
    cgroup.procs, which ignores a read-only *mount* (only a read-only superblock counts): an
    O_RDONLY fd of any cgroup directory is enough to start a child there."""
    iso = supervisor.Isolation.from_properties(PROTECTED)
    assert iso.describe().get("could_escape") is False  # what corral promises for it
    script = f'{intocg} {scratch} sh -c "exec sleep 60 </dev/null >/dev/null 2>&1"'
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup:
        r = await sup.run(["sh", "-c", script], isolation=iso, time_limit="20s")
    survivors = [p for p in procs(scratch) if alive(p)]
    try:
        # nothing the task started may outlive it; failing that, its record must say so
        assert survivors == [], (
            f"{survivors} born by the task in {cgroup_of(survivors[0])} survived it; the "
            f"record says outcome={r.outcome} cleanup={r.cleanup} "
            f"broken={r.containment.broken} escaped={r.containment.escaped}")
    finally:
        for pid in survivors:
            os.kill(pid, 9)
