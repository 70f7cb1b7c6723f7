"""A task's life: queued -> starting -> running -> stopping -> finished, one final record.

:func:`live` runs in a task of the caller's nursery (``start``) or of the supervisor's own
(``run``), never in trio's main task, so a Ctrl-C (KeyboardInterrupt) never lands inside it.
Its steps:

1. ``_queue``: a batch's place in line; a stop requested meanwhile means it never starts.
2. ``_start``: make the leaf, write its limits, plumb its stdio, spawn the child straight
   into the leaf (no checkpoint on the way, except a spawn that runs in a worker thread:
   see ``_spawn``).  Everything opened on the way is handed over only once the spawn
   succeeded; a failure undoes it all and records ``spawn_failed``.
3. ``drive``: the main process, the time limit and stop requests, as named states
   (``_drive.py``), until the main process has exited and the leaf is empty; or until the
   supervisor hands the task over to another process (``_handover.py``).
4. ``_finish``: end of output (short drain deadline), usage, the leaf removed, the record.

Exactly one record per task, whatever happens: a bug of ours after the spawn still kills the
leaf and records ``lost`` before it is raised as InternalError.

Cancellation: the caller's cancellation is a graceful stop request; the waits after it are
shielded, and the ``Cancelled`` goes on its way once the record exists.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import time
from typing import Any

import trio

from cgroupfs import Cgroup, CgroupBusy, CgroupError, CgroupNotFound, CgroupStats, Destroyed
from cgroupfs._record import record

from ._capture import StreamCapture
from ._drive import Driver, terms
from ._ending import Ending, Launch
from ._errors import InternalError
from ._guard import runs_as_another_user
from ._main import MainProcess
from ._result import Cleanup, Outcome, StopReason, TaskResult
from ._sample import read_pressure
from ._spawn import Spawned, SpawnError, spawn
from ._stdio import end, plumb, register
from ._task import (
    DRIVEN,
    STARTING,
    Task,
    TaskHandle,
    close_captures,
    finish,
    finish_unstarted,
    group_dir,
    request_stop,
)

__all__ = ["QueueSlot", "drive", "live"]

log = logging.getLogger(__name__)

REMOVE_DEADLINE = 1.0  # rmdir may answer EBUSY for a moment after populated 0


@record
class QueueSlot:
    """A place in a batch's queue: admitted after ``after`` (FIFO), under ``limiter``."""

    limiter: trio.CapacityLimiter
    after: trio.Event | None
    turn: trio.Event


@trio.lowlevel.enable_ki_protection  # (a Ctrl-C goes to the main task: see the docstring)
async def live(task: Task,
               task_status: trio.TaskStatus[TaskHandle] = trio.TASK_STATUS_IGNORED, *,
               slot: QueueSlot | None = None) -> TaskResult | None:
    """The whole life: queue, start, drive, finish; hands ``task`` to ``task_status`` once it
    runs (or once it is known that it never will).

    KeyboardInterrupt-protected: trio raises a Ctrl-C right where unprotected code happens to
    run, which may be any task's; raised inside a life it skipped the stop and left the task
    ``lost`` with its processes running.  Protected, it reaches the main task, where the
    caller waits (``run``, the supervisor's exit) and turns it into a stop."""
    if task.result is not None:  # recorded already: the supervisor closed before it ran
        task_status.started(task.handle)
        return task.result
    task.began = True
    try:
        if trio.current_effective_deadline() == -math.inf:
            # called in an already cancelled scope: the stop comes before the spawn
            request_stop(task, StopReason.CANCEL, by_caller=True)
        if slot is not None:
            admitted = await _queue(task, slot, task_status)
            if not admitted:
                task_status.started(task.handle)
                return finish_unstarted(task)
            try:
                return await _run(task, task_status)
            finally:
                slot.limiter.release_on_behalf_of(task)
        # (one coroutine frame less per held task than awaiting _run: a supervisor may hold
        # thousands, and each waiting frame costs a few hundred bytes)
        launched = await _launch(task, task_status)
        if isinstance(launched, Launched):
            return await drive(task, *launched)
        return launched
    finally:
        if task.result is None and not task.handed_over:
            _last_resort(task)
        task.rt.on_end(task)


