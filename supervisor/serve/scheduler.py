"""The daemon's queue: a global concurrency limit, per-uid limits, round-robin between uids.

Admission (at submit): a uid may hold at most ``max_queued_per_uid`` waiting tasks of at most
``max_queued_bytes_per_uid`` bytes, and the daemon at most ``max_queued`` and
``max_queued_bytes`` in all; past any, the submission is refused with 429 naming the limit.  A
queued task's bytes (:func:`queued_bytes`) are what its records come to if it never starts:
its request, and an end whose result repeats the request's argv and names in some 2 KiB of
its own.  (Counted as its request alone, a `true` of 80 bytes, a thousand of them on a small
state disk, and a shutdown that ended them unstarted wrote 1.8 to 2.7 KB for each: the disk
filled, end records failed.)  In memory a queued task holds about five times its request.

Dispatch: at most ``max_running`` tasks run at once, at most ``max_running_per_uid`` of one
uid (by default half the global: one uid never holds every slot); the next task comes from
the next uid in turn that has one waiting and room to run, so one busy uid cannot starve the
others.  FIFO within a uid.  The last ``first_task_slots`` free slots are kept for uids
running nothing: a uid's second and later tasks never take them (by default a quarter of the
slots, and never more than the per-uid limit leaves over, so that a uid alone still reaches
its limit).  So whatever two or three uids run, another's first task starts at once.  (Two
tenants at their share held all sixteen slots with long tasks, and a third tenant's `true`
waited until one of theirs ended: 10 s and more, an independent attack.)  A task may also
need room on the disk for its output (``room.py``): the one whose turn it is waits for it,
and the others with it.

Pure bookkeeping on the trio thread: no awaits, no locks.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Generic, NamedTuple, Protocol, TypeVar

from .protocol import ApiError

__all__ = ["QUEUED_END", "QueueLimits", "Scheduler", "queued_bytes"]

QUEUED_END = 2048  # bytes of a task's end record beyond what repeats its request (measured)


def queued_bytes(size: int) -> int:
    """What a queued task with a request of ``size`` bytes counts against the queues' bytes:
    its accept row's request, and the end it gets if it never starts (see the module
    docstring)."""
    return 2 * size + QUEUED_END


class _Owned(Protocol):
    @property
    def uid(self) -> int: ...

    @property
    def size(self) -> int: ...


T = TypeVar("T", bound=_Owned)


class QueueLimits(NamedTuple):
    max_running: int = 16
    max_running_per_uid: int = 8  # below the global: one uid never takes every slot
    max_queued: int = 10000
    max_queued_per_uid: int = 1000
    max_queued_bytes: int = 64 << 20
    max_queued_bytes_per_uid: int = 16 << 20
    first_task_slots: int | None = None  # None: the default (kept_free)

    def to_json(self) -> dict[str, int | None]:
        return self._asdict()

    @property
    def kept_free(self) -> int:
        """The free slots a uid that runs a task already may not take (see the module
        docstring): ``first_task_slots``, by default a quarter of the slots, at most what a
        uid alone could never take anyway."""
        if self.first_task_slots is not None:
            return self.first_task_slots
        return max(0, min(self.max_running // 4, self.max_running - self.max_running_per_uid))


class Scheduler(Generic[T]):
    """Who runs next.  ``T`` is anything with a ``uid``."""

    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self._waiting: dict[int, collections.deque[T]] = {}
        self._turns: collections.deque[int] = collections.deque()  # uids with waiting tasks
        self._running: collections.Counter[int] = collections.Counter()
        self._bytes: collections.Counter[int] = collections.Counter()  # queued, per uid
        self.total_running = 0
        self.total_queued = 0
        self.total_bytes = 0
        # admitted, not yet queued (its record being written): counted as queued, or four
        # concurrent submissions of one uid each found room for one (an independent attack:
        # 1,001 queued against a limit of 1,000)
        self._admitting: collections.Counter[int] = collections.Counter()
        self._admitting_bytes: collections.Counter[int] = collections.Counter()

    def admit(self, uid: int, size: int = 0) -> None:
        """Raise ApiError 429 if ``uid`` may not queue one more task (of a ``size``-byte
        request) now; else count it as queued until :meth:`admitted` (its record written, it
        is queued, or it failed).  (A task that can start at once is not queued:
        :meth:`reserve`.)"""
        lim = self.limits
        pending = self._admitting[uid]
        queued = len(self._waiting.get(uid, ())) + pending
        if queued >= lim.max_queued_per_uid:
            raise ApiError(429, "queue_full", f"uid {uid} already has {queued} queued tasks, "
                           f"the per-uid limit (max_queued_per_uid={lim.max_queued_per_uid}); "
                           f"wait for some to start, or stop queued ones")
        # (the daemon's own bounds shed a uid that has something queued already: one with
        # nothing queued always gets one task in, so that another uid's full queue never
        # refuses it; the bounds are exceeded by one request per uid at most)
        if queued and self.total_queued + self._admitting.total() >= lim.max_queued:
            raise ApiError(429, "queue_full", f"the daemon's queue holds {self.total_queued} "
                           f"tasks, its limit (max_queued={lim.max_queued}); retry later")
        cost = queued_bytes(size)
        mine = self._bytes[uid] + self._admitting_bytes[uid]
        if queued and mine + cost > lim.max_queued_bytes_per_uid:
            raise ApiError(429, "queue_full", f"uid {uid}'s queued tasks count "
                           f"{mine} bytes, and this one {cost} more (twice its "
                           f"request and {QUEUED_END}: its records if it never starts): above "
                           f"the per-uid limit (--max-queued-bytes-per-uid="
                           f"{lim.max_queued_bytes_per_uid}); wait for some to start, or "
                           f"send smaller requests")
        total = self.total_bytes + self._admitting_bytes.total()
        if queued and total + cost > lim.max_queued_bytes:
            raise ApiError(429, "queue_full", f"the daemon's queued tasks count "
                           f"{total} bytes, its limit "
                           f"(--max-queued-bytes={lim.max_queued_bytes}); retry later")
        self._admitting[uid] += 1
        self._admitting_bytes[uid] += cost

    def admitted(self, uid: int, size: int = 0) -> None:
        """A task :meth:`admit` counted is queued now (or started at once, or refused)."""
        self._admitting[uid] -= 1
        self._admitting_bytes[uid] -= queued_bytes(size)
        if not self._admitting[uid]:
            del self._admitting[uid], self._admitting_bytes[uid]

    def enqueue(self, task: T) -> None:
        self._put(task, front=False)

    def _put(self, task: T, *, front: bool) -> None:
        """Queue ``task`` at the back of its uid's queue (at the head with ``front``); a uid
        with nothing queued takes a turn at the back of the rotation (at its head)."""
        waiting = self._waiting.get(task.uid)
        if waiting is None:
            waiting = self._waiting[task.uid] = collections.deque()
            (self._turns.appendleft if front else self._turns.append)(task.uid)
        (waiting.appendleft if front else waiting.append)(task)
        self.total_queued += 1
        self._count_bytes(task, +1)

    def remove(self, task: T) -> bool:
        """Take a queued task out (it was stopped); False if it was not queued."""
        waiting = self._waiting.get(task.uid)
        if waiting is None or task not in waiting:
            return False
        waiting.remove(task)
        self.total_queued -= 1
        self._count_bytes(task, -1)
        if not waiting:
            self._drop_uid(task.uid)
        return True

    def _count_bytes(self, task: T, sign: int) -> None:
        cost = sign * queued_bytes(task.size)
        self._bytes[task.uid] += cost
        self.total_bytes += cost
        if not self._bytes[task.uid]:
            del self._bytes[task.uid]

    def _drop_uid(self, uid: int) -> None:
        del self._waiting[uid]
        self._turns.remove(uid)

    def next_ready(self, fits: Callable[[T], bool | None] | None = None) -> T | None:
        """The next task to start (counted as running from now), or None.  ``fits``: whether
        a task may start now by what else it needs (the disk's room for its output); if not
        (False), the task whose turn it is waits for it at the head of its queue, and so do
        all others (they would take the room it waits for); None: it waits, and the others
        may go before it (its uid holds more than its share of what it waits for)."""
        lim = self.limits
        if self.total_running >= lim.max_running:
            return None
        for _ in range(len(self._turns)):
            uid = self._turns[0]
            if self._running[uid] >= lim.max_running_per_uid or self._kept_from(uid):
                self._turns.rotate(-1)  # skipped: its next turn comes after the others
                continue
            waiting = self._waiting[uid]
            ok = True if fits is None else fits(waiting[0])
            if ok is None:
                self._turns.rotate(-1)  # (its own uid holds what it waits for)
                continue
            if not ok:
                return None  # (its turn stays: it starts first once there is room)
            self._turns.rotate(-1)  # served: its next turn comes after the others
            task = waiting.popleft()
            if not waiting:
                self._drop_uid(uid)
            self.total_queued -= 1
            self._count_bytes(task, -1)
            self._count(uid)
            return task
        return None

    def reserve(self, uid: int) -> bool:
        """Count a task of ``uid`` as running now, without queueing it, if it could start at
        once: the limits allow, ``uid`` has nothing waiting (FIFO holds), and no other uid's
        waiting task could take the slot (each such uid holds its per-uid limit: fairness
        holds).  False (nothing counted) otherwise.  The caller must call :meth:`finished`
        later.  (Anything of anyone's waiting sent every task through the queue: one more
        record and scheduling round each, and a tenant's queue standing behind its own stopped
        tasks made every other uid's `true` three times as slow: an independent attack.)"""
        lim = self.limits
        if self.total_running >= lim.max_running or self._kept_from(uid) or \
                self._running[uid] >= lim.max_running_per_uid or uid in self._waiting:
            return False
        if self.total_queued and any(self._running[u] < lim.max_running_per_uid
                                     and not self._kept_from(u) for u in self._turns):
            return False
        self._count(uid)
        return True

    def _kept_from(self, uid: int) -> bool:
        """Whether ``uid`` runs a task already and the free slots are the ones kept for uids
        running nothing."""
        return bool(self._running[uid]) and \
            self.limits.max_running - self.total_running <= self.limits.kept_free

    def running(self, uid: int) -> None:
        """Count a task that runs already (handed over by the daemon before) as running."""
        self._count(uid)

    def _count(self, uid: int) -> None:
        self._running[uid] += 1
        self.total_running += 1

    def requeue(self, task: T) -> None:
        """A task that :meth:`next_ready` handed out could not start: back to the head of its
        uid's queue (it is no longer counted as running)."""
        self.finished(task.uid)
        self._put(task, front=True)

    def finished(self, uid: int) -> None:
        """A task that ``next_ready`` handed out has ended."""
        self._running[uid] -= 1
        if not self._running[uid]:
            del self._running[uid]
        self.total_running -= 1

    def counts(self, uid: int) -> tuple[int, int]:
        """(running, queued) of ``uid``."""
        return self._running.get(uid, 0), len(self._waiting.get(uid, ()))

    def position(self, task: T) -> int | None:
        """0-based place in its uid's queue, or None if not queued."""
        waiting = self._waiting.get(task.uid)
        if waiting is None:
            return None
        try:
            return waiting.index(task)
        except ValueError:
            return None
