"""What this host offers an isolated task, and what it refuses this supervisor.

``Isolation`` (``_isolation.py``) is checked when it is made, before anything exists; the
syntax is ``_isovalues.py``'s, and the rest depends on the machine: whether a user or group
exists and what groups it brings (the user and group databases), which capabilities corral
holds (/proc/self/status), whether the kernel lets corral make namespaces (probed once per
process, in a throwaway thread), what cgroup mounts there are to make read-only
(/proc/self/mountinfo, re-read only after a mount changed), and corral's own resource limits.
Everything looked up here is read by corral's process about itself; nothing is changed on
the host.  The ``check_*`` functions raise :class:`SpecError` naming the setting, what it
needs and the fix.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import resource
import select
import threading
from collections.abc import Mapping
from typing import Any

from cgroupfs._record import record

from ._errors import SpecError
from ._isovalues import (
    INFINITY,
    MAX_ID,
    RLIMITS,
    capability_names,
    is_number,
    rlimit_label,
    show,
)
from ._spawn import CAPABILITIES, unshare
from ._units import whole_number

__all__ = [
    "CGROUP_MOUNTS",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CgroupMounts",
    "Credentials",
    "cgroup_mounts",
    "check_capabilities",
    "check_credentials",
    "check_namespaces",
    "check_rlimits",
    "has_cap",
    "namespace_refusal",
    "our_caps",
    "proc_status",
    "resolve_credentials",
    "user_name",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000


# --- our own credentials, capabilities and what the kernel lets us make --------------------


@functools.cache
def proc_status() -> dict[str, str]:
    """Our /proc/self/status, read once: corral never changes its own capabilities or umask
    (and reading it costs ~50 us)."""
    with open("/proc/self/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def our_caps(kind: str) -> int:
    """Our capability set ``kind`` (Eff, Prm, Bnd) as a mask."""
    return int(proc_status()[f"Cap{kind}"], 16)


def has_cap(name: str) -> bool:
    """Whether corral holds capability ``name`` in its effective set."""
    return bool((our_caps("Eff") >> CAPABILITIES.index(name)) & 1)


@functools.cache
def namespace_refusal(kind: str) -> str | None:
    """Why the kernel will not let us make a ``kind`` namespace ("net", "mnt"), or None.

    Probed once per process in a throwaway thread: unshare(2) moves only the calling thread,
    so the probe's namespace goes away with it.  A new network namespace is only useful with
    its loopback up (CAP_NET_ADMIN), so the probe does that too.
    """
    found: list[str] = []

    def probe() -> None:
        flag, call = (CLONE_NEWNET, "CLONE_NEWNET") if kind == "net" else (CLONE_NEWNS,
                                                                            "CLONE_NEWNS")
        try:
            unshare(flag)
        except OSError as e:
            found.append(f"unshare({call}): [Errno {e.errno}] {e.strerror}")
            return
        if kind == "net":
            found.extend(_loopback_up_refusal())

    thread = threading.Thread(target=probe, name=f"corral-{kind}ns-probe", daemon=True)
    thread.start()
    thread.join()
    return found[0] if found else None


def _loopback_up_refusal() -> list[str]:
    """Bring "lo" up in the calling thread's network namespace: [] or [why it failed]."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s, siocgifflags, struct.pack("16sH14x", b"lo", 0))
            flags = struct.unpack("16sH14x", raw)[1]
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))
        except OSError as e:
            return [f'bringing "lo" up: [Errno {e.errno}] {e.strerror}']
    return []


# --- the cgroup mounts (ProtectControlGroups=) and /tmp (PrivateTmp=) ------------------------


class CgroupMounts:
    """Every cgroup mount we can see, re-read only after a mount changed.

    Reading /proc/self/mountinfo costs ~75 us here; the kernel marks an open mountinfo fd
    POLLPRI after each mount or unmount in our namespace (proc(5)), so a poll says whether
    the list we have is still true.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._mounts: tuple[tuple[str, int], ...] = ()
        self._visible: tuple[object, object, tuple[tuple[str, int], ...]] = (None, None, ())
        self._tmp: tuple[str, ...] = ()

    def get(self) -> tuple[tuple[str, int], ...]:
        """``(mount point, MS_* flags to keep)`` of each cgroup mount, parents first."""
        with self._lock:
            if self._fd < 0:  # kept open for the process's life: one fd
                self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
            elif not self._changed():
                return self._mounts
            os.lseek(self._fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(self._fd, 65536):
                chunks.append(chunk)
            self._mounts = cgroup_mounts(os.fsdecode(b"".join(chunks)))
            self._tmp = _tmp_dirs()
            return self._mounts

    def tmp_dirs(self) -> tuple[str, ...]:
        """/tmp and /var/tmp as they were when the mounts last changed."""
        self.get()
        return self._tmp

    def visible(self, tmp: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        """The mounts less those under a private ``tmp`` (hidden by its tmpfs: nothing to
        remount there), the same tuple while nothing changed (the spawn caches by it)."""
        mounts = self.get()
        if self._visible[:2] != (mounts, tmp):
            hidden = tuple(t.rstrip("/") + "/" for t in tmp)
            self._visible = (mounts, tmp, tuple(m for m in mounts if not m[0].startswith(hidden)))
        return self._visible[2]

    def _changed(self) -> bool:
        """Whether a mount changed since mountinfo was last read (the fd polls POLLPRI)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLPRI | select.POLLERR)
        return any(ev & (select.POLLPRI | select.POLLERR) for _, ev in poller.poll(0))


