"""The listening sockets and the connections on them.

``bind_listeners`` gives the sockets to accept on: a socket unit's (socket activation), the one
an earlier run of this daemon bound and parked in the fd store across a restart, or
``--socket`` bound now (a stale file from a dead daemon is replaced; a live daemon's is
refused).  ``accept_loop`` serves each connection in the server nursery: the peer's
credentials, the connection limits, ``--allow-group``, then h11 (``http.py``) and the router.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import trio

from .http import serve_connection
from .ownsockets import OwnSockets, members
from .peers import Peer, allowed, peer_of_fd, uid_of_fd
from .routes import body_limit, make_router
from .shares import LINGERING, RATE, Held
from .state import Config, Daemon
from .statedir import StateDirError, check_ancestors

__all__ = ["Bound", "accept_loop", "bind_listeners", "own_accept_loop"]

log = logging.getLogger(__name__)


class Bound:
    """The sockets to accept on; ``own`` is the one this daemon bound (and may park across a
    restart: then ``keep`` is set, and its file is left in place)."""

    def __init__(self, listeners: list[socket.socket], own: socket.socket | None) -> None:
        self.sockets = listeners + ([own] if own is not None else [])
        for s in self.sockets:
            s.setblocking(False)  # (accept_loop waits for them to be readable)
        self.listeners = self.sockets
        self.own = own
        self.keep = False


@contextmanager
def bind_listeners(config: Config, passed: list[socket.socket],
                   parked: socket.socket | None) -> Iterator[Bound]:
    """The passed sockets (socket activation), else the parked one if it still is
    ``config.socket``, else ``config.socket`` bound now."""
    if passed:
        if parked is not None:
            parked.close()
        yield Bound(passed, None)
        return
    path = config.socket
    if parked is not None and _name(parked) != path:
        log.info("the parked socket is %s, not --socket %s: binding anew", _name(parked), path)
        parked.close()
        parked = None
    sock = parked if parked is not None else _bind(config)
    bound = Bound([], sock)
    try:
        yield bound
    finally:
        sock.close()
        if not bound.keep:
            with suppress(FileNotFoundError):
                os.unlink(path)


def _name(sock: socket.socket) -> str:
    name = sock.getsockname()
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def _bind(config: Config) -> socket.socket:
    path = config.socket
    directory = os.path.dirname(os.path.abspath(path))
    try:
        check_ancestors(os.path.dirname(directory), f"the socket {path}", "--socket")
        os.makedirs(directory, mode=0o755, exist_ok=True)
        _no_other_writers(directory)
        check_ancestors(directory, f"the socket {path}", "--socket")
    except StateDirError as e:
        raise OSError(errno.EPERM, str(e)) from None
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(path)
        if config.allow_gid is not None:
            os.chown(path, -1, config.allow_gid)
        os.chmod(path, config.socket_mode)
        sock.listen(4096)
    except BaseException:
        sock.close()
        raise
    return sock


def _no_other_writers(directory: str) -> None:
    """The socket's directory, if ours, writable by us alone (an emptyDir shared by a pod's
    containers is 0777: another uid could replace the socket with its own listener).  A
    directory others may write though it is sticky (``/tmp``) is refused: another user
    could bind the socket's path before the daemon, or after it stops, and receive every
    client's requests (an independent attack did, with the socket in /tmp), or make the
    directory of the uids' own sockets first."""
    st = os.stat(directory)
    if st.st_mode & 0o022 and st.st_mode & stat.S_ISVTX:
        raise StateDirError(
            f"the socket's directory {directory} is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): another user could take the socket's path "
            f"before the daemon binds it, or after it stops, and receive every client's "
            f"requests; give --socket a path in a directory only root may write (the "
            f"default, /run/corral/corral.sock, or e.g. /run/corral-ci/corral.sock: the "
            f"daemon makes it)")
    if st.st_uid == os.geteuid() and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        os.chmod(directory, stat.S_IMODE(st.st_mode) & ~0o022)
        log.warning("%s was writable by other users (mode %04o): made %04o, so that nobody "
                    "else can replace the socket", directory, stat.S_IMODE(st.st_mode),
                    stat.S_IMODE(st.st_mode) & ~0o022)


def _remove_stale_socket(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; remove it or give "
                      f"another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a dead daemon's
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another daemon already listens on {path}; stop it or "
                  f"give another --socket")


