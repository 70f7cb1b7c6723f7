"""A task's life: queued -> starting -> running -> stopping -> finished, one final record.

:class:`TaskHandle` is what users hold; :func:`live` runs the life itself, in a task of the
caller's nursery (``start``) or of the supervisor's own (``run``), never in trio's main task, so
a Ctrl-C (KeyboardInterrupt) never lands inside it.  Its steps:

1. ``_queue``: a batch's place in line; a stop requested meanwhile means it never starts.
2. ``_start`` (synchronous: no checkpoint between the leaf and the spawn): make the leaf,
   write its limits, plumb its stdio, spawn the child straight into the leaf.  Everything
   opened on the way is handed over only once the spawn succeeded; a failure undoes it all
   and records ``spawn_failed``.
3. ``Driver.run``: the main process, the time limit and stop requests, as named states
   (``_drive.py``), until the main process has exited and the leaf is empty.
4. ``_finish``: end of output (short drain deadline), usage, the leaf removed, the record.

Exactly one record per task, whatever happens: a bug of ours after the spawn still kills the
leaf and records ``lost`` before it is raised as InternalError.

Cancellation: the caller's cancellation is a graceful stop request; the waits after it are
shielded, and the ``Cancelled`` goes on its way once the record exists.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from cgroupfs import Cgroup, CgroupBusy, CgroupError, CgroupStats

from ._drive import Driver, Terms
from ._errors import InternalError, SpecError
from ._guard import SpawnGuard
from ._main import MainProcess
from ._outcome import classify, cleanup_of, outcome_notes, read_usage, usage_of
from ._output import IoReactor, StdinFeed, Stream, StreamCapture, Tap
from ._result import (
    Cleanup,
    Containment,
    KillSnapshot,
    Outcome,
    StopReason,
    StreamOutput,
    TaskResult,
    Usage,
)
from ._sample import Sampler, read_pressure
from ._spawn import Spawned, spawn
from ._spec import TaskSpec
from ._stdio import TaskIo, end, plumb, register, set_window_size
from ._stop import StopState
from ._watch import CgroupWatcher

__all__ = ["Incident", "QueueSlot", "Runtime", "TaskHandle", "finish_unstarted", "live",
           "make_task", "never_ran", "request_stop"]

log = logging.getLogger(__name__)

REMOVE_DEADLINE = 1.0  # rmdir may answer EBUSY for a moment after populated 0
_EMPTY_OUTPUT = StreamOutput()


@dataclass(frozen=True, slots=True)
class Incident:
    """Something done to the supervisor's own cgroups while tasks ran (e.g. a freeze)."""

    at: float  # trio time
    text: str


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
    on_end: Callable[[TaskHandle], None]
    incidents: list[Incident] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueSlot:
    """A place in a batch's queue: admitted after ``after`` (FIFO), under ``limiter``."""

    limiter: trio.CapacityLimiter
    after: trio.Event | None
    turn: trio.Event


