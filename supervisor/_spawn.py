"""Python face of the native helper: spawn a child straight into a cgroup leaf.

The C side (native/corral_native.c) does everything between clone and execve; this module turns
Python values into the C argument block, resolves the executable along PATH the way execvp
does, and turns a failure into a :class:`SpawnError` that says which step failed and why, so that
"not found", "permission denied" and "bad working directory" are told apart.

Isolation (systemd.exec(5)'s User=, PrivateNetwork=, PrivateTmp=...) is applied by the child
too, between clone and exec; ``supervisor._isolation`` turns a task's settings into the keyword
arguments of :func:`spawn` that say what to do, and each step that can fail has its own name.

It also carries the few syscalls Python 3.11 lacks (inotify, unshare, setns).  pidfds need
nothing extra: ``os.pidfd_open``, ``signal.pidfd_send_signal`` and ``os.waitid(os.P_PIDFD,
...)`` are there.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from cgroupfs._record import record

from ._native import ffi as _ffi
from ._native import lib as _lib

ffi: Any = _ffi
lib: Any = _lib

__all__ = [
    "SpawnError",
    "SpawnMethod",
    "Spawned",
    "inotify_add_watch",
    "inotify_init",
    "inotify_rm_watch",
    "resolve_executable",
    "setns",
    "shares_our_memory",
    "signalfd",
    "spawn",
    "unshare",
]

_STEPS = {
    lib.CORRAL_STEP_PREPARE: "prepare",
    lib.CORRAL_STEP_CLONE: "clone",
    lib.CORRAL_STEP_PIDFD: "pidfd",
    lib.CORRAL_STEP_CGROUP: "cgroup",
    lib.CORRAL_STEP_SETSID: "setsid",
    lib.CORRAL_STEP_NETNS: "netns",
    lib.CORRAL_STEP_RLIMIT: "rlimit",
    lib.CORRAL_STEP_FDS: "fds",
    lib.CORRAL_STEP_SIGNALS: "signals",
    lib.CORRAL_STEP_SETGROUPS: "setgroups",
    lib.CORRAL_STEP_SETGID: "setgid",
    lib.CORRAL_STEP_SETUID: "setuid",
    lib.CORRAL_STEP_CHDIR: "chdir",
    lib.CORRAL_STEP_EXEC: "exec",
    lib.CORRAL_STEP_CTTY: "ctty",
    lib.CORRAL_STEP_LOOPBACK: "loopback",
    lib.CORRAL_STEP_MOUNTNS: "mountns",
    lib.CORRAL_STEP_TMPFS: "tmpfs",
    lib.CORRAL_STEP_READONLY: "readonly",
    lib.CORRAL_STEP_CAPBSET: "capbset",
    lib.CORRAL_STEP_CAPS: "caps",
    lib.CORRAL_STEP_AMBIENT: "ambient",
    lib.CORRAL_STEP_NO_NEW_PRIVS: "no_new_privs",
    lib.CORRAL_STEP_SETPGID: "setpgid",
    lib.CORRAL_STEP_SECCOMP: "seccomp",
}

# What each step did, for SpawnError's message ("cannot <what> <target>: [Errno ...]").
_WHAT = {
    "exec": "cannot run",
    "chdir": "cannot change to working directory",
    "cgroup": "cannot join the task's cgroup",
    "clone": "cannot create the process",
    "netns": "cannot enter a new network namespace",
    "loopback": "cannot bring up the loopback device in the new network namespace",
    "mountns": "cannot make a private mount namespace",
    "tmpfs": "cannot mount a private tmpfs on",
    "readonly": "cannot remount read-only",
    "rlimit": "cannot set resource limit",
    "setgroups": "cannot set the supplementary groups",
    "setgid": "cannot change the group id",
    "setuid": "cannot change the user id",
    "capbset": "cannot drop from the capability bounding set",
    "caps": "cannot prepare the ambient capabilities (inheritable set, keep-caps)",
    "ambient": "cannot raise the ambient capability",
    "no_new_privs": "cannot set no_new_privs",
    "setpgid": "cannot make a process group of its own",
    "seccomp": "cannot install the seccomp filter that refuses clone3",
    "frozen": "the new process was frozen before it could run (an ancestor of the cgroup "
              "given to corral is frozen); corral killed it in",
    "stopped": "the new process was stopped by a signal before it could run (SIGSTOP: any "
               "process of the user it runs as may send it); corral killed it in",
    "timeout": "the new process had not started after 10s (a long PATH search, a hung "
               "filesystem?); corral killed it in",
}


class SpawnMethod:
    """How the child was created: the names used in results and ``corral check``."""

    CLONE3_VFORK = "clone3"  # born in its leaf, address space shared until exec
    CLONE3_FORK = "clone3-fork"  # born in its leaf, copy-on-write (non-x86_64)
    VFORK_JOIN = "vfork+cgroup.procs"  # fallback: joined its leaf before exec


_METHODS = {
    lib.CORRAL_METHOD_CLONE3_VFORK: SpawnMethod.CLONE3_VFORK,
    lib.CORRAL_METHOD_CLONE3_FORK: SpawnMethod.CLONE3_FORK,
    lib.CORRAL_METHOD_VFORK_JOIN: SpawnMethod.VFORK_JOIN,
}


class SpawnError(OSError):
    """The child could not be started.

    ``errno`` and ``strerror`` are the OS's; ``step`` names what failed: ``"exec"`` (the
    command: ENOENT not found, EACCES not executable), ``"chdir"`` (the working directory),
    ``"cgroup"`` (joining the leaf), ``"clone"`` (creating the process), the isolation steps
    (``"netns"``, ``"loopback"``, ``"mountns"``, ``"tmpfs"``, ``"readonly"``, ``"rlimit"``,
    ``"setgroups"``, ``"setgid"``, ``"setuid"``, ``"capbset"``, ``"caps"``, ``"ambient"``,
    ``"no_new_privs"``), and so on.  ``filename`` is what the step was about: the command,
    the directory, the mount point, the resource limit (``"RLIMIT_NOFILE"``) or the capability
    (``"CAP_NET_ADMIN"``).
    """

    def __init__(self, err: int, step: str, filename: str | None) -> None:
        super().__init__(err, os.strerror(err), filename)
        self.step = step

    def __str__(self) -> str:
        what = _WHAT.get(self.step, f"spawn step {self.step!r} failed")
        target = f" {self.filename!r}" if self.filename else ""
        return f"{what}{target}: [Errno {self.errno}] {self.strerror}"


@record
class Spawned:
    """A started child: its pid, a pidfd that holds it, and how it was placed."""

    pid: int
    pidfd: int
    method: str
    fallback_errno: int  # why clone3 was not used (0: it was)


def resolve_executable(file: str, env_path: str | None) -> list[str]:
    """Candidate paths for ``file``, in execvp's order.

    With a slash it is the only candidate.  Otherwise every PATH entry (an empty entry meaning
    the current directory, as POSIX says), with ``os.defpath`` when PATH is unset.
    """
    if not file:
        raise SpawnError(errno.ENOENT, "exec", file)
    if "/" in file:
        return [file]
    path = os.defpath if env_path is None else env_path
    entries = path.split(os.pathsep)
    if len(entries) > MAX_PATH_ENTRIES:
        # each candidate is an execve(2) in the child before its exec, and a symbolic link
        # chain makes one cost milliseconds: a PATH of a hundred thousand would hold the
        # spawn (and its thread) for minutes
        raise SpawnError(errno.E2BIG, "exec", f"{file} (PATH has {len(entries)} entries, more "
                                              f"than {MAX_PATH_ENTRIES}; shorten it, or give "
                                              f"the command's full path)")
    return [os.path.join(d or ".", file) for d in entries]


MAX_PATH_ENTRIES = 256


def _cstrings(items: Sequence[bytes], keep: list[Any]) -> Any:
    """A NULL-terminated C array of ``items`` (none holds a NUL), alive while ``keep`` is.
    The strings go into one buffer that C points the array into: a C string per item cost
    30 ms of the GIL for a command of 65,000 arguments, this well under 2."""
    blob = ffi.new("char[]", b"\0".join(items))  # (ffi.new adds the last NUL)
    arr = ffi.new("char *[]", len(items) + 1)
    if lib.corral_split_strings(blob, len(blob), arr, len(items)) != (len(blob) if items
                                                                      else 0):
        raise ValueError(f"spawn: a string holds a NUL byte: {items!r:.200}")
    keep += (blob, arr)
    return arr


@functools.lru_cache(maxsize=64)
def _cached_cstrings(items: tuple[str, ...]) -> tuple[Any, list[Any]]:
    """A NULL-terminated C array of ``items`` and what keeps its strings alive.  Most spawns
    repeat the same environment, PATH candidates and mount points: encoding them anew cost
    ~40 us per spawn.  (Only small ones are cached: see :func:`_strings_for_child`.)"""
    keep: list[Any] = []
    return _cstrings([os.fsencode(s) for s in items], keep), keep


_CACHED_BYTES = 16 << 10  # a C array cached for reuse holds at most this much text


def _environment_for_child(env: Mapping[str, str] | None, keep: list[Any]) -> Any:
    """The child's ``envp``: ``env``, or (None) ours as it is now.  Ours is read as bytes
    (``os.environb``: no decoding and encoding of every variable at every spawn) and its
    C array reused while it has not changed."""
    if env is None:
        # CPython keeps the bytes in a plain dict behind os.environ (os.environb's own items()
        # goes through Python-level lookups: ~30 us for a usual environment, this ~1 us)
        data = getattr(os.environ, "_data", None)
        items = tuple(data.items() if isinstance(data, dict) else os.environb.items())
        held = _cached_env(items)
        keep.append(held)
        return held[0]
    return _strings_for_child(tuple(f"{k}={v}" for k, v in env.items()), keep)


@functools.lru_cache(maxsize=4)
def _cached_env(items: tuple[tuple[bytes, bytes], ...]) -> tuple[Any, list[Any]]:
    keep: list[Any] = []
    return _cstrings([k + b"=" + v for k, v in items], keep), keep


def _strings_for_child(items: tuple[str, ...], keep: list[Any]) -> Any:
    """A C array of ``items``, alive while ``keep`` is: reused from the cache if small (a
    task's environment and PATH are the submitter's: a MiB of them, cached, would be held
    64 times over)."""
    if sum(len(i) for i in items) > _CACHED_BYTES:
        return _cstrings(_encode_all(items), keep)
    held = _cached_cstrings(items)
    keep.append(held)  # alive for this spawn even if the cache lets it go meanwhile
    return held[0]


# Capability numbers as the kernel knows them (linux/capability.h; capabilities(7)).
CAPABILITIES: tuple[str, ...] = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN",
    "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON",
    "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)


@functools.cache
def cap_last_cap() -> int:
    """The highest capability number the running kernel knows."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return len(CAPABILITIES) - 1


