"""The supervisor: owns a cgroup root, runs tasks in leaves below it, stops them all on exit.

Ownership: the supervisor owns its cgroups (root, ``tasks/``) and the inotify watcher; each
task's life runs in the caller's task or nursery and owns its leaf, pipes and pidfd.  The
supervisor keeps a handle on every live task so that closing it can stop them (reason:
``shutdown``) and wait for their records before it removes its cgroups.
"""

from __future__ import annotations

import collections
import logging
import secrets
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from ._errors import ConfigError, InternalError, SpecError, SupervisorError, first_leaf
from ._output import OutputReactor
from ._result import StopReason, TaskResult
from ._spec import DEFAULT_GRACE, TaskSpec
from ._task import QueueSlot, TaskHandle
from ._units import UnitsError, format_duration, parse_duration
from ._watch import CgroupWatcher
from .placement import Placement, check_limits, place_async

__all__ = ["DEFAULT_GRACE", "Batch", "Supervisor", "open_supervisor"]

log = logging.getLogger(__name__)

class Supervisor:
    """Runs tasks; made by :func:`open_supervisor`."""

    def __init__(self, placement: Placement, watcher: CgroupWatcher, reactor: OutputReactor,
                 default_time_limit: float | None, max_time_limit: float | None,
                 retain_results: int) -> None:
        self._placement = placement
        self._tasks = placement.tasks
        self._controllers = placement.controllers
        self._watcher = watcher
        self._reactor = reactor
        self.default_time_limit = default_time_limit
        self.max_time_limit = max_time_limit
        self._prefix = secrets.token_hex(3)
        self._counter = 0
        self._live: dict[str, TaskHandle] = {}
        self._retain = retain_results
        self.results: collections.OrderedDict[str, TaskResult] = collections.OrderedDict()
        self._closing = False

    @property
    def cgroup_root(self) -> str:
        return self._placement.root.path

    @property
    def controllers(self) -> frozenset[str]:
        """Controllers enabled for tasks: which limits work here."""
        return self._controllers

    @property
    def placement_notes(self) -> list[str]:
        return list(self._placement.notes)

    # ---- making tasks --------------------------------------------------------------------

    def _new_handle(self, spec: TaskSpec) -> TaskHandle:
        return self._register(spec, *self._admit(spec))

    def _admit(self, spec: TaskSpec) -> tuple[float | None, list[str]]:
        """Check ``spec`` against this supervisor; its time limit and notes.  Registers
        nothing, so that a batch is refused whole or admitted whole."""
        if self._closing:
            raise SupervisorError("the supervisor is shutting down: no new tasks")
        check_limits(spec.limits, self._controllers, self._tasks.path)
        notes: list[str] = []
        limit = spec.time_limit_s if spec.time_limit_s is not None else self.default_time_limit
        ceiling = self.max_time_limit
        if ceiling is not None:
            if limit is None:
                limit = ceiling
                notes.append(f"no time limit given: the {format_duration(ceiling)} ceiling "
                             f"applies")
            elif limit > ceiling:
                notes.append(f"time limit {format_duration(limit)} capped to the "
                             f"{format_duration(ceiling)} ceiling")
                limit = ceiling
        return limit, notes

    def _register(self, spec: TaskSpec, limit: float | None, notes: list[str]) -> TaskHandle:
        self._counter += 1
        task_id = f"{self._prefix}-{self._counter}"
        handle = TaskHandle(self, task_id, spec, limit, notes)
        self._live[task_id] = handle
        return handle

    def _forget(self, handle: TaskHandle) -> None:
        self._live.pop(handle.id, None)

    def _recorded(self, result: TaskResult) -> None:
        self.results[result.id] = result
        while len(self.results) > self._retain:
            self.results.popitem(last=False)

    # ---- the public verbs ------------------------------------------------------------------

    async def run(self, argv: Sequence[str] | TaskSpec, **options: Any) -> TaskResult:
        """Run ``argv`` to the end and return its :class:`TaskResult`.

        Options are the fields of :class:`TaskSpec` (or pass a TaskSpec as ``argv``).  Bad
        options raise a ``ValueError`` subclass before anything is created.

        Cancellation: if the caller's scope is cancelled, the task is stopped gracefully (stop
        signal, grace, then cgroup.kill); ``run`` waits, shielded, for its cleanup and final
        record, which is then the newest entry of ``supervisor.results``, and only then lets
        ``Cancelled`` through.
        """
        handle = self._new_handle(TaskSpec.from_call(argv, options))
        # The life runs in a task of its own: trio delivers Ctrl-C (KeyboardInterrupt) to the
        # main task, which may be this one, whatever shields are up.  Here it lands on the
        # wait below, and the life sees it as a cancellation: graceful stop, one record, then
        # the KeyboardInterrupt continues.
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle._live)
                return await handle.wait()
        except BaseExceptionGroup as group:
            raise _unwrapped(group) from None

    def start(self, argv: Sequence[str] | TaskSpec, *,
              task_status: trio.TaskStatus[TaskHandle] = trio.TASK_STATUS_IGNORED,
              **options: Any) -> Coroutine[Any, Any, TaskResult]:
        """Start ``argv`` in a nursery: ``task = await nursery.start(sup.start, argv)``.

        Hands back a :class:`TaskHandle` once the process runs (or once it is known that it
        never will: then ``task.wait()`` returns the ``spawn_failed`` or ``cancelled`` result
        at once).  The task's life continues in the nursery; cancelling the nursery stops the
        task gracefully, as for :meth:`run`.  Bad options raise here, before anything starts.

        (A plain function returning the life's coroutine, so that a held task costs one
        coroutine frame less: a supervisor may hold thousands.)
        """
        handle = self._new_handle(TaskSpec.from_call(argv, options))
        return handle._live(task_status)

    async def run_batch(self, specs: Iterable[TaskSpec], max_concurrency: int = 4,
                        fail_fast: bool = False) -> list[TaskResult]:
        """Run ``specs`` at most ``max_concurrency`` at a time; results in the given order.

        Every spec is checked before any task starts.  With ``fail_fast``, the first task that
        does not succeed cancels the batch.  Cancelling the caller's scope cancels the batch:
        queued tasks end ``cancelled`` without starting, running ones are stopped gracefully.
        To be able to cancel twice (the second cancel kills now), use :meth:`start_batch`.
        """
        batch = self._new_batch(specs, max_concurrency)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._drive_batch, batch, max_concurrency, fail_fast)
        return batch.results()

    async def start_batch(self, specs: Iterable[TaskSpec], max_concurrency: int = 4,
                          fail_fast: bool = False, *,
                          task_status: trio.TaskStatus[Batch] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
        """``batch = await nursery.start(sup.start_batch, specs)``; see :class:`Batch`."""
        batch = self._new_batch(specs, max_concurrency)
        await self._drive_batch(batch, max_concurrency, fail_fast, task_status=task_status)

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
        admitted = [(s, *self._admit(s)) for s in specs]
        return Batch([self._register(*a) for a in admitted])

    async def _drive_batch(self, batch: Batch, max_concurrency: int, fail_fast: bool, *,
                           task_status: trio.TaskStatus[Batch] = trio.TASK_STATUS_IGNORED,
                           ) -> None:
        # Admission is FIFO: each task queues behind the one before it, so tasks start in
        # the order given whatever order the scheduler wakes them in.
        limiter = trio.CapacityLimiter(max_concurrency)
        after: trio.Event | None = None
        async with trio.open_nursery() as nursery:
            for handle in batch.handles:
                slot = QueueSlot(limiter, after, trio.Event())
                after = slot.turn
                nursery.start_soon(batch._one, handle, slot, fail_fast)
            task_status.started(batch)

    def stop_all(self, *, force: bool = False, reason: StopReason = StopReason.CANCEL) -> int:
        """Ask every live task to stop; returns how many requests changed something."""
        return sum(h._request(reason, force) for h in list(self._live.values()))

    async def _shutdown(self) -> None:
        self._closing = True
        self.stop_all(reason=StopReason.SHUTDOWN)
        for handle in list(self._live.values()):
            if not handle._began:
                # start()'s coroutine was made but never run (dropped by its caller): nothing
                # was created, and nothing else will ever end it
                handle._finish_unstarted()
                self._forget(handle)
            await handle._done.wait()


class Batch:
    """A batch of tasks.  ``cancel()`` once: queued tasks never start, running ones stop
    gracefully; ``cancel()`` again: every running one is killed now."""

    def __init__(self, handles: list[TaskHandle]) -> None:
        self.handles = handles
        self._cancels = 0
        self._failed_fast = False

    def cancel(self) -> None:
        self._cancels += 1
        for h in self.handles:
            h._request(StopReason.CANCEL, force=self._cancels > 1)

    async def _one(self, handle: TaskHandle, slot: QueueSlot, fail_fast: bool) -> None:
        result = await handle._live(slot=slot)
        if fail_fast and result.outcome != "succeeded" and not self._failed_fast:
            # the batch's own graceful cancel: it does not count as the user's first
            self._failed_fast = True
            for h in self.handles:
                h._request(StopReason.CANCEL)

    async def wait(self) -> list[TaskResult]:
        return [await h.wait() for h in self.handles]

    def results(self) -> list[TaskResult]:
        out = [h.result for h in self.handles]
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]


