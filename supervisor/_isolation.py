"""How a task is isolated: systemd.exec(5)'s names (User=, PrivateNetwork=, ...) as one value.

``Isolation`` is to the spawn what ``cgroupfs.Limits`` is to the leaf: a frozen, validated
value in ``TaskSpec.isolation``.  The task's life uses it in exactly two places::

    with spec.isolation.prepare() as options:   # keyword arguments of _spawn.spawn(),
        spawned = spawn(argv, ..., **options)   # valid inside the block
    Containment(..., isolation=spec.isolation.describe())

An empty ``Isolation()`` means the task runs as the supervisor does.  Fields (systemd's names
in snake_case; ``Isolation.from_properties`` takes the ``-p NAME=VALUE`` spelling)::

    user, group, supplementary_groups      names or numbers; User= brings its primary group
                                           and its groups in /etc/group, as systemd does; a
                                           name must exist, a number is used as it is (a
                                           uid without an entry needs group as well)
    no_new_privileges, umask               PR_SET_NO_NEW_PRIVS; "0027" or 0o027
    rlimits                                {"NOFILE": "1024:4096", "CPU": "30s", ...}
    private_network                        a new network namespace: "lo" up, nothing else
    private_tmp                            a fresh tmpfs on /tmp and /var/tmp (what systemd
                                           256 calls PrivateTmp=disconnected)
    protect_control_groups                 every cgroup mount read-only for the task
    capability_bounding_set                "~CAP_SYS_ADMIN CAP_SYS_PTRACE" or names kept
    ambient_capabilities                   names kept across the change to ``user``

Everything is checked when the value is made, before anything exists: the syntax, that users
and groups exist, that the supervisor may do what is asked (CAP_SETUID for another user,
CAP_SYS_RESOURCE to raise a hard limit, namespaces the kernel lets it make: probed once per
process, in a throwaway thread).  The child does the work between clone and exec, in
systemd's order (native/corral_native.c); every failure there names its step.

What ``describe()`` cannot see, because it depends on other tasks: a root task reaches the
mount namespace of any process it may ptrace-read through ``/proc/PID/root``, which for root
means any root process holding no capability it lacks.  So a root task with a read-only
cgroupfs and fewer capabilities can still write cgroupfs through a sibling root task that has
the same capabilities but shares the host's mounts; and a root task, whatever its
capabilities, may signal every root process, corral's included.  For code that must not get
out, run it as another user (``user=``); for root tasks, protect them all alike.

Why no pyroute2 at run time: the task's network namespace is made by the child itself
(``unshare(CLONE_NEWNET)``) and its loopback brought up with one SIOCSIFFLAGS ioctl, two
syscalls and no helper process.  The netlink alternative (a thread that unshares and opens an
``IPRoute``, then passes the namespace's fd to the spawn) costs a thread start and a
netlink exchange per task, and pyroute2's own netns helpers fork a process; the benchmark
(``benchmarks/bench_isolation.py``) measures both.  pyroute2 is what the tests use to look at
a task's namespace from outside.  Mount namespaces need no helper either: the child makes its
own, slave to ours, so that nothing mounted in it reaches the host, and it goes away with the
task's last process (so does the tmpfs of ``private_tmp``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import grp
import math
import os
import pwd
import resource
import select
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import SpecError
from ._spawn import CAPABILITIES, cap_last_cap, capability_name, unshare
from ._units import UnitsError, parse_duration, parse_size

__all__ = ["ISOLATION_PROPERTIES", "Isolation"]

_INFINITY = 2**64 - 1  # RLIM_INFINITY as the kernel has it (Python's resource says -1)
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
_RLIMIT_LOCKS = 10  # Linux's number; Python's resource module has no name for it

# Limit*= as systemd spells them, and how each value is read (rlimit-util.c).
_RLIMITS: dict[str, tuple[int, str]] = {
    "CPU": (resource.RLIMIT_CPU, "seconds"), "FSIZE": (resource.RLIMIT_FSIZE, "size"),
    "DATA": (resource.RLIMIT_DATA, "size"), "STACK": (resource.RLIMIT_STACK, "size"),
    "CORE": (resource.RLIMIT_CORE, "size"), "RSS": (resource.RLIMIT_RSS, "size"),
    "NOFILE": (resource.RLIMIT_NOFILE, "count"), "AS": (resource.RLIMIT_AS, "size"),
    "NPROC": (resource.RLIMIT_NPROC, "count"), "MEMLOCK": (resource.RLIMIT_MEMLOCK, "size"),
    "LOCKS": (_RLIMIT_LOCKS, "count"),
    "SIGPENDING": (resource.RLIMIT_SIGPENDING, "count"),
    "MSGQUEUE": (resource.RLIMIT_MSGQUEUE, "size"), "NICE": (resource.RLIMIT_NICE, "nice"),
    "RTPRIO": (resource.RLIMIT_RTPRIO, "count"), "RTTIME": (resource.RLIMIT_RTTIME, "usec"),
}
_RLIMIT_RULES = {
    "seconds": 'seconds or a duration like "30s" or "5min"',
    "size": 'a size in bytes like "65536", "8M" or "1G"',
    "count": 'a whole number like "1024"',
    "nice": 'a nice level from "-20" to "+19", or the raw limit 0 to 40',
    "usec": 'microseconds, or a duration like "500ms"',
}

ISOLATION_PROPERTIES: tuple[str, ...] = (
    "User", "Group", "SupplementaryGroups", "NoNewPrivileges", "UMask", "PrivateNetwork",
    "PrivateTmp", "ProtectControlGroups", "CapabilityBoundingSet", "AmbientCapabilities",
    *(f"Limit{name}" for name in _RLIMITS),
)
_FIELD_OF = {
    "User": "user", "Group": "group", "SupplementaryGroups": "supplementary_groups",
    "NoNewPrivileges": "no_new_privileges", "UMask": "umask",
    "PrivateNetwork": "private_network", "PrivateTmp": "private_tmp",
    "ProtectControlGroups": "protect_control_groups",
    "CapabilityBoundingSet": "capability_bounding_set",
    "AmbientCapabilities": "ambient_capabilities",
}
_PROPERTY_OF = {v: k for k, v in _FIELD_OF.items()}


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _refuse(what: str, rule: str, value: object, fix: str = "") -> SpecError:
    return SpecError(what, f"{what} must be {rule}, got {_show(value)}" + (f"; {fix}" if fix
                                                                              else ""))


# --- values: booleans, umask, rlimits, capabilities ----------------------------------------

_TRUE = {"1", "yes", "y", "true", "t", "on"}
_FALSE = {"0", "no", "n", "false", "f", "off"}


def _boolean(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _refuse(what, 'a boolean: "yes" or "no" (also true/false, on/off, 1/0)', value)


def _umask(value: Any, what: str) -> int | None:
    rule = 'an octal mode like "0022" or "0077" (at most 0777)'
    if value is None:
        return None
    if isinstance(value, str) and value.strip() and set(value.strip()) <= set("01234567"):
        value = int(value.strip(), 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise _refuse(what, rule, value)
    return value


def _rlimit_one(text: str, kind: str, what: str, value: object) -> int:
    """One side of a Limit*= value, in the kernel's unit for that limit."""
    rule = f'{_RLIMIT_RULES[kind]}, "infinity", or "SOFT:HARD" of those'
    if text == "infinity":
        return _INFINITY
    try:
        found = _rlimit_with_units(text, kind, what) if kind in ("seconds", "size", "usec") \
            else None
    except UnitsError:
        raise _refuse(what, rule, value) from None
    if found is None:
        found = _rlimit_plain(text, kind)
    if found is None:
        raise _refuse(what, rule, value)
    return found


