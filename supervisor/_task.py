"""A task: what the life works on (:class:`Task`), what users hold (:class:`TaskHandle`).

A :class:`Task` is the supervisor's internal state of one accepted task: its spec and limit,
its stop, its captures and stdio once it runs, its driver while it runs, its one final record.
The life (``_life.py``) and the hand-over (``_handover.py``) work on it; the supervisor holds
the Tasks.  Users hold the :class:`TaskHandle` facade, whose methods are the public verbs.

:func:`record` writes the one final record: exactly once, whatever happens (a second call is
an InternalError).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from cgroupfs import Cgroup
from cgroupfs._record import record

from ._capture import StreamCapture, Tap
from ._drive import DONE, KILL, RUNNING, TERM, Driver
from ._ending import Ending, result_of
from ._errors import InternalError, SpecError, SupervisorError
from ._guard import SpawnGuard
from ._output import IoReactor, Latch, StdinFeed, Stream
from ._result import (
    Outcome,
    SignalSent,
    StopReason,
    StreamOutput,
    TaskResult,
)
from ._sample import Sampler
from ._spec import TaskSpec
from ._stdio import TaskIo, set_window_size
from ._stop import StopState
from ._watch import CgroupWatcher

__all__ = ["DRIVEN", "FINISHED", "HANDED_OVER", "PUBLIC_STATE", "QUEUED", "STARTING",
           "HandedOver", "Incident", "Runtime", "Task", "TaskHandle", "final_result",
           "finish", "finish_unstarted", "group_dir", "request_stop"]


def group_dir(group: str) -> str:
    """The directory of a group's cgroup in the supervisor's root (``@NAME``)."""
    return "@" + group


_TIOCSIG = 0x40045436  # _IOW('T', 0x36, int): signal the terminal's foreground process group
# what TIOCSIG sends (the kernel's pty_signal: a terminal's keys); any other signal to a tty
# task goes to the foreground process group's processes of its tree (it answered EINVAL: a
# 500 for HUP, TERM, USR1, USR2, WINCH and CONT, and a traceback in the log each: an attack)
_TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP})


class HandedOver(SupervisorError):
    """The task was handed over to another supervisor process (``hand_over()``): this one
    will never record it; the next one does."""


@record
class Incident:
    """Something done to the supervisor's own cgroups while tasks ran (e.g. a freeze)."""

    at: float  # trio time
    text: str


SPAWN_SLOTS = 2  # worker threads spawning children of one uid at once


@dataclass(slots=True)
class Runtime:
    """What a task's life needs of its supervisor, and nothing more."""

    root: Cgroup  # leaves go here
    controllers: frozenset[str]
    watcher: CgroupWatcher
    reactor: IoReactor
    guard: SpawnGuard
    root_view: str | None  # the root as /proc/PID/cgroup shows it (None: unknown)
    sampler: Sampler
    on_record: Callable[[TaskResult], None]
    on_end: Callable[[Task], None]
    # hand_over(): takes what a detached task holds (task, leaf, main, driver, spawn info)
    on_detach: Callable[..., None] = lambda *args: None
    # the caller's cancellation reached a running task's driver (a Ctrl-C's, perhaps)
    on_cancelled: Callable[[Task, trio.Cancelled], None] = lambda *args: None
    # worker threads spawning children of each uid (see _life._spawn)
    _spawning_as: dict[int, trio.Semaphore] = field(default_factory=dict)
    # the groups' cgroups (``Supervisor.start(group=...)``), made at their first task's start
    groups: dict[str, Cgroup] = field(default_factory=dict)

    def parent_of(self, group: str | None) -> Cgroup:
        """Where the leaf of a task of ``group`` goes: the root, or the group's cgroup in it
        (``@NAME``: no task id has an ``@``), made with the root's controllers enabled for
        its leaves; kept open for the supervisor's life (one fd a group)."""
        if group is None:
            return self.root
        cgroup = self.groups.get(group)
        if cgroup is None:
            cgroup = self.root.make_child(group_dir(group), exist_ok=True)
            try:
                wanted = self.root.enabled_controllers() - cgroup.enabled_controllers()
                if wanted:
                    cgroup.enable_controllers(wanted)
            except BaseException:
                cgroup.close()
                raise
            self.groups[group] = cgroup
        return cgroup

    @contextlib.asynccontextmanager
    async def spawn_slots(self, uid: int) -> AsyncIterator[None]:
        """One of ``SPAWN_SLOTS`` places to spawn a child that takes ``uid`` in a worker
        thread (its wait may be long: a stop, a slow PATH, until the guard ends it)."""
        slots = self._spawning_as.setdefault(uid, trio.Semaphore(SPAWN_SLOTS))
        try:
            async with slots:
                yield
        finally:
            if slots.value == SPAWN_SLOTS and not slots.statistics().tasks_waiting:
                self._spawning_as.pop(uid, None)
    incidents: list[Incident] = field(default_factory=list)


