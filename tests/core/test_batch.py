"""Batches: order, concurrency, fail-fast, and cancelling once (gracefully) and twice (kill)."""

from __future__ import annotations

import functools
import signal
import time

import pytest
import trio
from sup_util import HANG, IGNORE_TERM_READY, wait_for, wait_ready

import cgroupfs
import supervisor
from supervisor import TaskSpec

IGNORE_TERM = "trap '' TERM; "


def max_overlap(results: list[supervisor.TaskResult]) -> int:
    edges = sorted([(r.started_at, 1) for r in results if r.started_at] +
                   [(r.ended_at, -1) for r in results if r.started_at])
    peak = cur = 0
    for _, d in edges:
        cur += d
        peak = max(peak, cur)
    return peak


async def test_results_in_order_and_concurrency_bounded(sup: supervisor.Supervisor) -> None:
    specs = [TaskSpec(["sh", "-c", f"sleep 0.05; exit {i}"]) for i in range(10)]
    results = await sup.run_batch(specs, max_concurrency=3)
    assert [r.exit_code for r in results] == list(range(10))
    assert max_overlap(results) <= 3


async def test_fail_fast_cancels_the_rest(sup: supervisor.Supervisor) -> None:
    specs = [TaskSpec(["sh", "-c", "exit 1"])] + [TaskSpec(["sleep", "60"])] * 5
    with trio.fail_after(HANG):
        results = await sup.run_batch(specs, max_concurrency=2, fail_fast=True)
    assert results[0].outcome == "failed"
    assert all(r.outcome == "cancelled" for r in results[1:])
    assert sum(not r.started for r in results) >= 4  # queued ones never started


async def test_bad_spec_refuses_the_whole_batch_before_anything_runs(
        sup: supervisor.Supervisor) -> None:
    with pytest.raises(supervisor.SpecError, match=r"specs\[1\]"):
        await sup.run_batch([TaskSpec(["true"]), ["true"]])  # type: ignore[list-item]
    with pytest.raises(supervisor.SpecError, match="max_concurrency"):
        await sup.run_batch([TaskSpec(["true"])], max_concurrency=0)
    assert not sup.results


async def test_caller_cancel_stops_running_and_drops_queued(sup: supervisor.Supervisor) -> None:
    specs = [TaskSpec(["sleep", "60"])] * 6
    with trio.move_on_after(0.5):
        await sup.run_batch(specs, max_concurrency=2)
    results = list(sup.results.values())
    assert len(results) == 6 and all(r.outcome == "cancelled" for r in results)
    assert sum(r.started for r in results) == 2
    assert all(r.signal == signal.SIGTERM for r in results if r.started)


async def test_three_waves_ignoring_sigterm_with_two_cancels_in_the_second(
        sup: supervisor.Supervisor) -> None:
    # wave 1 (4 tasks) finishes on its own; wave 2 (4 tasks) ignores SIGTERM with a long grace;
    # wave 3 (4 tasks) is still queued when the two cancels come.
    quick = TaskSpec(["sh", "-c", IGNORE_TERM + "sleep 0.1"], grace="1h")
    stubborn = TaskSpec(["sh", "-c", IGNORE_TERM_READY], grace="1h")
    specs = [quick] * 4 + [stubborn] * 8
    async with trio.open_nursery() as n:
        batch = await n.start(functools.partial(sup.start_batch, specs, 4))
        second_wave = batch.handles[4:8]
        await wait_for(lambda: all(h.state == "running" for h in second_wave), what="wave 2")
        for h in second_wave:
            await wait_ready(h)
        batch.cancel()
        await wait_for(lambda: all(h.stop_level == "signalled" for h in second_wave),
                       what="wave 2 signalled")
        t0 = time.perf_counter()
        batch.cancel()
        results = await batch.wait()
        second_cancel = time.perf_counter() - t0
    print(f"second cancel to batch end: {second_cancel * 1e3:.1f} ms")
    assert second_cancel < HANG
    assert [r.outcome for r in results[:4]] == ["succeeded"] * 4
    for r in results[4:8]:
        assert r.outcome == "cancelled" and r.started and r.signal == signal.SIGKILL
        assert r.stop is not None and r.stop.reached == "killed"
        assert r.stop.kill_because == "second_request"
    for r in results[8:]:
        assert r.outcome == "cancelled" and not r.started


async def test_a_batch_refused_on_its_second_spec_registers_nothing(
        sup: supervisor.Supervisor) -> None:
    bad = TaskSpec(["true"], limits=supervisor.Limits(pids_max=8))
    if "pids" in sup.controllers:
        pytest.skip("this machine delegates the pids controller: the spec is not refused")
    with pytest.raises(supervisor.SpecError, match="pids"):
        await sup.run_batch([TaskSpec(["true"]), bad])
    assert sup.tasks == [] and not sup.results  # closing the supervisor will not wait on it


async def test_the_supervisors_records_are_in_the_order_their_tasks_were_made(
        test_cgroup: cgroupfs.Cgroup) -> None:
    """``sup.results`` is oldest first by creation, however the tasks ended (the last made
    ends first here); past ``retain_results`` the oldest made go, not the first ended."""
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          retain_results=3) as sup:
        specs = [TaskSpec(["sleep", f"{0.3 - 0.06 * i:.2f}"]) for i in range(5)]
        results = await sup.run_batch(specs, max_concurrency=5)
        assert sorted(r.ended_at for r in results) == [r.ended_at for r in reversed(results)]
        assert list(sup.results) == [r.id for r in results[2:]]
        lost = sup.record_lost(["true"], why="corral-test", started=False)
        assert list(sup.results) == [r.id for r in results[3:]] + [lost.id]
