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
    protect_control_groups                 every cgroup mount read-only for the task, and
                                           clone3 refused (seccomp: ENOSYS), which could
                                           start a child in another cgroup all the same
    capability_bounding_set                "~CAP_SYS_ADMIN CAP_SYS_PTRACE" or names kept
    ambient_capabilities                   names kept across the change to ``user``

Everything is checked when the value is made, before anything exists: the syntax, that users
and groups exist, that the supervisor may do what is asked (CAP_SETUID for another user,
CAP_SYS_RESOURCE to raise a hard limit, namespaces the kernel lets it make: probed once per
process, in a throwaway thread).  The syntax is read by ``_isovalues.py``, the host is looked
at by ``_isohost.py``; this module puts them together into the one value, the spawn's keywords
and ``describe()``.  The child does the work between clone and exec, in systemd's order
(native/corral_native.c); every failure there names its step.

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
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import field
from typing import Any, Literal

from cgroupfs._record import record

from ._errors import SpecError
from ._isohost import (
    CGROUP_MOUNTS,
    Credentials,
    check_capabilities,
    check_credentials,
    check_namespaces,
    check_rlimits,
    our_caps,
    proc_status,
    resolve_credentials,
    user_name,
)
from ._isovalues import (
    INFINITY,
    RLIMITS,
    capability_names,
    every_capability,
    merge_capability_line,
    parse_boolean,
    parse_id,
    parse_rlimit,
    parse_rlimit_key,
    parse_umask,
    refuse,
    rlimit_label,
)
from ._spawn import CAPABILITIES

__all__ = ["ISOLATION_PROPERTIES", "Isolation"]

ISOLATION_PROPERTIES: tuple[str, ...] = (
    "User", "Group", "SupplementaryGroups", "NoNewPrivileges", "UMask", "PrivateNetwork",
    "PrivateTmp", "ProtectControlGroups", "CapabilityBoundingSet", "AmbientCapabilities",
    *(f"Limit{name}" for name in RLIMITS),
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

RlimitValue = int | str | tuple[int | str | None, int | str | None]


@record
class _Resolved:
    """An Isolation's values as the spawn needs them: ids, masks, (resource, soft, hard)."""

    creds: Credentials = field(default_factory=Credentials)
    umask: int | None = None
    rlimits: tuple[tuple[str, int, int], ...] = ()
    bounding: int | None = None  # bit N: capability N kept; None: the set is left alone
    ambient: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)  # the spawn's, less the mounts


