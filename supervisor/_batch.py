"""Batches: many specs, at most N at a time, FIFO; cancel once (graceful), twice (kill).

:func:`drive_batch` runs every task's life in a nursery of its own, each queued behind the one
before it (``QueueSlot``) under one CapacityLimiter, so tasks start in the order given whatever
order trio wakes them in.  A fail-fast stop is the batch's own (reason ``fail_fast``): it
never counts as the caller's first cancel.
"""

from __future__ import annotations

import trio

from ._life import QueueSlot, live
from ._result import StopReason, TaskResult
from ._task import Task, request_stop

__all__ = ["Batch", "drive_batch"]


class Batch:
    """A batch of tasks.  ``cancel()`` once: queued tasks never start, running ones stop
    gracefully; ``cancel()`` again: every running one is killed now.  A fail-fast stop is the
    batch's own: it never counts as the caller's first cancel."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self.handles = [t.handle for t in tasks]
        self._failed_fast = False

    def cancel(self) -> None:
        for h in self.handles:
            h.stop()

    async def run_one(self, task: Task, slot: QueueSlot, fail_fast: bool) -> None:
        """One task's life in the batch (the batch's nursery runs this)."""
        result = await live(task, slot=slot)
        if fail_fast and result is not None and result.outcome != "succeeded" and \
                not self._failed_fast:
            self._failed_fast = True
            for t in self.tasks:
                request_stop(t, StopReason.FAIL_FAST, by_caller=False)

    async def wait(self) -> list[TaskResult]:
        return [await h.wait() for h in self.handles]

    def results(self) -> list[TaskResult]:
        out = [h.result for h in self.handles]
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]


async def drive_batch(batch: Batch, max_concurrency: int, fail_fast: bool, *,
                      task_status: trio.TaskStatus[Batch] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``batch`` to its end, at most ``max_concurrency`` at a time, FIFO."""
    limiter = trio.CapacityLimiter(max_concurrency)
    after: trio.Event | None = None
    async with trio.open_nursery() as nursery:
        for task in batch.tasks:
            slot = QueueSlot(limiter, after, trio.Event())
            after = slot.turn
            nursery.start_soon(batch.run_one, task, slot, fail_fast)
        task_status.started(batch)
