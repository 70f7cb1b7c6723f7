"""Who is calling, and as whom their tasks run.

The kernel tells the daemon who connected (``SO_PEERCRED``: pid, uid, gid at ``connect()``;
``SO_PEERGROUPS``: the supplementary groups then), see unix(7).  Nothing a client says about
itself counts.  A task belongs to its submitter's uid and runs with the submitter's uid, gid
and groups, unless root submitted it, and with no resource limit above the submitter's own
(:func:`rlimits_of`: what PAM or its service manager gave the process that connected).
"""

from __future__ import annotations

import _socket
import dataclasses
import os
import pwd
import signal
import socket
import struct
import time
from typing import Any, NamedTuple

__all__ = ["Peer", "PeerGone", "parse_limits", "peer_of", "peer_of_fd", "rlimits_of",
           "run_as_isolation", "task_environment"]

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python 3.11 lacks it
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5
_UCRED = struct.Struct("3i")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Peer(NamedTuple):
    """The credentials of a connected client, as the kernel gave them."""

    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]
    fd: int = -1  # the connection (while it is open): the kernel is asked about its peer

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def may_see(self, owner_uid: int) -> bool:
        return self.uid == 0 or self.uid == owner_uid


def peer_of(sock: socket.socket) -> Peer:
    """SO_PEERCRED and SO_PEERGROUPS of a connected AF_UNIX socket.  OSError if the kernel
    will not say (then the connection is refused)."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _UCRED.size))
    groups: tuple[int, ...] = ()
    size = 64 * 4
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
            groups = tuple(struct.unpack(f"{len(raw) // 4}I", raw))
            break
        except OSError as e:
            if e.errno == 34 and size < 65536 * 4:  # ERANGE: more groups than room
                size *= 4
                continue
            break  # an old kernel: no supplementary groups known
    return Peer(pid, uid, gid, groups, sock.fileno())


def uid_of_fd(fd: int) -> int:
    """The uid that connected on a socket's bare fd (SO_PEERCRED alone: the cheap look a
    flood of connections is refused after).  OSError if the kernel will not say."""
    sock = _socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    finally:
        sock.detach()
    return int(_UCRED.unpack(raw)[1])


def peer_of_fd(fd: int) -> Peer:
    """:func:`peer_of` for a connected socket's bare fd (left open)."""
    sock = _socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
    try:
        return peer_of(sock)  # type: ignore[arg-type]
    finally:
        sock.detach()


class PeerGone(Exception):
    """The process that connected cannot be asked about (it has exited, or it lives in a pid
    namespace this daemon cannot see into)."""


def rlimits_of(peer: Peer) -> dict[str, tuple[int, int]]:
    """The resource limits of the process that connected, ``{"NOFILE": (soft, hard), ...}``
    for each ``Limit*=`` systemd knows (2**64-1: infinity).  PeerGone if it cannot be known.

    They are read from ``/proc/PID/limits`` (prlimit(2) would need CAP_SYS_RESOURCE, which a
    container's root may lack) while a pidfd holds that very process: the kernel's
    ``SO_PEERPIDFD`` (Linux 6.5) names the process that called connect(), and as long as it
    has not exited its pid is no other process's, so the limits read through the pid are its
    own.  (Older kernels: a pidfd opened on the pid ``SO_PEERCRED`` gave, which a pid reused
    between the connect and this call would fool.)"""
    if peer.pid <= 0:
        raise PeerGone("the process that connected lives in a pid namespace this daemon "
                       "cannot see into, so its resource limits cannot be read")
    gone = PeerGone(f"the process that connected (pid {peer.pid}) has exited")
    pidfd = _pidfd_of(peer, gone)
    try:
        try:
            with open(f"/proc/{peer.pid}/limits", "rb") as f:
                text = f.read()
            signal.pidfd_send_signal(pidfd, 0)  # still that process: the limits were its own
        except (ProcessLookupError, FileNotFoundError):
            raise gone from None
    finally:
        os.close(pidfd)
    return parse_limits(text)