@record
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
        """Whether every field still has its default (read before any normalizing)."""
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
            set_("user", parse_id(self.user, names["user"], "user"))
        if self.group is not None:
            set_("group", parse_id(self.group, names["group"], "group"))
        supp: Any = self.supplementary_groups
        supp = supp.split() if isinstance(supp, str) else supp
        if not isinstance(supp, Iterable):
            raise refuse(names["supplementary_groups"], "group names or numbers", supp)
        supp = tuple(parse_id(g, names["supplementary_groups"], "group") for g in supp)
        set_("supplementary_groups", supp)
        if self.private_tmp == "disconnected":  # systemd 256's name for exactly this tmpfs
            set_("private_tmp", True)
        for f in ("no_new_privileges", "private_network", "private_tmp",
                  "protect_control_groups"):
            set_(f, parse_boolean(getattr(self, f), names[f]))
        umask = parse_umask(self.umask, names["umask"])
        set_("umask", umask)
        rlimits = self._normalized_rlimits(names["rlimits"])
        set_("rlimits", rlimits)
        bounding, ambient = self._normalized_caps(names)
        creds = resolve_credentials(self.user, self.group, supp, names)
        set_("_r", _Resolved(creds, umask, tuple((n, s, h) for n, (s, h) in rlimits.items()),
                             bounding, ambient))
        self._check_host(names)
        set_("_r", dataclasses.replace(self._r, options=self._static_options()))

    def _normalized_rlimits(self, prefix: str) -> dict[str, tuple[int, int]]:
        """``rlimits`` as ``{name: (soft, hard)}`` sorted by name; SpecError for bad syntax."""
        given: Any = self.rlimits
        if not isinstance(given, Mapping):
            raise refuse("rlimits", 'a mapping like {"NOFILE": "1024:4096"}', given)
        out = {}
        for key, value in given.items():
            name = parse_rlimit_key(key, "rlimits")
            out[name] = parse_rlimit(name, value, rlimit_label(name, prefix))
        return dict(sorted(out.items()))

    def _normalized_caps(self, names: Mapping[str, str]) -> tuple[int | None, int]:
        """The bounding (None: untouched) and ambient masks, the fields set to their names;
        SpecError for bad syntax or an ambient capability outside the bounding set."""
        everything = every_capability()
        bounding = None if self.capability_bounding_set is None else merge_capability_line(
            self.capability_bounding_set, names["capability_bounding_set"], None, everything)
        ambient = merge_capability_line(self.ambient_capabilities,
                                        names["ambient_capabilities"], None, everything)
        object.__setattr__(self, "capability_bounding_set",
                           None if bounding is None else capability_names(bounding))
        object.__setattr__(self, "ambient_capabilities", capability_names(ambient))
        if bounding is not None and ambient & ~bounding:
            outside = " ".join(capability_names(ambient & ~bounding))
            raise SpecError(names["ambient_capabilities"], f"{names['ambient_capabilities']} "
                            f"{outside} must also be in {names['capability_bounding_set']} "
                            f"(a capability outside the bounding set cannot be held); add "
                            f"it there or drop it here")
        return bounding, ambient

    def _check_host(self, names: Mapping[str, str]) -> None:
        """SpecError for what this supervisor, on this host, cannot do of this value (refused
        before anything exists); Limit*= values clamped as the kernel clamps them."""
        r = self._r
        check_credentials(r.creds, self.user, self.group, names)
        rlimits = check_rlimits(r.rlimits, names["rlimits"])
        object.__setattr__(self, "rlimits", {n: (s, h) for n, s, h in rlimits})
        object.__setattr__(self, "_r", dataclasses.replace(r, rlimits=rlimits))
        check_capabilities(r.bounding, r.ambient, names)
        check_namespaces({"private_network": self.private_network,
                          "private_tmp": bool(self.private_tmp),
                          "protect_control_groups": self.protect_control_groups}, names)

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
        """The spawn's keywords: the static ones, plus the mounts as the host has them now."""
        options = dict(self._r.options)
        if options.get("mount_namespace"):
            options["tmpfs"] = CGROUP_MOUNTS.tmp_dirs() if self.private_tmp else ()
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
            options["rlimits"] = [(RLIMITS[n][0], s, h) for n, s, h in r.rlimits]
        if self.private_network:
            options["new_netns"] = True
        if self.private_tmp or self.protect_control_groups:
            options["mount_namespace"] = True
        if self.protect_control_groups:
            # a read-only cgroupfs does not stop clone3(CLONE_INTO_CGROUP) (see _spawn)
            options["no_clone3"] = True
        if r.bounding is not None:
            options["drop_bounding_caps"] = every_capability() & ~r.bounding
        if r.ambient:
            options["ambient_caps"] = r.ambient
        if self.no_new_privileges:
            options["no_new_privs"] = True
        return options

    def _read_only(self, tmp: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        """The cgroup mounts to remount read-only (those not hidden under ``tmp``), or ()."""
        return CGROUP_MOUNTS.visible(tmp) if self.protect_control_groups else ()

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
        The same dict may be shared by many records (an Isolation with every default, keyed by
        our credentials): read it, do not change it.
        """
        if self._all_defaults():  # most tasks: one answer per identity of ours
            return _describe_default(os.geteuid(), os.getegid(), tuple(os.getgroups()))
        return _describe(self)


@functools.lru_cache(maxsize=8)
def _describe_default(euid: int, egid: int, groups: tuple[int, ...]) -> dict[str, Any]:
    return _describe(Isolation())


def _gather_properties(items: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Isolation's fields from property assignments in order (see from_properties)."""
    fields: dict[str, Any] = {"rlimits": {}}
    caps: dict[str, int | None] = {"CapabilityBoundingSet": None, "AmbientCapabilities": None}
    everything = every_capability()
    for name, value in items:
        limit = name.removeprefix("Limit")
        if name.startswith("Limit") and limit in RLIMITS:
            fields["rlimits"][limit] = value
            if not value.strip():
                del fields["rlimits"][limit]
        elif name in caps:
            caps[name] = merge_capability_line(value, name, caps[name], everything)
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
            fields[_FIELD_OF[name]] = list(capability_names(mask))
    return fields


def _describe(iso: Isolation) -> dict[str, Any]:
    """Isolation.describe(): what the task had, the supervisor's own where left alone."""
    r, c = iso._r, iso._r.creds
    uid = os.geteuid() if c.uid is None else c.uid
    bounding = our_caps("Bnd") & (r.bounding if r.bounding is not None else ~0)
    held = bounding if uid == 0 else r.ambient & bounding  # what execve(2) gives the program
    tmp = CGROUP_MOUNTS.tmp_dirs() if iso.private_tmp else ()
    read_only = [p for p, _ in iso._read_only(tmp)]
    routes = _escape_routes(uid, held, cgroupfs_writable=not read_only)
    return {
        **_describe_credentials(iso, uid), "no_new_privileges": iso.no_new_privileges,
        "rlimits": {n: ["infinity" if v == INFINITY else v for v in (s, h)]
                    for n, s, h in r.rlimits},
        "namespaces": ["net"] * iso.private_network + ["mnt"] * bool(
            iso.private_tmp or iso.protect_control_groups),
        "private_network": iso.private_network, "private_tmp": iso.private_tmp,
        "cgroupfs_read_only": bool(read_only), "read_only_paths": read_only,
        "syscalls_refused": ["clone3"] if iso.protect_control_groups else [],
        "capability_bounding_set": list(capability_names(bounding)),
        "ambient_capabilities": list(capability_names(r.ambient & bounding)),
        "capabilities": list(capability_names(held)),
        "could_escape": bool(routes), "escape_routes": routes,
        "escape_caveats": [_ROOT_CAVEAT] if uid == 0 and not routes else [],
    }


def _describe_credentials(iso: Isolation, uid: int) -> dict[str, Any]:
    """describe()'s user, uid, gid, groups and umask (octal text) for a task run as ``uid``."""
    r, c = iso._r, iso._r.creds
    umask = int(proc_status()["Umask"], 8) if r.umask is None else r.umask
    return {"user": c.user_name if c.user_name is not None else user_name(uid), "uid": uid,
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
