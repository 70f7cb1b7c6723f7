"""Each uid's own listening socket, beside the shared one.

A listening socket's kernel backlog is shared by every uid that connects to it: one tenant
connecting and closing in a loop kept the daemon's backlog of 4096 nearly full, and another
uid's non-blocking connect failed (EAGAIN) for 10 of 30 requests (an independent attack): no
accept loop drains a backlog faster than a tenant's threads fill it.  So the first time a uid
is admitted on a listener bound to a path, the daemon binds a socket for that uid alone beside
it, ``PATH.uid/UID`` (``protocol.OWN_SUFFIX``; the directory the daemon's, 0755; the socket
the uid's, 0600), and serves it with a loop of its own that accepts no faster than the uid's
connection rate (``Shares.rate_wait``): a flood there fills that uid's own backlog, costs the
daemon at most its rate, and no one else waits behind it.  Root's, and those of the members
``/etc/group`` lists for ``--allow-group`` (:func:`members`), are made at the start, before
any contact: the operator's ``corral ps`` and a member's first request never wait behind a
flood either.  The project's clients connect to their uid's socket when it is there and
trusted, else to the shared one (``client.own_socket_of``).  On the shared socket a flood is
refused as before; there it delays only first contacts and clients that do not use their own
socket.

A connection of another uid on a uid's socket (its owner may chmod it) is closed; root's is
served.  At most :data:`MAX_OWN` such sockets; the directory is emptied when the daemon
starts and removed when it stops accepting (a restart's hand-over included: the clients go
back to the shared socket, parked meanwhile).  A directory there that is not the daemon's
(another user made it first, in a sticky directory) turns the feature off, logged.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from collections.abc import Callable

from .protocol import OWN_SUFFIX

__all__ = ["MAX_OWN", "OwnSockets", "members"]

log = logging.getLogger(__name__)

MAX_OWN = 1024  # uids with a socket of their own (each an fd and an accept loop)
BACKLOG = 128  # one uid's connections waiting to be accepted on its own socket


class OwnSockets:
    """The uids' own sockets beside the shared ``listener`` (see the module docstring);
    ``serve(uid, sock)`` is called for each one made, to accept on it and close it when it
    ends.  A context manager: leaving it removes their files."""

    def __init__(self, listener: socket.socket,
                 serve: Callable[[int, socket.socket], None]) -> None:
        self.serve = serve
        self.sockets: dict[int, socket.socket] = {}
        self.failed: set[int] = set()  # uids whose socket could not be made (not tried again)
        self.trying = True  # (False: a failure that every uid's socket would meet)
        self.dir: str | None = None
        path = _path_of(listener)
        if path is not None:
            self.dir = _prepare(path + OWN_SUFFIX)

    def __enter__(self) -> OwnSockets:
        return self

    def __exit__(self, *exc: object) -> None:
        # (each socket is closed by its own loop, ``serve``'s, as it ends: closed here, a loop
        # started but not yet run waited on a closed socket: -1, a crash at a stop that came
        # while the daemon started)
        for uid in self.sockets:
            assert self.dir is not None
            _unlink(os.path.join(self.dir, str(uid)))
        self.sockets.clear()
        if self.dir is not None:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass

    def offer(self, uid: int) -> None:
        """A connection of ``uid`` was admitted on the shared socket: make its own, if it has
        none yet and may."""
        if uid in self.sockets or uid in self.failed or self.dir is None or not self.trying \
                or len(self.sockets) + len(self.failed) >= MAX_OWN:
            return
        path = os.path.join(self.dir, str(uid))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            _unlink(path)  # (an earlier run's, or a failed attempt's)
            sock.bind(path)
            os.chown(path, uid, -1)
            os.chmod(path, 0o600)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            _unlink(path)
            log.warning("a socket of uid %d's own at %s could not be made: %s; its clients use "
                        "the shared one", uid, path, e)
            self.failed.add(uid)  # (tried once: a connection each would be a log line each)
            if e.errno in (errno.ENAMETOOLONG, errno.EINVAL, errno.EROFS, errno.EACCES,
                           errno.EPERM):
                self.trying = False  # (the same for every uid, a daemon not root's)
            return
        self.sockets[uid] = sock
        self.serve(uid, sock)


def members(gid: int | None) -> list[int]:
    """The uids ``/etc/group`` (NSS) lists as members of ``gid`` (``--allow-group``): their
    sockets are made at the start, so that even a first contact never waits behind another
    uid's flood on the shared socket.  (Users whose primary group it is are not listed there:
    theirs come at their first contact.)"""
    import grp
    import pwd

    if gid is None:
        return []
    uids = []
    try:
        names = grp.getgrgid(gid).gr_mem
    except KeyError:
        return []
    for name in names[:MAX_OWN]:
        try:
            uids.append(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return uids


def _path_of(listener: socket.socket) -> str | None:
    """The filesystem path ``listener`` is bound to (None: abstract, or not a unix socket)."""
    try:
        name = listener.getsockname()
    except OSError:
        return None
    return name if isinstance(name, str) and name.startswith("/") else None


def _prepare(directory: str) -> str | None:
    """Make ``directory`` ours (0755) and empty it; None (the feature off, logged) if it is
    someone else's or cannot be made."""
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        pass
    except OSError as e:
        log.warning("%s could not be made (%s): every uid's clients use the shared socket",
                    directory, e)
        return None
    try:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("%s is not a directory of the daemon's (uid %d, mode %06o): every "
                        "uid's clients use the shared socket; remove it and restart to give "
                        "each uid a socket of its own", directory, st.st_uid, st.st_mode)
            return None
        os.chmod(directory, 0o755)
        for name in os.listdir(directory):
            _unlink(os.path.join(directory, name))
    except OSError as e:
        log.warning("%s: %s: every uid's clients use the shared socket", directory, e)
        return None
    return directory


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        pass