def _last_resort(task: Task) -> None:
    """The life is ending without a record (it raised past ``_lost``): record ``lost`` now,
    so that every waiter wakes to the one final record; if even that fails, wake them anyway
    (``wait()`` then raises InternalError)."""
    try:
        finish(task, Ending(
            Outcome.LOST, started=task.pid is not None, step="supervise",
            error=InternalError("the task's supervision ended without a record"),
            cleanup=Cleanup("incomplete", detail="corral could not tell what happened to the "
                                                 "task's processes"),
            notes=("corral hit an internal error while supervising this task",)))
    except Exception:
        log.exception("task %s: recording it lost failed", task.id)
        task.done.set()


async def _queue(task: Task, slot: QueueSlot,
                 task_status: trio.TaskStatus[TaskHandle]) -> bool:
    """Wait for a place (FIFO after ``slot.after``, then the limiter); False when a stop
    request came first.  The caller's cancellation: never started, recorded, re-raised."""
    stop = task.stop
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
        task_status.started(task.handle)
        finish_unstarted(task)
        raise
    finally:
        stop.waker = None
        slot.turn.set()  # admitted or given up: the next in line may queue now


class Launched(tuple):  # type: ignore[type-arg]
    """What ``drive`` needs of a task just spawned: (leaf, main, driver, started)."""


async def _run(task: Task, task_status: trio.TaskStatus[TaskHandle]) -> TaskResult | None:
    launched = await _launch(task, task_status)
    if isinstance(launched, Launched):
        return await drive(task, *launched)
    return launched


async def _launch(task: Task,
                  task_status: trio.TaskStatus[TaskHandle]) -> TaskResult | Launched:
    """Start the task: what ``drive`` needs, or the record of a task that never started
    (stopped first, or its spawn failed)."""
    if task.stop.reason is not None:
        task_status.started(task.handle)
        return finish_unstarted(task)
    task.stage = STARTING
    try:
        leaf, spawned = await _start(task)
    except Exception as e:
        task_status.started(task.handle)
        step = getattr(e, "step", "cgroup" if isinstance(e, CgroupError) else "prepare")
        result = finish(task, Ending(Outcome.SPAWN_FAILED, error=e, step=step))
        if not isinstance(e, OSError | CgroupError):  # SpawnError is an OSError
            raise InternalError(f"task {task.id}: preparing the spawn failed: {e!r}") from e
        return result
    started = Launch(spawned.method, spawned.fallback_errno, trio.current_time(), time.time())
    task.pid, task.cgroup = spawned.pid, leaf.path
    main = MainProcess(spawned.pid, spawned.pidfd)
    driver = new_driver(task, leaf, main, started.t0)
    task.driver, task.stage = driver, DRIVEN  # (running, for whoever looks from now on)
    task_status.started(task.handle)
    return Launched((leaf, main, driver, started))


def new_driver(task: Task, leaf: Cgroup, main: MainProcess, t0: float) -> Driver:
    """The driver of a running task, on what its spec and its supervisor say."""
    rt, spec = task.rt, task.spec
    view = None if rt.root_view is None else os.path.join(
        rt.root_view, *(() if task.group is None else (group_dir(task.group),)), task.id)
    told = terms(task.time_limit, spec.grace_s, spec.repeat_s, spec.idle_timeout_s,
                 rt.controllers)
    return Driver(leaf, main, task.stop, rt.watcher, told, t0=t0, leaf_view=view,
                  activity=task.last_output,
                  on_cancelled=functools.partial(rt.on_cancelled, task))


async def drive(task: Task, leaf: Cgroup, main: MainProcess, driver: Driver,
                started: Launch) -> TaskResult | None:
    """Drive a running task to its record, or (``hand_over()``) to its hand-off: then
    ``rt.on_detach`` takes everything it holds and there is no record here (None)."""
    rt = task.rt
    task.driver, task.stage = driver, DRIVEN
    rt.sampler.add(driver)
    try:
        await driver.run()
        rt.sampler.remove(driver)
        if driver.detaching:
            rt.on_detach(task, leaf, main, driver, started)
            return None
        result = await _finish(task, leaf, main, driver, started)
    except Exception as exc:
        # A bug or an OS failure nobody planned for: the task still ends with its one
        # record, and nothing it started is left running.
        log.exception("task %s: supervising failed", task.id)
        try:
            _lost(task, leaf, exc, started)
        except Exception:  # live() records it lost all the same (_last_resort)
            log.exception("task %s: clearing up after that failed too", task.id)
        if not driver.exited:
            with contextlib.suppress(OSError):
                main.reap()  # killed with its leaf: no zombie of ours stays behind
        raise InternalError(f"task {task.id}: supervising failed: {exc!r}") from exc
    finally:
        rt.sampler.remove(driver)
        task.driver = None
        if not driver.detaching:
            os.close(main.pidfd)
    if driver.pending is not None:
        raise driver.pending
    return result


