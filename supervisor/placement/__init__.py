"""Where a supervisor's cgroups live: find a base, make our own locked root in it, give it back.

::

    <base>/                  --cgroup-root, our delegated unit, a container's namespace root,
                             a systemd scope made for us, or the cgroup2 mount (as root)
      supervisor/            our own process, only when it lived in <base> and controllers
                             had to be enabled there (the no-internal-process rule)
      corral-<pid>-<hex>/    this supervisor's root, flock'ed while it lives (``_instance``)
        <task-id>/           one leaf per task

Stale roots (their flock can be taken: their supervisor and its keeper are gone) are cleared
whenever a new root is made beside them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from cgroupfs import (
    Cgroup,
    CgroupError,
    Limits,
    NoCgroup2Error,
    find_cgroup2_mount,
    own_cgroup,
    parse_proc_cgroup,
)

from .._errors import PlacementError, SpecError
from ._base import Base, choose
from ._instance import make_instance, reap_stale

__all__ = ["Placement", "adopt_root", "check_limits", "place_async", "planned_controllers"]

log = logging.getLogger(__name__)

WANTED_CONTROLLERS = ("cpu", "io", "memory", "pids")


@dataclass
class Placement:
    """A prepared root: leaves go in ``root``, which we made and hold locked."""

    root: Cgroup
    how: str
    controllers: frozenset[str]
    base: str = ""  # where the root was made
    notes: list[str] = field(default_factory=list)
    root_view: str | None = None  # the root as /proc/PID/cgroup shows it (None: unknown)

    @property
    def tasks(self) -> Cgroup:
        """Where task leaves go (the root itself)."""
        return self.root

    def close(self, *, keep: bool = False) -> None:
        """Remove our root (and anything still below it: the supervisor stopped its tasks
        already, this is the last guard), releasing the lock; with ``keep`` (the root was
        handed over: its lock lives on in a dup of its fd), only close our fd."""
        if keep:
            self.root.close()
            return
        done = self.root.destroy(timeout=5.0)
        if done.error is not None:
            log.warning("closing the supervisor's root: %s", done.error)


def adopt_root(path: str, fd: int) -> Placement:
    """The root an earlier supervisor process handed over (its directory fd, the same open
    file description as that process's flock, so it is still locked: by us now)."""
    root = Cgroup(path, fd)
    if not root.try_lock():  # the same open file description: taking it again succeeds
        root.close()
        raise PlacementError(f"the handed-over root {path} is locked by someone else: it "
                             f"was not handed over by the process that held it")
    controllers = root.enabled_controllers()
    return Placement(root, "adopted from an earlier process", controllers,
                     os.path.dirname(path), [], proc_view(path))


async def place_async(cgroup_root: str | None) -> Placement:
    """Find the base, make our root in it; PlacementError says what was found and what to
    change.

    Asynchronous for one way only: on a systemd host where we are not delegated already,
    systemd makes a transient scope with ``Delegate=yes`` holding our own process (one per
    supervisor, never one per task), and that scope is the base.  systemd removes it once our
    process has exited.  The rest (which may clear stale roots: blocking) runs in a thread.
    """
    import trio

    base = choose(cgroup_root)
    if base.via_systemd:
        from .systemd import SystemdError, create_delegated_scope

        try:
            scope = await create_delegated_scope(os.getpid())
        except SystemdError as e:
            raise PlacementError(f"systemd runs here but gave no delegated scope: {e}; or give "
                                 f"--cgroup-root a cgroup delegated to us") from e
        base = Base(f"systemd scope {scope.unit}", scope.cgroup, move_self=True, enable_here=True)
    return await trio.to_thread.run_sync(_place, base)


def _place(base: Base) -> Placement:
    notes: list[str] = []
    try:
        with Cgroup.open(base.path) as parent:
            notes += reap_stale(parent)
            if base.enable_here:
                wanted = parent.available_controllers() & set(WANTED_CONTROLLERS)
                if base.move_self and wanted and parent.procs():
                    # no controllers below a cgroup with processes in it
                    parent.move_procs_into("supervisor").close()
                _enable_wanted(parent, notes)
            root = make_instance(parent)
    except CgroupError as e:
        raise PlacementError(f"preparing a root below {base.path} ({base.how}): {e}") from e
    try:
        _enable_wanted(root, notes)
        controllers = root.enabled_controllers()
    except BaseException:
        root.destroy()
        raise
    log.debug("cgroup root %s (%s), controllers %s", root.path, base.how, sorted(controllers))
    return Placement(root, base.how, controllers, base.path, notes, proc_view(root.path))


def proc_view(path: str) -> str | None:
    """How /proc/PID/cgroup names the cgroup at filesystem ``path`` (in our cgroup
    namespace), or None where that cannot be told for sure (a mount whose root lies above our
    namespace's).  Checked on our own process: its two views must agree through the same
    mapping, else None."""
    try:
        mount = find_cgroup2_mount()
        own_fs, own_view = own_cgroup(), parse_proc_cgroup(_read_text("/proc/self/cgroup"))
    except (NoCgroup2Error, OSError):
        return None
    if ".." in mount.root.split("/"):
        return None

    def view(fs: str) -> str | None:
        rel = os.path.relpath(fs, mount.mount_point)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            return None
        return os.path.normpath(os.path.join(mount.root, rel))

    return view(path) if view(own_fs) == own_view else None


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def _enable_wanted(cg: Cgroup, notes: list[str]) -> None:
    missing = (cg.available_controllers() & set(WANTED_CONTROLLERS)) - cg.enabled_controllers()
    if missing:
        try:
            cg.enable_controllers(missing)
        except CgroupError as e:
            notes.append(f"controllers {sorted(missing)} could not be enabled in {cg.path}: {e}")


def planned_controllers(cgroup_root: str | None) -> tuple[frozenset[str], str]:
    """The controllers tasks would get under ``cgroup_root``, and where, found without
    creating anything: what the base offers if we may enable it there (its
    cgroup.controllers), else what it already enables for children (cgroup.subtree_control).
    systemd enables, for a delegated unit, whatever the hierarchy's root offers."""
    base = choose(cgroup_root)
    name = "cgroup.controllers" if base.enable_here or base.via_systemd else \
        "cgroup.subtree_control"
    try:
        with open(os.path.join(base.path, name)) as f:
            offered = set(f.read().split())
    except OSError as e:
        raise PlacementError(f"reading {os.path.join(base.path, name)}: {e.strerror}") from e
    where = os.path.join(base.path, "corral-<pid>-<random>")
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
