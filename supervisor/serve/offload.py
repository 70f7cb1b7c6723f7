"""Work whose cost grows with a request's size, off the event loop and fairly between uids.

A submission of a MiB costs tens of milliseconds of Python to parse, check, serialize and
record, and so does one of thousands of small variables (a session's command, and its report:
its size is counted by its items too, ``protocol.ITEM_WORK``); on the event loop that would
stall every tenant's requests for as long.  Such work goes to :class:`Offload`: one job at a
time, in a worker thread, the uids taking turns (round robin: a uid with a hundred jobs
waiting gets every other turn against a uid with one).  So the large requests of every tenant
together hold one thread, and the event loop (everyone's small requests) competes with that
one thread for the GIL, never with one per tenant.

The thread holds the GIL through each C call of a job (json.loads of a MiB is one call of
several milliseconds), and the event loop waits for it meanwhile.  So after a job the next one
starts only once the thread has rested as long as the last one ran (:data:`REST`): the large
requests of every tenant together take at most about half of the GIL, and a tenant sending
them back to back slows the others' small requests by about half as much (half as many of
their steps land behind a parse).  A job alone starts at once.

No task of its own: the caller whose job's turn has come runs it (in a worker thread) and,
once it is done, gives the turn to the next job.  A caller cancelled while it waits for its
turn gives its place up; one whose job runs waits for the end of it (a thread cannot be
stopped half way), then sees its cancellation.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

__all__ = ["Offload"]

T = TypeVar("T")

REST = 1.0  # after a job, the thread rests this many times as long as the job ran


class _Job:
    __slots__ = ("turn",)

    def __init__(self) -> None:
        self.turn = trio.Event()


class Offload:
    """One worker thread's turns, shared round robin between uids (see the module docstring).
    Methods run on the trio thread."""

    def __init__(self) -> None:
        self._waiting: dict[int, collections.deque[_Job]] = {}  # uid -> its jobs, in order
        self._order: collections.deque[int] = collections.deque()  # uids with jobs, next first
        self._busy = False  # a job runs now
        self._rested = 0.0  # (trio's clock) the next job starts no earlier
        # told each job's uid and seconds (``LoopShare.charge``: a job holds the GIL, which
        # the event loop waits for, so its time counts as its uid's on the loop)
        self.charge: Callable[[int, float], None] | None = None

    def waiting(self, uid: int) -> int:
        """Jobs of ``uid`` waiting for their turn (not counting one that runs)."""
        return len(self._waiting.get(uid, ()))

    async def run(self, uid: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread when ``uid``'s turn comes; its value or exception."""
        job = _Job()
        if self._busy:
            self._enqueue(uid, job)
            try:
                await job.turn.wait()
            except trio.Cancelled:
                if not job.turn.is_set():
                    self._drop(uid, job)
                    raise
                # the turn came with the cancellation: taken, then handed on (below)
        self._busy = True
        try:
            with trio.CancelScope(shield=True):
                await trio.sleep_until(self._rested)  # (the rest after the last job)
                began = trio.current_time()
                result: outcome.Outcome[T] = await trio.to_thread.run_sync(
                    outcome.capture, fn, *args)
                ended = trio.current_time()
                self._rested = ended + (ended - began) * REST
                if self.charge is not None:
                    self.charge(uid, ended - began)
        finally:
            self._next()
        await trio.lowlevel.checkpoint_if_cancelled()
        return result.unwrap()

    def _enqueue(self, uid: int, job: _Job) -> None:
        queue = self._waiting.get(uid)
        if queue is None:
            queue = self._waiting[uid] = collections.deque()
            self._order.append(uid)
        queue.append(job)

    def _drop(self, uid: int, job: _Job) -> None:
        queue = self._waiting[uid]
        queue.remove(job)
        if not queue:
            del self._waiting[uid]
            self._order.remove(uid)

    def _next(self) -> None:
        """The turn goes to the next uid's oldest job, or nobody runs."""
        if not self._order:
            self._busy = False
            return
        uid = self._order.popleft()
        queue = self._waiting[uid]
        job = queue.popleft()
        if queue:
            self._order.append(uid)  # its next job waits for the others' turns
        else:
            del self._waiting[uid]
        job.turn.set()  # (_busy stays True: that job's caller runs it)