_MS_KEEP = {"nosuid": 0x2, "nodev": 0x4, "noexec": 0x8, "noatime": 0x400,
            "nodiratime": 0x800, "relatime": 0x200000, "strictatime": 0x1000000}


def cgroup_mounts(text: str) -> tuple[tuple[str, int], ...]:
    """The cgroup and cgroup2 mounts in mountinfo ``text``, and the tmpfs that holds them
    (``/sys/fs/cgroup`` on a v1 or hybrid host), each only where it is the mount one sees."""
    from cgroupfs import parse_mountinfo

    mounts = [m for m in parse_mountinfo(text) if m.fstype in ("cgroup", "cgroup2", "tmpfs")]
    top = {m.mount_point: m for m in mounts}  # later lines are mounted over earlier ones
    groups = [m for m in top.values() if m.fstype != "tmpfs"]
    parents = {os.path.dirname(g.mount_point) for g in groups} - {"/"}
    holders = [m for m in top.values() if m.fstype == "tmpfs" and m.mount_point in parents]
    chosen = sorted(holders + groups, key=lambda m: m.mount_point)
    return tuple((m.mount_point, sum(_MS_KEEP.get(o, 0) for o in m.options.split(",")))
                 for m in chosen)


CGROUP_MOUNTS = CgroupMounts()


def _tmp_dirs() -> tuple[str, ...]:
    """/tmp and /var/tmp where they exist, once each (/var/tmp may be /tmp)."""
    seen, out = set(), []
    for path in ("/tmp", "/var/tmp"):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(path)
    return tuple(out)


# --- users and groups ----------------------------------------------------------------------


@record
class Credentials:
    """What User=, Group= and SupplementaryGroups= come to; None: left as the supervisor's."""

    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    user_name: str | None = None


def _id_number(value: str | int, what: str) -> int | None:
    """A uid or gid given as a number (None for a name); SpecError beyond what ids may be."""
    if isinstance(value, str) and not is_number(value):
        return None
    number = whole_number(value) if isinstance(value, str) else value
    if not 0 <= number <= MAX_ID:
        raise SpecError(what, f"{what} must be a name or an id from 0 to {MAX_ID} (ids are "
                              f"32 bits, and {MAX_ID + 1} means none), got {show(value)}")
    return number


def _lookup_user(value: str | int, what: str) -> tuple[int, pwd.struct_passwd | None]:
    """A user's uid and database entry; a number without an entry is (number, None); a name
    without one is a SpecError."""
    number = _id_number(value, what)
    try:
        if number is not None:
            return number, pwd.getpwuid(number)
        entry = pwd.getpwnam(str(value))
        return entry.pw_uid, entry
    except KeyError:
        if number is not None:
            return number, None
        raise SpecError(what, f"{what} names a user that does not exist: {show(value)} is "
                              f"not in the user database (getent passwd {value}); create it "
                              f"(useradd {value}) or give an existing user") from None


def _lookup_group(value: str | int, what: str) -> int:
    """A group's gid; a number is taken as it is (the kernel needs no entry for it)."""
    number = _id_number(value, what)
    if number is not None:
        return number
    try:
        return grp.getgrnam(str(value)).gr_gid
    except KeyError:
        raise SpecError(what, f"{what} names a group that does not exist: {show(value)} is "
                              f"not in the group database (getent group {value}); create it "
                              f"(groupadd {value}) or give an existing group") from None


def resolve_credentials(user: Any, group: Any, supplementary: tuple[str | int, ...],
                        names: Mapping[str, str]) -> Credentials:
    """systemd's rules: User= brings its primary group (unless Group= says otherwise) and its
    groups in the group database (initgroups; not for root, whose groups are kept); then
    SupplementaryGroups= are added.  With none of the three, everything stays ours."""
    extra = [_lookup_group(g, names["supplementary_groups"]) for g in supplementary]
    gid = None if group is None else _lookup_group(group, names["group"])
    if user is None:
        return Credentials(gid=gid, groups=tuple(dict.fromkeys(extra)) if extra else None)
    uid, entry = _lookup_user(user, names["user"])
    if entry is None and gid is None:
        raise SpecError(names["user"], f"{names['user']} {user} has no entry in the user "
                                       f"database, so it has no primary group: give "
                                       f"{names['group']} as well, or create the user")
    if gid is None:
        assert entry is not None
        gid = entry.pw_gid
    name = entry.pw_name if entry is not None else None
    if uid == 0 and gid == 0 and not extra:
        return Credentials(uid=uid, gid=gid, user_name=name)  # root keeps its groups
    groups = _user_groups(name, gid, extra)
    if len(groups) > os.sysconf("SC_NGROUPS_MAX"):
        raise SpecError(names["supplementary_groups"], f"{names['user']} {user} would be in "
                        f"{len(groups)} groups, more than the kernel's NGROUPS_MAX")
    return Credentials(uid, gid, groups, name)