def _rlimit_with_units(text: str, kind: str, what: str) -> int | None:
    if kind == "seconds":  # whole seconds, rounded up (rlimit_parse_sec)
        return math.ceil(parse_duration(text, what, allow_zero=True))
    if kind == "usec":  # a bare number is microseconds (rlimit_parse_usec)
        return int(text) if text.isdigit() else round(
            parse_duration(text, what, allow_zero=True) * 1_000_000)
    size = parse_size(text, what, allow_max=False)
    assert isinstance(size, int)
    return size


def _rlimit_plain(text: str, kind: str) -> int | None:
    """A count, or a nice level ("-20".."+19" is 40..1 as RLIMIT_NICE; 0..40 raw)."""
    if kind == "nice" and text[:1] in "+-" and text[1:].isdigit():
        level = int(text) if text[0] == "-" else int(text[1:])
        return 20 - level if -20 <= level <= 19 else None
    if text.isdigit() and (kind != "nice" or int(text) <= 40) and int(text) < _INFINITY:
        return int(text)
    return None


def _rlimit(name: str, value: Any, what: str) -> tuple[int, int]:
    """``(soft, hard)`` of one Limit*= value: "N", "SOFT:HARD", "infinity", an int, a pair."""
    kind = _RLIMITS[name][1]
    if isinstance(value, tuple | list) and len(value) == 2:
        parts = [str(v if v is not None else "infinity") for v in value]
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = [str(value)]
    elif isinstance(value, str) and value.strip() and value.count(":") <= 1:
        parts = [p.strip() for p in value.split(":")]
    else:
        raise _refuse(what, f'{_RLIMIT_RULES[kind]}, "infinity", or "SOFT:HARD"', value)
    soft = _rlimit_one(parts[0], kind, what, value)
    hard = _rlimit_one(parts[-1], kind, what, value)
    if soft > hard:
        raise _refuse(what, "SOFT:HARD with the soft limit at most the hard one", value,
                      "swap them, or raise the hard limit")
    return soft, hard


