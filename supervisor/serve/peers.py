"""Who is calling, and as whom their tasks run.

The kernel tells the daemon who connected (``SO_PEERCRED``: pid, uid, gid at ``connect()``;
``SO_PEERGROUPS``: the supplementary groups then), see unix(7).  Nothing a client says about
itself counts.  A task belongs to its submitter's uid and runs with the submitter's uid, gid
and groups, unless root submitted it.
"""

from __future__ import annotations

import _socket
import dataclasses
import os
import pwd
import socket
import struct
from typing import Any, NamedTuple

__all__ = ["Peer", "peer_of", "peer_of_fd", "run_as_isolation", "task_environment"]

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python 3.11 lacks it
_UCRED = struct.Struct("3i")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Peer(NamedTuple):
    """The credentials of a connected client, as the kernel gave them."""

    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]

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
    return Peer(pid, uid, gid, groups)


def peer_of_fd(fd: int) -> Peer:
    """:func:`peer_of` for a connected socket's bare fd (left open)."""
    sock = _socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
    try:
        return peer_of(sock)  # type: ignore[arg-type]
    finally:
        sock.detach()


def allowed(peer: Peer, allow_gid: int | None) -> bool:
    """``--allow-group``: root, or a member (primary or supplementary) of the group."""
    return allow_gid is None or peer.uid == 0 or peer.gid == allow_gid or \
        allow_gid in peer.groups


def run_as_isolation(peer: Peer, asked: Any = None) -> Any:
    """The ``supervisor.Isolation`` a non-root submitter's task runs with: what it ``asked``
    for (its properties' Isolation: PrivateNetwork=, Limit*=..., already checked by
    ``policy.check_tenant``), run as its uid, gid and groups; ``asked`` as it is for root."""
    if peer.is_root:
        return asked
    import supervisor

    kept = {} if asked is None else {
        f.name: getattr(asked, f.name) for f in dataclasses.fields(asked)
        if not f.name.startswith("_") and f.name not in ("user", "group",
                                                         "supplementary_groups")}
    return supervisor.Isolation(user=peer.uid, group=peer.gid,
                                supplementary_groups=tuple(peer.groups), **kept)


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