def capability_name(number: int) -> str:
    return CAPABILITIES[number] if 0 <= number < len(CAPABILITIES) else f"capability {number}"


def _rlimit_name(resource_number: int) -> str:
    import resource

    for name in dir(resource):
        if name.startswith("RLIMIT_") and getattr(resource, name) == resource_number:
            return name
    return f"rlimit {resource_number}"


def spawn(
    argv: Sequence[str | bytes], *, env: Mapping[str, str] | None = None, cgroup_fd: int = -1,
    stdin: int, stdout: int, stderr: int, cwd: str | None = None, umask: int | None = None,
    new_session: bool = False, controlling_tty: bool = False, new_process_group: bool = False,
    pass_fds: Sequence[int] = (), numbered_fds: Sequence[int] = (), force_fallback: bool = False,
    new_netns: bool = False, netns_fd: int | None = None, mount_namespace: bool = False,
    tmpfs: Sequence[str] = (), read_only: Sequence[tuple[str, int]] = (),
    rlimits: Sequence[tuple[int, int, int]] = (),
    uid: int | None = None, gid: int | None = None, groups: Sequence[int] | None = None,
    drop_bounding_caps: int = 0, ambient_caps: int = 0, no_new_privs: bool = False,
    no_clone3: bool = False, ignored_signals: Sequence[int] = (),
) -> Spawned:
    """Start ``argv`` with fds ``stdin``/``stdout``/``stderr`` as 0/1/2, in cgroup ``cgroup_fd``.

    ``cgroup_fd`` is an ``O_DIRECTORY`` fd of the leaf (-1: our own cgroup).  Every other fd is
    closed at exec except ``pass_fds`` (at their numbers) and ``numbered_fds`` (given as fds 3,
    4, ... in order, at most 16; not with ``pass_fds``).  Signal dispositions are reset
    (``ignored_signals`` start ignored instead, as a shell's background job or nohup gets
    them) and the mask emptied.  ``new_session``: a session of its own (``controlling_tty``:
    fd 0, a terminal, becomes its controlling terminal); ``new_process_group``: a process
    group of its own.
    ``env`` is the complete environment (None: ours).  ``force_fallback`` takes the vfork +
    cgroup.procs path even where clone3 works, so that tests can prove it.

    Isolation (``supervisor._isolation`` computes these from a task's settings):
    ``new_netns`` (a new network namespace with "lo" up) or ``netns_fd`` (join that one);
    ``mount_namespace`` (a mount namespace of the task's own, a slave of ours) with ``tmpfs``
    (mount points given a fresh tmpfs) and ``read_only`` (``(mount point, MS_* flags to
    keep)`` remounted read-only); ``rlimits`` (``(resource, soft, hard)`` triples); ``uid``,
    ``gid``, ``groups``; ``drop_bounding_caps`` and ``ambient_caps`` (bit N is capability N);
    ``no_new_privs``; ``no_clone3`` (a seccomp filter: clone3 answers ENOSYS, so that no
    child can be born in another cgroup with CLONE_INTO_CGROUP).

    Any thread may spawn, several at once (the child of one that takes another uid may be
    stopped before its exec by a process of that uid, and its thread waits: ``_life.py``
    spawns those in a worker thread).

    Returns once the child has exec'd: a :class:`SpawnError` says the exec did not happen and
    no child remains.
    """
    if not argv:
        raise ValueError("argv must name a command, got an empty list")
    iso = _IsolationArgs(new_netns, netns_fd, mount_namespace, tuple(tmpfs), tuple(read_only),
                         tuple(rlimits), uid, gid, None if groups is None else tuple(groups),
                         drop_bounding_caps, ambient_caps, no_new_privs, no_clone3)
    bargv = _encode_all(argv)
    keep: list[Any] = []  # every C object the argument block points to, alive until the call
    if pass_fds and numbered_fds:
        raise ValueError("spawn: pass_fds and numbered_fds cannot be combined")
    a = _process_args(bargv, env, cgroup_fd, (stdin, stdout, stderr), pass_fds, cwd, umask,
                      ignored_signals, keep)
    if numbered_fds:
        if len(numbered_fds) > lib.CORRAL_MAX_NUMBERED_FDS:
            raise ValueError(f"spawn: at most {lib.CORRAL_MAX_NUMBERED_FDS} numbered_fds")
        numbered = ffi.new("int[]", list(numbered_fds))
        keep.append(numbered)
        a.numbered_fds, a.n_numbered_fds = numbered, len(numbered_fds)
    a.flags = iso.fill(a, keep) | _process_flags(new_session, controlling_tty,
                                                 new_process_group, force_fallback)
    r = ffi.new("struct corral_spawn_result *")
    rc = lib.corral_spawn(a, r)
    if rc < 0:
        raise _spawn_error(-rc, r, bargv[0], cwd, iso)
    return Spawned(r.pid, r.pidfd, _METHODS[r.method], r.fallback_errno)