ACCEPT_BATCH = 64  # connections accepted per wake-up, with no checkpoint between them
# more, while most of them are refused for their uid's connection rate; a batch is loop time
# nobody else gets (~10 us a refusal): a tenant re-making idle connections as fast as it can,
# the other tenant's p99 was 155-198 ms with batches of 4096, 57-76 ms with 128
# (bench_tenants, connections and slow_headers)
FLOOD_BATCH = 128
# after a batch mostly refused, the shared socket rests this long: refusing a flood takes at
# most ~10% of the loop (128 refusals, ~1.2 ms, every ~11 ms).  Every uid's clients use their
# own sockets (ownsockets.py), so the rest delays only first contacts and other clients; a
# tenant re-making connections as fast as it could had the daemon closing 100,000 a second,
# its loop 91% busy, and another uid's p99 at 3.9x (bench_tenants, connections)
FLOOD_PAUSE = 0.01


async def accept_loop(d: Daemon, listener: socket.socket, connections: trio.Nursery,
                      loops: trio.Nursery) -> None:
    """Accept on ``listener`` (non-blocking, shared by every uid it admits) until cancelled;
    each admitted connection runs in ``connections``.  What the backlog holds is taken in
    batches, without a scheduling round each, and a refused connection costs no socket object
    unless it is answered: a uid re-making thousands of connections a second is refused at
    the cost of the accepts alone, and the other uids' connections behind them in the backlog
    wait less.  A uid admitted here gets a socket of its own (``ownsockets``), accepted on in
    ``loops`` (:func:`own_accept_loop`)."""
    router = make_router(d)

    def serve(uid: int, sock: socket.socket) -> None:
        loops.start_soon(own_accept_loop, d, uid, sock, connections, router)

    with OwnSockets(listener, serve) as own:
        for uid in [0, *await trio.to_thread.run_sync(members, d.config.allow_gid)]:
            own.offer(uid)
        await _accept_shared(d, listener, connections, router, own)


async def _accept_shared(d: Daemon, listener: socket.socket, connections: trio.Nursery,
                         router: Any, own: OwnSockets) -> None:
    while True:
        await trio.lowlevel.wait_readable(listener)
        admitted_now, taken = 0, 0
        # (a batch ends after ACCEPT_BATCH admitted, so that those get served; refusals
        # cost microseconds each: a flood is taken off the backlog, every uid shares, whole)
        while admitted_now < ACCEPT_BATCH and taken < FLOOD_BATCH:
            taken += 1
            fd = _take(d, listener)
            if fd is None:
                break
            if fd < 0:
                await trio.sleep(0.1)  # out of descriptors: let some connections end
                break
            admitted = _admit(d, fd, connections)
            if admitted is not None:
                admitted_now += 1
                connections.start_soon(_connection, d, _trio_socket(fd), router, *admitted)
                own.offer(admitted[0].uid)
        if taken >= FLOOD_BATCH and admitted_now < taken // 2:
            await trio.sleep(FLOOD_PAUSE)  # (a flood: see FLOOD_PAUSE)


async def own_accept_loop(d: Daemon, uid: int, listener: socket.socket,
                          connections: trio.Nursery, router: Any) -> None:
    """Accept on ``uid``'s own socket, no faster than its connection rate: past it, its
    connections wait in its own backlog (a connect blocks, or fails EAGAIN), and the daemon
    spends nothing on them.  Another uid's connection here is closed (root's is served)."""
    with listener:
        while True:
            await trio.lowlevel.wait_readable(listener)
            wait = d.shares.rate_wait(uid)
            if wait > 0:
                await trio.sleep(wait)
                continue
            fd = _take(d, listener)
            if fd is None:
                continue
            if fd < 0:
                await trio.sleep(0.1)
                continue
            try:
                who = uid_of_fd(fd)
            except OSError:
                who = -1
            if who not in (uid, 0):
                # (counted as the owner's: others let in by a chmod are paced with it)
                d.shares.over_rate(uid)
                os.close(fd)
                d.metrics.shed.labels(reason="not_allowed").inc()
                continue
            admitted = _admit(d, fd, connections, who)
            if admitted is not None:
                connections.start_soon(_connection, d, _trio_socket(fd), router, *admitted)


def _take(d: Daemon, listener: socket.socket) -> int | None:
    """One connection off ``listener``'s backlog: its fd (a bare one: no socket object unless
    it is served or answered); None if there is none; -1 if the daemon is out of descriptors
    (counted; the caller pauses, so that some connections end)."""
    try:
        fd: int = listener._accept()[0]  # type: ignore[attr-defined]
    except BlockingIOError:
        return None
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            raise
        d.metrics.shed.labels(reason="no_fds").inc()
        return -1
    return fd


