"""Each supervisor's own root, ``<base>/corral-<pid>-<hex>``, owned by an flock.

Ownership is proved without pids or clocks: a live supervisor holds an exclusive ``flock`` on
its root's directory for as long as it lives (the lock goes with the last fd on that open file
description, so a SIGKILLed supervisor loses it at once, and its keeper, which holds a dup,
keeps it until it has cleaned up).  A root whose lock can be taken is stale: whatever /proc, the
pid in its name (another PID namespace may reuse it) or the clock say.  Two supervisors given
the same base each make their own root, so neither can clear the other's tasks.

The pid in the name is for people reading ``ls``: nothing relies on it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets

from cgroupfs import Cgroup, CgroupError, CgroupNotFound

__all__ = ["INSTANCE_NAME", "make_instance", "reap_stale"]

log = logging.getLogger(__name__)

INSTANCE_NAME = re.compile(r"corral-\d+-[0-9a-f]{6}")
_ATTEMPTS = 8


def make_instance(base: Cgroup) -> Cgroup:
    """A fresh root below ``base``, locked by us; CgroupError if none could be made.

    A reaper in another corral may lock and remove a root in the instant between our mkdir
    and our flock (it looks stale then): after taking the lock we check that the directory
    still exists, and otherwise try a new name.
    """
    for _ in range(_ATTEMPTS):
        root = base.make_child(f"corral-{os.getpid()}-{secrets.token_hex(3)}")
        if root.try_lock() and _still_there(root):
            return root
        root.close()
    raise CgroupError(f"could not make a root of our own below {base.path}: each new one was "
                      f"taken or removed by another process before we could lock it")


def _still_there(cg: Cgroup) -> bool:
    try:
        cg.read_events()
    except CgroupNotFound:
        return False
    return True


def reap_stale(base: Cgroup) -> list[str]:
    """Clear the roots below ``base`` that no live supervisor owns (those whose flock we can
    take): kill what is left in them, remove them.  Returns one note per root cleared or not
    cleared.  Blocking (up to a few seconds per stale root): run it in a thread."""
    notes = []
    for name in base.children():
        if not INSTANCE_NAME.fullmatch(name):
            continue
        try:
            cg = base.child(name)
        except CgroupError:
            continue  # removed meanwhile
        if not cg.try_lock():
            cg.close()  # its supervisor (or that one's keeper) is alive
            continue
        count = sum(len(pids) for pids in _procs_tree(cg).values())
        done = cg.destroy()
        if done.error is not None:
            notes.append(f"could not clear {cg.path}, left by a corral that ended without "
                         f"cleaning up: {done.error}")
            continue
        # (the note is how callers hear of it: corral run prints it, a library program finds
        # it in sup.placement_notes; a warning too would say it twice)
        log.info("removed %s, left by a corral that ended without cleaning up; %d "
                 "process(es) in it were killed", cg.path, count)
        notes.append(f"removed {cg.path}, left by a corral that ended without cleaning up; "
                     f"{count} process(es) in it were killed")
    return notes


def _procs_tree(cg: Cgroup) -> dict[str, list[int]]:
    try:
        return cg.procs_tree()
    except CgroupError:
        return {}