def _encode_all(items: Sequence[str | bytes]) -> list[bytes]:
    """``os.fsencode`` of each item, in one encode when all are text (65,000 calls of it
    took 18 ms)."""
    try:
        joined = "\0".join(items)  # type: ignore[arg-type]
    except TypeError:  # (some are bytes)
        return [os.fsencode(i) for i in items]
    if joined.count("\0") != len(items) - 1:  # one holds a NUL: each encoded alone
        return [os.fsencode(i) for i in items]
    return joined.encode(_FS_ENCODING, _FS_ERRORS).split(b"\0")


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def _process_args(bargv: list[bytes], env: Mapping[str, str] | None, cgroup_fd: int,
                  stdio: tuple[int, int, int], pass_fds: Sequence[int], cwd: str | None,
                  umask: int | None, ignored_signals: Sequence[int], keep: list[Any]) -> Any:
    """A new C argument block with the process's part written (the executable's candidates,
    argv, environment, cgroup, fds, cwd, umask, ignored signals); what it points to is added
    to ``keep``.  Raises SpawnError (ENOENT, "exec") for an empty command name."""
    environ = os.environ if env is None else env
    candidates = resolve_executable(os.fsdecode(bargv[0]), environ.get("PATH"))
    a = ffi.new("struct corral_spawn_args *")
    a.exec_paths = _strings_for_child(tuple(candidates), keep)
    a.argv = _cstrings(bargv, keep)
    a.envp = _environment_for_child(env, keep)
    a.cgroup_fd = cgroup_fd
    a.stdin_fd, a.stdout_fd, a.stderr_fd = stdio
    if pass_fds:
        fds = ffi.new("int[]", list(pass_fds))
        keep.append(fds)
        a.pass_fds, a.n_pass_fds = fds, len(pass_fds)
    if cwd is not None:
        c = ffi.new("char[]", os.fsencode(cwd))
        keep.append(c)
        a.cwd = c
    a.umask = -1 if umask is None else umask
    a.ignored_signals = sum(1 << (int(sig) - 1) for sig in set(ignored_signals))
    return a