def _trio_socket(fd: int) -> trio.socket.SocketType:
    return trio.socket.from_stdlib_socket(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM,
                                                        fileno=fd))


def _admit(d: Daemon, fd: int, nursery: trio.Nursery,
           uid: int | None = None) -> tuple[Peer, Held] | None:
    """Who connected on ``fd`` (its ``uid`` if known already), and its place in its uid's
    share; None (the connection refused: then answered in a task of its own, or closed at
    once in a flood) if it has none.  No checkpoint."""
    try:
        uid = uid_of_fd(fd) if uid is None else uid
        if uid != 0 and d.shares.over_rate(uid):  # (first: a flood is refused cheaply)
            d.metrics.shed_rate.inc()
            _refuse(d, fd, _FAST, nursery, uid)
            return None
        peer = peer_of_fd(fd)
    except OSError:
        os.close(fd)
        return None
    if not allowed(peer, d.config.allow_gid):
        d.metrics.shed.labels(reason="not_allowed").inc()
        _refuse(d, fd, _FORBIDDEN, nursery)
        return None
    held = Held(peer.uid)
    refused = d.shares.open(held)
    if refused is None:
        return peer, held
    d.metrics.shed.labels(reason=f"max_connections{'_per_uid' * (refused == 'per_uid')}").inc()
    _refuse(d, fd, _MINE if refused == "per_uid" else _BUSY, nursery, peer.uid)
    return None


def _refuse(d: Daemon, fd: int, response: bytes, nursery: trio.Nursery,
            uid: int | None = None) -> None:
    """Answer a refused connection in a task of its own (it lingers a moment), or close it
    now: while LINGERING of them are being answered, and for a uid answered once in the last
    second already (a flood of re-made connections)."""
    if d.shares.refusing >= LINGERING or (uid is not None and not d.shares.may_answer(uid)):
        os.close(fd)
        return
    d.shares.refusing += 1
    nursery.start_soon(_answer_refusal, d, _trio_socket(fd), response)


async def _answer_refusal(d: Daemon, sock: trio.socket.SocketType, response: bytes) -> None:
    try:
        with sock:
            await _refuse_raw(sock, response)
    finally:
        d.shares.refusing -= 1


async def _connection(d: Daemon, sock: trio.socket.SocketType, router: Any, peer: Peer,
                      held: Held) -> None:
    d.shares.loop.enter(peer.uid)
    with sock:
        try:
            with held.scope:
                shed = await serve_connection(trio.SocketStream(sock), peer, d.config.http,
                                              router, _answered(d), held, d.shares,
                                              body_limit)
                if shed is not None:
                    d.metrics.shed.labels(reason=shed).inc()
            if held.scope.cancelled_caught:
                d.metrics.shed.labels(reason="another_uid").inc()
        except Exception:
            # a bug of ours on one connection: it ends, the daemon goes on
            log.exception("connection of uid %d", peer.uid)
        finally:
            d.shares.close(held)
            d.shares.loop.leave(peer.uid)


def _answered(d: Daemon) -> Any:
    def answered(verb: str, status: int) -> None:
        d.metrics.requests.labels(verb=verb, status=str(status)).inc()

    return answered


async def _refuse_raw(sock: trio.socket.SocketType, response: bytes) -> None:
    """Send a whole refusal, then read what the client sent for a moment before closing:
    closing with unread bytes would reset the connection and lose the answer."""
    with suppress(OSError), trio.move_on_after(1.0):
        await sock.send(response)
        sock.shutdown(socket.SHUT_WR)
        while await sock.recv(65536):
            pass


def _raw_error(status: str, code: str, message: str) -> bytes:
    """A whole HTTP response for refusing a connection before h11 is involved."""
    body = json.dumps({"error": {"code": code, "message": message, "field": None}}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body) + 1}\r\n\r\n").encode() + body + b"\n"


_BUSY = _raw_error("503 Service Unavailable", "busy", "the daemon holds its maximum of "
                   "connections (--max-connections), and your uid holds as many as any "
                   "other; retry later")
_MINE = _raw_error("429 Too Many Requests", "too_many_connections", "your uid holds its "
                   "maximum of connections (--max-connections-per-uid); close some (a client "
                   "needs one per concurrent request) and retry")
_FORBIDDEN = _raw_error("403 Forbidden", "forbidden", "your uid is not in the group that "
                        "--allow-group admits; ask the host's administrator to add you to it")
_FAST = _raw_error("429 Too Many Requests", "too_many_connects", f"your uid opened more than "
                   f"{RATE:g} connections in the last second; keep a connection open for many "
                   f"requests (HTTP keep-alive), or retry in a moment")