async def _start(task: Task) -> tuple[Cgroup, Spawned]:
    """Leaf, limits, stdio, spawn.  On failure everything made is undone (the captures are
    closed so that subscribers see the end) and the error raised.  Synchronous up to the
    spawn, which has a checkpoint only when it runs in a worker thread (:func:`_spawn`): a
    stop request that comes then is the driver's first step."""
    spec, rt = task.spec, task.rt
    with contextlib.ExitStack() as undo, contextlib.ExitStack() as child_ends:
        task.stdout = StreamCapture(spec.output_head, spec.output_tail)
        task.stderr = StreamCapture(spec.output_head, spec.output_tail)
        for name in task.taps:  # asked for from the spawn on: not a byte is missed
            capture = task.capture(name)
            assert capture is not None
            capture.open_tap()
        undo.callback(close_captures, task)
        leaf = rt.parent_of(task.group).make_child(task.id)
        undo.callback(_remove_unused, leaf)
        _delegate(leaf)
        if not spec.limits.is_empty():
            leaf.set_limits(spec.limits)
        stdio, io = plumb(spec, task.stdout, task.stderr, undo, child_ends,
                          rt.reactor.null_input)
        with spec.isolation.prepare() as options:
            kwargs = dict(env=spec.environment_or_none(), cgroup_fd=leaf.fd, stdin=stdio[0],
                          stdout=stdio[1], stderr=stdio[2], cwd=spec.cwd,
                          new_session=spec.tty, controlling_tty=spec.tty,
                          new_process_group=not spec.tty and spec.own_process_group(),
                          ignored_signals=spec.ignored_signal_numbers,
                          numbered_fds=spec.pass_fds, **options)
            spawned = await _spawn(task, leaf, kwargs, in_thread=runs_as_another_user(options))
        undo.pop_all()
    register(io, rt.reactor, tty=spec.tty)
    for stream in io.streams:
        if stream.capture is not None and stream.capture.tap is not None:
            rt.reactor.watch_tap(stream)
    task.io = io
    return leaf, spawned


async def _spawn(task: Task, leaf: Cgroup, kwargs: dict[str, Any], *,
                 in_thread: bool) -> Spawned:
    """The spawn, watched by the spawn guard.  On the event loop's thread unless the child
    takes another uid before its exec: then any process of that uid may stop it there, and
    the spawning thread waits for it, so it runs in a worker thread, waited for whatever
    happens (shielded: the child is ours to hold once it exists); at most
    ``SPAWN_SLOTS`` at once per uid, so that one user's held spawns never take every
    worker thread from the others'."""
    rt = task.rt
    spawning = rt.guard.begin(leaf)
    try:
        if not in_thread:
            spawned = spawn(task.spec.argv, **kwargs)
        else:
            with trio.CancelScope(shield=True):
                async with rt.spawn_slots(kwargs["uid"]):
                    spawned = await trio.to_thread.run_sync(
                        functools.partial(spawn, task.spec.argv, **kwargs))
    finally:
        killed, notes = rt.guard.end(spawning)
        if notes:
            task.notes = (*task.notes, *notes)
    if killed is not None:  # frozen from above, stopped, too slow: the guard killed it
        _reap(spawned)
        raise SpawnError({"frozen": errno.EBUSY, "timeout": errno.ETIMEDOUT}.get(
            killed, errno.ECANCELED), killed, leaf.path)
    return spawned


def _delegate(leaf: Cgroup) -> None:
    """Mark the leaf delegated to the task, as systemd marks a ``Delegate=yes`` unit's cgroup
    (``trusted.delegate``; ``user.delegate`` where we may not write trusted xattrs).  A corral
    run by the task (a CI job running corral) then nests its own root inside this leaf
    (placement's "delegated unit"), so that this task's kill, limits and accounting cover
    whatever that corral starts.  Best effort: one setxattr."""
    for name in ("trusted.delegate", "user.delegate"):
        try:
            os.setxattr(leaf.fd, name, b"1")
            return
        except OSError:
            continue


