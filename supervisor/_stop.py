"""One stop per task: none -> requested(reason) -> signalled -> killed, only ever harder.

Who asks matters.  The first request fixes the reason.  After that:

- the caller's second request (``handle.stop()`` again, a second ``Batch.cancel()``, a second
  Ctrl-C) or any ``force=True`` request kills now: the rest of the grace is skipped;
- a stop the supervisor makes itself (time limit, fail-fast, shutdown) never escalates, and
  never turns the caller's *first* request into a kill: the caller keeps both requests.

A request after the task has ended changes nothing and says so.  The escalation itself (what is
sent when) lives in the task's driver (``_drive``); this module holds the state and the one
place that signals a subtree (``signal_tree``: by pidfd; by pid, checked again, only when
out of fds).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Collection, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from cgroupfs import Cgroup

from ._procfs import read_comm, read_pgrp, read_start
from ._result import ProcessInfo, StopReason, StopRecord

if TYPE_CHECKING:
    from ._clock import HandOverClock

__all__ = ["Signalled", "StopState", "signal_tree", "signal_tree_in_steps"]

log = logging.getLogger(__name__)


class StopState:
    """The stop state of one task.  Times are ``trio.current_time()`` values."""

    __slots__ = ("by_signal", "caller_requests", "kill_because", "killed_at", "landed", "level",
                 "reason", "requested_at", "signal", "signalled_at", "waker")

    def __init__(self, stop_signal: int) -> None:
        self.reason: StopReason | None = None
        self.by_signal: int | None = None  # the signal that made the first request, if one did
        self.level = "none"  # none, requested, signalled, killed, gone
        self.caller_requests = 0
        self.kill_because: str | None = None  # set once a kill is due: see StopRecord
        self.requested_at: float | None = None
        self.signalled_at: float | None = None
        self.killed_at: float | None = None
        self.landed = False  # the stop signal or the kill reached the main process alive
        self.signal = stop_signal
        # the scope the task is waiting in (driver or queue): a request cancels it
        self.waker: trio.CancelScope | None = None

    @property
    def kill_now(self) -> bool:
        """A kill is due before the grace ends (forced, or the caller asked twice)."""
        return self.kill_because is not None

    def request(self, reason: StopReason, *, by_caller: bool, force: bool = False,
                by_signal: int | None = None) -> bool:
        """Ask for a stop; True when this changed anything: a first request, a kill made due,
        or the caller's first request after the supervisor's own stop (it arms the next).

        ``by_caller``: the task's user asked (``stop()``, a cancelled scope, Ctrl-C), as
        opposed to the supervisor's own time limit, fail-fast or shutdown.  ``by_signal``: a
        signal to the program asked (SIGINT for a Ctrl-C, SIGTERM for ``kill``); the first
        request's is kept, for the record (and the exit status that follows from it).
        """
        if self.level == "gone" or self.kill_because is not None:
            return False  # ended, or nothing harder is left to ask for
        changed = False
        if self.reason is None:
            self.reason = reason
            self.by_signal = by_signal
            self.requested_at = trio.current_time()
            self.level = "requested"
            changed = True
        if by_caller:
            self.caller_requests += 1
            changed = True
        if force or self.caller_requests >= 2:
            self.kill_because = "force" if force else "second_request"
            changed = True
        if changed and self.waker is not None:
            self.waker.cancel()
        return changed

    def finish(self) -> None:
        """The task has ended: later requests change nothing."""
        self.level = "gone"

    def mark(self, level: str, *, main_alive: bool) -> None:
        """Record that a requested stop reached ``level`` (``signalled`` or ``killed``) now;
        ``main_alive``: the main process was still running, so the stop landed."""
        now = trio.current_time()
        if level == "signalled":
            self.signalled_at = self.signalled_at or now
        else:
            self.killed_at = self.killed_at or now
            self.kill_because = self.kill_because or "grace_expired"
        self.level = level
        self.landed = self.landed or main_alive

    def export(self, clock: HandOverClock) -> dict[str, Any]:
        """Everything of this stop but its waker, as a hand-over carries it (JSON)."""
        return {"reason": None if self.reason is None else str(self.reason),
                "by_signal": self.by_signal, "level": self.level,
                "caller_requests": self.caller_requests, "kill_because": self.kill_because,
                "requested_at": clock.out(self.requested_at),
                "signalled_at": clock.out(self.signalled_at),
                "killed_at": clock.out(self.killed_at), "landed": self.landed}

    def restore(self, s: dict[str, Any], clock: HandOverClock) -> None:
        """Take up where :meth:`export` left (``by_signal`` is missing from what an older
        corral exported)."""
        self.reason = None if s["reason"] is None else StopReason(s["reason"])
        self.by_signal = s.get("by_signal")
        self.level, self.caller_requests = s["level"], s["caller_requests"]
        self.kill_because, self.landed = s["kill_because"], s["landed"]
        self.requested_at = clock.back_or_none(s["requested_at"])
        self.signalled_at = clock.back_or_none(s["signalled_at"])
        self.killed_at = clock.back_or_none(s["killed_at"])

    def result(self, t0: float | None) -> StopRecord | None:
        """The result's view; times in seconds after ``t0`` (the spawn), None if not started."""
        if self.reason is None or self.requested_at is None:
            return None

        def after(t: float | None) -> float | None:
            return None if t is None or t0 is None else max(0.0, round(t - t0, 6))

        reached = ("killed" if self.killed_at is not None else
                   "signalled" if self.signalled_at is not None else "requested")
        return StopRecord(reason=self.reason, reached=reached, signal=self.signal,
                          requested_after_s=after(self.requested_at),
                          signalled_after_s=after(self.signalled_at),
                          killed_after_s=after(self.killed_at),
                          kill_because=self.kill_because if self.killed_at is not None else None,
                          landed=self.landed, requested_by=self.by_signal)


