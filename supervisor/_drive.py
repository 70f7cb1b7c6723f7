"""A running task's driver: its main process, its leaf and its stop, as named states.

::

    RUNNING --stop requested, or the main exited leaving processes--> TERM
    TERM    --grace over, or a kill made due------------------------> KILL
    any     --the main has exited and the leaf (with its subtree) is empty--> DONE

Each state is entered by one function (``_enter_*``) that sends what that state sends and arms
exactly one deadline; the loop (:meth:`Driver.run`) only waits and dispatches.  It waits for one
thing at a time: the main process's pidfd while it lives, then the leaf emptying (inotify), with
the state's deadline, and a waker scope that a stop request (or a pause) cancels.

- RUNNING: deadline = the time limit or the idle timeout, whichever comes first; neither runs
  while the task is paused (the time limit counts running time, not paused time).  Reaching
  one is the supervisor's own stop request (``time_limit``, ``idle``).
- TERM: the stop signal (and SIGCONT, so a stopped process sees it) to every process of the
  subtree, and to the main process through its pidfd wherever it went; deadline = the grace's
  end (or the next repeat of the stop signal).  A TERM without a stop request is the cleanup of
  what the main process left behind: same steps, no stop record.
- KILL: a snapshot of what is there (frozen first), then ``cgroup.kill`` (and SIGKILL to an
  escaped main process's pidfd); deadline = a bound after which the cleanup is reported
  incomplete.

The caller's cancellation is a graceful stop request (by the caller); the waits after it are
shielded, and the ``Cancelled`` is kept in :attr:`Driver.pending` for the task's life to raise
once the task has its record.  KeyboardInterrupt never arrives here: trio delivers it to the main
task only, and a task's life never runs in it; a cancellation that a KeyboardInterrupt caused
is said so (``on_cancelled``: the supervisor then takes the next Ctrl-C, ``_interrupt.py``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

import trio

from cgroupfs import Cgroup, CgroupError, CgroupNotFound
from cgroupfs._record import record

from ._interrupt import from_ctrl_c
from ._main import Exit, MainProcess
from ._result import KillSnapshot, StopReason
from ._sample import Sampled, Series, sample
from ._snapshot import take_snapshot
from ._stop import StopState, signal_tree, signal_tree_in_steps
from ._tracking import Tracker, leave_leaf
from ._watch import CgroupWatcher

if TYPE_CHECKING:
    from ._clock import HandOverClock

__all__ = ["DONE", "KILL", "RUNNING", "TERM", "Driver", "Terms", "terms"]

log = logging.getLogger(__name__)

RUNNING, TERM, KILL, DONE = "running", "term", "kill", "done"
KILL_TIMEOUT = 30.0  # after cgroup.kill: how long before we call the cleanup incomplete


@record
class Terms:
    """What the spec and the supervisor say about one running task."""

    time_limit: float | None
    grace: float
    repeat: float | None
    idle: float | None
    controllers: frozenset[str]


@functools.lru_cache(maxsize=256)
def terms(time_limit: float | None, grace: float, repeat: float | None, idle: float | None,
          controllers: frozenset[str]) -> Terms:
    """Terms, shared by every task told the same (most tasks of a supervisor are)."""
    return Terms(time_limit, grace, repeat, idle, controllers)


class Driver(Sampled):
    """Drives one spawned task from RUNNING to DONE; what it found stays on it for the record.

    ``activity()`` says when the task last printed (trio time), for the idle timeout."""

    __slots__ = ("activity", "deadline", "detaching", "exit", "exited", "exited_at",
                 "grace_end", "killed_tree", "leaf", "main", "notes", "on_cancelled",
                 "paused_at", "paused_s", "pending", "phase", "problems", "repeat_at",
                 "resumed_at", "series", "signalled_tree", "snapshot", "stop", "t0", "terms",
                 "tracker", "watcher")

    def __init__(self, leaf: Cgroup, main: MainProcess, stop: StopState,
                 watcher: CgroupWatcher, terms: Terms, *, t0: float, leaf_view: str | None,
                 activity: Callable[[], float],
                 on_cancelled: Callable[[trio.Cancelled], None] = lambda exc: None) -> None:
        self.leaf, self.main, self.stop, self.watcher = leaf, main, stop, watcher
        self.terms, self.t0, self.activity = terms, t0, activity
        self.on_cancelled = on_cancelled  # the caller's cancellation came (see run())
        # ``leaf_view``: the leaf as /proc/PID/cgroup names it (None: unknown here)
        self.tracker = Tracker(leaf, main.pid, leaf_view)
        self.paused_at: float | None = None
        self.paused_s = 0.0
        self.resumed_at = t0
        self._enter(RUNNING, self.running_deadline())
        self.grace_end = self.repeat_at = math.inf
        self.exited = False  # the main process has exited
        self.exit: Exit | None = None  # how (None: not known, or not yet for an adopted one)
        self.exited_at = 0.0
        self.detaching = False  # hand_over(): stop driving, leave the task running
        self.problems: tuple[str, ...] = ()  # (tuples: most tasks never have any)
        self.notes: tuple[str, ...] = ()
        self.signalled_tree = self.killed_tree = False
        self.series: Series | None = None
        self.snapshot: KillSnapshot | None = None
        self.pending: trio.Cancelled | None = None

    def _enter(self, phase: str, deadline: float) -> None:
        """The one way into a state: its name and the one deadline it arms."""
        self.phase, self.deadline = phase, deadline

    # ---- a hand-over -------------------------------------------------------------------------

    def export(self, clock: HandOverClock) -> dict[str, Any]:
        """Where this driver is, as a hand-over carries it (JSON; times on the monotonic
        clock); its tracker's part included."""
        return {"phase": self.phase, "grace_end": clock.out(self.grace_end),
                "repeat_at": clock.out(self.repeat_at),
                "kill_by": clock.out(self.deadline) if self.phase == KILL else None,
                "paused_at": clock.out(self.paused_at), "paused_s": self.paused_s,
                "resumed_at": clock.out(self.resumed_at), "exited": self.exited,
                "exit": None if self.exit is None else [self.exit.code, self.exit.signal],
                "exited_at": clock.out(self.exited_at) if self.exited else None,
                "signalled_tree": self.signalled_tree, "killed_tree": self.killed_tree,
                "notes": list(self.notes), "problems": list(self.problems),
                "series": None if self.series is None else self.series.to_dict(),
                **self.tracker.export()}

    def restore(self, s: dict[str, Any], clock: HandOverClock) -> None:
        """Take up where :meth:`export` left, in another supervisor process."""
        self.grace_end, self.repeat_at = clock.back(s["grace_end"]), clock.back(s["repeat_at"])
        self.paused_s, self.resumed_at = s["paused_s"], clock.back(s["resumed_at"])
        self.paused_at = clock.back_or_none(s["paused_at"])
        self.exited = s["exited"]
        self.exit = None if s["exit"] is None else Exit(*s["exit"])
        self.exited_at = clock.back(s["exited_at"]) if s["exited_at"] is not None else 0.0
        self.signalled_tree, self.killed_tree = s["signalled_tree"], s["killed_tree"]
        self.notes, self.problems = tuple(s["notes"]), tuple(s["problems"])
        self.tracker.restore(s)
        self.series = None if s["series"] is None else Series.restore(s["series"])
        if s["phase"] == KILL:
            self._enter(KILL, clock.back(s["kill_by"]))
        else:
            # step at once, before the first wait: a stop asked for just before the hand-over
            # (exported still RUNNING), or of this process before the life first ran (no
            # waker to cancel yet), is acted on now; the step sets the real deadline.  (A
            # task exported DONE was finishing: its leaf is looked at again.)
            self._enter(TERM if s["phase"] == DONE else s["phase"], -math.inf)

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Drive to DONE.  Raises only for our own bugs (the caller kills the leaf then)."""
        try:
            # A stop request can have come while the spawn ran in a worker thread (otherwise
            # it had no checkpoint); a deadline cannot have passed, an exit shows on the pidfd
            if self.stop.reason is not None:
                self._step(trio.current_time())
            while self.phase != DONE:
                # One wait at a time (written out here, not in a helper coroutine: every
                # frame a held task waits in costs memory): the main process while it lives,
                # then the leaf emptying; the deadline; the waker a stop request cancels.
                try:
                    with trio.CancelScope(deadline=self.deadline,
                                          shield=self.pending is not None) as waker:
                        self.stop.waker = waker
                        if not self.exited:
                            await trio.lowlevel.wait_readable(self.main.pidfd)
                        else:
                            await self.watcher.wait_empty(self.leaf)
                except trio.Cancelled as exc:
                    # the caller's scope: a graceful stop now, the Cancelled once the record
                    # exists (a Ctrl-C's, if a KeyboardInterrupt cancelled it: _interrupt.py)
                    self.pending = exc
                    self.stop.request(StopReason.CANCEL, by_caller=True,
                                      by_signal=signal.SIGINT if from_ctrl_c(exc) else None)
                    self.on_cancelled(exc)
                finally:
                    self.stop.waker = None
                if self.detaching:
                    return  # handed over: the task runs on, another supervisor drives it
                self._step(trio.current_time())
            self.tracker.check_seen()
        finally:
            if not self.detaching:
                self.stop.finish()

    def _step(self, now: float) -> None:
        """What happened since the last wait, then the current state's rule."""
        populated = None  # (what _on_main_exit read last, if nothing has been sent since)
        if not self.exited and self.main.has_exited():
            populated = self._on_main_exit(now)
        if self.exited and not (self._populated() if populated is None else populated):
            self._enter(DONE, math.inf)
        elif self.phase == RUNNING:
            self._step_running(now)
        elif self.phase == TERM:
            self._step_term(now)
        elif self.phase == KILL and now >= self.deadline:
            self._step_kill_overdue()

    def _step_running(self, now: float) -> None:
        if not self.exited and self.stop.reason is None and self.paused_at is None:
            limit = self.terms.time_limit
            if limit is not None and now >= self.t0 + self.paused_s + limit:
                self.stop.request(StopReason.TIME_LIMIT, by_caller=False)
            elif self.terms.idle is not None and now >= self._idle_at():
                self.stop.request(StopReason.IDLE, by_caller=False)
        if self.stop.reason is not None or self.exited:
            self._enter_term(now)
        else:
            self._enter(RUNNING, self.running_deadline())

    def _step_term(self, now: float) -> None:
        if self.stop.kill_now or now >= self.grace_end:
            self._enter_kill(now)
            return
        if now >= self.repeat_at:
            self._send((self.stop.signal, signal.SIGCONT))
            self.repeat_at = now + (self.terms.repeat or math.inf)
        self._enter(TERM, min(self.grace_end, self.repeat_at))

    def _step_kill_overdue(self) -> None:
        self.problems += (f"the leaf did not empty within {KILL_TIMEOUT:.0f}s of cgroup.kill",)
        # the main process itself may be stuck (D state): keep waiting for it
        self._enter(DONE if self.exited else KILL, math.inf)

    def running_deadline(self) -> float:
        if self.paused_at is not None:
            return math.inf  # neither clock runs while paused
        deadline = math.inf
        if self.terms.time_limit is not None:
            deadline = self.t0 + self.paused_s + self.terms.time_limit
        if self.terms.idle is not None:
            deadline = min(deadline, self._idle_at())
        return deadline

    def _idle_at(self) -> float:
        assert self.terms.idle is not None
        return max(self.activity(), self.resumed_at) + self.terms.idle

    # ---- the states ------------------------------------------------------------------------

    def _enter_term(self, now: float) -> None:
        """The stop signal to the subtree (a stop, or the cleanup of leftovers)."""
        if self.terms.grace <= 0 or self.stop.kill_now:
            self._enter_kill(now)
            return
        main_alive = self._main_alive()
        self._leave_running(now)
        self._send((self.stop.signal, signal.SIGCONT))
        if self.stop.reason is not None:
            self.stop.mark("signalled", main_alive=main_alive)
        self.signalled_tree = True
        self.grace_end = now + self.terms.grace
        self.repeat_at = now + self.terms.repeat if self.terms.repeat else math.inf
        self._enter(TERM, min(self.grace_end, self.repeat_at))

    def _enter_kill(self, now: float) -> None:
        """A snapshot of what is there, then cgroup.kill; SIGKILL to the main process's
        pidfd if it left its leaf."""
        main_alive = self._main_alive()
        self._leave_running(now)
        self._thaw()
        stuck = self._evict_self()
        if self.exited:
            self.tracker.record_leftovers()  # what appeared since, named as it is now
        if stuck:  # (no freeze, no cgroup.kill: both would reach us)
            signal_tree(self.leaf, (signal.SIGKILL,))
        else:
            self.snapshot = self.snapshot or take_snapshot(self.leaf, now - self.t0)
            try:
                self.leaf.kill()  # (frozen by the snapshot: SIGKILL needs no thaw)
            except CgroupNotFound:
                pass  # the leaf itself was removed: nothing in it to kill
            self.watcher.expect_late(self.leaf)  # (the freeze's notifications delay its end's)
        if main_alive and self.main.pid in self.tracker.escaped:
            self.main.signal(signal.SIGKILL)
        if self.stop.reason is not None:
            if self.terms.grace <= 0 and self.stop.kill_because is None:
                self.stop.kill_because = "no_grace"
            self.stop.mark("killed", main_alive=main_alive)
        self.killed_tree = True
        self._enter(KILL, now + KILL_TIMEOUT)

    def _leave_running(self, now: float) -> None:
        if self.phase == RUNNING:
            self._end_pause(now)

    # ---- what the states do ------------------------------------------------------------------

    def _send(self, signals: tuple[int, ...], skip: Collection[int] = ()) -> None:
        """``signals`` to every process of the subtree (but ``skip``), and to the main process
        wherever it is; after the main's exit, what is found is recorded as leftovers (named
        as now)."""
        self._thaw()
        self._evict_self()
        try:
            found = signal_tree(self.leaf, signals, self.main.pid, self.tracker.keep(), skip)
        except CgroupNotFound:
            return
        if not self.exited and not found.main_listed and self._main_alive():
            self.tracker.main_escaped()
            for sig in signals:
                self.main.signal(sig)
        if self.exited:
            for p in found.processes:
                self.tracker.leftovers[p.pid] = p

    def _evict_self(self) -> bool:
        """If a task moved corral's own process into the leaf, move it back (and say so);
        True if it is still inside."""
        note, stuck = leave_leaf(self.leaf, self.tracker.leaf_view)
        if note is not None and note not in self.notes:
            self.notes += (note,)
        return stuck

    def _thaw(self) -> None:
        """A task may freeze its own leaf (or a sub-cgroup): thaw it so signals land."""
        try:
            thawed = self.leaf.thaw_tree()
        except CgroupError:
            return
        if thawed:
            where = ", ".join(os.path.join(self.leaf.path, r) if r != "." else self.leaf.path
                              for r in thawed)
            self.notes += (f"the task had frozen {where}; corral thawed it to stop it",)

    def _on_main_exit(self, now: float) -> bool | None:
        """The main process has exited: reap it, and deal with what it left behind.  Returns
        whether the subtree was populated when last read, if nothing was sent since (None:
        read it again)."""
        if not self.main.adopted:
            # before the reap: a zombie keeps its cgroup
            self.tracker.main_exiting(self.main.cgroup_id())
        self.exit = self.main.reap()
        self.exited, self.exited_at = True, now
        self._leave_running(now)
        killed = (self.exit is not None and self.exit.signal == signal.SIGKILL
                  and self.killed_tree)
        self.tracker.main_ended(killed)
        if self.phase == KILL:
            return None  # (what is still listed is dying with the main process, not left
            # behind by it)
        if not self._populated():
            return False
        if not self._evict_self() and not self._populated():
            return False  # corral itself, moved in by the task, is no leftover
        if self.phase == TERM:
            # a process forked after the stop signal went out has not had it yet
            self._send((self.stop.signal, signal.SIGCONT), skip=frozenset(self.tracker.seen))
        self.tracker.record_leftovers()
        return None

    # ---- pause, resume, sample: called from outside the loop ------------------------------

    def signal(self, sig: int, pgrp: int | None = None) -> None:
        """``sig`` to every process of the task's tree, and to the main process wherever it
        is (a signal verb's: no stop, no SIGCONT); ``pgrp``: to that process group's
        processes of the tree only."""
        try:
            listed = signal_tree(self.leaf, (sig,), self.main.pid, self.tracker.keep(),
                                 pgrp=pgrp).main_listed
        except CgroupNotFound:
            listed = False
        self._signal_main_elsewhere(sig, pgrp, listed)

    async def signal_in_steps(self, sig: int, pgrp: int | None = None,
                              pause: Callable[[int], Awaitable[None]] | None = None) -> None:
        """:meth:`signal`, the tree walked in steps (``signal_tree_in_steps``)."""
        try:
            listed = await signal_tree_in_steps(self.leaf, (sig,), self.main.pid,
                                                self.tracker.keep(), pgrp=pgrp, pause=pause)
        except CgroupNotFound:
            listed = False
        self._signal_main_elsewhere(sig, pgrp, listed)

    def _signal_main_elsewhere(self, sig: int, pgrp: int | None, listed: bool) -> None:
        if pgrp is None and not listed and self._main_alive():
            self.main.signal(sig)

    def pause(self) -> bool:
        """Freeze the task (cgroup.freeze); False unless it is running and not paused."""
        if self.phase != RUNNING or self.exited or self.paused_at is not None:
            return False
        if self._evict_self():
            return False  # corral itself is stuck in the leaf: freezing it would freeze us
        self.leaf.freeze()
        self.paused_at = trio.current_time()
        self._wake()
        return True

    def resume(self) -> bool:
        """Thaw a paused task; False if it was not paused (by :meth:`pause`)."""
        if self.paused_at is None:
            return False
        self.leaf.thaw()
        self._end_pause(trio.current_time())
        self._wake()
        return True

    def _end_pause(self, now: float) -> None:
        """The pause is over (resume, or a stop: the stop thaws the leaf itself)."""
        if self.paused_at is not None:
            self.paused_s += now - self.paused_at
            self.paused_at = None
            self.resumed_at = now
            try:
                self.leaf.thaw()
            except CgroupNotFound:
                pass

    def _wake(self) -> None:
        if self.stop.waker is not None:
            self.stop.waker.cancel()

    def sample(self, now: float) -> None:
        """One reading of the leaf's usage; each process seen in it is remembered (by pid and
        start time)."""
        if self.phase == DONE:
            return
        cpu, memory, pids, io = sample(self.leaf, self.terms.controllers)
        now = trio.current_time()  # after the reads: a rate never runs ahead of its time
        if self.series is None:
            self.series = Series()
        self.series.add(round(now - self.t0, 3), cpu, memory, pids, io)
        self.tracker.note(self.leaf.procs())

    # ---- small reads ---------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Past running: the main process exited, or a stop began (the public "stopping")."""
        return self.exited or self.phase != RUNNING

    def detach(self) -> bool:
        """Stop driving (hand_over()): the loop returns at once, the task goes on running.
        False once the task is done (it is finishing: its record comes here)."""
        if self.phase == DONE:
            return False
        self.detaching = True
        self._wake()
        return True

    def _main_alive(self) -> bool:
        return not self.exited and not self.main.has_exited()

    def _populated(self) -> bool:
        try:
            return self.leaf.is_populated()
        except CgroupNotFound:
            return False