# Where a task's life is (``Task.stage``); while it is DRIVEN, its driver's state says more.
QUEUED, STARTING, DRIVEN, FINISHED, HANDED_OVER = (
    "queued", "starting", "driven", "finished", "handed over")

# The state users see, from where the life is (as systemd's state_translation_table maps a
# unit's own states to the few everyone sees): nothing else keeps it.
PUBLIC_STATE = {QUEUED: "queued", STARTING: "starting", RUNNING: "running", TERM: "stopping",
                KILL: "stopping", DONE: "stopping", FINISHED: "finished",
                HANDED_OVER: "handed over"}


class Task:
    """One accepted task, as the supervisor knows it (internal; users hold ``handle``)."""

    __slots__ = ("began", "cgroup", "created_at", "done", "driver", "group", "handed_over", "id",
                 "io", "notes", "pid", "result", "rt", "signals", "signals_omitted", "spec",
                 "stage", "stderr", "stdout", "stop", "taps", "time_limit")

    def __init__(self, rt: Runtime, task_id: str, spec: TaskSpec, time_limit: float | None,
                 notes: tuple[str, ...]) -> None:
        self.rt = rt
        self.id = task_id
        self.spec = spec
        self.time_limit = time_limit
        self.pid: int | None = None
        self.cgroup: str | None = None
        self.stage = QUEUED  # (set by the life: _life.py, _handover.py, finish())
        self.notes = notes  # () for most: shared, costs nothing per task
        self.stop = StopState(int(spec.stop_signal))
        self.done = Latch()
        self.result: TaskResult | None = None
        self.handed_over = False
        self.created_at = time.time()
        self.stdout: StreamCapture | None = None
        self.stderr: StreamCapture | None = None
        self.io: TaskIo | None = None
        self.driver: Driver | None = None
        self.began = False  # the life has run (start() hands out a coroutine that might not)
        self.taps: tuple[str, ...] = ()  # streams tapped from the spawn on (start(taps=...))
        self.group: str | None = None  # its leaf's group in the root (start(group=...))
        # sent by TaskHandle.signal(), for the record: the first and the last KEPT_SIGNALS,
        # and how many between them were not kept (keep_signal)
        self.signals: list[SignalSent] = []
        self.signals_omitted = 0

    @property
    def handle(self) -> TaskHandle:
        """A handle on this task (handles of one task compare equal).  Made at each ask, not
        kept: a task that kept its handle, which keeps the task, was a cycle, freed only by
        the cyclic collector, with its command and output: each a daemon's finished task
        held until then (tens of them, 4.7 MiB each for a command of 65,000 arguments)."""
        return TaskHandle(self)

    def capture(self, stream: str) -> StreamCapture | None:
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be \"stdout\" or \"stderr\", got {stream!r}")
        return self.stdout if stream == "stdout" else self.stderr

    def last_output(self) -> float:
        """When the task last printed (trio time), for the idle timeout."""
        return max(self.stdout.last_at if self.stdout else 0.0,
                   self.stderr.last_at if self.stderr else 0.0)

    @property
    def phase(self) -> str:
        """Where the life is: its stage, or its driver's state while it is driven (the main
        process gone counts as past RUNNING)."""
        d = self.driver
        if self.stage != DRIVEN or d is None:
            return self.stage
        return TERM if d.phase == RUNNING and d.exited else d.phase

    @property
    def state(self) -> str:
        """The public state: ``queued starting running stopping finished`` (or ``handed
        over``), from :data:`PUBLIC_STATE`."""
        return PUBLIC_STATE[self.phase]

    def feed(self) -> tuple[StdinFeed, Stream]:
        if self.spec.stdin != "pipe" and not self.spec.tty:
            raise SpecError("stdin", f"task {self.id} was not started with stdin=\"pipe\" (or "
                                     f"tty=True): its stdin cannot be written")
        io = self.io
        if io is None or io.feed is None or io.feed_stream is None:
            raise BrokenPipeError(errno.EPIPE, f"task {self.id}: it is not running")
        return io.feed, io.feed_stream