class TaskHandle:
    """A task started by a supervisor.

    ``id`` is never reused; ``pid`` is the main process's pid once it runs (for display: every
    signal goes through pidfds); ``cgroup`` the leaf's path once it exists.  ``stop()`` asks
    for a graceful stop and ``stop(force=True)`` a kill; ``wait()`` returns the final
    :class:`TaskResult`, the same one every time.
    """

    __slots__ = ("_began", "_created_at", "_done", "_driver", "_io", "_notes", "_result", "_rt",
                 "_stderr", "_stdout", "_stop", "cgroup", "id", "pid", "spec", "state",
                 "time_limit")

    def __init__(self, rt: Runtime, task_id: str, spec: TaskSpec, time_limit: float | None,
                 notes: tuple[str, ...]) -> None:
        self._rt = rt
        self.id = task_id
        self.spec = spec
        self.time_limit = time_limit
        self.pid: int | None = None
        self.cgroup: str | None = None
        self.state = "queued"
        self._notes = notes  # () for most: shared, costs nothing per task
        self._stop = StopState(int(spec.stop_signal))
        self._done = trio.Event()
        self._result: TaskResult | None = None
        self._created_at = time.time()
        self._stdout: StreamCapture | None = None
        self._stderr: StreamCapture | None = None
        self._io: TaskIo | None = None
        self._driver: Driver | None = None
        self._began = False  # the life has run (start() hands out a coroutine that might not)

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id} {self.state} pid={self.pid} argv={list(self.spec.argv)}>"

    def stop(self, *, force: bool = False) -> bool:
        """Ask the task to stop: gracefully, or with ``force=True`` kill now.

        A second call kills now (skips the rest of the grace), also after a stop the
        supervisor made itself (time limit, shutdown).  On a task that has already ended this
        is a no-op; the return value says whether the request changed anything.
        """
        return request_stop(self, StopReason.CANCEL, by_caller=True, force=force)

    async def wait(self) -> TaskResult:
        """Wait for the final record (returns at once once there is one)."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    @property
    def result(self) -> TaskResult | None:
        """The final record, or ``None`` while the task is not finished."""
        return self._result

    @property
    def stop_requested(self) -> StopReason | None:
        """Why the task is being stopped (the first request's reason), or None."""
        return self._stop.reason

    @property
    def stop_level(self) -> str:
        """How far its stop has gone: ``none``, ``requested``, ``signalled``, ``killed``, or
        ``gone`` once the task has ended."""
        return self._stop.level

    def tap(self, stream: str = "stdout") -> Tap:
        """Every byte of ``stream`` from now on, in order, with back-pressure: while the tap
        is not read, the task waits on its own writes (``async for chunk in task.tap():``).
        One tap per stream; for a ``tty`` task ``stdout`` is its terminal.  The tap ends with
        the stream.  What ``output()`` kept before it opened is not repeated."""
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be \"stdout\" or \"stderr\", got {stream!r}")
        cap = self._stdout if stream == "stdout" else self._stderr
        if cap is None:
            raise SpecError(stream, f"task {self.id} has not started: tap it once start() "
                                    f"has handed it over")
        tap = cap.open_tap()
        if self._io is not None:
            for s in self._io.streams:
                if s.capture is cap:
                    self._rt.reactor.watch_tap(s)
        return tap

    def output(self, stream: str = "stdout") -> StreamOutput:
        """What is kept of ``stream`` so far (head, tail, counts); empty before the spawn."""
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be \"stdout\" or \"stderr\", got {stream!r}")
        cap = self._stdout if stream == "stdout" else self._stderr
        return _EMPTY_OUTPUT if cap is None else cap.result()

    def subscribe(self, stream: str = "stdout") -> trio.MemoryReceiveChannel[bytes]:
        """``stream`` as kept so far (head, then tail), then live; the channel closes at the
        end of output.  A subscriber that falls behind misses chunks (counted) rather than
        growing memory.
        """
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be \"stdout\" or \"stderr\", got {stream!r}")
        cap = self._stdout if stream == "stdout" else self._stderr
        if cap is None:
            send, recv = trio.open_memory_channel[bytes](0)
            send.close()  # nothing to stream (not started, or never will be)
            return recv
        return cap.subscribe()

    async def write_stdin(self, data: bytes) -> None:
        """Queue ``data`` for the task's stdin (``stdin="pipe"``, or a ``tty`` task); waits
        while more than a MiB is queued.  BrokenPipeError once the task's stdin is closed (it
        closed it, it ended, or :meth:`close_stdin` was called)."""
        feed, stream = self._feed()
        while True:
            if feed.broken or feed.eof:
                raise BrokenPipeError(errno.EPIPE, f"task {self.id}: its stdin is closed")
            if len(feed.buffer) < (1 << 20):
                break
            feed.space = feed.space or trio.Event()
            await feed.space.wait()
        feed.buffer += data
        self._rt.reactor.poke(stream)
        await trio.lowlevel.checkpoint()

    def close_stdin(self) -> None:
        """End of input: what is queued is written, then the pipe is closed.  A ``tty`` task
        gets its terminal's end-of-file character instead, once, as if Ctrl-D were pressed
        (which ends input at the start of a line).  Idempotent for a pipe."""
        feed, stream = self._feed()
        if feed.eof or feed.broken:
            return
        if self.spec.tty:
            feed.buffer += b"\x04"  # VEOF: the terminal ends the line discipline's input
        else:
            feed.eof = True
        self._rt.reactor.poke(stream)

    def resize(self, rows: int, columns: int) -> None:
        """Set the size of a ``tty`` task's terminal (the task gets SIGWINCH)."""
        io = self._io
        if not self.spec.tty:
            raise SpecError("tty", f"task {self.id} has no terminal: resize() is for tty=True")
        if io is None or io.master is None:
            return  # not started yet, or ended
        set_window_size(io.master, rows, columns)

    def pause(self) -> bool:
        """Freeze the task where it stands (cgroup.freeze): its processes stop running until
        :meth:`resume`.  Neither its time limit nor its idle timeout counts paused time; the
        record says how long it was paused (``usage.paused_s``).  A stop request ends a pause.
        False if it is not running (queued, stopping, ended) or already paused."""
        return self._driver is not None and self._driver.pause()

    def resume(self) -> bool:
        """Thaw a task :meth:`pause` froze; False if it was not paused."""
        return self._driver is not None and self._driver.resume()

    @property
    def paused(self) -> bool:
        return self._driver is not None and self._driver.paused_at is not None

    def _last_output(self) -> float:
        """When the task last printed (trio time), for the idle timeout."""
        return max(self._stdout.last_at if self._stdout else 0.0,
                   self._stderr.last_at if self._stderr else 0.0)

    def _stopping(self) -> None:
        self.state = "stopping"

    def _feed(self) -> tuple[StdinFeed, Stream]:
        if self.spec.stdin != "pipe" and not self.spec.tty:
            raise SpecError("stdin", f"task {self.id} was not started with stdin=\"pipe\" (or "
                                     f"tty=True): its stdin cannot be written")
        io = self._io
        if io is None or io.feed is None or io.feed_stream is None:
            raise BrokenPipeError(errno.EPIPE, f"task {self.id}: it is not running")
        return io.feed, io.feed_stream


