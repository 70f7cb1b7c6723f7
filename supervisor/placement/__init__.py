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
import re
import secrets
from dataclasses import dataclass, field

from cgroupfs import (
    Cgroup,
    CgroupError,
    Limits,
    NoCgroup2Error,
    find_cgroup2_mount,
    own_cgroup,
)

from .._errors import PlacementError, SpecError

__all__ = ["Placement", "check_limits", "place_async", "planned_controllers"]

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


@dataclass(frozen=True)
class _Choice:
    how: str
    path: str  # the root itself, or (create_instance) where a fresh root goes
    create_instance: bool
    move_self: bool
    enable_in_parent: bool = False  # the parent is the real root: we may enable its controllers
    via_systemd: bool = False  # ask systemd for a delegated scope holding us: it is the root


def _choose(cgroup_root: str | None) -> _Choice:
    """Where the root is or would go; reads only.  PlacementError: what was found, and why not."""
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
        return _Choice("explicit --cgroup-root", path, False, _contains_self(path))
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
        return _Choice("delegated unit", own, False, True)
    tried.append(f"our cgroup {own} is not a delegated unit (no trusted.delegate xattr)")
    is_real_root = not os.path.exists(os.path.join(own, "cgroup.events"))
    ns_root = own == mount.mount_point
    if (is_real_root or ns_root) and os.access(os.path.join(own, "cgroup.procs"), os.W_OK):
        how = "host root cgroup" if is_real_root else "cgroup namespace root"
        return _Choice(how, own, True, False, enable_in_parent=is_real_root)
    tried.append(f"our cgroup {own} is neither the hierarchy's root nor writable")
    if _systemd_running():
        return _Choice("systemd scope", mount.mount_point, False, True, via_systemd=True)
    tried.append("systemd is not running here (no /run/systemd/system)")
    if os.geteuid() == 0 and os.access(os.path.join(mount.mount_point, "cgroup.procs"), os.W_OK):
        return _Choice("writable cgroup2 mount", mount.mount_point, True, False)
    tried.append(f"the cgroup2 mount {mount.mount_point} is not writable by uid {os.geteuid()}")
    raise PlacementError(
        "found no cgroup this supervisor may use: " + "; ".join(tried) + ". Run under a "
        "systemd unit with Delegate=yes, in a container with a writable cgroup namespace, as "
        "root, or give --cgroup-root a delegated cgroup")


def _systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")  # sd_booted()'s test


async def place_async(cgroup_root: str | None) -> Placement:
    """Find and prepare the root; PlacementError says what was found and what to change.

    Asynchronous for one way only: a delegated systemd scope.

    On a systemd host where we are not delegated already, systemd makes a transient scope with
    ``Delegate=yes`` holding our own process (one per supervisor, never one per task), and that
    scope is the root.  systemd removes it once our process has exited.
    """
    import trio

    choice = _choose(cgroup_root)
    if choice.via_systemd:
        from .systemd import SystemdError, create_delegated_scope

        try:
            scope = await create_delegated_scope(os.getpid())
        except SystemdError as e:
            raise PlacementError(f"systemd runs here but gave no delegated scope: {e}; or give "
                                 f"--cgroup-root a cgroup delegated to us") from e
        choice = _Choice(f"systemd scope {scope.unit}", scope.cgroup, False, True)
    return await trio.to_thread.run_sync(_place_choice, choice)


def _place_choice(choice: _Choice) -> Placement:
    if not choice.create_instance:
        return _prepare(Cgroup.open(choice.path), choice.how, created=False,
                        move_self=choice.move_self)
    notes: list[str] = []
    with Cgroup.open(choice.path) as parent:
        _reap_orphaned_roots(parent, notes)
        if choice.enable_in_parent:
            # The real root cgroup has no internal-process rule; where nobody (systemd) has
            # enabled its controllers for children yet, we do, so that limits work below it.
            _enable_wanted(parent, [])
        root = parent.make_child(_instance_name())
    placement = _prepare(root, choice.how, created=True, move_self=False)
    placement.notes[:0] = notes
    return placement


_INSTANCE = re.compile(r"corral-(\d+)-[0-9a-f]{6}")