class TaskHandle:
    """A task started by a supervisor.

    ``id`` is never reused; ``pid`` is the main process's pid once it runs (for display: every
    signal goes through pidfds); ``cgroup`` the leaf's path once it exists; ``state`` one of
    ``queued starting running stopping finished``.  ``stop()`` asks for a graceful stop and
    ``stop(force=True)`` a kill; ``wait()`` returns the final :class:`TaskResult`, the same
    one every time.
    """

    __slots__ = ("_t",)

    def __init__(self, task: Task) -> None:
        self._t = task

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskHandle) and other._t is self._t

    def __hash__(self) -> int:
        return id(self._t)

    def __repr__(self) -> str:
        t = self._t
        return f"<TaskHandle {t.id} {t.state} pid={t.pid} argv={list(t.spec.argv)}>"

    @property
    def id(self) -> str:
        return self._t.id

    @property
    def spec(self) -> TaskSpec:
        return self._t.spec

    @property
    def time_limit(self) -> float | None:
        """The time limit that applies (after the supervisor's ceiling), in seconds."""
        return self._t.time_limit

    @property
    def pid(self) -> int | None:
        return self._t.pid

    @property
    def cgroup(self) -> str | None:
        return self._t.cgroup

    @property
    def state(self) -> str:
        return self._t.state

    def own_output(self, owner: int) -> None:
        """Its output pipes are ``owner``'s: the supervisor reads them at the pace its
        :meth:`Supervisor.pace_output` hooks give ``owner`` (a daemon's per-uid share)."""
        io = self._t.io
        if io is not None:
            feed = [] if io.feed_stream is None else [io.feed_stream]  # (a terminal's keys)
            self._t.rt.reactor.own([*io.streams, *feed], owner)

    def stop(self, *, force: bool = False, by_signal: int | None = None) -> bool:
        """Ask the task to stop: gracefully, or with ``force=True`` kill now.

        A second call kills now (skips the rest of the grace), also after a stop the
        supervisor made itself (time limit, shutdown).  On a task that has already ended this
        is a no-op; the return value says whether the request changed anything.
        ``by_signal``: the signal to this program that asks (a program that turns its own
        SIGINT or SIGTERM into a stop, as ``corral run`` does): the record says so
        (``stop.requested_by``), and the exit status follows it.
        """
        return request_stop(self._t, StopReason.CANCEL, by_caller=True, force=force,
                            by_signal=by_signal)

    async def wait(self) -> TaskResult:
        """Wait for the final record (returns at once once there is one).  HandedOver if the
        task went to another supervisor process (``hand_over()``).

        Ctrl-C meanwhile (trio's KeyboardInterrupt, in the main task): the first stops the
        task gracefully, a second kills it now, and one KeyboardInterrupt is raised once the
        record exists (see ``_interrupt.py``)."""
        from ._interrupt import Interrupts

        interrupts = Interrupts()
        while not self._t.done.is_set():
            try:
                with trio.CancelScope(shield=interrupts.first is not None):
                    await self._t.done.wait()
            except KeyboardInterrupt as exc:
                interrupts.caught(exc, [self._t])
        interrupts.reraise()
        return final_result(self._t)

    @property
    def result(self) -> TaskResult | None:
        """The final record, or ``None`` while the task is not finished."""
        return self._t.result

    @property
    def signals(self) -> tuple[SignalSent, ...]:
        """The signals sent to it so far (:meth:`signal`), as its record will list them (the
        first and the last 32: :func:`keep_signal`)."""
        return tuple(self._t.signals)

    @property
    def signals_omitted(self) -> int:
        """How many signals sent to it are not listed in :attr:`signals` (between its first
        and last 32)."""
        return self._t.signals_omitted

    @property
    def stop_requested(self) -> StopReason | None:
        """Why the task is being stopped (the first request's reason), or None."""
        return self._t.stop.reason

    @property
    def stop_level(self) -> str:
        """How far its stop has gone: ``none``, ``requested``, ``signalled``, ``killed``, or
        ``gone`` once the task has ended."""
        return self._t.stop.level

    def output(self, stream: str = "stdout") -> StreamOutput:
        """What is kept of ``stream`` so far (head, tail, counts); empty before the spawn."""
        cap = self._t.capture(stream)
        return StreamOutput() if cap is None else cap.result()

    def subscribe(self, stream: str = "stdout") -> trio.MemoryReceiveChannel[bytes]:
        """``stream`` as kept so far (head, then tail), then live; the channel closes at the
        end of output.  A subscriber that falls behind misses chunks (counted) rather than
        growing memory; for every byte with back-pressure, use :meth:`tap`.
        """
        cap = self._t.capture(stream)
        if cap is None:
            send, recv = trio.open_memory_channel[bytes](0)
            send.close()  # nothing to stream (not started, or never will be)
            return recv
        return cap.subscribe()

    def on_output(self, stream: str, watcher: Callable[[], None]) -> Callable[[], None]:
        """``watcher()`` at each chunk of ``stream`` and at its end, with no bytes (a reader
        of the task's ``log_file``: nothing is held in memory for it, and bytes past the
        head may still pass by unread); at once if there is no such stream or it has ended.
        Returns what stops it."""
        cap = self._t.capture(stream)
        if cap is None:
            watcher()
            return lambda: None
        return cap.watch(watcher)

    def tap(self, stream: str = "stdout") -> Tap:
        """Every byte of ``stream`` from now on, in order, with back-pressure: while the tap
        is not read, the task waits on its own writes (``async for chunk in task.tap():``).
        One tap per stream; for a ``tty`` task ``stdout`` is its terminal.  The tap ends with
        the stream.  What ``output()`` kept before it opened is not repeated."""
        t = self._t
        cap = t.capture(stream)
        if cap is None:
            raise SpecError(stream, f"task {t.id} has not started: tap it once start() has "
                                    f"handed it over, or ask start(taps=[...]) for it")
        if stream in t.taps and cap.tap is not None:
            t.taps = tuple(s for s in t.taps if s != stream)  # opened at the spawn: hand it
            return cap.tap
        tap = cap.open_tap()
        for s in t.io.streams if t.io is not None else ():
            if s.capture is cap:
                t.rt.reactor.watch_tap(s)
        return tap

    async def write_stdin(self, data: bytes) -> None:
        """Queue ``data`` for the task's stdin (``stdin="pipe"``, or a ``tty`` task); waits
        while more than a MiB is queued.  BrokenPipeError once the task's stdin is closed (it
        closed it, it ended, or :meth:`close_stdin` was called)."""
        feed, stream = self._t.feed()
        while True:
            if feed.broken or feed.eof:
                raise BrokenPipeError(errno.EPIPE, f"task {self._t.id}: its stdin is closed")
            if len(feed.buffer) < (1 << 20):
                break
            if feed.space is None:  # (another write may wait already: the same event)
                feed.space = trio.Event()
            await feed.space.wait()
        feed.buffer += data
        self._t.rt.reactor.poke(stream)
        await trio.lowlevel.checkpoint()

    def close_stdin(self) -> None:
        """End of input: what is queued is written, then the pipe is closed.  A ``tty`` task
        gets its terminal's end-of-file character instead (VEOF as its modes say: Ctrl-D
        unless changed), as if it were pressed: that ends input at the start of a line, and
        each call types it once more.  For a pipe, idempotent."""
        t = self._t
        feed, stream = t.feed()
        if feed.eof or feed.broken:
            return
        if t.spec.tty:
            feed.buffer += self._eof_character()
        else:
            feed.eof = True
        t.rt.reactor.poke(stream)

    def _eof_character(self) -> bytes:
        modes = self.terminal_modes()
        eof = modes[6][termios.VEOF] if modes is not None else b"\x04"
        return eof if isinstance(eof, bytes) and eof else b"\x04"

    def terminal_modes(self) -> list[Any] | None:
        """A ``tty`` task's terminal modes now (``termios.tcgetattr``), None once it ended."""
        master = self._master()
        return None if master is None else termios.tcgetattr(master)

    def terminal_foreground(self) -> int | None:
        """The process group in the foreground of a ``tty`` task's terminal (who reads the
        keys: the task, or a program its shell started), None once it ended."""
        master = self._master()
        return None if master is None else os.tcgetpgrp(master)

    def terminal_signal(self, sig: int) -> bool:
        """Send ``sig`` to the foreground process group of a ``tty`` task's terminal, as its
        keys would (Ctrl-C's SIGINT), without waiting behind queued input (TIOCSIG: SIGINT,
        SIGQUIT and SIGTSTP only, what a terminal's keys send); False once it ended."""
        master = self._master()
        if master is None:
            return False
        fcntl.ioctl(master, _TIOCSIG, int(sig))
        return True

    def _master(self) -> int | None:
        t = self._t
        if not t.spec.tty:
            raise SpecError("tty", f"task {t.id} has no terminal: this is for tty=True")
        return None if t.io is None else t.io.master

    def resize(self, rows: int, columns: int) -> None:
        """Set the size of a ``tty`` task's terminal (the task gets SIGWINCH)."""
        master = self._master()
        if master is not None:
            set_window_size(master, rows, columns)

    def signal(self, sig: int | str, *, by: str | None = None) -> bool:
        """Send ``sig`` to the running task without stopping it: to every process of its
        tree, or, for a ``tty`` task, to its terminal's foreground process group, as the key
        would (SIGINT for Ctrl-C: a REPL interrupted this way goes on).  The record lists each
        signal sent (``signals``: which, when, to what, ``by`` whom).  False if it is not
        running.  SIGKILL and SIGSTOP are not for this: ``stop(force=True)`` kills the tree,
        :meth:`pause` freezes it.  The tree is walked in one go: a caller that serves others
        on its event loop uses :meth:`deliver_signal`."""
        aimed = self._aim_signal(sig, by)
        if aimed is None:
            return False
        number, driver, walk, pgrp = aimed
        if walk:
            driver.signal(number, pgrp)
        return True

    async def deliver_signal(self, sig: int | str, *, by: str | None = None,
                             pause: Callable[[int], Awaitable[None]] | None = None,
                             ) -> bool:
        """:meth:`signal`, the task's tree walked with a checkpoint every 128 processes (a
        task may have thousands: one step of the event loop each would hold everyone else's
        work on it); ``pause(n)``, if given, is awaited there instead, and once at the end,
        ``n`` the processes reached since the last (a caller's pacing: the daemon's, of the
        uid that asked)."""
        aimed = self._aim_signal(sig, by)
        if aimed is None:
            return False
        number, driver, walk, pgrp = aimed
        if walk:
            await driver.signal_in_steps(number, pgrp, pause)
        return True

    def _aim_signal(self, sig: int | str,
                    by: str | None) -> tuple[int, Driver, bool, int | None] | None:
        """The signal's number, the driver, whether the tree is to be walked and, for a
        ``tty`` task's signal that its terminal cannot send (all but SIGINT, SIGQUIT and
        SIGTSTP, sent here at once: TIOCSIG), the foreground process group whose processes
        get it; the signal recorded as sent now.  None if the task is not running.  A
        terminal that answers neither (its programs all closed it) has the tree signalled,
        as any task's."""
        from ._units import parse_signal

        number = parse_signal(sig, "signal")
        if number in (signal.SIGKILL, signal.SIGSTOP):
            raise SpecError("signal", f"signal {signal.Signals(number).name} is not sent this "
                                      f"way: stop(force=True) kills the task's tree, pause() "
                                      f"freezes it")
        t = self._t
        driver = t.driver
        if driver is None or t.result is not None or t.state != "running":
            return None
        pgrp, walk, to = None, True, "tree"
        if t.spec.tty:
            try:
                if number in _TERMINAL_SIGNALS:
                    if not self.terminal_signal(number):
                        return None
                    walk = False
                else:
                    pgrp = self.terminal_foreground()
                    if pgrp is None:
                        return None
                to = "foreground"
            except OSError:
                pgrp = None
        keep_signal(t, SignalSent(number, round(trio.current_time() - driver.t0, 6), to, by))
        return number, driver, walk, pgrp

    def pause(self) -> bool:
        """Freeze the task where it stands (cgroup.freeze): its processes stop running until
        :meth:`resume`.  Neither its time limit nor its idle timeout counts paused time; the
        record says how long it was paused (``usage.paused_s``).  A stop request ends a pause.
        False if it is not running (queued, stopping, ended) or already paused."""
        return self._t.driver is not None and self._t.driver.pause()

    def resume(self) -> bool:
        """Thaw a task :meth:`pause` froze; False if it was not paused."""
        return self._t.driver is not None and self._t.driver.resume()

    @property
    def paused(self) -> bool:
        return self._t.driver is not None and self._t.driver.paused_at is not None


