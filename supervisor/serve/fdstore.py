"""Running tasks kept across ``systemctl restart corral``, through systemd's fd store.

The old daemon (on SIGTERM, when systemd says a restart job is queued: ``sdjob.py``) stops
dispatching, lets the core hand its running tasks over (``sup.hand_over()``: nothing is
stopped, the keeper lets go) and parks what the next daemon needs in the unit's fd store
(``Notifier.store``, ``FDPOLL=0``)::

    corral.t.<name>     each fd of the core's hand-over, by the core's name (``root``,
                        ``<id>.pidfd``, ``<id>.stdout``, ...); ``root`` keeps the cgroup root
                        locked while PID 1 holds it, so no reaper touches the tasks
    corral-listen       the socket the daemon bound itself (not socket-activated), so that
                        clients connecting during the restart wait in its backlog
    corral-state        last: a memfd with ``{"format", "run", "socket", "root", "handover"}``;
                        a store without it is an interrupted hand-over

then waits for PID 1 to have taken them all (``BARRIER=1``) and exits 0.  systemd keeps a
unit's fd store while a job is queued for it and passes it back at the next start
(``$LISTEN_FDNAMES``).  The new daemon takes the passed fds before anything else
(:func:`take`), rebuilds the core's hand-over (``adopt_from``) for ``open_supervisor(adopt=)``,
and once its supervisor holds them, removes them from the store (:func:`release`): PID 1 must
not keep pipe ends (the tasks would never see EOF) or the root's lock.

A store this daemon cannot use (no state, a format it does not know, a core without
adoption) is released at once, before the supervisor is made: the root's lock then drops, the
new supervisor's placement finds the old root stale, kills what is in it, and the start-up
records the tasks ``lost`` (``recover.py``), as after a crash.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
from typing import Any, NamedTuple

from .sdnotify import Notifier

__all__ = ["LISTENER", "PREFIX", "STATE", "Passed", "abandon", "adopt_from", "park", "release",
           "take"]

log = logging.getLogger(__name__)

FORMAT = 1
PREFIX = "corral.t."
LISTENER = "corral-listen"
STATE = "corral-state"


class Passed(NamedTuple):
    """What systemd passed at start: listening sockets of a socket unit (systemd's), the one
    an earlier run bound and parked (ours), the parked state, the parked fds of the core's
    hand-over (by the core's names), and every name that came from the fd store (to remove
    from it)."""

    listeners: list[socket.socket]
    own: socket.socket | None
    state: dict[str, Any] | None
    fds: dict[str, int]
    stored: list[str]


def take(passed: list[tuple[str, int]]) -> Passed:
    """Sort the fds systemd passed (``sdnotify.listen_fds()``) by name."""
    listeners: list[socket.socket] = []
    own: socket.socket | None = None
    fds: dict[str, int] = {}
    stored: list[str] = []
    state: dict[str, Any] | None = None
    for name, fd in passed:
        if name == STATE:
            stored.append(name)
            state = _read_state(fd)
        elif name.startswith(PREFIX):
            stored.append(name)
            fds[name[len(PREFIX):]] = fd
        elif _is_listening(fd):
            if name == LISTENER:
                stored.append(name)
                own = socket.socket(fileno=fd)
            else:
                listeners.append(socket.socket(fileno=fd))
        else:
            log.warning("systemd passed fd %d named %r, which is not ours: closed", fd, name)
            stored.append(name)
            os.close(fd)
    return Passed(listeners, own, state, fds, stored)


def _read_state(fd: int) -> dict[str, Any] | None:
    try:
        with os.fdopen(fd, "rb") as f:
            f.seek(0)
            data = json.loads(f.read())
    except (OSError, ValueError) as e:
        log.warning("the parked state of an earlier run cannot be read (%s): ignored", e)
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        log.warning("the parked state of an earlier run has an unknown format: ignored")
        return None
    return data


def _is_listening(fd: int) -> bool:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        with socket.socket(fileno=os.dup(fd)) as s:
            return bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False


def adopt_from(passed: Passed, supported: bool) -> Any:
    """The core's ``HandOver`` rebuilt from a parked store, or None (the fds closed) when there
    is none, it is unusable, or the core cannot adopt (``supported``)."""
    if not passed.fds:
        return None
    why = None
    if passed.state is None:
        why = "the hand-over was interrupted (no parked state)"
    elif not supported:
        why = "this corral's supervisor cannot adopt tasks"
    else:
        import supervisor

        try:
            return supervisor.HandOver.from_json(passed.state["handover"], passed.fds)
        except (ValueError, KeyError, TypeError) as e:
            why = f"the parked hand-over is unusable: {e}"
    log.warning("not adopting the %d parked fds of the earlier run: %s; its tasks will be "
                "recorded lost", len(passed.fds), why)
    _close_all(passed)
    return None


def _close_all(passed: Passed) -> None:
    """Close every fd taken from the store (their tasks are not ours to adopt)."""
    for fd in passed.fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    passed.fds.clear()


def release(notifier: Notifier, passed: Passed) -> None:
    """Remove what we took from the fd store (once our own copies hold it, or were closed),
    and wait until PID 1 has dropped its copies."""
    for name in dict.fromkeys(passed.stored):
        notifier.remove(name)
    if passed.stored and not notifier.barrier():
        log.warning("systemd did not confirm dropping the fd store's copies (no BARRIER=1 "
                    "support?)")


def abandon(notifier: Notifier, passed: Passed) -> None:
    """This start fails before its supervisor took a parked hand-over (a full disk, a bad
    --cgroup-root): kill what the hand-over's root holds, so that nothing runs unsupervised
    meanwhile (the next start records those tasks lost), then close the fds and empty the
    store.  Blocking (up to a few seconds): run it in a thread."""
    root = (passed.state or {}).get("root")
    if passed.fds and isinstance(root, str):
        from cgroupfs import Cgroup, CgroupError

        try:
            with Cgroup.open(root) as cg:
                done = cg.destroy()
            log.error("could not take the %d parked task(s) over: killed them with %s%s",
                      len(passed.fds), root, "" if done.error is None else f" ({done.error})")
        except CgroupError as e:
            log.error("could not take the parked tasks over, nor kill them: %s", e)
    _close_all(passed)
    release(notifier, passed)


def park(notifier: Notifier, fds: dict[str, int], state: dict[str, Any],
         listener: socket.socket | None) -> None:
    """Put a hand-over into the fd store: every fd by name, then the state (a memfd), and
    wait for PID 1 to have taken them.  OSError if any of it could not be sent."""
    for name, fd in fds.items():
        notifier.store(PREFIX + name, fd)
    if listener is not None:
        notifier.store(LISTENER, listener.fileno())
    memfd = os.memfd_create(STATE, os.MFD_CLOEXEC)
    try:
        data = json.dumps({"format": FORMAT, **state}).encode()
        while data:
            data = data[os.write(memfd, data):]
        notifier.store(STATE, memfd)
    finally:
        os.close(memfd)
    if not notifier.barrier(timeout=10.0):
        raise OSError("systemd did not confirm taking the parked fds within 10 s")


def store_room(count: int, limit: int | None) -> str | None:
    """Why ``count`` fds do not fit a store of ``limit`` (None: they fit)."""
    if limit is None:
        return "the unit's FileDescriptorStoreMax= could not be read"
    if count > limit:
        return (f"the hand-over needs {count} fds and the unit's FileDescriptorStoreMax= is "
                f"{limit}; raise it (systemctl edit corral)")
    return None