def _reap(spawned: Spawned) -> None:
    try:
        os.waitid(os.P_PIDFD, spawned.pidfd, os.WEXITED)
    except ChildProcessError:
        pass
    finally:
        os.close(spawned.pidfd)


def _remove_unused(leaf: Cgroup) -> None:
    """Undo a leaf that never held a process (the spawn failed): rmdir, close."""
    try:
        leaf.remove()
    except CgroupError as e:
        log.warning("removing the unused leaf %s: %s", leaf.path, e)
        leaf.close()


async def _finish(task: Task, leaf: Cgroup, main: MainProcess, driver: Driver,
                  started: Launch) -> TaskResult:
    """End of output, usage, the leaf removed, the record."""
    if driver.exit is None and main.adopted:  # its new parent (PID 1) reaps it first
        driver.exit = await main.wait_exit_info(5.0)
    held: list[str] = []
    if task.io is not None:
        notes, still_open = await end(task.io, task.rt.reactor)
        task.notes = (*task.notes, *notes)
        if still_open:
            held = await _held_outside(task, driver, still_open, started)
    stats = read_usage(leaf, task.rt.controllers)
    # pressure totals are worth reading for a task that ran a sampling interval at least
    pressure = read_pressure(leaf) if driver.series is not None else None
    removed = await _remove_leaf(leaf)
    problems = (*driver.problems, *([removed] if removed else []), *held)
    return finish(task, Ending(started=True, launch=started, driver=driver, stats=stats,
                               pressure=pressure, problems=problems, leaf_path=leaf.path))


async def _held_outside(task: Task, driver: Driver, still_open: list[tuple[Any, str]],
                        started: Launch) -> list[str]:
    """The leaf is empty and the task's output pipes are still held open: by processes of
    the task outside its leaf (a root task's child that left it before corral listed it).
    They are found, ended and recorded (``Tracker.holders_of``); the cleanup is incomplete,
    and says so."""
    names = [("stdout" if capture is task.stdout else "stderr") for capture, _ in still_open]
    what = " and ".join(names) + (" were" if len(names) > 1 else " was")
    uid = task.spec.isolation.describe()["uid"]
    holders = await trio.to_thread.run_sync(driver.tracker.holders_of,
                                            {link for _, link in still_open},
                                            trio.current_time() - started.t0, uid)
    who = "; ".join(holders) if holders else "no process could be found holding it"
    return [f"the task's {what} still held open after its cgroup had emptied: something of "
            f"the task lived outside it ({who})"]


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


def _lost(task: Task, leaf: Cgroup, exc: BaseException, started: Launch) -> None:
    """After a bug of ours: kill and remove the leaf (blocking: this is not the normal path),
    close the streams, and record ``lost`` unless a record exists already."""
    try:
        done = leaf.destroy(timeout=5.0)
    except Exception as e:  # (destroy reports what it finds; this would be a second bug)
        done = Destroyed(False, f"destroying it raised {e!r}")
    if task.io is not None:
        for stream in task.io.streams:
            task.rt.reactor.remove(stream)
    if task.result is None:
        # incomplete even when the kill worked: the grace, the leftovers and the escape
        # checks were skipped, so corral cannot vouch for what happened
        cleanup = Cleanup("incomplete", detail=f"supervision failed: {exc!r}; the leaf was "
                          + (f"not cleared: {done.error}" if done.error else
                             "killed and removed"))
        finish(task, Ending(Outcome.LOST, started=True, launch=started, error=exc,
                            step="supervise", cleanup=cleanup,
                            notes=("corral hit an internal error while supervising this "
                                   "task",)))


USAGE_FILES = frozenset({"cpu.stat", "memory.peak", "memory.events", "pids.peak"})


def read_usage(leaf: Cgroup, controllers: frozenset[str]) -> CgroupStats | None:
    """What the record keeps of the leaf's accounting (and only that: read at every end)."""
    try:
        return leaf.read_stats(controllers, only=USAGE_FILES)
    except CgroupNotFound:
        return None
    except CgroupError as e:
        log.warning("reading the usage of %s: %s", leaf.path, e)
        return None
