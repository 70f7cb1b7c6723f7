"""Python face of the native helper: spawn a child straight into a cgroup leaf.

The C side (native/corral_native.c) does everything between clone and execve; this module turns
Python values into the C argument block, resolves the executable along PATH the way execvp
does, and turns a failure into a :class:`SpawnError` that says which step failed and why, so that
"not found", "permission denied" and "bad working directory" are told apart.

It also carries the few syscalls Python 3.11 lacks (inotify).  pidfds need nothing extra:
``os.pidfd_open``, ``signal.pidfd_send_signal`` and ``os.waitid(os.P_PIDFD, ...)`` are there.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    "signalfd",
    "spawn",
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
    ``"cgroup"`` (joining the leaf), ``"clone"`` (creating the process), and so on.
    ``filename`` is the command or directory concerned.
    """

    def __init__(self, err: int, step: str, filename: str | None) -> None:
        super().__init__(err, os.strerror(err), filename)
        self.step = step

    def __str__(self) -> str:
        what = {
            "exec": "cannot run",
            "chdir": "cannot change to working directory",
            "cgroup": "cannot join the task's cgroup",
            "clone": "cannot create the process",
        }.get(self.step, f"spawn step {self.step!r} failed")
        target = f" {self.filename!r}" if self.filename else ""
        return f"{what}{target}: [Errno {self.errno}] {self.strerror}"


@dataclass(frozen=True, slots=True)
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
    return [os.path.join(d or ".", file) for d in path.split(os.pathsep)]


def _cstrings(items: Sequence[bytes], keep: list[Any]) -> Any:
    ptrs = [ffi.new("char[]", s) for s in items]
    keep.extend(ptrs)
    arr = ffi.new("char *[]", [*ptrs, ffi.NULL])
    keep.append(arr)
    return arr


def spawn(
    argv: Sequence[str | bytes],
    *,
    env: Mapping[str, str] | None = None,
    cgroup_fd: int = -1,
    stdin: int,
    stdout: int,
    stderr: int,
    cwd: str | None = None,
    umask: int | None = None,
    new_session: bool = False,
    new_netns: bool = False,
    controlling_tty: bool = False,
    uid: int | None = None,
    gid: int | None = None,
    groups: Sequence[int] | None = None,
    rlimits: Sequence[tuple[int, int, int]] = (),
    pass_fds: Sequence[int] = (),
    force_fallback: bool = False,
) -> Spawned:
    """Start ``argv`` with fds ``stdin``/``stdout``/``stderr`` as 0/1/2, in cgroup ``cgroup_fd``.

    ``cgroup_fd`` is an ``O_DIRECTORY`` fd of the leaf (-1: our own cgroup).  Every other fd is
    closed at exec except ``pass_fds``.  Signal dispositions are reset and the mask emptied.
    ``env`` is the complete environment (None: ours).  ``rlimits`` are ``(resource, soft,
    hard)`` triples.  ``force_fallback`` takes the vfork + cgroup.procs path even where clone3
    works, so that tests can prove it.

    Returns once the child has exec'd: a :class:`SpawnError` says the exec did not happen and
    no child remains.
    """
    if not argv:
        raise ValueError("argv must name a command, got an empty list")
    bargv = [os.fsencode(a) for a in argv]
    environ = os.environ if env is None else env
    candidates = resolve_executable(os.fsdecode(bargv[0]), environ.get("PATH"))
    benv = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in environ.items()]

    keep: list[Any] = []
    a = ffi.new("struct corral_spawn_args *")
    a.exec_paths = _cstrings([os.fsencode(c) for c in candidates], keep)
    a.argv = _cstrings(bargv, keep)
    a.envp = _cstrings(benv, keep)
    a.cgroup_fd = cgroup_fd
    a.stdin_fd, a.stdout_fd, a.stderr_fd = stdin, stdout, stderr
    if pass_fds:
        fds = ffi.new("int[]", list(pass_fds))
        keep.append(fds)
        a.pass_fds, a.n_pass_fds = fds, len(pass_fds)
    if cwd is not None:
        c = ffi.new("char[]", os.fsencode(cwd))
        keep.append(c)
        a.cwd = c
    a.umask = -1 if umask is None else umask
    flags = 0
    if new_session:
        flags |= lib.CORRAL_SPAWN_SETSID
    if new_netns:
        flags |= lib.CORRAL_SPAWN_NEWNET
    if controlling_tty:
        flags |= lib.CORRAL_SPAWN_SETCTTY
    if groups is not None:
        g = ffi.new("unsigned int[]", list(groups))
        keep.append(g)
        a.groups, a.n_groups = g, len(groups)
        flags |= lib.CORRAL_SPAWN_SETGROUPS
    if gid is not None:
        a.gid = gid
        flags |= lib.CORRAL_SPAWN_SETGID
    if uid is not None:
        a.uid = uid
        flags |= lib.CORRAL_SPAWN_SETUID
    if force_fallback:
        flags |= lib.CORRAL_SPAWN_FORCE_FALLBACK
    a.flags = flags
    if rlimits:
        rl = ffi.new("struct corral_rlimit[]", [list(t) for t in rlimits])
        keep.append(rl)
        a.rlimits, a.n_rlimits = rl, len(rlimits)

    r = ffi.new("struct corral_spawn_result *")
    rc = lib.corral_spawn(a, r)
    if rc < 0:
        step = _STEPS.get(r.step, str(r.step))
        filename: str | None = None
        if step == "exec":
            filename = os.fsdecode(bargv[0])
        elif step == "chdir":
            filename = cwd
        raise SpawnError(-rc, step, filename)
    return Spawned(r.pid, r.pidfd, _METHODS[r.method], r.fallback_errno)


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


SIGNALFD_SIGINFO_SIZE = 128


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