@dataclass(slots=True)
class Signalled:
    """One pass of :func:`signal_tree`: the processes listed (named as they were), and whether
    ``main_pid`` was among them."""

    processes: list[ProcessInfo]
    main_listed: bool


_CHUNK = 128  # pidfds held at once: far below RLIMIT_NOFILE's usual 1024
# signal_tree_in_steps': the daemon's fds are many (its connections'); the most pidfds one of
# its walks holds at once (public as ``supervisor.lowlevel.WALK_FDS``: the daemon bounds them)
WALK_FDS = 1024
_HEADROOM = 8  # pidfds given back when a pass's listing finds no fd left
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


def signal_tree(cg: Cgroup, signals: tuple[int, ...], main_pid: int | None = None,
                keep: dict[int, int] | None = None,
                skip: Collection[int] = (), *, pgrp: int | None = None) -> Signalled:
    """Send each of ``signals`` to every process in ``cg`` and its sub-cgroups (``pgrp``:
    of that process group only).

    Never by bare pid: listed pids are opened as pidfds (a chunk at a time), the subtree is
    listed again, and only pidfds whose pid is still listed get the signals.  A pidfd holds the
    process it was opened on: if that process died and its pid went to someone else in the
    meantime, the send reaches the dead one (a no-op), never the newcomer.  Anything that
    arrives meanwhile is caught by the next pass or by cgroup.kill.  ``keep`` (pid -> start
    time), if given, remembers each process signalled (the caller checks later whether it
    left the tree).  Pids in ``skip`` (signalled already) are left out, and so is our own
    process (a task that can write the tree may move it in).

    Out of fds (EMFILE: a supervisor holding many tasks, a task with thousands of processes),
    fewer pidfds are held at once (a listing that finds no fd left makes the pass give some
    back); with none to be had, a process is signalled by pid right after its start time is
    read again (the same pid and start time are the same process).
    """
    found = Signalled([], False)
    for _ in _walk(cg, signals, main_pid, keep, skip, found, names=True, pgrp=pgrp,
                   chunk=_CHUNK):
        pass
    return found


async def signal_tree_in_steps(cg: Cgroup, signals: tuple[int, ...], main_pid: int | None,
                               keep: dict[int, int] | None, *, pgrp: int | None = None,
                               pause: Callable[[int], Awaitable[None]] | None = None,
                               ) -> bool:
    """:func:`signal_tree` with a checkpoint after every :data:`_CHUNK` processes opened or
    signalled (the tree listed again once per :data:`WALK_FDS`: per 128, a tree of
    3,000 was listed 24 times a signal), the processes not named (no ``comm`` read);
    ``pgrp``: only the processes of that process group; ``pause(n)``: awaited instead of a
    bare checkpoint, between chunks and once at the end, ``n`` the processes opened since
    the last (a caller's pacing: the daemon's budget of processes a uid's signals reach).
    Whether ``main_pid`` was listed.  For a
    signal a caller asks for while the task runs (``TaskHandle.deliver_signal``): a tenant's
    task with thousands of processes and a flood of such signals made each one a step of the
    event loop of 10-20 ms (a /proc read or two per process, the tree listed again per
    chunk), and with two such tenants every other tenant's request waited ~0.7 s (an
    independent attack).  A checkpoint is not a cancellation point here: a signal is sent to
    the whole tree or the caller's cancellation waits for it (it is bounded by the tree)."""
    found = Signalled([], False)
    walk = _walk(cg, signals, main_pid, keep, (), found, names=False, pgrp=pgrp,
                 chunk=WALK_FDS)
    with contextlib.closing(walk), trio.CancelScope(shield=True):
        for opened in walk:
            await (trio.lowlevel.checkpoint() if pause is None else pause(opened))
    return found.main_listed