def _rlimit_key(key: Any, what: str) -> str:
    name = key.upper().removeprefix("RLIMIT_") if isinstance(key, str) else ""
    if isinstance(key, str) and key.startswith("Limit"):
        name = key.removeprefix("Limit")
    if name not in _RLIMITS:
        raise _refuse(what, f"keyed by systemd's Limit names without the prefix "
                            f"({', '.join(_RLIMITS)})", key)
    return name


def _capability(word: str | int, what: str, value: object) -> int:
    if isinstance(word, int) and not isinstance(word, bool) and 0 <= word <= cap_last_cap():
        return word
    if isinstance(word, str):
        text = word.strip().upper()
        if text.isdigit() and int(text) <= cap_last_cap():
            return int(text)
        if text in CAPABILITIES:
            return CAPABILITIES.index(text)
        if f"CAP_{text}" in CAPABILITIES:
            raise _refuse(what, "capability names like CAP_SYS_ADMIN", value,
                          f'write "CAP_{text}"')
    raise _refuse(what, "capability names like CAP_SYS_ADMIN or CAP_NET_BIND_SERVICE "
                        "(capabilities(7)), space-separated, optionally after \"~\"", value,
                  f"{_show(word)} is not one")


def _capability_line(value: Any, what: str, current: int | None, everything: int) -> int:
    """One systemd assignment applied to ``current`` (None: never set).

    As systemd.exec(5) says: names keep only those (merged by OR with earlier lines), "~names"
    drop those (merged by AND), "" resets to the empty set and "~" alone to the full one.
    A list (not a string) is the set kept.
    """
    if isinstance(value, str):
        text = value.strip()
        invert = text.startswith("~")
        words: list[str | int] = list(text.removeprefix("~").split())
        if not words:
            return everything if invert else 0
    elif isinstance(value, Iterable):
        invert, words = False, list(value)
    else:
        raise _capability_error(what, value)
    mask = 0
    for word in words:
        mask |= 1 << _capability(word, what, value)
    if invert:
        mask = everything & ~mask
        return mask if current is None else current & mask
    return mask if current is None else current | mask


def _capability_error(what: str, value: object) -> SpecError:
    return _refuse(what, 'capability names like "CAP_SYS_ADMIN CAP_NET_RAW", "~CAP_SYS_ADMIN" '
                         "to drop them, or a list of names", value)


@functools.lru_cache(maxsize=256)
def _names(mask: int) -> tuple[str, ...]:
    return tuple(capability_name(n) for n in range(mask.bit_length()) if (mask >> n) & 1)


def _mask(names: Iterable[str]) -> int:
    return sum(1 << CAPABILITIES.index(n) for n in names if n in CAPABILITIES)


# --- the host: our own credentials, capabilities and what the kernel lets us make -------------