def _started_after(pid: int, when: float) -> bool | None:
    """Did process ``pid`` start after the wall-clock time ``when``?  None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return btime + start_ticks / os.sysconf("SC_CLK_TCK") > when + 1.0


def _reap_orphaned_roots(parent: Cgroup, notes: list[str]) -> None:
    """Roots of corral processes that died without cleaning up (SIGKILL, OOM, a crash): kill
    what they still hold and remove them, so nothing survives a supervisor unseen.  A root
    is orphaned when its pid is gone, or was reused by a process younger than the root."""
    for name in parent.children():
        m = _INSTANCE.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        path = os.path.join(parent.path, name)
        try:
            created = os.stat(path).st_ctime
        except FileNotFoundError:
            continue
        if _started_after(int(m.group(1)), created) is False:
            continue  # its corral is alive
        try:
            with Cgroup.open(path) as orphan:
                count = len(orphan.procs())
                for rel in orphan.descendants():
                    with Cgroup.open(os.path.join(path, rel)) as below:
                        count += len(below.procs())
                if orphan.is_populated():
                    orphan.kill()
                    orphan.wait_unpopulated(5.0)
                orphan.remove(recursive=True)
        except CgroupError as e:
            notes.append(f"could not clear {path}, left by corral process {m.group(1)}: {e}")
            continue
        log.warning("removed %s, left by corral process %s, killing %d process(es)", path,
                    m.group(1), count)
        notes.append(f"removed {path}, left by corral process {m.group(1)} that ended without "
                     f"cleaning up; {count} process(es) in it were killed")


def _enable_wanted(cg: Cgroup, notes: list[str]) -> None:
    missing = (cg.available_controllers() & set(WANTED_CONTROLLERS)) - cg.enabled_controllers()
    if missing:
        try:
            cg.enable_controllers(missing)
        except CgroupError as e:
            notes.append(f"controllers {sorted(missing)} could not be enabled in {cg.path}: {e}")


def planned_controllers(cgroup_root: str | None) -> tuple[frozenset[str], str]:
    """The controllers tasks would get under ``cgroup_root``, and where, found without
    creating anything.

    A fresh root made below a parent can use what the parent already enables for its children;
    an existing root can enable what it is offered (its cgroup.controllers).
    """
    choice = _choose(cgroup_root)
    # a fresh root below a parent gets what the parent enables for children; the real root
    # and an existing root can enable what they are offered; systemd enables for a delegated
    # unit, down the tree, whatever the hierarchy's root offers
    name = ("cgroup.subtree_control" if choice.create_instance and not choice.enable_in_parent
            else "cgroup.controllers")
    try:
        with open(os.path.join(choice.path, name)) as f:
            offered = set(f.read().split())
    except OSError as e:
        raise PlacementError(f"reading {os.path.join(choice.path, name)}: {e.strerror}") from e
    where = (os.path.join(choice.path, "corral-<pid>-<random>") if choice.create_instance
             else choice.path)
    return frozenset(offered & set(WANTED_CONTROLLERS)), where


_CONTROLLER_OF = {"memory_max": "memory", "memory_high": "memory", "memory_swap_max": "memory",
                  "pids_max": "pids", "cpu_max": "cpu", "cpu_weight": "cpu", "io_weight": "io"}


def check_limits(limits: Limits, controllers: frozenset[str], where: str) -> None:
    """Refuse limits that need a controller not enabled for tasks (SpecError: which, where, fix)."""
    missing = sorted({c for f, c in _CONTROLLER_OF.items()
                      if getattr(limits, f) is not None} - controllers)
    if missing:
        enabled = ", ".join(sorted(controllers)) or "none"
        raise SpecError("limits", (
            f"limits need the {', '.join(missing)} controller(s), which are not enabled under "
            f"{where} (enabled: {enabled}); run where they are delegated (a systemd unit with "
            f"Delegate=yes on a pure cgroup v2 host) or drop those limits"))


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
        _enable_wanted(root, notes)
        tasks = root.make_child("tasks", exist_ok=True)
        _clear_stale(tasks)
        _enable_wanted(tasks, notes)
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
