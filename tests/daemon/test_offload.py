"""The offload thread's turns: one job at a time, the uids taking turns, cancellation kept."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from supervisor.serve.offload import Offload


async def test_uids_take_turns_whatever_one_of_them_queued_first() -> None:
    off, ran = Offload(), []
    gate = threading.Event()

    def job(name: str) -> str:
        if name == "a0":
            gate.wait(10)  # (holds the thread until every job is queued)
        ran.append(name)
        return name

    async with trio.open_nursery() as n:
        n.start_soon(off.run, 1, job, "a0")
        await trio.testing.wait_all_tasks_blocked()
        for i in range(1, 4):  # the attacker's flood queued first ...
            n.start_soon(off.run, 1, job, f"a{i}")
            await trio.testing.wait_all_tasks_blocked()
        n.start_soon(off.run, 2, job, "v0")  # ... then one job of another uid
        await trio.testing.wait_all_tasks_blocked()
        assert off.waiting(1) == 3 and off.waiting(2) == 1
        gate.set()
    assert ran == ["a0", "a1", "v0", "a2", "a3"]


async def test_a_job_gives_its_value_or_its_exception_to_its_caller() -> None:
    off = Offload()
    assert await off.run(1, lambda x: x * 2, 21) == 42
    with pytest.raises(ZeroDivisionError):
        await off.run(1, lambda: 1 / 0)
    assert await off.run(1, str, 5) == "5"  # (the turn was handed on after the error)


async def test_a_caller_cancelled_while_it_waits_gives_its_turn_up() -> None:
    off, ran = Offload(), []
    gate = threading.Event()

    def slow() -> None:
        gate.wait(10)
        ran.append("slow")

    async with trio.open_nursery() as n:
        n.start_soon(off.run, 1, slow)
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(off.run, 2, ran.append, "kept")
        cancelled = trio.CancelScope()

        async def waiter() -> None:
            with cancelled:
                await off.run(3, ran.append, "dropped")

        n.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert off.waiting(2) == 1 and off.waiting(3) == 1
        cancelled.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert off.waiting(3) == 0
        gate.set()
    assert ran == ["slow", "kept"]


async def test_a_caller_cancelled_while_its_job_runs_waits_for_its_end() -> None:
    off, ran = Offload(), []
    gate = threading.Event()

    def slow() -> None:
        gate.wait(10)
        ran.append("slow")

    with trio.move_on_after(0.05) as scope:
        async with trio.open_nursery() as n:
            n.start_soon(off.run, 1, slow)
            await trio.sleep(0.01)
            threading.Timer(0.2, gate.set).start()
    assert scope.cancelled_caught and ran == ["slow"]  # ended only after the job did
    assert await off.run(2, ran.append, "next") is None and ran == ["slow", "next"]


async def test_the_thread_rests_as_long_as_its_last_job_ran_before_the_next() -> None:
    # (the GIL's share: a tenant's back-to-back MiB parses leave the event loop half of it)
    import time

    off, times = Offload(), {}

    def job(name: str, seconds: float) -> None:
        times[name] = [time.monotonic()]
        time.sleep(seconds)
        times[name].append(time.monotonic())

    async with trio.open_nursery() as n:
        n.start_soon(off.run, 1, job, "first", 0.2)
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(off.run, 2, job, "next", 0)
    ran = times["first"][1] - times["first"][0]
    assert times["next"][0] - times["first"][1] >= ran * 0.9, times