@functools.cache
def _proc_status() -> dict[str, str]:
    """Our /proc/self/status, read once: corral never changes its own capabilities or umask
    (and reading it costs ~50 us)."""
    with open("/proc/self/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def _our_caps(kind: str) -> int:
    """Our capability set ``kind`` (Eff, Prm, Bnd) as a mask."""
    return int(_proc_status()[f"Cap{kind}"], 16)


def _has_cap(name: str) -> bool:
    return bool((_our_caps("Eff") >> CAPABILITIES.index(name)) & 1)


@functools.cache
def _namespace_refusal(kind: str) -> str | None:
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


class _CgroupMounts:
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
            self._mounts = _cgroup_mounts(os.fsdecode(b"".join(chunks)))
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
        poller = select.poll()
        poller.register(self._fd, select.POLLPRI | select.POLLERR)
        return any(ev & (select.POLLPRI | select.POLLERR) for _, ev in poller.poll(0))


_MS_KEEP = {"nosuid": 0x2, "nodev": 0x4, "noexec": 0x8, "noatime": 0x400,
            "nodiratime": 0x800, "relatime": 0x200000, "strictatime": 0x1000000}


def _cgroup_mounts(text: str) -> tuple[tuple[str, int], ...]:
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


_CGROUP_MOUNTS = _CgroupMounts()


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


@dataclass(frozen=True, slots=True)
class _Credentials:
    """What User=, Group= and SupplementaryGroups= come to; None: left as the supervisor's."""

    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    user_name: str | None = None


def _lookup_user(value: str | int, what: str) -> tuple[int, pwd.struct_passwd | None]:
    number = value if isinstance(value, int) else int(value) if value.isdigit() else None
    try:
        if number is not None:
            return number, pwd.getpwuid(number)
        entry = pwd.getpwnam(str(value))
        return entry.pw_uid, entry
    except KeyError:
        if number is not None:
            return number, None
        raise SpecError(what, f"{what} names a user that does not exist: {_show(value)} is "
                              f"not in the user database (getent passwd {value}); create it "
                              f"(useradd {value}) or give an existing user") from None


def _lookup_group(value: str | int, what: str) -> int:
    """A group's gid; a number is taken as it is (the kernel needs no entry for it)."""
    if isinstance(value, int) or value.isdigit():
        return int(value)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise SpecError(what, f"{what} names a group that does not exist: {_show(value)} is "
                              f"not in the group database (getent group {value}); create it "
                              f"(groupadd {value}) or give an existing group") from None


def _id_text(value: Any, what: str, kind: str) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32 - 1:
        return value
    if isinstance(value, str) and value.strip() and "\0" not in value and ":" not in value:
        return value.strip()
    raise _refuse(what, f"a {kind} name or number like \"nobody\" or \"65534\"", value)


def _credentials(user: Any, group: Any, supplementary: tuple[str | int, ...],
                 names: Mapping[str, str]) -> _Credentials:
    """systemd's rules: User= brings its primary group (unless Group= says otherwise) and its
    groups in the group database (initgroups; not for root, whose groups are kept); then
    SupplementaryGroups= are added.  With none of the three, everything stays ours."""
    extra = [_lookup_group(g, names["supplementary_groups"]) for g in supplementary]
    gid = None if group is None else _lookup_group(group, names["group"])
    if user is None:
        return _Credentials(gid=gid, groups=tuple(dict.fromkeys(extra)) if extra else None)
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
        return _Credentials(uid=uid, gid=gid, user_name=name)  # root keeps its groups
    groups = _user_groups(name, gid, extra)
    if len(groups) > os.sysconf("SC_NGROUPS_MAX"):
        raise SpecError(names["supplementary_groups"], f"{names['user']} {user} would be in "
                        f"{len(groups)} groups, more than the kernel's NGROUPS_MAX")
    return _Credentials(uid, gid, groups, name)


def _user_groups(name: str | None, gid: int, extra: list[int]) -> tuple[int, ...]:
    """initgroups(name, gid) (never for gid 0), then the extra ones, each once."""
    base = os.getgrouplist(name, gid) if name is not None and gid != 0 else (
        [gid] if gid != 0 else [])
    return tuple(dict.fromkeys([*base, *extra]))


# --- Isolation -----------------------------------------------------------------------------

RlimitValue = int | str | tuple[int | str | None, int | str | None]


@dataclass(frozen=True, slots=True)
class _Resolved:
    """An Isolation's values as the spawn needs them: ids, masks, (resource, soft, hard)."""

    creds: _Credentials = _Credentials()
    umask: int | None = None
    rlimits: tuple[tuple[str, int, int], ...] = ()
    bounding: int | None = None  # bit N: capability N kept; None: the set is left alone
    ambient: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)  # the spawn's, less the mounts


