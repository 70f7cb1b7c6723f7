"""Enabling controllers and writing limits, with the kernel's rules spelled out.

Two rules trip everyone up, and the kernel's answer to both is a bare errno:

* a controller can only be enabled in ``cgroup.subtree_control`` if the
  parent enabled it for this cgroup (it is listed in ``cgroup.controllers``);
  otherwise ENOENT. On a hybrid host, controllers bound to cgroup v1 never
  appear in v2 at all.
* the no-internal-process rule: a non-root cgroup that holds processes cannot
  enable domain controllers (memory, io) for its children (EBUSY), and once it
  has, processes can only be added to its leaves. Threaded controllers (cpu,
  pids) slip through, and the cgroup silently becomes a thread root whose new
  children are "domain invalid"; we enforce the rule for every controller.

So these functions check first and raise ``ControllerUnavailable`` naming the
controller, the cgroup, what is offered and what would fix it, before
anything is written; and they turn the EBUSY into a ``CgroupBusy`` that says
which rule applied.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

from ._errors import CgroupBusy, CgroupNotFound, CgroupOSError, ControllerUnavailable
from ._fileio import exists, read_file, read_file_optional, write_file
from ._limits import Limits

__all__ = ["enable_controllers", "set_limits"]

# What a missing limit file usually means, for the error message.
_FEATURES = {
    "memory.swap.max": "no swap accounting: CONFIG_MEMCG_SWAP, or swapaccount=0",
    "io.weight": "no iocost model: CONFIG_BLK_CGROUP_IOCOST; BFQ offers io.bfq.weight",
    "cpu.max": "no CFS bandwidth control: CONFIG_CFS_BANDWIDTH",
}

_GENERIC_FIX = (
    "limits need a cgroup v2 tree with {it} delegated: boot with "
    "systemd.unified_cgroup_hierarchy=1 or run under a unit with Delegate=yes"
)


def _available(dir_fd: int, path: str) -> frozenset[str]:
    return frozenset(read_file(dir_fd, path, "cgroup.controllers").split())


def enable_controllers(dir_fd: int, path: str, names: Iterable[str]) -> None:
    """Write ``+name ...`` to ``cgroup.subtree_control`` (see ``Cgroup``)."""
    if isinstance(names, str):
        raise TypeError(f"names must be an iterable of names, e.g. [{names!r}]")
    wanted = list(dict.fromkeys(names))
    for name in wanted:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"controller names look like 'memory' or 'pids', got {name!r}")
    if not wanted:
        return
    available = _available(dir_fd, path)
    missing = [n for n in wanted if n not in available]
    if missing:
        raise ControllerUnavailable(missing, path, available, fix=_fix(path, missing))
    if set(wanted) <= set(read_file(dir_fd, path, "cgroup.subtree_control").split()):
        return  # already enabled: nothing to write, whatever the processes
    text = " ".join(f"+{n}" for n in wanted)
    subtree_control = os.path.join(path, "cgroup.subtree_control")
    # The kernel applies the no-internal-process rule to domain controllers
    # (memory, io) only. Threaded ones (cpu, pids) it accepts in a cgroup with
    # processes, which silently turns it into a thread root and makes every
    # new child "domain invalid" (EOPNOTSUPP when a process is added there).
    # So we apply the rule to all controllers. The root cgroup (the only one
    # without cgroup.events) is exempt, as in the kernel.
    if exists(dir_fd, "cgroup.events"):
        procs = read_file(dir_fd, path, "cgroup.procs").split()
        if procs:
            code = errno.EBUSY
            hint = _internal_process_hint(path, procs)
            action = f"refusing to write {text!r} to"
            raise CgroupBusy(code, os.strerror(code), subtree_control, action, hint)
    try:
        write_file(dir_fd, path, "cgroup.subtree_control", text)
    except CgroupBusy as exc:
        procs = read_file(dir_fd, path, "cgroup.procs").split()
        if not procs:
            raise
        raise exc.with_hint(_internal_process_hint(path, procs)) from exc


def _internal_process_hint(path: str, procs: list[str]) -> str:
    return (
        f"{path} still holds processes ({', '.join(procs)}), and a cgroup with "
        "processes cannot enable controllers for its children (the no-internal-process "
        "rule): move them into a leaf first, e.g. move_procs_into('supervisor')"
    )


def set_limits(dir_fd: int, path: str, limits: Limits) -> None:
    """Write each set field of ``limits`` (see ``Cgroup.set_limits``)."""
    if limits.is_empty():
        return
    available = _available(dir_fd, path)
    missing = sorted(limits.controllers() - available)
    if missing:
        raise ControllerUnavailable(
            missing,
            path,
            available,
            verb="enabled for",
            needed_by=[field for c in missing for field in limits.needed_by(c)],
            fix=_fix(path, missing),
        )
    # Check every file first so that a missing one (the controller is there
    # but not the feature behind this file) leaves the cgroup untouched.
    for filename, _ in limits.files():
        if not exists(dir_fd, filename):
            if not exists(dir_fd, "cgroup.procs"):
                break  # the cgroup itself is gone: the write below says so
            code = errno.ENOENT
            raise CgroupNotFound(
                code,
                os.strerror(code),
                os.path.join(path, filename),
                "looking for",
                f"the {filename.partition('.')[0]} controller is enabled but this kernel "
                f"offers no {filename} ({_FEATURES.get(filename, 'a feature left out')})",
            )
    for filename, text in limits.files():
        write_file(dir_fd, path, filename, text)


def _fix(path: str, missing: list[str]) -> str:
    """How to make ``missing`` appear in ``path``'s cgroup.controllers."""
    # cgroup.controllers lists what the parent enables in its subtree_control.
    # If the parent is offered them itself, enabling them there is the fix;
    # otherwise the tree above was not delegated with them (or they are bound
    # to a cgroup v1 hierarchy), which only the system's setup can change.
    it = "it" if len(missing) == 1 else "them"
    generic = _GENERIC_FIX.format(it=it)
    parent = os.path.dirname(path)
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return generic
    try:
        offered = read_file_optional(fd, parent, "cgroup.controllers")
    except CgroupOSError:
        offered = None
    finally:
        os.close(fd)
    if offered is None or not set(missing) <= set(offered.split()):
        return generic
    plus = " ".join(f"+{n}" for n in missing)
    return (
        f"enable {it} in the parent first: write {plus!r} to "
        f"{os.path.join(parent, 'cgroup.subtree_control')} (Cgroup.enable_controllers)"
    )