def _user_groups(name: str | None, gid: int, extra: list[int]) -> tuple[int, ...]:
    """initgroups(name, gid) (never for gid 0), then the extra ones, each once."""
    base = os.getgrouplist(name, gid) if name is not None and gid != 0 else (
        [gid] if gid != 0 else [])
    return tuple(dict.fromkeys([*base, *extra]))


@functools.lru_cache(maxsize=64)
def user_name(uid: int) -> str | None:
    """The user database's name for ``uid``, or None (cached)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


# --- what this supervisor may do here: refused before anything exists -------------------------


def check_credentials(creds: Credentials, user: object, group: object,
                      names: Mapping[str, str]) -> None:
    """SpecError unless corral may become ``creds`` (CAP_SETUID, CAP_SETGID where they change).
    ``user`` and ``group`` are the settings as given, for the message."""
    if creds.uid is not None and creds.uid != os.geteuid() and not has_cap("CAP_SETUID"):
        raise SpecError(names["user"], f"{names['user']}={user} needs CAP_SETUID, and "
                        f"corral runs as uid {os.geteuid()} without it; run corral as root, "
                        f"or leave {names['user']} unset")
    regroup = (creds.gid is not None and creds.gid != os.getegid()) or (
        creds.groups is not None and set(creds.groups) != set(os.getgroups()))
    if regroup and not has_cap("CAP_SETGID"):
        field_ = names["group"] if group is not None else names["supplementary_groups"]
        raise SpecError(field_, f"changing the task's groups needs CAP_SETGID, and corral "
                                f"(uid {os.geteuid()}) lacks it; run corral as root, or leave "
                                f"{names['user']}, {names['group']} and "
                                f"{names['supplementary_groups']} unset")


def check_rlimits(rlimits: tuple[tuple[str, int, int], ...],
                  prefix: str) -> tuple[tuple[str, int, int], ...]:
    """``(name, soft, hard)`` as the kernel will take them, or SpecError: hard limits above
    ours need CAP_SYS_RESOURCE; open files stop at fs.nr_open (the kernel refuses more even
    to root, so "infinity" means nr_open there)."""
    checked = []
    for name, soft, hard in rlimits:
        what = rlimit_label(name, prefix)
        if name == "NOFILE":
            with open("/proc/sys/fs/nr_open") as f:
                nr_open = int(f.read())
            soft, hard = min(soft, nr_open), min(hard, nr_open)
        ours = resource.getrlimit(RLIMITS[name][0])[1]
        if ours != resource.RLIM_INFINITY and hard > ours and not has_cap("CAP_SYS_RESOURCE"):
            shown = "infinity" if hard == INFINITY else hard
            raise SpecError(what, f"{what} hard limit {shown} is above corral's own ({ours}), "
                                  f"and raising a hard limit needs CAP_SYS_RESOURCE, which "
                                  f"corral lacks here; give at most {ours}")
        checked.append((name, soft, hard))
    return tuple(checked)


def check_capabilities(bounding: int | None, ambient: int, names: Mapping[str, str]) -> None:
    """SpecError unless corral may drop from the bounding set (CAP_SETPCAP) and holds every
    ``ambient`` capability (permitted and bounding sets)."""
    if bounding is None and not ambient:
        return
    if bounding is not None and not has_cap("CAP_SETPCAP"):
        raise SpecError(names["capability_bounding_set"], f"{names['capability_bounding_set']}"
                        f" needs CAP_SETPCAP to drop capabilities, which corral lacks; run "
                        f"corral as root, or leave it unset")
    missing = capability_names(ambient & ~(our_caps("Prm") & our_caps("Bnd")))
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise SpecError(names["ambient_capabilities"], f"{names['ambient_capabilities']} "
                        f"{' '.join(missing)}: corral does not hold {them} (its permitted and "
                        f"bounding sets), so the task cannot get {them}; run corral as root "
                        f"with {them}, or drop {them} here")


_NAMESPACES = (("private_network", "net", "a network namespace"),
               ("private_tmp", "mnt", "a mount namespace"),
               ("protect_control_groups", "mnt", "a mount namespace"))


def check_namespaces(asked: Mapping[str, bool], names: Mapping[str, str]) -> None:
    """SpecError for the first setting in ``asked`` (private_network, private_tmp,
    protect_control_groups: on or off) that needs a namespace the kernel refuses corral."""
    for flag, kind, need in _NAMESPACES:
        refusal = asked[flag] and namespace_refusal(kind)
        if refusal:
            raise SpecError(names[flag], f"{names[flag]}=yes needs {need}, which this host "
                            f"refuses corral ({refusal}); run corral as root with "
                            f"CAP_SYS_ADMIN (a container needs it granted and unshare "
                            f"allowed by its seccomp profile), or leave {names[flag]} off")
