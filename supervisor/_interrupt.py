"""Ctrl-C while a program waits for its tasks: one rule, wherever it waits.

trio turns SIGINT into a KeyboardInterrupt raised in the main task, at the checkpoint where
it waits, whatever it waits for (a task's life is KI-protected and never runs in the main
task: ``_supervisor.py``).  A program of ours may wait in four places, and each follows the
same rule: **the first Ctrl-C stops the task gracefully, the second kills it now, and exactly
one KeyboardInterrupt goes on once the record exists**:

- ``run()``, and ``start()`` awaited directly (both wait in ``Supervisor._to_record``);
- ``TaskHandle.wait()``;
- leaving ``open_supervisor`` (every live task, reason ``shutdown``);
- a nursery the caller's code left with the KeyboardInterrupt (``nursery.start(sup.start,
  ...)`` and the Ctrl-C landed in the nursery's body or while it waited for its children):
  trio cancels the nursery, the task's driver sees that cancellation come from a
  KeyboardInterrupt (:func:`from_ctrl_c`) and stops the task gracefully; while such a stop
  runs, the supervisor takes SIGINT itself (:class:`CtrlC`), so that a second Ctrl-C kills
  now instead of joining the first as another KeyboardInterrupt in the nursery's group.

:class:`Interrupts` is the counting: a waiter feeds it each KeyboardInterrupt it catches.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import trio

from ._result import StopReason

if TYPE_CHECKING:
    from ._task import Task

__all__ = ["CtrlC", "Interrupts", "from_ctrl_c"]


class Interrupts:
    """The KeyboardInterrupts one waiter caught: the first is kept (raised once the records
    exist: :meth:`reraise`), and each is a stop request (the second kills)."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.first: KeyboardInterrupt | None = None
        self.count = 0

    def caught(self, exc: KeyboardInterrupt, tasks: Iterable[Task], *,
               reason: StopReason = StopReason.CANCEL) -> None:
        """``exc`` came: a stop request of ``tasks`` (``reason`` CANCEL: the caller's, whose
        second is a kill; SHUTDOWN, the supervisor's own, which Ctrl-C forces)."""
        from ._task import request_stop

        self.first = self.first or exc
        self.count += 1
        by_caller = reason == StopReason.CANCEL
        for task in tasks:
            request_stop(task, reason, by_caller=by_caller,
                         force=not by_caller and self.count > 1, by_signal=signal.SIGINT)

    def reraise(self) -> None:
        if self.first is not None:
            raise self.first


def from_ctrl_c(exc: trio.Cancelled) -> bool:
    """Whether trio cancelled a scope because a KeyboardInterrupt left it (or a nursery
    around it): trio's cancel reasons say so (trio 0.30 and later; earlier ones say nothing,
    and the task is stopped as for any cancellation)."""
    source = getattr(exc, "source", None)
    return source == "KeyboardInterrupt" or (
        source == "nursery" and "KeyboardInterrupt" in (getattr(exc, "reason", None) or ""))


class CtrlC:
    """While tasks stop because of a Ctrl-C that left a nursery, SIGINT is the supervisor's:
    each further one kills them now.  Runs in the supervisor's nursery from the first such
    stop until the last of those tasks has ended; then trio's own SIGINT handling is back.
    Outside the main thread (where signal handlers cannot be set) it does nothing: trio's own
    rule holds then."""

    def __init__(self, nursery: trio.Nursery, escalate: Callable[[Task], object]) -> None:
        self._nursery = nursery
        self._escalate = escalate
        self._tasks: set[Task] = set()
        self._scope: trio.CancelScope | None = None

    def stopping(self, task: Task) -> None:
        """``task`` is being stopped because a Ctrl-C cancelled its nursery."""
        self._tasks.add(task)
        if self._scope is None:
            self._scope = trio.CancelScope()
            self._nursery.start_soon(self._take_sigint, self._scope)

    def ended(self, task: Task) -> None:
        self._tasks.discard(task)
        if not self._tasks and self._scope is not None:
            self._scope.cancel()
            self._scope = None

    @trio.lowlevel.enable_ki_protection
    async def _take_sigint(self, scope: trio.CancelScope) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        with scope, trio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                for task in list(self._tasks):
                    self._escalate(task)