def _walk(cg: Cgroup, signals: tuple[int, ...], main_pid: int | None,
          keep: dict[int, int] | None, skip: Collection[int], found: Signalled, *,
          names: bool, pgrp: int | None, chunk: int) -> Generator[int, None, None]:
    """:func:`signal_tree`'s pass, into ``found``: ``chunk`` pidfds opened, the tree listed
    again, those still in it signalled, closed, and again; yields after every
    :data:`_CHUNK` pidfds opened or signalled, after each chunk and at the end (if it
    opened any since), how many it opened since it last did.  ``names``: each process's
    ``comm`` in ``found.processes``."""
    ours = os.getpid()
    listed = [pid for pids in cg.procs_tree().values() for pid in pids
              if pid not in skip and pid != ours]
    found.main_listed = main_pid is not None and main_pid in listed
    opened = 0
    while listed:
        fds: dict[int, int] = {}
        try:
            while listed and len(fds) < chunk:
                got, listed, out = _open_pidfds(listed, min(_CHUNK, chunk - len(fds)))
                fds.update(got)
                opened += len(got)
                if out:
                    break  # (the listing that follows gives some back: _give_back)
                if listed and len(fds) < chunk:
                    yield opened
                    opened = 0
            while True:
                try:
                    still = {pid for pids in cg.procs_tree().values() for pid in pids}
                    break
                except OSError as e:
                    back = _give_back(fds) if e.errno in _OUT_OF_FDS else None
                    if back is None:
                        raise
                    listed = back + listed
            for n, (pid, pidfd) in enumerate(fds.items()):
                if n and not n % _CHUNK:
                    yield opened
                    opened = 0
                if pid in still and (pgrp is None or read_pgrp(pid) == pgrp):
                    _signal_one(pid, pidfd, signals, found, keep, names)
        finally:
            for pidfd in fds.values():
                if pidfd >= 0:
                    os.close(pidfd)
        if listed:
            yield opened
            opened = 0
    if opened:
        yield opened


def _signal_one(pid: int, pidfd: int, signals: tuple[int, ...], found: Signalled,
                keep: dict[int, int] | None, names: bool) -> None:
    start = None
    if pidfd < 0 or (keep is not None and pid not in keep):
        start = read_start(pid)
        if start is None:
            return  # gone
        if keep is not None and pid not in keep:
            keep[pid] = start
    if names:
        found.processes.append(ProcessInfo(pid, read_comm(pid)))
    for sig in signals:
        try:
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, sig)
            elif read_start(pid) == start:  # no pidfd to be had: by pid, checked again
                os.kill(pid, sig)
        except ProcessLookupError:
            break


def _give_back(fds: dict[int, int]) -> list[int] | None:
    """The listing found no fd left (the chunk took the last ones): close up to
    ``_HEADROOM`` pidfds, the last held one turned into a by-pid send (-1), so that every pass
    still signals one process; the pids given back, to try again (None: none was held)."""
    held = [pid for pid, fd in fds.items() if fd >= 0]
    if not held:
        return None
    if len(held) == 1:
        os.close(fds[held[0]])
        fds[held[0]] = -1
        return []
    back = held[max(1, len(held) - _HEADROOM):]
    for pid in back:
        os.close(fds.pop(pid))
    return back


def _open_pidfds(pids: list[int], size: int) -> tuple[dict[int, int], list[int], bool]:
    """Pidfds of up to ``size`` of ``pids`` (those gone are left out), the pids not tried
    yet, and whether the fds ran out.  Out of fds, the chunk ends where the fds did; if not
    even one could be opened, the first pid comes as -1: signal it by pid."""
    fds: dict[int, int] = {}
    for i, pid in enumerate(pids[:size]):
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except OSError as e:
            if e.errno not in _OUT_OF_FDS:
                raise
            if not fds:
                fds[pid] = -1
                return fds, pids[i + 1:], True
            return fds, pids[i:], True
    return fds, pids[size:], False