def request_stop(task: Task, reason: StopReason, *, by_caller: bool,
                 force: bool = False, by_signal: int | None = None) -> bool:
    """A stop request (see ``_stop.StopState.request``); False for a task already ended."""
    if task.result is not None or task.handed_over:
        return False
    return task.stop.request(reason, by_caller=by_caller, force=force, by_signal=by_signal)


def final_result(task: Task) -> TaskResult:
    """The record of a task that is done: HandedOver if it went to another supervisor
    process, InternalError if it ended without one (a bug)."""
    if task.result is None and not task.handed_over:
        raise InternalError(f"task {task.id} ended without a record (a bug in corral: its log "
                            f"says more)")
    if task.result is None:
        raise HandedOver(f"task {task.id} was handed over to another supervisor process; its "
                         f"record will be written there")
    return task.result


def finish_unstarted(task: Task) -> TaskResult:
    """Record a task that never started: it was stopped (or its life never ran) first."""
    reason = task.stop.reason or StopReason.CANCEL
    task.stop.finish()
    return finish(task, Ending(Outcome.CANCELLED, notes=(f"stopped before it started "
                                                         f"({reason})",)))


def close_captures(task: Task) -> None:
    for cap in (task.stdout, task.stderr):
        if cap is not None and not cap.closed:
            cap.close()


def finish(task: Task, ending: Ending) -> TaskResult:
    """The one final record, made of ``ending`` (``_ending.result_of``): kept once, waiters
    woken, the supervisor told; a second one is an InternalError."""
    if task.result is not None:
        raise InternalError(f"task {task.id} was about to get a second final record")
    close_captures(task)
    result = result_of(task, ending, time.time())
    task.result = result
    task.io = None
    task.stage = FINISHED
    task.done.set()
    task.rt.on_record(result)
    return result


KEPT_SIGNALS = 32  # the first and the last this many signals sent are listed in a record


def keep_signal(t: Task, sent: SignalSent) -> None:
    """List ``sent`` in ``t``'s record: the first and the last :data:`KEPT_SIGNALS` signals
    are kept, those between them only counted (``signals_omitted``).  (Every signal was
    kept: one tenant's 136,708 signals to one task made its end record 11.7 MB, which
    filled a 20 MB state disk, and every answer about the running task repeated them: an
    independent attack.)"""
    t.signals.append(sent)
    if len(t.signals) > 2 * KEPT_SIGNALS:
        del t.signals[KEPT_SIGNALS]
        t.signals_omitted += 1
