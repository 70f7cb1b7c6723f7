"""A stop landing at each point of a task's life, each followed by a second stop.

Whatever the point, the task ends with exactly one final record, the second request only ever
escalates, and nothing is left in the leaf.
"""

from __future__ import annotations

import functools
import pathlib
import signal

import pytest
import trio
from sup_util import HANG, IGNORE_TERM_READY, alive, wait_for, wait_ready

import supervisor
from supervisor import TaskSpec

IGNORE_TERM = "trap '' TERM; "


@pytest.mark.parametrize("second", [False, True], ids=["once", "twice"])
async def test_stop_before_spawn(sup: supervisor.Supervisor, second: bool) -> None:
    # a queued task (concurrency 1, the first slot busy) is stopped before its spawn
    specs = [TaskSpec(["sleep", "0.3"]), TaskSpec(["touch", "/corral-must-not-run"])]
    async with trio.open_nursery() as n:
        batch = await n.start(functools.partial(sup.start_batch, specs, 1))
        queued = batch.handles[1]
        assert queued.stop() is True
        if second:
            assert queued.stop() is True  # escalates: still never starts
        results = await batch.wait()
    assert results[0].outcome == "succeeded"
    assert results[1].outcome == "cancelled" and not results[1].started


@pytest.mark.parametrize("second", [False, True], ids=["once", "twice"])
async def test_stop_right_after_spawn(sup: supervisor.Supervisor, second: bool) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", IGNORE_TERM + "sleep 60"],
                                               grace="0.5s"))
        task.stop()
        if second:
            task.stop()
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "cancelled" and r.started
    assert r.stop is not None and (r.stop.kill_because == "second_request") is second


@pytest.mark.parametrize("second", [False, True], ids=["once", "twice"])
async def test_stop_during_the_grace(sup: supervisor.Supervisor, second: bool) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", IGNORE_TERM_READY],
                                               grace="0.5s" if not second else "1h"))
        await wait_ready(task)
        task.stop()
        await wait_for(lambda: task.stop_level == "signalled", what="signalled")
        if second:
            assert task.stop() is True
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    assert r.stop is not None and r.stop.reached == "killed"
    assert (r.stop.kill_because == "second_request") is second


@pytest.mark.parametrize("second", [False, True], ids=["once", "twice"])
async def test_stop_after_main_exit_with_leftovers(sup: supervisor.Supervisor, second: bool,
                                                   tmp_path: pathlib.Path) -> None:
    ready = tmp_path / "ready"
    script = (f"setsid sh -c \"trap '' TERM; touch {ready}; sleep 60\" >/dev/null 2>&1 & "
              f"while [ ! -e {ready} ]; do sleep 0.01; done; exit 4")
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", script], grace="1h"))
        await wait_for(lambda: task.state == "stopping", what="main exited")
        task.stop()
        if second:
            task.stop()
        else:
            task.stop(force=True)
        with trio.fail_after(HANG):
            r = await task.wait()
    # the main process had ended before the stop: its exit decides the outcome
    assert r.outcome == "failed" and r.exit_code == 4
    assert r.cleanup.leftovers and r.cleanup.leftovers_ended_by == "killed"
    assert all(not alive(p.pid) for p in r.cleanup.leftovers)
    assert any("after the main process ended" in note for note in r.notes)


@pytest.mark.parametrize("second", [False, True], ids=["once", "twice"])
async def test_stop_after_the_end(sup: supervisor.Supervisor, second: bool) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(sup.start, ["true"])
        r = await task.wait()
        assert task.stop() is False
        if second:
            assert task.stop(force=True) is False
    assert await task.wait() is r
    assert r.outcome == "succeeded" and r.stop is None
