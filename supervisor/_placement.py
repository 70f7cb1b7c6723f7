"""Where a supervisor's cgroups live: find a root we may use, prepare it, and give it back.

Discovery, in order (DESIGN.md; never a fixed path, always /proc/self/mountinfo and
/proc/self/cgroup):

1. ``cgroup_root=PATH``: the caller says where.
2. Already inside a delegated unit (systemd marks it with the ``trusted.delegate`` xattr):
   our own cgroup is the root; we move ourselves into ``<root>/supervisor`` so that controllers
   can be enabled below it (the no-internal-process rule).
3. Our own cgroup is the root of the hierarchy we can see (a container's cgroup namespace, or
   the host's real root): we make a per-supervisor ``corral-<pid>-<rand>`` below it.
4. Running as root with a writable cgroup2 mount (hybrid hosts mount it at
   /sys/fs/cgroup/unified): likewise, below the mount's root.

(The systemd D-Bus scope comes between 2 and 3 on systemd hosts: see the CLI issue.)
Below the root: ``tasks/`` with every useful controller enabled, one leaf per task inside.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, field

from cgroupfs import (
    Cgroup,
    CgroupError,
    NoCgroup2Error,
    find_cgroup2_mount,
    own_cgroup,
)

from ._errors import PlacementError

__all__ = ["Placement", "place"]

log = logging.getLogger(__name__)

WANTED_CONTROLLERS = ("cpu", "io", "memory", "pids")


@dataclass
class Placement:
    """A prepared root: ``tasks`` is where leaves go."""

    root: Cgroup
    tasks: Cgroup
    how: str
    created_root: bool
    controllers: frozenset[str]
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Remove what we made.  Leaves must already be gone (the supervisor saw to that)."""
        problems = []
        try:
            self.tasks.remove()
        except CgroupError as e:
            problems.append(str(e))
        if self.created_root:
            try:
                self.root.remove()
            except CgroupError as e:
                problems.append(str(e))
        else:
            self.root.close()
        for p in problems:
            log.warning("closing the supervisor's cgroups: %s", p)


def _is_delegated(path: str) -> bool:
    for attr in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, attr) in (b"1", b"1\n"):
                return True
        except OSError:
            continue
    return False


def _instance_name() -> str:
    return f"corral-{os.getpid()}-{secrets.token_hex(3)}"


def place(cgroup_root: str | None) -> Placement:
    """Find and prepare the root; raises PlacementError saying what was found and what to do."""
    tried: list[str] = []
    if cgroup_root is not None:
        path = os.path.abspath(cgroup_root)
        if not os.path.isfile(os.path.join(path, "cgroup.procs")):
            raise PlacementError(
                f"cgroup_root {cgroup_root!r} is not a cgroup v2 directory (no cgroup.procs "
                f"there); give a directory inside the cgroup2 mount, e.g. a delegated unit's "
                f"cgroup")
        if not os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
            raise PlacementError(
                f"cgroup_root {cgroup_root!r} is not writable by uid {os.geteuid()}; run as "
                f"root or point at a cgroup delegated to this user (Delegate=yes)")
        root = Cgroup.open(path)
        return _prepare(root, "explicit --cgroup-root", created=False,
                        move_self=_contains_self(path))
    try:
        mount = find_cgroup2_mount()
        own = own_cgroup()
    except NoCgroup2Error as e:
        raise PlacementError(f"no usable cgroup v2 hierarchy: {e}") from None
    if mount.read_only:
        raise PlacementError(
            f"the cgroup2 mount at {mount.mount_point} is read-only; in a container, mount it "
            f"read-write (docker: --cgroupns=private with a writable /sys/fs/cgroup), or give "
            f"--cgroup-root a writable delegated cgroup")
    if _is_delegated(own):
        root = Cgroup.open(own)
        return _prepare(root, "delegated unit", created=False, move_self=True)
    tried.append(f"our cgroup {own} is not a delegated unit (no trusted.delegate xattr)")
    is_real_root = not os.path.exists(os.path.join(own, "cgroup.events"))
    ns_root = own == mount.mount_point
    if (is_real_root or ns_root) and os.access(os.path.join(own, "cgroup.procs"), os.W_OK):
        parent = Cgroup.open(own)
        try:
            root = parent.make_child(_instance_name())
        finally:
            parent.close()
        how = "host root cgroup" if is_real_root else "cgroup namespace root"
        return _prepare(root, how, created=True, move_self=False)
    tried.append(f"our cgroup {own} is neither the hierarchy's root nor writable")
    if os.geteuid() == 0 and os.access(os.path.join(mount.mount_point, "cgroup.procs"), os.W_OK):
        parent = Cgroup.open(mount.mount_point)
        try:
            root = parent.make_child(_instance_name())
        finally:
            parent.close()
        return _prepare(root, "writable cgroup2 mount", created=True, move_self=False)
    tried.append(f"the cgroup2 mount {mount.mount_point} is not writable by uid {os.geteuid()}")
    raise PlacementError(
        "found no cgroup this supervisor may use: " + "; ".join(tried) + ". Run under a "
        "systemd unit with Delegate=yes, in a container with a writable cgroup namespace, as "
        "root, or give --cgroup-root a delegated cgroup")


def _contains_self(path: str) -> bool:
    try:
        return own_cgroup() == path
    except NoCgroup2Error:
        return False


def _prepare(root: Cgroup, how: str, *, created: bool, move_self: bool) -> Placement:
    notes: list[str] = []
    try:
        wanted = root.available_controllers() & set(WANTED_CONTROLLERS)
        if move_self and wanted and root.procs():
            # the no-internal-process rule: no controllers below a cgroup with processes in it
            root.move_procs_into("supervisor").close()
        missing = wanted - root.enabled_controllers()
        if missing:
            try:
                root.enable_controllers(missing)
            except CgroupError as e:
                notes.append(f"controllers {sorted(missing)} could not be enabled: {e}")
        tasks = root.make_child("tasks", exist_ok=True)
        _clear_stale(tasks)
        usable = tasks.available_controllers() & set(WANTED_CONTROLLERS)
        if usable - tasks.enabled_controllers():
            try:
                tasks.enable_controllers(usable)
            except CgroupError as e:
                notes.append(f"controllers {sorted(usable)} could not be enabled in "
                             f"{tasks.path}: {e}")
        controllers = tasks.enabled_controllers()
    except BaseException:
        if created:
            root.remove()
        else:
            root.close()
        raise
    log.debug("cgroup root %s (%s), controllers %s", root.path, how, sorted(controllers))
    return Placement(root, tasks, how, created, controllers, notes)


def _clear_stale(tasks: Cgroup) -> None:
    """Leaves an earlier supervisor left here: kill what is in them and remove them."""
    for name in tasks.children():
        try:
            with tasks.child(name) as leaf:
                if leaf.is_populated():
                    log.warning("killing the processes left in %s by an earlier run", leaf.path)
                    leaf.kill()
                    leaf.wait_unpopulated(5.0)
                leaf.remove()
        except CgroupError as e:
            raise PlacementError(f"{tasks.path} holds a leaf from an earlier run that could "
                                 f"not be cleared: {e}") from e
