"""Finding cgroup v2 on this machine: where it is mounted and where we are in it.

Nothing here assumes a path. ``/proc/self/mountinfo`` says where cgroup2 is
mounted (``/sys/fs/cgroup`` on a pure v2 host, ``/sys/fs/cgroup/unified`` on a
hybrid one, anywhere in a container) and ``/proc/PID/cgroup`` says which cgroup
a process is in. The parsers are pure functions over the text so they can be
tested against samples from machines we are not running on; the readers are
thin.

Cgroup namespaces: both the ``0::`` path in ``/proc/PID/cgroup`` and the root
field of a cgroup2 line in mountinfo are shown relative to the *reader's*
cgroup-namespace root, so they can be combined directly. Two cases are handled:

* the usual one, where the mount's root is an ancestor of (or equal to) the
  cgroup path, e.g. a container that mounted cgroup2 inside its namespace
  (root ``/``, path ``/``): prefix arithmetic;
* a mount made outside our namespace and inherited (``unshare --cgroup``
  without a remount): its root shows as ``/..`` or ``/../..``. The names of
  the levels above our namespace root are not visible, so we look for the one
  directory at exactly that depth under the mount point whose ``cgroup.procs``
  lists the process.

Anything else (the process outside our namespace, a root like ``/../sibling``)
raises ``NoCgroup2Error``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Literal

from ._errors import NoCgroup2Error
from ._record import record

__all__ = [
    "MountInfo",
    "cgroup_fs_path",
    "find_cgroup2_mount",
    "hierarchy_mode",
    "is_writable",
    "own_cgroup",
    "parse_mountinfo",
    "parse_proc_cgroup",
]

logger = logging.getLogger(__name__)

_ESCAPE = re.compile(rb"\\([0-7]{3})")
_FIX_V2 = (
    "corral needs cgroup v2: boot with systemd.unified_cgroup_hierarchy=1 "
    "(or mount it: mount -t cgroup2 none /sys/fs/cgroup/unified)"
)
# Bound on the directories visited when resolving a "/.." mount root.
_SEARCH_LIMIT = 10_000


@record
class MountInfo:
    """One line of ``/proc/PID/mountinfo``, with octal escapes decoded."""

    mount_id: int
    parent_id: int
    major_minor: str
    root: str
    mount_point: str
    options: str  # per-mount options, e.g. "rw,nosuid,relatime"
    optional_fields: tuple[str, ...]  # e.g. ("shared:5",)
    fstype: str
    source: str
    super_options: str  # per-superblock options, e.g. "rw,nsdelegate"

    @property
    def read_only(self) -> bool:
        """True when either the mount or its superblock is mounted ``ro``."""
        return "ro" in self.options.split(",") or "ro" in self.super_options.split(",")


def _unescape(field: str) -> str:
    # The kernel escapes space, tab, newline and backslash as \ooo (octal).
    # Work on bytes so that an escaped byte of a multi-byte name decodes right.
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), os.fsencode(field))
    return os.fsdecode(raw)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse the text of ``/proc/PID/mountinfo`` (see proc(5)).

    Raises ``ValueError`` naming the line for a line that is not mountinfo.
    """
    mounts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(" ")
        try:
            sep = parts.index("-", 6)
        except ValueError:
            sep = -1
        if sep < 0 or len(parts) < sep + 3:
            raise ValueError(f"malformed mountinfo line {number}: {line!r}")
        try:
            mount_id, parent_id = int(parts[0]), int(parts[1])
        except ValueError:
            raise ValueError(f"malformed mountinfo line {number}: {line!r}") from None
        mounts.append(
            MountInfo(
                mount_id=mount_id,
                parent_id=parent_id,
                major_minor=parts[2],
                root=_unescape(parts[3]),
                mount_point=_unescape(parts[4]),
                options=parts[5],
                optional_fields=tuple(parts[6:sep]),
                fstype=parts[sep + 1],
                source=_unescape(parts[sep + 2]),
                super_options=" ".join(parts[sep + 3 :]),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> str:
    """Return the cgroup v2 path from the text of ``/proc/PID/cgroup``.

    That is the ``0::/path`` line; the v1 lines (``4:memory:/x``) are ignored.
    Raises ``NoCgroup2Error`` when there is no such line (a v1-only machine)
    or when the kernel marks the cgroup ``(deleted)``.
    """
    v1 = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            if path.endswith(" (deleted)"):
                raise NoCgroup2Error(
                    f"the process's cgroup {path[: -len(' (deleted)')]} has been removed"
                )
            return path
        if controllers:
            v1.append(controllers)
    found = f"only cgroup v1 hierarchies ({', '.join(v1)})" if v1 else "no cgroup at all"
    raise NoCgroup2Error(f"/proc/PID/cgroup has no cgroup v2 ('0::') line, {found}; {_FIX_V2}")


def _read_proc(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return os.fsdecode(b"".join(chunks))


def _read_proc_cgroup(pid: int | str) -> str:
    path = f"/proc/{pid}/cgroup"
    try:
        return _read_proc(path)
    except FileNotFoundError:
        raise ProcessLookupError(errno.ESRCH, f"no process {pid} ({path} is missing)") from None


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def _up_count(root: str) -> int | None:
    """For a root made only of ``..`` components, their count; else None."""
    parts = _parts(root)
    if parts and all(p == ".." for p in parts):
        return len(parts)
    return None


def _contains(mount: MountInfo, cgroup_path: str) -> bool:
    root, path = _parts(mount.root), _parts(cgroup_path)
    if ".." in path:
        return False
    return _up_count(mount.root) is not None or path[: len(root)] == root


def hierarchy_mode(mounts: Iterable[MountInfo]) -> Literal["unified", "hybrid", "legacy", "none"]:
    """systemd's names: v2 only, v2 beside v1 hierarchies, v1 only, no cgroups."""
    fstypes = {m.fstype for m in mounts}
    if "cgroup2" in fstypes:
        return "hybrid" if "cgroup" in fstypes else "unified"
    return "legacy" if "cgroup" in fstypes else "none"


def find_cgroup2_mount(
    mountinfo_text: str | None = None, *, cgroup_path: str | None = None
) -> MountInfo:
    """The cgroup2 mount to use, from mountinfo (ours when ``mountinfo_text`` is None).

    ``cgroup_path`` is our cgroup as ``/proc/self/cgroup`` shows it; when not
    given and mountinfo is ours, it is read. With several cgroup2 mounts the
    choice prefers, in order: one that contains our cgroup, one whose root is
    ``/``, a writable one, the earliest. A mount hidden by another mount on the
    same mount point is skipped.
    """
    if mountinfo_text is None:
        mountinfo_text = _read_proc("/proc/self/mountinfo")
        if cgroup_path is None:
            try:
                cgroup_path = parse_proc_cgroup(_read_proc("/proc/self/cgroup"))
            except NoCgroup2Error:
                cgroup_path = None
    mounts = parse_mountinfo(mountinfo_text)
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    if not v2:
        v1 = sorted({opt for m in mounts if m.fstype == "cgroup" for opt in _v1_names(m)})
        if v1:
            found = f"only cgroup v1 hierarchies are mounted ({', '.join(v1)})"
        else:
            found = "no cgroup filesystem is mounted"
        raise NoCgroup2Error(f"no cgroup2 mount in /proc/self/mountinfo: {found}; {_FIX_V2}")
    stacked = {(m.parent_id, m.mount_point) for m in mounts}
    visible = [m for m in v2 if (m.mount_id, m.mount_point) not in stacked] or v2

    def rank(item: tuple[int, MountInfo]) -> tuple[bool, bool, bool, int]:
        index, m = item
        ours = cgroup_path is None or _contains(m, cgroup_path)
        return (not ours, m.root != "/", m.read_only, index)

    return min(enumerate(visible), key=rank)[1]


def _v1_names(mount: MountInfo) -> list[str]:
    known = {
        "rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec",
        "clone_children", "xattr", "noprefix", "cpuset_v2_mode", "none",
    }
    names = []
    for opt in mount.super_options.split(","):
        # "name=systemd" for named hierarchies, a bare controller name otherwise.
        if opt.startswith("name=") or (opt and "=" not in opt and opt not in known):
            names.append(opt)
    return names


def cgroup_fs_path(mount: MountInfo, cgroup_path: str) -> str:
    """Filesystem path of ``cgroup_path`` through ``mount`` (pure).

    Both arguments are in the same cgroup-namespace view. Raises
    ``NoCgroup2Error`` when the cgroup is not below the mount's root, or when
    the root is above our namespace root (``/..``): that case needs the
    directory search ``own_cgroup`` does.
    """
    root, path = _parts(mount.root), _parts(cgroup_path)
    if ".." in path or ".." in root or path[: len(root)] != root:
        raise NoCgroup2Error(
            f"cgroup {cgroup_path} is not below the root {mount.root} of the cgroup2 "
            f"mount at {mount.mount_point}; mount cgroup2 inside this cgroup namespace "
            "(mount -t cgroup2 none /sys/fs/cgroup) or pass the cgroup path explicitly"
        )
    return os.path.join(mount.mount_point, *path[len(root) :])


def own_cgroup(pid: int | str = "self") -> str:
    """Absolute filesystem path of the cgroup process ``pid`` is in.

    Raises ``NoCgroup2Error`` when it cannot be located (see the module
    docstring for the namespace cases handled) and ``ProcessLookupError`` for
    a pid that does not exist.
    """
    cgroup_path = parse_proc_cgroup(_read_proc_cgroup(pid))
    mount = find_cgroup2_mount(_read_proc("/proc/self/mountinfo"), cgroup_path=cgroup_path)
    ups = _up_count(mount.root)
    if ups is None or ".." in _parts(cgroup_path):
        return cgroup_fs_path(mount, cgroup_path)
    numeric = os.getpid() if pid == "self" else int(pid)
    found = _search_depth(mount.mount_point, ups, _parts(cgroup_path), numeric)
    if found is None:
        raise NoCgroup2Error(
            f"cgroup {cgroup_path} of process {pid} is in a cgroup namespace whose root lies "
            f"{ups} level(s) below the cgroup2 mount at {mount.mount_point} (root "
            f"{mount.root}), and no directory at that depth lists the process; mount "
            "cgroup2 inside the namespace (mount -t cgroup2 none /sys/fs/cgroup)"
        )
    return found


def _search_depth(mount_point: str, depth: int, tail: Sequence[str], pid: int) -> str | None:
    """The directory ``D/tail`` whose cgroup.procs lists ``pid``, D at ``depth``."""
    level = [mount_point]
    visited = 0
    for _ in range(depth):
        following = []
        for directory in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    following.append(entry.path)
        visited += len(following)
        if visited > _SEARCH_LIMIT:
            logger.warning("gave up searching %s after %d directories", mount_point, visited)
            return None
        level = following
    for directory in level:
        candidate = os.path.join(directory, *tail)
        try:
            procs = _read_proc(os.path.join(candidate, "cgroup.procs")).split()
        except OSError:
            continue
        if str(pid) in procs:
            return candidate
    return None


def is_writable(path: str | os.PathLike[str]) -> bool:
    """Whether we may create children in, and move processes into, cgroup ``path``."""
    path = os.fspath(path)
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return False
    except OSError:
        return False
    return os.access(path, os.W_OK) and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)
