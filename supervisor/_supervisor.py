"""The supervisor: owns a cgroup root, runs tasks in leaves below it, stops them all on exit.

Ownership: the supervisor owns its root (made for it, locked with flock, see ``placement``),
its keeper (a tiny process that kills the root if this process dies, ``_keeper``), the inotify
watcher, the I/O reactor and the spawn guard; it hands each task a
:class:`~supervisor._task.Runtime` with exactly those and four callbacks.  Each task's life runs
in the caller's nursery (``start``) or the supervisor's own (``run``) and owns its leaf, pipes
and pidfd.  The supervisor keeps a handle on every live task so that closing it can stop them
(reason ``shutdown``) and wait for their records before it removes its root.

Ctrl-C: trio raises KeyboardInterrupt in the main task only, where the caller waits (``run``,
``start`` awaited directly, ``TaskHandle.wait``, closing the supervisor, a nursery the
KeyboardInterrupt left), never inside a task's life.  Everywhere the first one becomes a
graceful stop, a second one a kill, and exactly one KeyboardInterrupt goes on once the
records exist: ``_interrupt.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
import re
import secrets
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from cgroupfs import CgroupError

from ._batch import Batch, drive_batch
from ._ending import Ending
from ._errors import ConfigError, SpecError, SupervisorError
from ._guard import SpawnGuard
from ._interrupt import CtrlC, Interrupts, from_ctrl_c
from ._keeper import Keeper
from ._life import live
from ._output import IoReactor, Latch
from ._result import Cleanup, Outcome, StopReason, TaskResult
from ._sample import Sampler
from ._spec import DEFAULT_GRACE, TaskSpec
from ._task import (
    Incident,
    Runtime,
    Task,
    TaskHandle,
    final_result,
    finish,
    finish_unstarted,
    request_stop,
)
from ._tracking import remember_home
from ._units import UnitsError, format_duration, parse_duration
from ._watch import CgroupWatcher
from .placement import Placement, adopt_root, check_limits, place_async
from .placement._instance import INSTANCE_NAME

if TYPE_CHECKING:  # (imported by a hand-over itself: most supervisors never make one)
    from ._handover import HandOver

__all__ = ["DEFAULT_GRACE", "Batch", "Supervisor", "open_supervisor"]

log = logging.getLogger(__name__)

_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Supervisor:
    """Runs tasks; made by :func:`open_supervisor`."""

    def __init__(self, placement: Placement, watcher: CgroupWatcher, reactor: IoReactor,
                 guard: SpawnGuard, sampler: Sampler, default_time_limit: float | None,
                 max_time_limit: float | None, retain_results: int) -> None:
        self._placement = placement
        self._rt = Runtime(placement.root, placement.controllers, watcher, reactor, guard,
                           placement.root_view, sampler, self._recorded, self._ended)
        self.default_time_limit = default_time_limit
        # Without an explicit ceiling the default is the ceiling: a caller may shorten its
        # limit, never extend it, until the operator raises the ceiling.
        self.max_time_limit = max_time_limit if max_time_limit is not None else \
            default_time_limit
        self._prefix = secrets.token_hex(3)
        self._counter = 0
        self._live: dict[str, Task] = {}
        self._retain = retain_results
        self.results: collections.OrderedDict[str, TaskResult] = collections.OrderedDict()
        self._born = 0  # tasks made or adopted so far: the order ``results`` keeps
        self._order: dict[str, int] = {}  # id -> its place in that order (live or kept)
        self._closing = False
        self._handover: HandOver | None = None
        self._nursery: trio.Nursery  # set by _serving: the supervisor's own nursery
        self._ctrl_c: CtrlC | None = None  # set by _serving (it needs the nursery)
        self._rt.on_cancelled = self._cancelled

    def pace_output(self, pace: Callable[[int], bool],
                    charge: Callable[[int, float], None]) -> None:
        """Read the output of tasks with an owner (:meth:`TaskHandle.own_output`) only while
        ``pace(owner)`` is false (else the pipes rest a moment: their writers block when they
        are full), and ``charge(owner, seconds)`` the time each read held the loop's thread."""
        self._rt.reactor.pace = pace
        self._rt.reactor.charge = charge

    @property
    def cgroup_root(self) -> str:
        """This supervisor's own root: each task's leaf is a directory in it."""
        return self._placement.root.path

    @property
    def controllers(self) -> frozenset[str]:
        """Controllers enabled for tasks: which limits work here."""
        return self._placement.controllers

    @property
    def placement_notes(self) -> list[str]:
        return list(self._placement.notes)

    @property
    def tasks(self) -> list[TaskHandle]:
        """The tasks not finished yet (queued, starting, running or stopping)."""
        return [t.handle for t in self._live.values()]

    # ---- making tasks --------------------------------------------------------------------

    def _new_task(self, spec: TaskSpec, task_id: str | None = None,
                  group: str | None = None) -> Task:
        if task_id is not None:
            self._check_id(task_id)
        if group is not None and (not isinstance(group, str) or not _TASK_ID.fullmatch(group)):
            raise SpecError("group", f"group must be 1 to 64 letters, digits, '_' or '-' (it "
                                     f"names a cgroup), got {group!r}")
        task = self._register(*self._admit(spec), task_id=task_id)
        task.group = group
        return task

    def _check_id(self, task_id: object) -> None:
        if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
            raise SpecError("task_id", f"task_id must be 1 to 64 letters, digits, '_' or '-' "
                                       f"(it names the task's cgroup), got {task_id!r}")
        if INSTANCE_NAME.fullmatch(task_id):
            raise SpecError("task_id", f"task_id {task_id!r} has the form of a supervisor's "
                                       f"root (corral-<pid>-<hex>), which another corral on "
                                       f"this cgroup could take for a stale one and clear; "
                                       f"choose another")
        if task_id in self._live or task_id in self.results:
            raise SpecError("task_id", f"task_id {task_id!r} is taken by another task of this "
                                       f"supervisor: ids are never reused; choose another")

    def _admit(self, spec: TaskSpec) -> tuple[TaskSpec, float | None, tuple[str, ...]]:
        """Check ``spec`` against this supervisor: the spec (its grace capped), its time limit
        and notes.  Registers nothing, so that a batch is refused whole or admitted whole.

        The ceiling bounds both a task's time limit and its grace: a stop the supervisor makes
        itself never escalates before the grace ends, so an uncapped grace would let a task
        that ignores the stop signal outlive the ceiling by as long as it asked."""
        if self._closing:
            raise SupervisorError("the supervisor is shutting down: no new tasks")
        check_limits(spec.limits, self.controllers, self.cgroup_root)
        limit = spec.time_limit_s if spec.time_limit_s is not None else self.default_time_limit
        ceiling = self.max_time_limit
        if ceiling is None:
            return spec, limit, ()
        notes: tuple[str, ...] = ()
        if spec.grace_s > ceiling:  # (noted when the grace was chosen, not the default)
            if spec.grace_s != DEFAULT_GRACE:
                notes = (f"grace {format_duration(spec.grace_s)} capped to the "
                         f"{format_duration(ceiling)} ceiling",)
            spec = dataclasses.replace(spec, grace=ceiling)
        if limit is None:
            return spec, ceiling, (f"no time limit given: the {format_duration(ceiling)} "
                                   f"ceiling applies", *notes)
        if limit > ceiling:
            return spec, ceiling, (f"time limit {format_duration(limit)} capped to the "
                                   f"{format_duration(ceiling)} ceiling", *notes)
        return spec, limit, notes

    def _register(self, spec: TaskSpec, limit: float | None, notes: tuple[str, ...], *,
                  task_id: str | None = None) -> Task:
        self._counter += 1
        task = Task(self._rt, task_id or f"{self._prefix}-{self._counter}", spec, limit, notes)
        self._live[task.id] = task
        self._born_now(task.id)
        return task

    def _born_now(self, task_id: str) -> None:
        self._born += 1
        self._order[task_id] = self._born

    def _ended(self, task: Task) -> None:
        self._live.pop(task.id, None)
        if self._ctrl_c is not None:
            self._ctrl_c.ended(task)

    def _cancelled(self, task: Task, exc: trio.Cancelled) -> None:
        """The caller's cancellation reached ``task`` running: one a Ctrl-C caused (it left
        the caller's nursery) makes the next Ctrl-C ours, to kill it now."""
        if from_ctrl_c(exc) and self._ctrl_c is not None:
            self._ctrl_c.stopping(task)

    def _kill_after_ctrl_c(self, task: Task) -> None:
        # (the caller's second request: the cancellation was its first)
        request_stop(task, StopReason.CANCEL, by_caller=True, by_signal=signal.SIGINT)

    @property
    def retain_results(self) -> int:
        """How many records ``results`` keeps (the oldest go first).  Lowering it lets the
        oldest go now; a caller that keeps its own records (the daemon, once it has taken
        over an earlier run's) sets 0: a record holds its command's argv, and sixteen of a
        MiB each held 75 MiB of strings."""
        return self._retain

    @retain_results.setter
    def retain_results(self, n: int) -> None:
        self._retain = _retain_count(n)
        self._let_go()

    def _recorded(self, result: TaskResult) -> None:
        """Keep ``result`` in ``results``, which are in the order the tasks were made
        (oldest first), however they ended; the oldest go beyond ``retain_results``."""
        if result.id not in self._order:  # (a record of a task never made: lost, unstarted)
            self._born_now(result.id)
        place = self._order[result.id]
        later = []  # kept records of tasks made after this one: they go after it
        for kept in reversed(self.results):
            if self._order.get(kept, 0) < place:
                break
            later.append(kept)
        self.results[result.id] = result
        for kept in reversed(later):
            self.results.move_to_end(kept)
        self._let_go()

    def _let_go(self) -> None:
        while len(self.results) > self._retain:
            gone, _ = self.results.popitem(last=False)
            self._order.pop(gone, None)

    # ---- the public verbs ------------------------------------------------------------------

    async def run(self, argv: Sequence[str] | TaskSpec, *, task_id: str | None = None,
                  group: str | None = None, **options: Any) -> TaskResult:
        """Run ``argv`` to the end and return its :class:`TaskResult`.

        Options are the fields of :class:`TaskSpec` (or pass a TaskSpec as ``argv``).  Bad
        options raise a ``ValueError`` subclass before anything is created.  ``task_id``: the
        task's id (1-64 of ``[A-Za-z0-9_-]``; not one of a live task, nor of a record still
        in ``results``: once ``retain_results`` has let a record go, its id may be given
        again, as a caller that numbers its own tasks, the daemon, does; ids made here never
        repeat); default:
        ``<random prefix>-<n>``.  ``group``: the task's leaf is made in the cgroup ``@group``
        of our root (made at its first task, the root's controllers enabled in it), not in
        the root itself, so that where the ``cpu`` (or ``io``) controller is enabled, the
        tasks of one group together weigh as one sibling against another's (the daemon
        groups each uid's tasks so); the same rule as a ``task_id``.

        Cancellation: if the caller's scope is cancelled, the task is stopped gracefully (stop
        signal, grace, then cgroup.kill); ``run`` waits, shielded, for its cleanup and final
        record, which is then in ``supervisor.results``, and only then lets ``Cancelled``
        through.  Ctrl-C (in trio's main task): the first stops the task gracefully, a second
        kills it now; one KeyboardInterrupt is raised once the record exists.
        """
        task = self._new_task(TaskSpec.from_call(argv, options), task_id, group)
        return await self._to_record(task)

    async def _to_record(self, task: Task) -> TaskResult:
        """The life of ``task`` in our nursery, waited for here: the caller's cancellation is
        one graceful stop request by the caller (and the waits after it are shielded), each
        Ctrl-C a stop request by the caller (the second kills: ``_interrupt.py``); the
        KeyboardInterrupt, or the Cancelled, goes on once the record exists."""
        if trio.current_effective_deadline() == -math.inf:
            # called in an already cancelled scope: the stop comes before the spawn
            request_stop(task, StopReason.CANCEL, by_caller=True)
        life = _Life()
        self._nursery.start_soon(_life_of, task, life)
        interrupts = Interrupts()
        cancelled: trio.Cancelled | None = None
        while not life.ended.is_set():
            try:
                if cancelled is None:
                    await life.ended.wait()
                else:
                    with trio.CancelScope(shield=True):
                        await life.ended.wait()
            except KeyboardInterrupt as exc:
                interrupts.caught(exc, [task])
            except trio.Cancelled as exc:
                cancelled = exc  # the caller's cancellation: a graceful stop by the caller
                request_stop(task, StopReason.CANCEL, by_caller=True)
        if life.error is not None:
            raise life.error
        interrupts.reraise()
        if cancelled is not None:
            raise cancelled
        return final_result(task)

    def start(self, argv: Sequence[str] | TaskSpec, *, task_id: str | None = None,
              group: str | None = None, taps: Sequence[str] = (),
              task_status: trio.TaskStatus[TaskHandle] = trio.TASK_STATUS_IGNORED,
              **options: Any) -> Coroutine[Any, Any, TaskResult | None]:
        """Start ``argv`` in a nursery: ``task = await nursery.start(sup.start, argv)``.

        Hands back a :class:`TaskHandle` once the process runs (or once it is known that it
        never will: then ``task.wait()`` returns the ``spawn_failed`` or ``cancelled`` result
        at once).  The task's life continues in the nursery; cancelling the nursery stops the
        task gracefully, as for :meth:`run`.  Bad options raise here, before anything starts.
        ``taps``: streams to tap from the spawn on (``handle.tap(name)`` then returns that tap:
        not a byte is missed).  ``group``: as for :meth:`run`.

        Awaited directly (``await sup.start(argv)``) it is :meth:`run`: the record once the
        task has ended, with the same rules for cancellation and Ctrl-C.

        (A plain function returning the life's coroutine, so that a held task costs one
        coroutine frame less: a supervisor may hold thousands.)  The coroutine returns the
        record, or None for a task :meth:`hand_over` handed to another process.
        """
        task = self._new_task(TaskSpec.from_call(argv, options), task_id, group)
        for name in taps:
            if name not in ("stdout", "stderr"):
                raise SpecError("taps", f"taps are \"stdout\" and/or \"stderr\", got "
                                        f"{name!r}")
        task.taps = tuple(taps)
        if task_status is trio.TASK_STATUS_IGNORED:
            # awaited directly (not by nursery.start): as run(), its life in our nursery, so
            # that a Ctrl-C to the caller is a stop and never lands inside the life
            return self._to_record(task)
        return live(task, task_status)

    def record_unstarted(self, argv: Sequence[str] | TaskSpec, *,
                         reason: StopReason | str = StopReason.CANCEL,
                         task_id: str | None = None, by_signal: int | None = None,
                         notes: Sequence[str] = (), **options: Any) -> TaskResult:
        """The final record of a task that was accepted but will never run (a daemon's own
        queue dropped it, a shutdown came first, a Ctrl-C before the spawn): ``cancelled``,
        ``started=False``, with ``reason`` (``cancel`` as the caller's, or ``shutdown``,
        ``fail_fast``...) and ``by_signal`` (see ``TaskHandle.stop``) in its stop record.
        ``notes`` go into the record too.  Nothing is created; the task takes an id like
        any other."""
        reason = StopReason(reason)
        task = self._new_task(TaskSpec.from_call(argv, options), task_id)
        task.notes = (*task.notes, *notes)
        request_stop(task, reason, by_caller=reason == StopReason.CANCEL, by_signal=by_signal)
        result = finish_unstarted(task)
        self._ended(task)
        return result

    def record_lost(self, argv: Sequence[str] | TaskSpec, *, why: str, started: bool,
                    task_id: str | None = None, cleanup: Cleanup | None = None,
                    created_at: float | None = None, started_at: float | None = None,
                    notes: Sequence[str] = (), **options: Any) -> TaskResult:
        """The final record of a task this supervisor cannot follow to its end (the daemon
        that ran it died, or failed it): ``lost``, error step ``daemon`` with ``why``, the
        ``cleanup`` as known (default: incomplete, nothing known), ``created_at`` and
        ``started_at`` as they were (wall clock).  A complete record of the result format,
        like any other; nothing is created."""
        task = self._new_task(TaskSpec.from_call(argv, options), task_id)
        if created_at is not None:
            task.created_at = created_at
        task.stop.finish()
        result = finish(task, Ending(
            Outcome.LOST, started=started, error=RuntimeError(why), step="daemon",
            started_at=started_at, notes=(*notes, why),
            cleanup=cleanup or Cleanup("incomplete", detail="what became of the task's "
                                                            "processes is not known")))
        self._ended(task)
        return result

    async def run_batch(self, specs: Iterable[TaskSpec], max_concurrency: int = 4,
                        fail_fast: bool = False) -> list[TaskResult]:
        """Run ``specs`` at most ``max_concurrency`` at a time; results in the given order.

        Every spec is checked before any task starts.  With ``fail_fast``, the first task that
        does not succeed stops the others (reason ``fail_fast``; queued ones never start).
        Cancelling the caller's scope cancels the batch: queued tasks end ``cancelled``
        without starting, running ones are stopped gracefully.  To be able to cancel twice
        (the second cancel kills now), use :meth:`start_batch`.
        """
        batch = self._new_batch(specs, max_concurrency)
        async with trio.open_nursery() as nursery:
            await nursery.start(drive_batch, batch, max_concurrency, fail_fast)
        return batch.results()

    async def start_batch(self, specs: Iterable[TaskSpec], max_concurrency: int = 4,
                          fail_fast: bool = False, *,
                          task_status: trio.TaskStatus[Batch] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
        """``batch = await nursery.start(sup.start_batch, specs)``; see :class:`Batch`."""
        batch = self._new_batch(specs, max_concurrency)
        await drive_batch(batch, max_concurrency, fail_fast, task_status=task_status)

    def _new_batch(self, specs: Iterable[TaskSpec], max_concurrency: int) -> Batch:
        specs = list(specs)
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or \
                max_concurrency < 1:
            raise SpecError("max_concurrency", f"max_concurrency must be a whole number >= 1, "
                                               f"got {max_concurrency!r}")
        for i, spec in enumerate(specs):
            if not isinstance(spec, TaskSpec):
                raise SpecError("specs", f"specs[{i}] must be a TaskSpec, got {spec!r}: build "
                                         f"it with TaskSpec([\"cmd\", \"arg\"], ...)")
        admitted = [self._admit(s) for s in specs]
        return Batch([self._register(*a) for a in admitted])

    async def hand_over(self) -> HandOver:
        """Stop supervising without stopping anything, for another process to carry on (a
        daemon's restart): every running task's driver lets go, its pipes come off the
        reactor unread, and on leaving ``open_supervisor`` the root is kept (not removed) and
        the keeper told to leave it alone.  Tasks already finishing are recorded here first;
        queued ones are recorded as never started (reason ``shutdown``).  Returns what the
        next process passes to ``open_supervisor(adopt=...)``: keep its :meth:`HandOver.fds`
        alive across the restart (systemd's fd store) and its :meth:`HandOver.to_json`.
        Waiters on a handed-over task get HandedOver."""
        if self._handover is not None:
            raise SupervisorError("this supervisor has handed its tasks over already")
        from ._handover import HandOver, export_task

        self._closing = True
        handover = self._handover = HandOver(self.cgroup_root, os.dup(self._placement.root.fd))
        self._rt.on_detach = functools.partial(export_task, handover)
        for task in list(self._live.values()):
            if task.driver is None or not task.driver.detach():
                request_stop(task, StopReason.SHUTDOWN, by_caller=False)  # not running yet
        with trio.CancelScope(shield=True):
            for task in list(self._live.values()):
                if not task.began:
                    finish_unstarted(task)
                    self._ended(task)
                else:
                    await task.done.wait()
        return handover

    def _adopt(self, handover: HandOver, nursery: trio.Nursery) -> None:
        """Carry on the tasks an earlier process handed over, each in our nursery."""
        from ._handover import adopt_all

        adopt_all(self._rt, handover, nursery, self._adopted)

    def _adopted(self, task: Task) -> None:
        self._live[task.id] = task
        self._born_now(task.id)

    def stop_all(self, *, force: bool = False, reason: StopReason = StopReason.CANCEL,
                 by_signal: int | None = None) -> int:
        """Ask every live task to stop; returns how many requests changed something.

        ``reason=CANCEL`` (the default) asks as the caller: a second call kills.  ``SHUTDOWN``
        is the supervisor's own stop (a daemon draining): graceful, and it never turns a
        caller's first request into a kill; ``force=True`` kills now whatever the reason.
        ``by_signal``: the signal to this program that asks (see ``TaskHandle.stop``).
        """
        by_caller = reason == StopReason.CANCEL
        return sum(request_stop(h, reason, by_caller=by_caller, force=force,
                                by_signal=by_signal)
                   for h in list(self._live.values()))

    async def _shutdown(self) -> None:
        """Stop every live task (reason ``shutdown``: the supervisor's own, graceful) and wait
        for their records.  Ctrl-C meanwhile kills them all now; it is raised at the end."""
        self._closing = True
        for task in list(self._live.values()):
            request_stop(task, StopReason.SHUTDOWN, by_caller=False)
        interrupts = Interrupts()
        interrupts.count = 1  # (the shutdown was the graceful request: a Ctrl-C kills now)
        for task in list(self._live.values()):
            if not task.began:
                # start()'s coroutine was made but never run (dropped by its caller): nothing
                # was created, and nothing else will ever end it
                finish_unstarted(task)
                self._ended(task)
                continue
            while not task.done.is_set():
                try:
                    await task.done.wait()
                except KeyboardInterrupt as exc:
                    interrupts.caught(exc, list(self._live.values()),
                                      reason=StopReason.SHUTDOWN)
        interrupts.reraise()

    @trio.lowlevel.enable_ki_protection  # (a Ctrl-C goes to the main task: see live())
    async def _guard_root(self) -> None:
        """A task with write access to our cgroups may freeze our root: thaw it at once, and
        say so in the records of the tasks running meanwhile.  Woken by writes to the root's
        cgroup.freeze only (IN_MODIFY), so it costs nothing per task.  Runs until cancelled.
        (A freeze of an ancestor outside corral is not ours to undo: a stop still ends a
        frozen task, by cgroup.kill at the end of its grace.)"""
        root, watcher = self._placement.root, self._rt.watcher
        path = os.path.join(root.path, "cgroup.freeze")

        def frozen() -> bool:
            try:
                return root.read_file("cgroup.freeze").strip() == "1"
            except CgroupError:
                return False

        while True:
            try:
                await watcher.wait_file(path, frozen)
                root.write_file("cgroup.freeze", "0")
            except (CgroupError, FileNotFoundError) as e:
                log.warning("guarding our root %s against freezes: %s", root.path, e)
                return
            self._incident(f"corral's root {root.path} was frozen (someone wrote 1 to its "
                           f"cgroup.freeze: a task with write access to corral's cgroups?) "
                           f"while this task ran; corral thawed it")

    @trio.lowlevel.enable_ki_protection  # (a Ctrl-C goes to the main task: see live())
    async def _guard_keeper(self, keeper: Keeper) -> None:
        """The keeper may die before us (an operator's kill, the OOM killer): then nothing
        would end our tasks should we die too.  Start another at once, and say so in the
        records of the tasks running meanwhile.  Runs until cancelled."""
        while True:
            await trio.lowlevel.wait_readable(keeper.fileno())
            dead = keeper.pid
            try:
                status = keeper.rearm()
            except (SupervisorError, OSError) as e:
                self._incident(f"corral's keeper (pid {dead}) died and no other could be "
                               f"started ({e}): had corral died too, its tasks would have "
                               f"outlived it")
                return
            self._incident(f"corral's keeper (pid {dead}, which ends the tasks should corral "
                           f"die) died (status {status}) while this task ran; a new one (pid "
                           f"{keeper.pid}) took its place")

    def _incident(self, text: str) -> None:
        log.warning("%s", text)
        self._rt.incidents.append(Incident(trio.current_time(), text))
        del self._rt.incidents[:-100]  # bounded: the newest hundred


class _Life:
    """A life that ``run`` started in the supervisor's nursery: ended (after its record, and
    after whatever it raised), and what it raised (our InternalError, for ``run`` to raise)."""

    __slots__ = ("ended", "error")

    def __init__(self) -> None:
        self.ended = Latch()
        self.error: Exception | None = None


async def _life_of(task: Task, life: _Life) -> None:
    """``live(task)`` in the supervisor's nursery, for ``run``: a task of its own (never
    trio's main task, which gets KeyboardInterrupt) without a nursery per call (each costs
    scheduling rounds).  Shielded: the caller's cancellation reaches it as ``run``'s one stop
    request (a scope cancelled around the supervisor would otherwise count twice, a kill).
    What it raises goes to ``run``'s caller, not to our nursery."""
    try:
        with trio.CancelScope(shield=True):
            await live(task)
    except Exception as exc:
        life.error = exc
    finally:
        life.ended.set()


def _config_duration(name: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, name)
    except UnitsError as e:
        raise ConfigError(str(e)) from None


def _retain_count(n: Any) -> int:
    """``retain_results`` checked: a whole number of records, 0 or more (ConfigError)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"retain_results must be a count of records to keep, 0 or more, "
                          f"got {n!r}")
    return n


@asynccontextmanager
async def open_supervisor(cgroup_root: str | None = None, default_time_limit: Any = None,
                          max_time_limit: Any = None, *, retain_results: int = 1000,
                          sample_interval: Any = "1s",
                          adopt: HandOver | None = None) -> AsyncIterator[Supervisor]:
    """Open a supervisor: find a base, make its own root there, yield it, clean up on exit.

    ``cgroup_root``: a cgroup v2 directory to make our root in (default: discovered, see
    ``placement``).  ``default_time_limit`` applies to tasks that give none; ``max_time_limit``
    caps every task (a larger limit is capped, and the result's notes say so); without it, the
    default is the ceiling.  A ceiling below the default is refused here.  ``sample_interval``:
    how often each running task's usage is sampled into its record's series (None: never).
    ``retain_results``: how many records ``sup.results`` keeps (the oldest go first).
    ``adopt``: what an earlier process's :meth:`Supervisor.hand_over` gave: its root and its
    running tasks become this supervisor's (``cgroup_root`` is then not used).  On exit every
    task still live is stopped (reason ``shutdown``: stop signal, grace, kill), their records
    are awaited, and the root is removed (unless this supervisor handed its tasks over).
    """
    default = _config_duration("default_time_limit", default_time_limit)
    ceiling = _config_duration("max_time_limit", max_time_limit)
    interval = _config_duration("sample_interval", sample_interval)
    _retain_count(retain_results)
    if interval is not None and interval < 0.1:
        raise ConfigError(f"sample_interval must be at least 0.1s (or None for no sampling), "
                          f"got {sample_interval!r}")
    if default is not None and ceiling is not None and ceiling < default:
        raise ConfigError(
            f"max_time_limit ({format_duration(ceiling)}) is below default_time_limit "
            f"({format_duration(default)}): every task would be capped at once; raise the "
            f"ceiling or lower the default")
    placement = (adopt_root(adopt.root_path, adopt.root_fd) if adopt is not None
                 else await place_async(cgroup_root))
    remember_home()  # where to go back to, should a task move us into its leaf
    guard = SpawnGuard(placement.root, placement.base)
    keeper: Keeper | None = None
    handed_over = False
    try:
        # Armed before any task exists: if this process dies, the keeper kills the root.
        keeper = Keeper.start(placement.root)
        guard.start()
        async with _serving(placement, guard, Sampler(interval), default, ceiling,
                            retain_results, adopt, keeper) as sup:
            try:
                yield sup
            finally:
                handed_over = sup._handover is not None
    finally:
        guard.close()
        try:
            placement.close(keep=handed_over)
        finally:
            if keeper is not None:
                keeper.release() if handed_over else keeper.close()


@asynccontextmanager
async def _serving(placement: Placement, guard: SpawnGuard, sampler: Sampler,
                   default: float | None, ceiling: float | None, retain: int,
                   adopt: HandOver | None, keeper: Keeper) -> AsyncIterator[Supervisor]:
    """The supervisor's own trio tasks (watcher, reactor, root guard) around the caller's
    block; on exit every task is stopped and recorded first, then they go."""
    watcher, reactor = CgroupWatcher(), IoReactor()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.run)
            nursery.start_soon(reactor.run)
            sup = Supervisor(placement, watcher, reactor, guard, sampler, default, ceiling,
                             retain)
            sup._nursery = nursery  # where run() starts its tasks' lives
            sup._ctrl_c = CtrlC(nursery, sup._kill_after_ctrl_c)
            nursery.start_soon(sup._guard_root)
            nursery.start_soon(sup._guard_keeper, keeper)
            nursery.start_soon(sampler.run)
            if adopt is not None:
                sup._adopt(adopt, nursery)
            try:
                yield sup
            finally:
                with trio.CancelScope(shield=True):
                    await sup._shutdown()
                nursery.cancel_scope.cancel()
                watcher.stop()
                reactor.stop()
                for cgroup in sup._rt.groups.values():
                    cgroup.close()
    except BaseExceptionGroup as group:
        # The nursery is ours (it only runs our helpers): what the caller's block raised
        # comes back as itself, not wrapped in a group of ours.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