def make_task(rt: Runtime, task_id: str, spec: TaskSpec, time_limit: float | None,
              notes: tuple[str, ...]) -> TaskHandle:
    """A queued task; nothing exists for it yet."""
    return TaskHandle(rt, task_id, spec, time_limit, notes)


def never_ran(task: TaskHandle) -> bool:
    """``start()`` made the task but its life never ran (the coroutine was dropped)."""
    return not task._began


def request_stop(task: TaskHandle, reason: StopReason, *, by_caller: bool,
                 force: bool = False) -> bool:
    """A stop request (see ``_stop.StopState.request``); False for a task already ended."""
    if task._result is not None:
        return False
    return task._stop.request(reason, by_caller=by_caller, force=force)


def finish_unstarted(task: TaskHandle) -> TaskResult:
    """Record a task that never started: it was stopped (or its life never ran) first."""
    reason = task._stop.reason or StopReason.CANCEL
    task._stop.finish()
    return _record(task, Outcome.CANCELLED, started=False,
                   notes=[f"stopped before it started ({reason})"])


async def live(task: TaskHandle,
               task_status: trio.TaskStatus[TaskHandle] = trio.TASK_STATUS_IGNORED, *,
               slot: QueueSlot | None = None) -> TaskResult:
    """The whole life: queue, start, drive, finish; hands ``task`` to ``task_status`` once it
    runs (or once it is known that it never will)."""
    task._began = True
    try:
        if trio.current_effective_deadline() == -math.inf:
            # called in an already cancelled scope: the stop comes before the spawn
            request_stop(task, StopReason.CANCEL, by_caller=True)
        if slot is not None:
            admitted = await _queue(task, slot, task_status)
            if not admitted:
                task_status.started(task)
                return finish_unstarted(task)
            try:
                return await _run(task, task_status)
            finally:
                slot.limiter.release_on_behalf_of(task)
        return await _run(task, task_status)
    finally:
        task._rt.on_end(task)


async def _queue(task: TaskHandle, slot: QueueSlot,
                 task_status: trio.TaskStatus[TaskHandle]) -> bool:
    """Wait for a place (FIFO after ``slot.after``, then the limiter); False when a stop
    request came first.  The caller's cancellation: never started, recorded, re-raised."""
    stop = task._stop
    try:
        with trio.CancelScope() as scope:
            stop.waker = scope  # a stop request cancels the wait
            if stop.reason is None:
                if slot.after is not None:
                    await slot.after.wait()
                await slot.limiter.acquire_on_behalf_of(task)
                if stop.reason is None:
                    return True
                slot.limiter.release_on_behalf_of(task)
        return False
    except trio.Cancelled:
        request_stop(task, StopReason.CANCEL, by_caller=True)
        task_status.started(task)
        finish_unstarted(task)
        raise
    finally:
        stop.waker = None
        slot.turn.set()  # admitted or given up: the next in line may queue now