def _process_flags(new_session: bool, controlling_tty: bool, new_process_group: bool,
                   force_fallback: bool) -> int:
    """The CORRAL_SPAWN_* flags of :func:`spawn`'s process keywords."""
    return ((lib.CORRAL_SPAWN_SETSID if new_session else 0)
            | (lib.CORRAL_SPAWN_SETCTTY if controlling_tty else 0)
            | (lib.CORRAL_SPAWN_SETPGID if new_process_group else 0)
            | (lib.CORRAL_SPAWN_FORCE_FALLBACK if force_fallback else 0))


def _spawn_error(err: int, r: Any, command: bytes, cwd: str | None,
                 iso: _IsolationArgs) -> SpawnError:
    """The SpawnError for a failed corral_spawn() whose result is ``r``: the step, ``err``
    (an errno) and what the step was about (the command, the directory, a mount...)."""
    step = _STEPS.get(r.step, str(r.step))
    target = {"exec": os.fsdecode(command), "chdir": cwd}.get(step)
    return SpawnError(err, step, target or iso.target(step, r.index))


@functools.lru_cache(maxsize=16)
def _mount_flags(flags: tuple[int, ...]) -> Any:
    return ffi.new("unsigned long[]", list(flags) or [0])


@record
class _IsolationArgs:
    """The isolation keywords of :func:`spawn`, checked, and their place in the C arguments."""

    new_netns: bool = False
    netns_fd: int | None = None
    mount_namespace: bool = False
    tmpfs: Sequence[str] = ()
    read_only: Sequence[tuple[str, int]] = ()
    rlimits: Sequence[tuple[int, int, int]] = ()
    uid: int | None = None
    gid: int | None = None
    groups: Sequence[int] | None = None
    drop_bounding_caps: int = 0
    ambient_caps: int = 0
    no_new_privs: bool = False
    no_clone3: bool = False

    def __post_init__(self) -> None:
        if (self.tmpfs or self.read_only) and not self.mount_namespace:
            raise ValueError("tmpfs and read_only mounts need mount_namespace=True: without "
                             "a mount namespace of the task's own they would change ours")
        if self.new_netns and self.netns_fd is not None:
            raise ValueError("give new_netns or netns_fd, not both")

    def fill(self, a: Any, keep: list[Any]) -> int:
        """Write these into the C argument block ``a``; returns the CORRAL_SPAWN_* flags."""
        flags = 0
        if self.new_netns:
            flags |= lib.CORRAL_SPAWN_NEWNET
        if self.netns_fd is not None:
            a.netns_fd = self.netns_fd
            flags |= lib.CORRAL_SPAWN_SETNS
        if self.mount_namespace:
            flags |= lib.CORRAL_SPAWN_NEWNS
            a.tmpfs_paths = _strings_for_child(tuple(self.tmpfs), keep)
            a.n_tmpfs = len(self.tmpfs)
            a.readonly_paths = _strings_for_child(tuple(p for p, _ in self.read_only), keep)
            a.readonly_flags = _mount_flags(tuple(f for _, f in self.read_only))
            a.n_readonly = len(self.read_only)
        if self.rlimits:
            rl = ffi.new("struct corral_rlimit[]", [list(t) for t in self.rlimits])
            keep.append(rl)
            a.rlimits, a.n_rlimits = rl, len(self.rlimits)
        return flags | self._fill_credentials(a, keep)

    def _fill_credentials(self, a: Any, keep: list[Any]) -> int:
        flags = 0
        if self.groups is not None:
            g = ffi.new("unsigned int[]", list(self.groups) or [0])
            keep.append(g)
            a.groups, a.n_groups = g, len(self.groups)
            flags |= lib.CORRAL_SPAWN_SETGROUPS
        if self.gid is not None:
            a.gid = self.gid
            flags |= lib.CORRAL_SPAWN_SETGID
        if self.uid is not None:
            a.uid = self.uid
            flags |= lib.CORRAL_SPAWN_SETUID
        a.cap_last = cap_last_cap()
        if self.drop_bounding_caps:
            a.cap_bset_drop = self.drop_bounding_caps
            flags |= lib.CORRAL_SPAWN_CAPBSET
        if self.ambient_caps:
            a.cap_ambient = self.ambient_caps
            flags |= lib.CORRAL_SPAWN_AMBIENT
        if self.no_clone3:
            flags |= lib.CORRAL_SPAWN_NO_CLONE3
        if self.no_new_privs:
            flags |= lib.CORRAL_SPAWN_NO_NEW_PRIVS
        return flags

    def target(self, step: str, index: int) -> str | None:
        """What the failed ``step`` was about, from the child's ``index``."""
        if step == "tmpfs" and 0 <= index < len(self.tmpfs):
            return self.tmpfs[index]
        if step == "readonly" and 0 <= index < len(self.read_only):
            return self.read_only[index][0]
        if step == "rlimit" and 0 <= index < len(self.rlimits):
            return _rlimit_name(self.rlimits[index][0])
        if step in ("capbset", "ambient"):
            return capability_name(index)
        return None


