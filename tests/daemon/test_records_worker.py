"""The records' own thread (records._Worker): every call off the trio thread, in one thread, one
at a time; errors come back to the caller; a call once handed over is never abandoned."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio

from supervisor.serve.records import Records, _Worker


def test_calls_run_in_one_thread_not_the_trio_one() -> None:
    async def main() -> set[int]:
        w = _Worker()
        try:
            return {await w.run(threading.get_ident) for _ in range(5)}
        finally:
            w.stop()

    seen = trio.run(main)
    assert len(seen) == 1 and threading.get_ident() not in seen


def test_an_error_is_raised_to_its_caller_and_the_thread_goes_on() -> None:
    async def main() -> int:
        w = _Worker()
        try:
            with pytest.raises(ZeroDivisionError):
                await w.run(lambda: 1 // 0)
            return await w.run(lambda: 42)
        finally:
            w.stop()

    assert trio.run(main) == 42


def test_one_call_at_a_time() -> None:
    running: list[int] = []
    overlap: list[int] = []

    def call() -> None:
        running.append(1)
        overlap.append(len(running))
        time.sleep(0.01)
        running.pop()

    async def main() -> None:
        w = _Worker()
        try:
            async with trio.open_nursery() as n:
                for _ in range(8):
                    n.start_soon(w.run, call)
        finally:
            w.stop()

    trio.run(main)
    assert overlap == [1] * 8


def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    done: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append("written")

    async def main() -> None:
        w = _Worker()
        try:
            with trio.move_on_after(0.02) as scope:
                await w.run(slow)
                await trio.sleep(0)  # (the cancellation takes effect here)
            assert scope.cancelled_caught
            assert done == ["written"]  # not abandoned half way
            assert await w.run(lambda: "next") == "next"  # and the next call is not confused
        finally:
            w.stop()

    trio.run(main)


async def test_a_writer_returns_once_its_own_write_is_committed_however_many_follow(
        tmp_path: Path) -> None:
    # The first writer to find no flush running flushes.  It used to flush until no write was
    # left: under another tenant's steady stream of writes, it never returned.
    records = await Records.open(str(tmp_path))
    try:
        ids = [await records.accept({"uid": 0, "gid": 0, "spec": {"argv": ["true"]},
                                     "state": "queued", "created_at": 0.0}) for _ in range(2)]
        stop, victim_done = trio.Event(), trio.Event()
        flood = 0

        async def one() -> None:
            nonlocal flood
            await records.notified(ids[1])
            flood += 1

        async def flooder(n: trio.Nursery) -> None:
            while not stop.is_set():  # new writes arrive while each commit runs
                n.start_soon(one)
                await trio.sleep(0)

        async def victim() -> None:
            await records.notified(ids[0])
            victim_done.set()

        async with trio.open_nursery() as n:
            n.start_soon(victim)  # first, on an idle records thread: it is the flusher ...
            n.start_soon(flooder, n)  # ... and another tenant's writes keep coming
            with trio.move_on_after(5):
                await victim_done.wait()
            returned, at_victim = victim_done.is_set(), flood
            await trio.sleep(0.1)
            stop.set()
        assert returned and flood > at_victim  # it returned while the flood went on
    finally:
        await records.close()


def test_a_call_nobody_waits_before_takes_one_round_of_the_loop_not_two() -> None:
    """Each schedule point of a request waits for a whole round of the event loop, which a
    tenant's flood makes long: a worker call that found the worker free still spent one on
    its lock (and a uid's read of the records one more on its own).  Now: one round (the wait
    for the thread's answer), and a cancelled caller hands nothing over (a call behind
    another still waits for it: test_one_call_at_a_time)."""
    from supervisor.serve.shares import take

    class Steps(trio.abc.Instrument):
        def __init__(self) -> None:
            self.of: dict[trio.lowlevel.Task, int] = {}

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.of[task] = self.of.get(task, 0) + 1

    async def main() -> dict[str, object]:
        w = _Worker()
        steps = Steps()
        got: dict[str, object] = {}
        try:
            await w.run(lambda: None)  # (the thread started)
            me = trio.lowlevel.current_task()
            trio.lowlevel.add_instrument(steps)
            await w.run(lambda: None)
            lock = trio.Lock()
            await take(lock)
            got["steps"] = steps.of.get(me, 0)
            got["held"] = lock.locked()
            lock.release()
            trio.lowlevel.remove_instrument(steps)
            ran: list[int] = []
            with trio.CancelScope() as scope:
                scope.cancel()
                await w.run(ran.append, 1)
            got["cancelled ran"] = ran
        finally:
            w.stop()
        return got

    got = trio.run(main)
    assert got == {"steps": 1, "held": True, "cancelled ran": []}, got


async def test_one_flush_at_a_time_however_the_writers_wake(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found under two tenants' floods of `true` (bench_tenants, two_floods): a writer whose
    write another writer's flush had committed handed the turn over too, when it woke, so a
    second flush began while the first ran, each with a batch it took before it waited for
    the records' thread: writes were committed 1.5 at a time, and another tenant's
    submission waited 12 ms (median) for the thread behind the floods' flushes, on top of
    its own.  One writer flushes at a time (the oldest write queued meanwhile next), and
    every writer returns."""
    from supervisor.serve import records as module

    records = await Records.open(str(tmp_path))
    commit = module._commit

    def slow_commit(*args: object) -> None:  # (a disk's fsync: writes queue meanwhile)
        time.sleep(0.002)
        commit(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "_commit", slow_commit)
    flushing, most, batches = 0, 0, []
    flush = records._flush_batch

    async def counted() -> None:
        nonlocal flushing, most
        flushing += 1
        most = max(most, flushing)
        batches.append(len(records._batch))
        try:
            await flush()
        finally:
            flushing -= 1

    records._flush_batch = counted  # type: ignore[method-assign]
    try:
        task_id = await records.accept({"uid": 0, "gid": 0, "spec": {"argv": ["true"]},
                                        "state": "queued", "created_at": 0.0})
        done = 0

        async def one() -> None:
            nonlocal done
            await records.notified(task_id)
            done += 1

        async with trio.open_nursery() as n:
            for _ in range(300):  # (writes arriving while a flush runs)
                n.start_soon(one)
                await trio.sleep(0.0003)
        assert done == 300 and not records._batch and not records._flushing
        assert most == 1, most  # (before: 42 at once)
        assert sum(batches) >= 300  # (each write in a flush)
    finally:
        await records.close()