async def _run(task: TaskHandle, task_status: trio.TaskStatus[TaskHandle]) -> TaskResult:
    if task._stop.reason is not None:
        task_status.started(task)
        return finish_unstarted(task)
    task.state = "starting"
    try:
        leaf, spawned = _start(task)
    except Exception as e:
        task_status.started(task)
        step = getattr(e, "step", "cgroup" if isinstance(e, CgroupError) else "prepare")
        result = _record(task, Outcome.SPAWN_FAILED, started=False, error=e, step=step)
        if not isinstance(e, OSError | CgroupError):  # SpawnError is an OSError
            raise InternalError(f"task {task.id}: preparing the spawn failed: {e!r}") from e
        return result
    t0, started_at = trio.current_time(), time.time()
    task.pid, task.cgroup, task.state = spawned.pid, leaf.path, "running"
    task_status.started(task)
    rt, spec = task._rt, task.spec
    view = None if rt.root_view is None else f"{rt.root_view.rstrip('/')}/{task.id}"
    terms = Terms(task.time_limit, spec.grace_s, spec.repeat_s, spec.idle_timeout_s,
                  rt.controllers, view)
    main = MainProcess(spawned.pid, spawned.pidfd)
    driver = task._driver = Driver(leaf, main, task._stop, rt.watcher, terms, t0=t0,
                                   activity=task._last_output, on_stopping=task._stopping)
    rt.sampler.add(driver)
    try:
        await driver.run()
        rt.sampler.remove(driver)
        result = await _finish(task, leaf, spawned, driver, t0, started_at)
    except Exception as exc:
        # A bug or an OS failure nobody planned for: the task still ends with its one
        # record, and nothing it started is left running.
        log.exception("task %s: supervising failed", task.id)
        _lost(task, leaf, exc, t0, started_at)
        raise InternalError(f"task {task.id}: supervising failed: {exc!r}") from exc
    finally:
        rt.sampler.remove(driver)
        task._driver = None
        os.close(spawned.pidfd)
    if driver.pending is not None:
        raise driver.pending
    return result


def _start(task: TaskHandle) -> tuple[Cgroup, Spawned]:
    """Leaf, limits, stdio, spawn; synchronous.  On failure everything made is undone (the
    captures are closed so that subscribers see the end) and the error raised."""
    spec, rt = task.spec, task._rt
    with contextlib.ExitStack() as undo, contextlib.ExitStack() as child_ends:
        task._stdout = StreamCapture(spec.output_head, spec.output_tail)
        task._stderr = StreamCapture(spec.output_head, spec.output_tail)
        undo.callback(_close_captures, task)
        leaf = rt.root.make_child(task.id)
        undo.callback(_remove_unused, leaf)
        if not spec.limits.is_empty():
            leaf.set_limits(spec.limits)
        stdio, io = plumb(spec, task._stdout, task._stderr, undo, child_ends)
        with rt.guard.spawning(leaf), spec.isolation.prepare() as options:
            spawned = spawn(spec.argv, env=spec.environment(), cgroup_fd=leaf.fd,
                            stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], cwd=spec.cwd,
                            new_session=spec.tty, controlling_tty=spec.tty,
                            ignored_signals=spec.ignored_signal_numbers, **options)
        undo.pop_all()
    for thawed in rt.guard.take_thawed():
        task._notes = (*task._notes, thawed)
    register(io, rt.reactor, tty=spec.tty)
    task._io = io
    return leaf, spawned


def _close_captures(task: TaskHandle) -> None:
    for cap in (task._stdout, task._stderr):
        if cap is not None and not cap.closed:
            cap.close()


def _remove_unused(leaf: Cgroup) -> None:
    """Undo a leaf that never held a process (the spawn failed): rmdir, close."""
    try:
        leaf.remove()
    except CgroupError as e:
        log.warning("removing the unused leaf %s: %s", leaf.path, e)
        leaf.close()


async def _finish(task: TaskHandle, leaf: Cgroup, spawned: Spawned, driver: Driver, t0: float,
                  started_at: float) -> TaskResult:
    """End of output, usage, the leaf removed, the record."""
    if task._io is not None:
        task._notes = (*task._notes, *await end(task._io, task._rt.reactor))
    stats = read_usage(leaf, task._rt.controllers)
    # pressure totals are worth reading for a task that ran a sampling interval at least
    pressure = read_pressure(leaf) if driver.series is not None else None
    removed = await _remove_leaf(leaf)
    problems = [*driver.problems, *([removed] if removed else [])]
    return _outcome(task, driver, stats, pressure, problems, spawned, leaf.path, t0,
                    started_at)


