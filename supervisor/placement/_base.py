"""Where a supervisor's root may go: the base cgroup, found by reading, never by a fixed path.

Discovery, in order (always from /proc/self/mountinfo and /proc/self/cgroup):

1. ``cgroup_root=PATH``: the caller says where.
2. Already inside a delegated unit (systemd marks it with the ``trusted.delegate`` xattr): our
   own cgroup is the base; we move ourselves into ``<base>/supervisor`` when controllers must
   be enabled below it (the no-internal-process rule).
3. Our own cgroup is the root of the hierarchy we can see (a container's cgroup namespace, or
   the host's real root).
4. On a systemd host: a transient scope with ``Delegate=yes`` holding our process (asked for
   over D-Bus by the caller of :func:`choose`, see ``systemd.py``).
5. Running as root with a writable cgroup2 mount (hybrid hosts mount it at
   /sys/fs/cgroup/unified): the mount's root.

Whatever the base, each supervisor then makes its own instance root below it (``_instance``).
"""

from __future__ import annotations

import os

from cgroupfs import NoCgroup2Error, find_cgroup2_mount, own_cgroup
from cgroupfs._record import record

from .._errors import PlacementError

__all__ = ["Base", "choose"]


@record
class Base:
    """Where instance roots go, and how we may prepare it."""

    how: str  # for notes and `corral check`: "explicit --cgroup-root", "delegated unit", ...
    path: str
    move_self: bool = False  # our process lives here: move it out before enabling controllers
    enable_here: bool = False  # we may enable controllers in its subtree_control
    via_systemd: bool = False  # ask systemd for a delegated scope; that scope is the base


def _is_delegated(path: str) -> bool:
    for attr in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, attr) in (b"1", b"1\n"):
                return True
        except OSError:
            continue
    return False


def _own_cgroup_or_none() -> str | None:
    try:
        return own_cgroup()
    except NoCgroup2Error:
        return None


def _explicit(cgroup_root: str) -> Base:
    path = os.path.abspath(cgroup_root)
    procs = os.path.join(path, "cgroup.procs")
    if not os.path.isfile(procs):
        raise PlacementError(
            f"cgroup_root {cgroup_root!r} is not a cgroup v2 directory (no cgroup.procs "
            f"there); give a directory inside the cgroup2 mount, e.g. a delegated unit's cgroup")
    if not os.access(procs, os.W_OK):
        raise PlacementError(
            f"cgroup_root {cgroup_root!r} is not writable by uid {os.geteuid()}; run as root "
            f"or point at a cgroup delegated to this user (Delegate=yes)")
    # Our own cgroup: we leave it for <path>/supervisor before enabling controllers (the
    # no-internal-process rule), unless it is the real root, which that rule exempts (and
    # whose processes are the whole machine's, never ours to move).
    ours = _own_cgroup_or_none() == path and not _is_real_root(path)
    return Base("explicit --cgroup-root", path, move_self=ours, enable_here=True)


def _is_real_root(path: str) -> bool:
    """The hierarchy's real root has no cgroup.events (a namespace root does)."""
    return not os.path.exists(os.path.join(path, "cgroup.events"))


def choose(cgroup_root: str | None) -> Base:
    """The base for this supervisor's root; reads only.  PlacementError: what was found at
    each step, and what to change."""
    if cgroup_root is not None:
        return _explicit(cgroup_root)
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
        return Base("delegated unit", own, move_self=True, enable_here=True)
    tried = [f"our cgroup {own} is not a delegated unit (no trusted.delegate xattr)"]
    is_real_root = _is_real_root(own)
    ns_root = own == mount.mount_point
    if (is_real_root or ns_root) and os.access(os.path.join(own, "cgroup.procs"), os.W_OK):
        # The real root has no internal-process rule: we may enable its controllers.  A
        # namespace root holding processes may not, so we use what it already enables.
        how = "host root cgroup" if is_real_root else "cgroup namespace root"
        return Base(how, own, enable_here=is_real_root)
    tried.append(f"our cgroup {own} is neither the hierarchy's root nor writable")
    if os.path.isdir("/run/systemd/system"):  # sd_booted()'s test
        return Base("systemd scope", mount.mount_point, via_systemd=True)
    tried.append("systemd is not running here (no /run/systemd/system)")
    if os.geteuid() == 0 and os.access(os.path.join(mount.mount_point, "cgroup.procs"), os.W_OK):
        return Base("writable cgroup2 mount", mount.mount_point)
    tried.append(f"the cgroup2 mount {mount.mount_point} is not writable by uid {os.geteuid()}")
    raise PlacementError(
        "found no cgroup this supervisor may use: " + "; ".join(tried) + ". Run under a "
        "systemd unit with Delegate=yes, in a container with a writable cgroup namespace, as "
        "root, or give --cgroup-root a delegated cgroup")
