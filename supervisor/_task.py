"""A task's life: queued -> starting -> running -> stopping -> finished, one final record.

:class:`TaskHandle` is what users hold; :meth:`TaskHandle._live` runs the life itself, in the
caller's task (``run``) or in the caller's nursery (``start``).  Its order of operations:

1. A stop requested before the spawn means the task never starts (``cancelled``, not started).
2. The leaf is made and its limits written before the spawn; the child is born in it.
3. Running: both pipes are read by the supervisor's output reactor, the main process is
   awaited on its pidfd, the time limit and
   any stop request drive the escalation (signal every process in the leaf, grace, cgroup.kill).
4. The main process's exit ends the command; what it left in the leaf is stopped the same way.
5. Once the leaf is empty (inotify, not EOF), the output gets a short drain deadline, usage is
   read, the leaf removed, and the result recorded: exactly once, whatever happened.

Cancellation: everything from the spawn on runs in a shielded scope.  A sibling task notices the
caller's cancellation and turns it into a graceful stop request; the shielded part finishes the
cleanup (still escalating on a second request), records the result, and only then does the
caller's ``Cancelled`` continue on its way.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from cgroupfs import Cgroup, CgroupBusy, CgroupError, CgroupStats

from ._errors import InternalError, first_leaf
from ._output import StreamCapture, enlarge_pipe
from ._result import (
    Cleanup,
    Containment,
    Outcome,
    ProcessInfo,
    StopReason,
    TaskResult,
    Usage,
)
from ._spawn import Spawned, SpawnError, spawn
from ._spec import TaskSpec
from ._stop import StopState, signal_leaf

if TYPE_CHECKING:
    from ._supervisor import Supervisor

__all__ = ["QueueSlot", "TaskHandle"]

log = logging.getLogger(__name__)

DRAIN_DEADLINE = 0.25  # after the leaf is empty: how long a pipe held outside it may delay us
KILL_TIMEOUT = 30.0  # after cgroup.kill: how long before we call the cleanup incomplete


@dataclass(slots=True)
class _Drive:
    """What the driver found: the main process's status, leftovers, pending interruption."""

    status: os.waitid_result | None = None
    exited_at: float = 0.0
    leftovers: list[ProcessInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pending: BaseException | None = None


@dataclass(frozen=True, slots=True)
class QueueSlot:
    """A place in a batch's queue: admitted after ``after`` (FIFO), under ``limiter``."""

    limiter: trio.CapacityLimiter
    after: trio.Event | None
    turn: trio.Event


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class TaskHandle:
    """A task started by a supervisor.

    ``id`` is never reused; ``pid`` is the main process's pid once it runs (for display: every
    signal goes through pidfds).  ``stop()`` asks for a graceful stop and ``stop(force=True)``
    a kill; ``wait()`` returns the final :class:`TaskResult`, the same one every time.
    """

    __slots__ = ("_began", "_captures", "_created_at", "_done", "_killed_leftovers", "_notes",
                 "_result", "_stop", "_sup", "id", "pid", "spec", "state", "time_limit")

    def __init__(self, sup: Supervisor, task_id: str, spec: TaskSpec, time_limit: float | None,
                 notes: list[str]) -> None:
        self._sup = sup
        self.id = task_id
        self.spec = spec
        self.time_limit = time_limit
        self.pid: int | None = None
        self.state = "queued"
        self._notes = tuple(notes)  # () for most: shared, costs nothing per task
        self._stop = StopState()
        self._stop.signal = int(spec.stop_signal)
        self._done = trio.Event()
        self._result: TaskResult | None = None
        self._created_at = time.time()
        self._captures: dict[str, StreamCapture] = {}
        self._killed_leftovers = False
        self._began = False  # the life has run (start() hands out a coroutine that might not)

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id} {self.state} pid={self.pid} argv={list(self.spec.argv)}>"

    # ---- what users call -------------------------------------------------------------------

    def stop(self, *, force: bool = False) -> bool:
        """Ask the task to stop: gracefully, or with ``force=True`` kill now.

        A second request escalates (skips the rest of the grace).  On a task that has already
        ended this is a no-op; the return value says whether anything changed.
        """
        if self._result is not None:
            return False
        return self._stop.request(StopReason.CANCEL, force=force)

    async def wait(self) -> TaskResult:
        """Wait for the final record (returns at once once there is one)."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    @property
    def result(self) -> TaskResult | None:
        """The final record, or ``None`` while the task is not finished."""
        return self._result

    def subscribe(self, stream: str = "stdout") -> trio.MemoryReceiveChannel[bytes]:
        """``stream`` as kept so far (head, then tail), then live; the channel closes at the
        end of output.  A subscriber that falls behind misses chunks (counted) rather than
        growing memory.
        """
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be \"stdout\" or \"stderr\", got {stream!r}")
        cap = self._captures.get(stream)
        if cap is None:
            send, recv = trio.open_memory_channel[bytes](0)
            send.close()  # nothing to stream (not started, or never will be)
            return recv
        return cap.subscribe()

    # ---- the life ----------------------------------------------------------------------------

    def _request(self, reason: StopReason, force: bool = False) -> bool:
        if self._result is not None:
            return False
        return self._stop.request(reason, force=force)

    async def _live(self, task_status: trio.TaskStatus[TaskHandle] = trio.TASK_STATUS_IGNORED,
                    *, slot: QueueSlot | None = None) -> TaskResult:
        """The whole life, in the caller's task.  Nothing here is shielded wholesale: each
        wait handles the caller's cancellation (and Ctrl-C, which trio delivers to the main
        task whatever the shields) itself, turning it into a stop request; the final record is
        written before either continues on its way."""
        self._began = True
        if trio.current_effective_deadline() == -math.inf:
            # called in an already cancelled scope: the stop comes before the spawn
            self._request(StopReason.CANCEL)
        try:
            acquired = False
            if slot is not None:
                try:
                    acquired = await self._wait_turn(slot)
                except BaseException:  # the caller's cancellation, Ctrl-C: never started
                    slot.turn.set()
                    self._request(StopReason.CANCEL)
                    task_status.started(self)
                    self._finish_unstarted()
                    raise
                slot.turn.set()  # admitted or given up: the next in line may queue now
                if not acquired or self._stop.reason is not None:
                    if acquired:
                        slot.limiter.release_on_behalf_of(self)
                    task_status.started(self)
                    return self._finish_unstarted()
            try:
                return await self._run(task_status)
            finally:
                if acquired:
                    assert slot is not None
                    slot.limiter.release_on_behalf_of(self)
        finally:
            self._sup._forget(self)

    async def _wait_turn(self, slot: QueueSlot) -> bool:
        """Queue for a place; False when a stop request came first."""
        with trio.CancelScope() as scope:
            self._stop.waker = scope  # a stop request cancels the wait
            if self._stop.reason is None:
                if slot.after is not None:
                    await slot.after.wait()
                await slot.limiter.acquire_on_behalf_of(self)
                self._stop.waker = None
                return True
        self._stop.waker = None
        return False

    def _finish_unstarted(self) -> TaskResult:
        reason = self._stop.reason or StopReason.CANCEL
        self._stop.mark("gone")
        return self._record(Outcome.CANCELLED, started=False, notes=[
            f"stopped before it started ({reason})"])

    async def _run(self, task_status: trio.TaskStatus[TaskHandle]) -> TaskResult:
        sup = self._sup
        spec = self.spec
        if self._stop.reason is not None:
            task_status.started(self)
            return self._finish_unstarted()
        self.state = "starting"
        try:
            leaf = sup._tasks.make_child(self.id)
        except CgroupError as e:
            task_status.started(self)
            return self._record(Outcome.SPAWN_FAILED, started=False, error=e, step="cgroup")
        fds: list[int] = []
        try:
            if not spec.limits.is_empty():
                leaf.set_limits(spec.limits)
            spawned, pipes = self._spawn(leaf, fds)
        except Exception as e:
            # Nothing runs: close what we opened (the captures' log fds are among ``fds``),
            # end the streams for any subscriber, remove the leaf, record.
            for fd in fds:
                os.close(fd)
            for cap in self._captures.values():
                cap.log_fd = None
                cap.close()
            cleanup = self._remove_leaf(leaf)
            task_status.started(self)
            step = getattr(e, "step", "cgroup" if isinstance(e, CgroupError) else "prepare")
            result = self._record(Outcome.SPAWN_FAILED, started=False, error=e, step=step,
                                  cleanup=cleanup)
            if not isinstance(e, SpawnError | CgroupError | OSError):
                raise InternalError(f"task {self.id}: preparing the spawn failed: {e!r}") from e
            return result

        t0 = trio.current_time()
        started_at = time.time()
        self.pid = spawned.pid
        self.state = "running"
        task_status.started(self)
        try:
            return await self._supervise(leaf, spawned, pipes, t0, started_at)
        except Exception as group:
            cause = first_leaf(group)
            # A bug or an OS failure nobody planned for: the task still ends with its one
            # record, and nothing it started is left running.
            log.exception("task %s: supervising failed", self.id)
            cleanup = self._kill_and_remove(leaf, f"supervision failed: {cause!r}")
            if self._result is None:
                self._record(Outcome.LOST, started=True, error=cause, step="supervise",
                             cleanup=cleanup, started_at=started_at,
                             notes=["corral hit an internal error while supervising this task"])
            raise InternalError(f"task {self.id}: supervising failed: {cause!r}") from group
        finally:
            trio.lowlevel.notify_closing(spawned.pidfd)
            os.close(spawned.pidfd)

    def _kill_and_remove(self, leaf: Cgroup, why: str) -> Cleanup:
        problems = [why]
        try:
            if leaf.is_populated():
                leaf.kill()
                if not leaf.wait_unpopulated(5.0):  # blocks: a bug's path, not a normal one
                    problems.append("the leaf did not empty after cgroup.kill")
        except CgroupError as e:
            problems.append(str(e))
        return self._remove_leaf(leaf, problems=problems)

    def _spawn(self, leaf: Cgroup, fds: list[int]) -> tuple[Spawned, dict[str, int]]:
        spec = self.spec
        pipes: dict[str, int] = {}
        child_ends: list[int] = []
        for name, inherited_fd in (("stdout", 1), ("stderr", 2)):
            if getattr(spec, name) == "inherit":
                child_ends.append(inherited_fd)
                self._captures[name] = StreamCapture(0, 0, mode="inherit")
                self._captures[name].close()
                continue
            r, w = os.pipe2(os.O_CLOEXEC)
            fds += [r, w]
            os.set_blocking(r, False)
            enlarge_pipe(r)
            pipes[name] = r
            child_ends.append(w)
            log_path = None
            log_fd = None
            if spec.log_file is not None:
                log_path = spec.log_file if name == "stdout" else f"{spec.log_file}.stderr"
                log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                                 0o640)
                fds.append(log_fd)
            self._captures[name] = StreamCapture(
                spec.output_head, spec.output_tail, log_fd=log_fd,
                log_limit=spec.log_max_bytes, log_path=log_path)
        if spec.stdin == "inherit":
            stdin_fd = 0
        elif isinstance(spec.stdin, bytes):
            r, w = os.pipe2(os.O_CLOEXEC)
            fds += [r, w]
            os.set_blocking(w, False)
            stdin_fd = r
            pipes["stdin"] = w
        else:
            stdin_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            fds.append(stdin_fd)
        with spec.isolation.prepare() as options:
            spawned = spawn(spec.argv, env=spec.environment(), cgroup_fd=leaf.fd,
                            stdin=stdin_fd, stdout=child_ends[0], stderr=child_ends[1],
                            cwd=spec.cwd, **options)
        # the child has its copies: ours of the child's ends must go, or EOF never comes
        keep = set(pipes.values()) | {c.log_fd for c in self._captures.values()}
        for fd in fds:
            if fd not in keep:
                os.close(fd)
        return spawned, pipes

    async def _supervise(self, leaf: Cgroup, spawned: Spawned, pipes: dict[str, int],
                         t0: float, started_at: float) -> TaskResult:
        spec = self.spec
        reactor = self._sup._reactor
        outputs = {name: reactor.add(pipes[name], self._captures[name])
                   for name in ("stdout", "stderr") if name in pipes}
        feeder = trio.CancelScope()
        drive: _Drive | None = None
        try:
            # a nursery only for a stdin feeder: most tasks need none, and every running
            # task's memory counts when a supervisor holds thousands
            feeding = "stdin" in pipes
            async with trio.open_nursery() if feeding else contextlib.nullcontext() as n:
                if feeding:
                    assert isinstance(spec.stdin, bytes) and n is not None
                    n.start_soon(_feed_stdin, pipes["stdin"], spec.stdin, feeder)
                try:
                    drive = await self._drive(leaf, spawned.pidfd, t0)
                except BaseException:
                    # the driver itself failed (a bug): nothing may outlive it
                    with contextlib.suppress(CgroupError):
                        leaf.kill()
                    raise
                finally:
                    feeder.cancel()  # whoever still holds stdin now is outside the leaf
                # End of output: EOF, or the drain deadline (the leaf is empty, so whoever
                # still holds a pipe is outside it and EOF may never come).
                with trio.move_on_after(DRAIN_DEADLINE, shield=True):
                    for done in outputs.values():
                        await done.wait()
        except BaseException as e:
            # Ctrl-C at the nursery's exit (main task only): record first, then let it go
            # on.  Anything before the driver's end is a bug, for _run to handle.
            if drive is None or drive.status is None:
                raise
            drive.pending = drive.pending or first_leaf(e)
        finally:
            for name in outputs:
                reactor.remove(pipes[name])
        assert drive is not None and drive.status is not None
        stats = _read_stats(leaf, self._sup._controllers)
        cleanup = await self._remove_leaf_async(leaf, drive.leftovers, drive.problems)
        result = self._outcome(drive.status, drive.exited_at, t0, started_at, stats, cleanup,
                               spawned, leaf)
        if drive.pending is not None:
            raise drive.pending
        return result

    async def _drive(self, leaf: Cgroup, pidfd: int, t0: float) -> _Drive:
        """Wait for the main process, enforce the time limit, escalate a stop; then wait for
        the leaf to empty, stopping what the main process left the same way.

        One loop, one wait at a time, woken by the pidfd, the watcher, a deadline (time limit,
        end of grace, next repeat) or a stop request (``StopState.waker``).  After the
        caller's cancellation or a Ctrl-C the waits are shielded and the interruption is kept
        in ``pending``, to be raised once the task has its record.
        """
        spec, stop, watcher = self.spec, self._stop, self._sup._watcher
        d = _Drive()
        limit_at = math.inf if self.time_limit is None else t0 + self.time_limit
        grace_end = repeat_at = kill_by = math.inf
        escalating = killed = False
        while True:
            wake_at = min(limit_at if stop.reason is None and d.status is None else math.inf,
                          grace_end, repeat_at, kill_by)
            try:
                with trio.CancelScope(deadline=wake_at, shield=d.pending is not None) as waker:
                    stop.waker = waker
                    if stop.reason is None or escalating:
                        if d.status is None:
                            await trio.lowlevel.wait_readable(pidfd)
                        else:
                            await watcher.wait_empty(leaf)
            except (trio.Cancelled, KeyboardInterrupt) as e:
                # the caller's scope was cancelled, or Ctrl-C: first a graceful stop, then
                # (a second Ctrl-C) a kill
                d.pending = d.pending or e
                if self._result is None:
                    self._request(StopReason.CANCEL)
            finally:
                stop.waker = None
            now = trio.current_time()
            if d.status is None and _exited_nowait(pidfd):
                d.status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
                d.exited_at = now
                self.state = "stopping"
                if leaf.is_populated() and not killed:
                    # (after a kill, what is still listed is dying with the main process,
                    # not left behind by it)
                    d.leftovers = [ProcessInfo(pid, _comm(pid)) for pid in leaf.procs()]
            if d.status is not None and not leaf.is_populated():
                break
            if stop.reason is None and d.status is None and now >= limit_at:
                stop.request(StopReason.TIME_LIMIT)
            if not escalating and (stop.reason is not None or d.status is not None):
                # one pass, never restarted: the stop signal now, the kill at the grace's end
                escalating = True
                if spec.grace_s > 0 and not stop.forced:
                    main_alive = d.status is None and not _exited_nowait(pidfd)
                    signal_leaf(leaf, stop.signal)
                    stop.signalled_leaf = True
                    if stop.reason is not None:
                        stop.mark("signalled")
                        stop.landed = main_alive
                    grace_end = now + spec.grace_s
                    if spec.repeat_s is not None:
                        repeat_at = now + spec.repeat_s
                    continue
            if escalating and not killed and (stop.forced or now >= grace_end
                                              or spec.grace_s == 0):
                main_alive = d.status is None and not _exited_nowait(pidfd)
                leaf.kill()
                killed = self._killed_leftovers = True
                if stop.reason is not None:
                    stop.mark("killed")
                    stop.landed = stop.landed or main_alive
                grace_end = repeat_at = math.inf
                kill_by = now + KILL_TIMEOUT
            elif now >= repeat_at:
                signal_leaf(leaf, stop.signal)
                assert spec.repeat_s is not None
                repeat_at = now + spec.repeat_s
            if killed and now >= kill_by:
                d.problems.append("the leaf did not empty within "
                                  f"{KILL_TIMEOUT:.0f}s of cgroup.kill")
                if d.status is None:  # the main process itself is stuck (D state?): keep
                    kill_by = math.inf  # waiting for it, the problem is on record
                    continue
                break
        stop.mark("gone")
        return d

    async def _remove_leaf_async(self, leaf: Cgroup, leftovers: list[ProcessInfo],
                                 problems: list[str]) -> Cleanup:
        """rmdir the empty leaf.  The kernel may answer EBUSY for a moment after ``populated
        0``: retry with trio sleeps (never blocking the other tasks), a second at most."""
        delay = 0.001
        deadline = trio.current_time() + 1.0
        while True:
            try:
                leaf.remove(busy_timeout=0)
                return self._cleanup(leftovers, problems)
            except CgroupBusy as e:
                if trio.current_time() >= deadline:
                    return self._cleanup(leftovers, [*problems, str(e)])
            except CgroupError as e:
                return self._cleanup(leftovers, [*problems, str(e)])
            with trio.CancelScope(shield=True):
                await trio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _remove_leaf(self, leaf: Cgroup, problems: list[str] | None = None) -> Cleanup:
        """rmdir a leaf that never held a process (or whose processes were killed)."""
        problems = list(problems or [])
        try:
            leaf.remove()
        except CgroupError as e:
            problems.append(str(e))
        return self._cleanup([], problems)

    def _cleanup(self, leftovers: list[ProcessInfo], problems: list[str]) -> Cleanup:
        ended_by = None
        if leftovers:
            ended_by = ("killed" if self._killed_leftovers else
                        "stop signal" if self._stop.signalled_leaf else "exited")
        if problems:
            return Cleanup("incomplete", tuple(leftovers), ended_by, "; ".join(problems))
        return Cleanup("clean", tuple(leftovers), ended_by)

    def _outcome(self, status: os.waitid_result, exited_at: float, t0: float, started_at: float,
                 stats: CgroupStats | None, cleanup: Cleanup, spawned: Spawned,
                 leaf: Cgroup) -> TaskResult:
        exit_code: int | None = None
        sig: int | None = None
        if status.si_code == os.CLD_EXITED:
            exit_code = status.si_status
        else:
            sig = status.si_status
        oom_kills = None
        if stats is not None and stats.memory_events is not None:
            oom_kills = stats.memory_events.oom_kill
        stop = self._stop
        if stop.landed:
            outcome = (Outcome.TIMED_OUT if stop.reason == StopReason.TIME_LIMIT
                       else Outcome.CANCELLED)
        elif sig == 9 and oom_kills:
            outcome = Outcome.OOM_KILLED
        elif sig is not None:
            outcome = Outcome.SIGNALED
        elif exit_code:
            outcome = Outcome.FAILED
        else:
            outcome = Outcome.SUCCEEDED
        usage = _usage(stats, exited_at - t0, oom_kills)
        notes = []
        if stop.reason is not None and not stop.landed:
            notes.append(f"a stop ({stop.reason}) was requested after the main process ended")
        if oom_kills and outcome != Outcome.OOM_KILLED:
            notes.append(f"the OOM killer ended {oom_kills} process(es) in the task's cgroup")
        if spawned.fallback_errno:
            notes.append(f"spawned by {spawned.method}: clone3 into the cgroup was refused "
                         f"({errno.errorcode.get(spawned.fallback_errno, '?')})")
        containment = Containment("cgroup", leaf.path, spawned.method,
                                  tuple(sorted(self._sup._controllers)))
        return self._record(outcome, started=True, exit_code=exit_code, sig=sig,
                            cleanup=cleanup, usage=usage, t0=t0, started_at=started_at,
                            notes=notes, containment=containment)

    def _record(self, outcome: Outcome, *, started: bool, exit_code: int | None = None,
                sig: int | None = None, cleanup: Cleanup | None = None,
                usage: Usage | None = None, t0: float | None = None,
                started_at: float | None = None, notes: list[str] | None = None,
                error: BaseException | None = None, step: str | None = None,
                containment: Containment | None = None) -> TaskResult:
        if self._result is not None:
            raise InternalError(f"task {self.id} was about to get a second final record")
        empty = StreamCapture(0, 0).result()
        result = TaskResult(
            id=self.id, argv=self.spec.argv, outcome=outcome, exit_code=exit_code, signal=sig,
            started=started, cleanup=cleanup or Cleanup("clean"),
            stop=self._stop.record(t0 if t0 is not None else self._stop.requested_at or 0.0),
            usage=usage or Usage(),
            output_stdout=self._captures["stdout"].result() if "stdout" in self._captures
            else empty,
            output_stderr=self._captures["stderr"].result() if "stderr" in self._captures
            else empty,
            containment=containment or Containment("cgroup"),
            time_limit=self.time_limit, created_at=self._created_at, started_at=started_at,
            ended_at=time.time(), notes=(*self._notes, *(notes or ())),
            error=None if error is None else str(error),
            error_errno=getattr(error, "errno", None), error_step=step,
        )
        self._result = result
        self.state = "finished"
        self._done.set()
        self._sup._recorded(result)
        return result


def _exited_nowait(pidfd: int) -> bool:
    """Has the process exited (reaped or not)?  Leaves it for _wait_exit to reap."""
    try:
        return os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # already reaped


async def _wait_exit(pidfd: int) -> os.waitid_result:
    while True:
        await trio.lowlevel.wait_readable(pidfd)
        status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        if status is not None:
            return status


async def _feed_stdin(fd: int, data: bytes, scope: trio.CancelScope) -> None:
    view = memoryview(data)
    try:
        # the caller's cancellation is the driver's to handle: only ``scope`` ends this
        with trio.CancelScope(shield=True), scope:
            await _write_all(fd, view)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)


async def _write_all(fd: int, view: memoryview) -> None:
    while view:
        await trio.lowlevel.wait_writable(fd)
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return  # the task stopped reading: not our failure
        view = view[n:]


def _read_stats(leaf: Cgroup, controllers: frozenset[str]) -> CgroupStats | None:
    try:
        return leaf.read_stats(controllers)
    except CgroupError as e:
        log.warning("reading the usage of %s: %s", leaf.path, e)
        return None


def _usage(stats: CgroupStats | None, wall: float, oom_kills: int | None) -> Usage:
    if stats is None:
        return Usage(wall_s=round(wall, 6))
    cpu = stats.cpu

    def sec(usec: int | None) -> float | None:
        return None if usec is None else usec / 1e6

    return Usage(
        wall_s=round(wall, 6),
        cpu_user_s=sec(cpu.user_usec) if cpu else None,
        cpu_system_s=sec(cpu.system_usec) if cpu else None,
        cpu_total_s=sec(cpu.usage_usec) if cpu else None,
        memory_peak=stats.memory_peak,
        pids_peak=stats.pids_peak,
        oom_kills=oom_kills,
    )