async def _remove_leaf(leaf: Cgroup) -> str | None:
    """rmdir the empty leaf and any sub-cgroups the task made, depth-first; None or the
    problem.  EBUSY for a moment after ``populated 0`` is retried with trio sleeps."""
    delay, deadline = 0.001, trio.current_time() + REMOVE_DEADLINE
    while True:
        try:
            leaf.remove(recursive=True, busy_timeout=0)
            return None
        except CgroupBusy as e:
            if trio.current_time() >= deadline:
                leaf.close()
                return str(e)
        except CgroupError as e:
            leaf.close()
            return str(e)
        with trio.CancelScope(shield=True):
            await trio.sleep(delay)
        delay = min(delay * 2, 0.05)


def _lost(task: TaskHandle, leaf: Cgroup, exc: BaseException, t0: float,
          started_at: float) -> None:
    """After a bug of ours: kill and remove the leaf (blocking: this is not the normal path),
    close the streams, and record ``lost`` unless a record exists already."""
    done = leaf.destroy(timeout=5.0)
    if task._io is not None:
        for stream in task._io.streams:
            task._rt.reactor.remove(stream)
    if task._result is None:
        # incomplete even when the kill worked: the grace, the leftovers and the escape
        # checks were skipped, so corral cannot vouch for what happened
        cleanup = Cleanup("incomplete", detail=f"supervision failed: {exc!r}; the leaf was "
                          + (f"not cleared: {done.error}" if done.error else
                             "killed and removed"))
        _record(task, Outcome.LOST, started=True, error=exc, step="supervise",
                cleanup=cleanup, t0=t0, started_at=started_at,
                notes=["corral hit an internal error while supervising this task"])


def _outcome(task: TaskHandle, d: Driver, stats: CgroupStats | None,
             pressure: dict[str, Any] | None, problems: list[str], spawned: Spawned,
             leaf_path: str, t0: float, started_at: float) -> TaskResult:
    exit_code = None if d.exit is None else d.exit.code
    sig = None if d.exit is None else d.exit.signal
    oom_kills = None
    if stats is not None and stats.memory_events is not None:
        oom_kills = stats.memory_events.oom_kill
    outcome = classify(task._stop, exit_code, sig, oom_kills)
    notes = [*d.notes, *outcome_notes(task._stop, outcome, oom_kills, spawned)]
    notes += [i.text for i in task._rt.incidents if i.at >= t0]
    escaped = tuple(d.tracker.escaped.values())
    if escaped:
        problems = [*problems, f"{len(escaped)} process(es) of the task left its cgroup: "
                    + ", ".join(f"{e.comm}[{e.pid}] to {e.cgroup} ({e.ended})" for e in escaped)]
    containment = Containment("cgroup", leaf_path, spawned.method,
                              tuple(sorted(task._rt.controllers)), escaped,
                              task.spec.isolation.describe())
    usage = usage_of(stats, d.exited_at - t0, oom_kills, pressure=pressure,
                     series=None if d.series is None else d.series.to_dict(),
                     paused_s=d.paused_s)
    return _record(task, outcome, started=True, exit_code=exit_code, sig=sig,
                   cleanup=cleanup_of(d, problems), usage=usage, t0=t0, started_at=started_at,
                   notes=notes, containment=containment, snapshot=d.snapshot)


def _record(task: TaskHandle, outcome: Outcome, *, started: bool, exit_code: int | None = None,
            sig: int | None = None, cleanup: Cleanup | None = None, usage: Usage | None = None,
            t0: float | None = None, started_at: float | None = None,
            notes: list[str] | None = None, error: BaseException | None = None,
            step: str | None = None, containment: Containment | None = None,
            snapshot: KillSnapshot | None = None) -> TaskResult:
    """The one final record: written once, waiters woken, the supervisor told."""
    if task._result is not None:
        raise InternalError(f"task {task.id} was about to get a second final record")
    _close_captures(task)
    result = TaskResult(
        id=task.id, argv=task.spec.argv, outcome=outcome, exit_code=exit_code, signal=sig,
        started=started, cleanup=cleanup or Cleanup("clean"), stop=task._stop.record(t0),
        usage=usage or Usage(),
        output_stdout=task._stdout.result() if task._stdout is not None else _EMPTY_OUTPUT,
        output_stderr=task._stderr.result() if task._stderr is not None else _EMPTY_OUTPUT,
        containment=containment or Containment("cgroup"),
        time_limit=task.time_limit, created_at=task._created_at, started_at=started_at,
        ended_at=time.time(), notes=(*task._notes, *(notes or ())),
        error=None if error is None else str(error),
        error_errno=getattr(error, "errno", None), error_step=step, name=task.spec.name,
        kill_snapshot=snapshot,
    )
    task._result = result
    task._io = None
    task.state = "finished"
    task._done.set()
    task._rt.on_record(result)
    return result