@dataclass(frozen=True, slots=True)
class Isolation:
    """How one task is isolated, in systemd.exec(5)'s terms; empty: as the supervisor runs.

    ``Isolation(user="agent", private_network=True, rlimits={"NOFILE": 1024})`` runs the task
    as ``agent`` (its primary group and groups), in a network namespace of its own with only
    ``lo``, with at most 1024 open files.  Each field takes what its property takes (strings
    in systemd's syntax) or the Python value: ``umask=0o027``, ``rlimits={"CPU": (10, 20)}``,
    ``capability_bounding_set=["CAP_NET_BIND_SERVICE"]`` (the set kept) or
    ``"~CAP_SYS_ADMIN CAP_SYS_PTRACE"`` (those dropped).  Values are normalized when made:
    ``umask`` to an int, ``rlimits`` to ``{"NOFILE": (soft, hard)}`` (2**64-1 is infinity),
    the capability sets to tuples of names.  Raises :class:`SpecError` (a ``ValueError``)
    naming the field, the value, the rule and the fix, for bad syntax and for what this
    supervisor cannot do on this host.
    """

    user: str | int | None = None
    group: str | int | None = None
    supplementary_groups: str | Iterable[str | int] = ()
    no_new_privileges: bool = False
    umask: int | str | None = None
    rlimits: Mapping[str, RlimitValue] = field(default_factory=dict)
    private_network: bool = False
    private_tmp: bool | Literal["disconnected"] = False
    protect_control_groups: bool = False
    capability_bounding_set: str | Iterable[str | int] | None = None
    ambient_capabilities: str | Iterable[str | int] = ()
    _r: _Resolved = field(default=_Resolved(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._all_defaults():
            return  # every TaskSpec makes one: nothing to check, nothing to look up
        self._normalize({f: f for f in (*_PROPERTY_OF, "rlimits")})

    def _all_defaults(self) -> bool:
        return (self.user is None and self.group is None and self.supplementary_groups == ()
                and self.no_new_privileges is False and self.umask is None and not self.rlimits
                and self.private_network is False and self.private_tmp is False
                and self.protect_control_groups is False
                and self.capability_bounding_set is None and self.ambient_capabilities == ())

    @classmethod
    def from_properties(cls, items: Iterable[tuple[str, str]]) -> Isolation:
        """From ``(NAME, VALUE)`` pairs of systemd properties, in order (``-p User=agent``).

        As in a unit file, a later assignment replaces an earlier one and an empty one
        resets the setting, except for SupplementaryGroups= (added up; "" empties it) and the
        capability sets (merged as systemd.exec(5) says).  Errors name the property.
        """
        fields = _gather_properties(items)
        iso = object.__new__(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default_factory is dataclasses.MISSING else \
                f.default_factory()
            object.__setattr__(iso, f.name, fields.get(f.name, default))
        iso._normalize({**_PROPERTY_OF, "rlimits": "Limit"})
        return iso

    def _normalize(self, names: Mapping[str, str]) -> None:
        """Check and normalize every field in place; ``names`` says how errors call them."""
        set_ = functools.partial(object.__setattr__, self)
        if self.user is not None:
            set_("user", _id_text(self.user, names["user"], "user"))
        if self.group is not None:
            set_("group", _id_text(self.group, names["group"], "group"))
        supp: Any = self.supplementary_groups
        supp = supp.split() if isinstance(supp, str) else supp
        if not isinstance(supp, Iterable):
            raise _refuse(names["supplementary_groups"], "group names or numbers", supp)
        supp = tuple(_id_text(g, names["supplementary_groups"], "group") for g in supp)
        set_("supplementary_groups", supp)
        if self.private_tmp == "disconnected":  # systemd 256's name for exactly this tmpfs
            set_("private_tmp", True)
        for f in ("no_new_privileges", "private_network", "private_tmp",
                  "protect_control_groups"):
            set_(f, _boolean(getattr(self, f), names[f]))
        umask = _umask(self.umask, names["umask"])
        set_("umask", umask)
        rlimits = self._normalized_rlimits(names["rlimits"])
        set_("rlimits", rlimits)
        bounding, ambient = self._normalized_caps(names)
        creds = _credentials(self.user, self.group, supp, names)
        set_("_r", _Resolved(creds, umask, tuple((n, s, h) for n, (s, h) in rlimits.items()),
                             bounding, ambient))
        _check_host(self, names)
        set_("_r", dataclasses.replace(self._r, options=self._static_options()))

    def _normalized_rlimits(self, prefix: str) -> dict[str, tuple[int, int]]:
        given: Any = self.rlimits
        if not isinstance(given, Mapping):
            raise _refuse("rlimits", 'a mapping like {"NOFILE": "1024:4096"}', given)
        out = {}
        for key, value in given.items():
            name = _rlimit_key(key, "rlimits")
            out[name] = _rlimit(name, value, f"Limit{name}" if prefix == "Limit"
                                else f"rlimits[{name!r}]")
        return dict(sorted(out.items()))

    def _normalized_caps(self, names: Mapping[str, str]) -> tuple[int | None, int]:
        everything = (1 << (cap_last_cap() + 1)) - 1
        bounding = None if self.capability_bounding_set is None else _capability_line(
            self.capability_bounding_set, names["capability_bounding_set"], None, everything)
        ambient = _capability_line(self.ambient_capabilities, names["ambient_capabilities"],
                                   None, everything)
        object.__setattr__(self, "capability_bounding_set",
                           None if bounding is None else _names(bounding))
        object.__setattr__(self, "ambient_capabilities", _names(ambient))
        if bounding is not None and ambient & ~bounding:
            outside = " ".join(_names(ambient & ~bounding))
            raise SpecError(names["ambient_capabilities"], f"{names['ambient_capabilities']} "
                            f"{outside} must also be in {names['capability_bounding_set']} "
                            f"(a capability outside the bounding set cannot be held); add "
                            f"it there or drop it here")
        return bounding, ambient

    def is_empty(self) -> bool:
        """True when the task runs exactly as the supervisor does."""
        return self._all_defaults()

    @contextlib.contextmanager
    def prepare(self) -> Iterator[dict[str, Any]]:
        """Keyword arguments for ``supervisor._spawn.spawn``, valid inside the block.

        Nothing is made here (the child makes its namespaces itself); what is looked up is the
        host as it is now: the cgroup mounts to make read-only, /tmp and /var/tmp.
        """
        yield self._spawn_options()

    def _spawn_options(self) -> dict[str, Any]:
        options = dict(self._r.options)
        if options.get("mount_namespace"):
            options["tmpfs"] = _CGROUP_MOUNTS.tmp_dirs() if self.private_tmp else ()
            options["read_only"] = self._read_only(options["tmpfs"])
        return options

    def _static_options(self) -> dict[str, Any]:
        """The spawn's keywords that depend on nothing but this value (made once)."""
        r, c = self._r, self._r.creds
        options: dict[str, Any] = {}
        for key, value in (("uid", c.uid), ("gid", c.gid), ("groups", c.groups),
                           ("umask", r.umask)):
            if value is not None:
                options[key] = value
        if r.rlimits:
            options["rlimits"] = [(_RLIMITS[n][0], s, h) for n, s, h in r.rlimits]
        if self.private_network:
            options["new_netns"] = True
        if self.private_tmp or self.protect_control_groups:
            options["mount_namespace"] = True
        if r.bounding is not None:
            options["drop_bounding_caps"] = ((1 << (cap_last_cap() + 1)) - 1) & ~r.bounding
        if r.ambient:
            options["ambient_caps"] = r.ambient
        if self.no_new_privileges:
            options["no_new_privs"] = True
        return options

    def _read_only(self, tmp: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        return _CGROUP_MOUNTS.visible(tmp) if self.protect_control_groups else ()

    def describe(self) -> dict[str, Any]:
        """What the task really had, for the result's ``containment`` (JSON-ready).

        ``user``/``uid``/``gid``/``groups`` (the supervisor's where left alone), ``umask``
        (octal text), ``no_new_privileges``, ``rlimits`` set (``{"NOFILE": [soft, hard]}``,
        ``"infinity"``), ``namespaces`` of its own (``"net"``, ``"mnt"``), ``private_tmp``,
        ``cgroupfs_read_only`` and ``read_only_paths``, ``capability_bounding_set`` (what
        remains), ``ambient_capabilities``, ``capabilities`` (what its first program holds
        after exec), and ``could_escape`` with ``escape_routes``: it could leave its leaf (or
        freeze or move others) when it may write corral's cgroup files (uid 0, corral's own
        uid, or CAP_DAC_OVERRIDE) and reach a writable cgroupfs (not made read-only, or
        CAP_SYS_ADMIN to remount or mount one).  ``escape_caveats`` says what depends on
        other processes (a root task and its root siblings: see the module docstring).
        """
        return _describe(self)


def _gather_properties(items: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Isolation's fields from property assignments in order (see from_properties)."""
    fields: dict[str, Any] = {"rlimits": {}}
    caps: dict[str, int | None] = {"CapabilityBoundingSet": None, "AmbientCapabilities": None}
    everything = (1 << (cap_last_cap() + 1)) - 1
    for name, value in items:
        limit = name.removeprefix("Limit")
        if name.startswith("Limit") and limit in _RLIMITS:
            fields["rlimits"][limit] = value
            if not value.strip():
                del fields["rlimits"][limit]
        elif name in caps:
            caps[name] = _capability_line(value, name, caps[name], everything)
        elif name == "SupplementaryGroups":
            words = value.split()
            fields[_FIELD_OF[name]] = [*fields.get(_FIELD_OF[name], ()), *words] if words else []
        elif name in _FIELD_OF:
            fields[_FIELD_OF[name]] = value
            if not value.strip():  # an empty assignment resets, as in a unit file
                del fields[_FIELD_OF[name]]
        else:
            raise SpecError(name, f"{name} is not an isolation property; they are: "
                                  f"{', '.join(ISOLATION_PROPERTIES)}")
    for name, mask in caps.items():
        if mask is not None:
            fields[_FIELD_OF[name]] = list(_names(mask))
    return fields


def _check_host(iso: Isolation, names: Mapping[str, str]) -> None:
    """What this supervisor, on this host, cannot do of ``iso``: refused before anything."""
    c = iso._r.creds
    if c.uid is not None and c.uid != os.geteuid() and not _has_cap("CAP_SETUID"):
        raise SpecError(names["user"], f"{names['user']}={iso.user} needs CAP_SETUID, and "
                        f"corral runs as uid {os.geteuid()} without it; run corral as root, "
                        f"or leave {names['user']} unset")
    regroup = (c.gid is not None and c.gid != os.getegid()) or (
        c.groups is not None and set(c.groups) != set(os.getgroups()))
    if regroup and not _has_cap("CAP_SETGID"):
        field_ = names["group"] if iso.group is not None else names["supplementary_groups"]
        raise SpecError(field_, f"changing the task's groups needs CAP_SETGID, and corral "
                                f"(uid {os.geteuid()}) lacks it; run corral as root, or leave "
                                f"{names['user']}, {names['group']} and "
                                f"{names['supplementary_groups']} unset")
    _check_rlimits(iso, names["rlimits"])
    _check_caps(iso, names)
    for flag, kind, need in (("private_network", "net", "a network namespace"),
                             ("private_tmp", "mnt", "a mount namespace"),
                             ("protect_control_groups", "mnt", "a mount namespace")):
        refusal = getattr(iso, flag) and _namespace_refusal(kind)
        if refusal:
            raise SpecError(names[flag], f"{names[flag]}=yes needs {need}, which this host "
                            f"refuses corral ({refusal}); run corral as root with "
                            f"CAP_SYS_ADMIN (a container needs it granted and unshare "
                            f"allowed by its seccomp profile), or leave {names[flag]} off")


def _check_rlimits(iso: Isolation, prefix: str) -> None:
    """Hard limits above ours need CAP_SYS_RESOURCE; open files stop at fs.nr_open (the
    kernel refuses more even to root, so "infinity" means nr_open there)."""
    checked = []
    for name, soft, hard in iso._r.rlimits:
        what = f"Limit{name}" if prefix == "Limit" else f"rlimits[{name!r}]"
        if name == "NOFILE":
            with open("/proc/sys/fs/nr_open") as f:
                nr_open = int(f.read())
            soft, hard = min(soft, nr_open), min(hard, nr_open)
        ours = resource.getrlimit(_RLIMITS[name][0])[1]
        if ours != resource.RLIM_INFINITY and hard > ours and not _has_cap("CAP_SYS_RESOURCE"):
            shown = "infinity" if hard == _INFINITY else hard
            raise SpecError(what, f"{what} hard limit {shown} is above corral's own ({ours}), "
                                  f"and raising a hard limit needs CAP_SYS_RESOURCE, which "
                                  f"corral lacks here; give at most {ours}")
        checked.append((name, soft, hard))
    object.__setattr__(iso, "rlimits", {n: (s, h) for n, s, h in checked})
    object.__setattr__(iso, "_r", dataclasses.replace(iso._r, rlimits=tuple(checked)))


def _check_caps(iso: Isolation, names: Mapping[str, str]) -> None:
    if iso._r.bounding is None and not iso._r.ambient:
        return
    if iso._r.bounding is not None and not _has_cap("CAP_SETPCAP"):
        raise SpecError(names["capability_bounding_set"], f"{names['capability_bounding_set']}"
                        f" needs CAP_SETPCAP to drop capabilities, which corral lacks; run "
                        f"corral as root, or leave it unset")
    missing = _names(iso._r.ambient & ~(_our_caps("Prm") & _our_caps("Bnd")))
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise SpecError(names["ambient_capabilities"], f"{names['ambient_capabilities']} "
                        f"{' '.join(missing)}: corral does not hold {them} (its permitted and "
                        f"bounding sets), so the task cannot get {them}; run corral as root "
                        f"with {them}, or drop {them} here")


@functools.lru_cache(maxsize=64)
def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _describe(iso: Isolation) -> dict[str, Any]:
    r, c = iso._r, iso._r.creds
    uid = os.geteuid() if c.uid is None else c.uid
    bounding = _our_caps("Bnd") & (r.bounding if r.bounding is not None else ~0)
    held = bounding if uid == 0 else r.ambient & bounding  # what execve(2) gives the program
    tmp = _CGROUP_MOUNTS.tmp_dirs() if iso.private_tmp else ()
    read_only = [p for p, _ in iso._read_only(tmp)]
    routes = _escape_routes(uid, held, cgroupfs_writable=not read_only)
    return {
        **_describe_credentials(iso, uid), "no_new_privileges": iso.no_new_privileges,
        "rlimits": {n: ["infinity" if v == _INFINITY else v for v in (s, h)]
                    for n, s, h in r.rlimits},
        "namespaces": ["net"] * iso.private_network + ["mnt"] * bool(
            iso.private_tmp or iso.protect_control_groups),
        "private_network": iso.private_network, "private_tmp": iso.private_tmp,
        "cgroupfs_read_only": bool(read_only), "read_only_paths": read_only,
        "capability_bounding_set": list(_names(bounding)),
        "ambient_capabilities": list(_names(r.ambient & bounding)),
        "capabilities": list(_names(held)),
        "could_escape": bool(routes), "escape_routes": routes,
        "escape_caveats": [_ROOT_CAVEAT] if uid == 0 and not routes else [],
    }


def _describe_credentials(iso: Isolation, uid: int) -> dict[str, Any]:
    r, c = iso._r, iso._r.creds
    umask = int(_proc_status()["Umask"], 8) if r.umask is None else r.umask
    return {"user": c.user_name if c.user_name is not None else _user_name(uid), "uid": uid,
            "gid": os.getegid() if c.gid is None else c.gid,
            "groups": list(os.getgroups() if c.groups is None else c.groups),
            "umask": f"{umask:04o}"}


_ROOT_CAVEAT = ("as root it reaches the mounts of any root process holding no capability it "
                "lacks (/proc/PID/root: a sibling task with a writable cgroupfs is a way out) "
                "and may signal every root process")


def _escape_routes(uid: int, held: int, *, cgroupfs_writable: bool) -> list[str]:
    """Why a task could leave its leaf: it needs both a writer and a writable cgroupfs."""
    def has(name: str) -> bool:
        return bool((held >> CAPABILITIES.index(name)) & 1)

    writer = ("runs as uid 0" if uid == 0 else
              f"runs as uid {uid}, corral's own, which owns its cgroups" if uid == os.geteuid()
              else "holds CAP_DAC_OVERRIDE" if has("CAP_DAC_OVERRIDE") else None)
    reach = ("cgroupfs is writable in its mount namespace" if cgroupfs_writable else
             "holds CAP_SYS_ADMIN (can remount cgroupfs read-write or mount it anew)"
             if has("CAP_SYS_ADMIN") else None)
    return [writer, reach] if writer and reach else []