def unshare(flags: int) -> None:
    """unshare(2) for the calling thread (Python 3.11's os has none); OSError on failure."""
    rc: int = lib.corral_unshare(flags)
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc), "unshare")


def setns(fd: int, nstype: int = 0) -> None:
    """setns(2) for the calling thread: join the namespace ``fd`` refers to."""
    rc: int = lib.corral_setns(fd, nstype)
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc), "setns")


def shares_our_memory(pid: int) -> bool:
    """Whether process ``pid`` shares our address space (kcmp(2)): a child of ours that has
    not exec'd yet.  False when it cannot be told (gone, not ours to compare)."""
    rc: int = lib.corral_shares_our_memory(pid)
    return rc == 1


def inotify_init() -> int:
    """A non-blocking, close-on-exec inotify fd."""
    fd: int = lib.corral_inotify_init()
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), "inotify_init1")
    return fd


IN_MODIFY = 0x00000002


def inotify_rm_watch(fd: int, wd: int) -> None:
    """Remove watch ``wd``; OSError(EINVAL) when the kernel already dropped it."""
    rc: int = lib.corral_inotify_rm_watch(fd, wd)
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc), "inotify_rm_watch")


def signalfd(signals: Sequence[int]) -> int:
    """A non-blocking, close-on-exec signalfd for ``signals`` (block them first, in every
    thread); each read of 128 bytes is one ``struct signalfd_siginfo``."""
    arr = ffi.new("int[]", [int(s) for s in signals])
    fd: int = lib.corral_signalfd(arr, len(signals))
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), "signalfd")
    return fd


def inotify_add_watch(fd: int, path: str, mask: int = IN_MODIFY) -> int:
    """Watch ``path``; returns the watch descriptor."""
    wd: int = lib.corral_inotify_add_watch(fd, os.fsencode(path), mask)
    if wd < 0:
        raise OSError(-wd, os.strerror(-wd), path)
    return wd