def _unwrapped(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a caller of run() should see of our own nursery's group: our InternalError or a
    KeyboardInterrupt as itself; a group of Cancelled as it is (trio knows what to do)."""
    for kind in (InternalError, KeyboardInterrupt):
        found, _ = group.split(kind)
        if found is not None:
            return first_leaf(found)
    return group


def _config_duration(name: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, name)
    except UnitsError as e:
        raise ConfigError(str(e)) from None


@asynccontextmanager
async def open_supervisor(cgroup_root: str | None = None, default_time_limit: Any = None,
                          max_time_limit: Any = None, *,
                          retain_results: int = 1000) -> AsyncIterator[Supervisor]:
    """Open a supervisor: find and prepare its cgroup root, yield it, clean up on exit.

    ``cgroup_root``: a cgroup v2 directory to use (default: discovered, see DESIGN.md).
    ``default_time_limit`` applies to tasks that give none; ``max_time_limit`` caps every task
    (a larger limit is capped, and the result's notes say so).  A ceiling below the default is
    refused here.  On exit every task still live is stopped (reason ``shutdown``: stop signal,
    grace, kill), their records are awaited, and the supervisor's cgroups are removed.
    """
    default = _config_duration("default_time_limit", default_time_limit)
    ceiling = _config_duration("max_time_limit", max_time_limit)
    if default is not None and ceiling is not None and ceiling < default:
        raise ConfigError(
            f"max_time_limit ({format_duration(ceiling)}) is below default_time_limit "
            f"({format_duration(default)}): every task would be capped at once; raise the "
            f"ceiling or lower the default")
    placement = await place_async(cgroup_root)
    try:
        watcher = CgroupWatcher()
        reactor = OutputReactor()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watcher.run)
                nursery.start_soon(reactor.run)
                sup = Supervisor(placement, watcher, reactor, default, ceiling,
                                 retain_results)
                try:
                    yield sup
                finally:
                    with trio.CancelScope(shield=True):
                        await sup._shutdown()
                    watcher.stop()
                    reactor.stop()
        except BaseExceptionGroup as group:
            # The nursery is ours (it only runs the watcher): what the caller's block raised
            # comes back as itself, not wrapped in a group of ours.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
    finally:
        placement.close()