def parse_limits(text: bytes) -> dict[str, tuple[int, int]]:
    """``/proc/PID/limits`` as ``{name: (soft, hard)}``: one line per resource after the
    header, in the kernel's order of resource numbers, each ``%-25s %-20s %-20s`` (the
    label, soft, hard) and maybe the units (fs/proc/base.c, proc_pid_limits)."""
    from ..syntax import INFINITY, RLIMITS

    lines = text.decode("ascii", "replace").splitlines()[1:]
    limits = {}
    for name, (number, _) in RLIMITS.items():
        soft, hard = lines[number][26:].split()[:2]
        limits[name] = (INFINITY if soft == "unlimited" else int(soft),
                        INFINITY if hard == "unlimited" else int(hard))
    return limits


def _pidfd_of(peer: Peer, gone: PeerGone) -> int:
    if peer.fd >= 0:
        sock = _socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=peer.fd)
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4)
            return int(struct.unpack("i", raw)[0])
        except OSError as e:
            if e.errno == 3:  # ESRCH: it has exited
                raise gone from None
            # ENOPROTOOPT (before Linux 6.5): a pidfd on the pid, below
        finally:
            sock.detach()
    try:
        return os.pidfd_open(peer.pid)
    except ProcessLookupError:
        raise gone from None


def allowed(peer: Peer, allow_gid: int | None) -> bool:
    """``--allow-group``: root, or a member (primary or supplementary) of the group."""
    return allow_gid is None or peer.uid == 0 or peer.gid == allow_gid or \
        allow_gid in peer.groups


def run_as_isolation(peer: Peer, asked: Any = None,
                     rlimits: dict[str, tuple[int, int]] | None = None) -> Any:
    """The ``supervisor.Isolation`` a non-root submitter's task runs with: what it ``asked``
    for (its properties' Isolation: PrivateNetwork=, Limit*=..., already checked by
    ``policy.check_tenant``), run as its uid, gid and groups; ``asked`` as it is for root.
    ``rlimits``: the task's starting resource limits, in place of those asked (None: those
    asked)."""
    import supervisor

    if peer.is_root:
        if rlimits is None:
            return asked
        return dataclasses.replace(asked or supervisor.Isolation(), rlimits=rlimits)
    key = None
    if asked is None:  # (a tenant's plain submission: the same Isolation as its last one)
        key = (peer.uid, peer.gid, peer.groups,
               None if rlimits is None else tuple(sorted(rlimits.items())))
        made = _made.get(key)
        if made is not None and time.monotonic() - made[0] < MADE_FOR:
            return made[1]
    kept = {} if asked is None else {
        f.name: getattr(asked, f.name) for f in dataclasses.fields(asked)
        if not f.name.startswith("_") and f.name not in ("user", "group",
                                                         "supplementary_groups")}
    if rlimits is not None:
        kept["rlimits"] = rlimits
    isolation = supervisor.Isolation(user=peer.uid, group=peer.gid,
                                     supplementary_groups=tuple(peer.groups), **kept)
    if key is not None:
        if len(_made) >= 256:
            _made.clear()
        _made[key] = (time.monotonic(), isolation)
    return isolation


# Isolations made lately for plain submissions, by (uid, gid, groups, limits): making one
# checks its ids, groups and limits against the host (the user's groups looked up, each
# limit parsed and clamped): ~270 us of a tenant's `true`'s ~390 us spec.  An Isolation
# is frozen; one made again within MADE_FOR s is the one made (a user's groups changed in
# /etc/group meanwhile: the kernel's groups, part of the key, are those of the client's
# process anyway).
_made: dict[tuple[Any, ...], tuple[float, Any]] = {}
MADE_FOR = 1.0


def task_environment(peer: Peer, env: dict[str, str]) -> dict[str, str]:
    """A task's whole environment: a login-like base for its user, then what was asked.

    Never the daemon's own environment: that is root's, and says nothing about the caller.
    """
    base = {"PATH": SAFE_PATH, "LANG": os.environ.get("LANG", "C.UTF-8")}
    try:
        pw = pwd.getpwuid(peer.uid)
        base.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name,
                    SHELL=pw.pw_shell or "/bin/sh")
    except KeyError:
        base["HOME"] = "/"
    base.update(env)
    return base
