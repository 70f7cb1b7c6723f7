"""The outcome rules (supervisor/_ending.py), each by value: what a finished task's facts
(its stop, its exit, the OOM killer, its leftovers, the leaf's accounting) add up to.

Pure functions over small inputs: written to judge mutants (tests/mutation/run_mutation.py).
"""

from __future__ import annotations

import errno
import logging
import os
from types import SimpleNamespace
from typing import Any

import pytest
import trio

import cgroupfs
from cgroupfs import CgroupStats, CpuStat, MemoryEvents
from supervisor import Outcome, ProcessInfo, StopReason
from supervisor._ending import classify, cleanup_of, outcome_notes, usage_of
from supervisor._life import USAGE_FILES, read_usage
from supervisor._stop import StopState


def stop(reason: StopReason | None = None, landed: bool = False) -> StopState:
    s = StopState(15)
    if reason is not None:
        s.request(reason, by_caller=reason == StopReason.CANCEL)
    s.landed = landed
    return s


@pytest.mark.parametrize(("reason", "outcome"), [
    (StopReason.TIME_LIMIT, Outcome.TIMED_OUT), (StopReason.IDLE, Outcome.TIMED_OUT),
    (StopReason.CANCEL, Outcome.CANCELLED), (StopReason.SHUTDOWN, Outcome.CANCELLED),
    (StopReason.FAIL_FAST, Outcome.CANCELLED)])
async def test_a_stop_that_landed_decides_whatever_the_exit(reason: StopReason,
                                                            outcome: Outcome) -> None:
    for exit_code, sig, oom in ((0, None, None), (1, None, 0), (None, 9, 3), (None, 15, None)):
        assert classify(stop(reason, landed=True), exit_code, sig, oom) == outcome


async def test_a_stop_that_did_not_land_leaves_the_exit_to_decide() -> None:
    late = stop(StopReason.TIME_LIMIT, landed=False)
    assert classify(late, 0, None, None) == Outcome.SUCCEEDED
    assert classify(late, 3, None, None) == Outcome.FAILED
    assert classify(late, None, 15, None) == Outcome.SIGNALED


@pytest.mark.parametrize(("exit_code", "sig", "oom", "outcome"), [
    (0, None, None, Outcome.SUCCEEDED), (0, None, 2, Outcome.SUCCEEDED),
    (1, None, None, Outcome.FAILED), (255, None, 0, Outcome.FAILED),
    (None, 9, 1, Outcome.OOM_KILLED), (None, 9, 0, Outcome.SIGNALED),
    (None, 9, None, Outcome.SIGNALED), (None, 15, 1, Outcome.SIGNALED),
    (None, 8, 1, Outcome.SIGNALED), (None, 10, 1, Outcome.SIGNALED)])
async def test_without_a_stop_the_exit_and_the_oom_killer_decide(
        exit_code: int | None, sig: int | None, oom: int | None, outcome: Outcome) -> None:
    assert classify(stop(), exit_code, sig, oom) == outcome


def notes(s: StopState, outcome: Outcome, oom: int | None, fallback_errno: int = 0,
          ) -> list[str]:
    method = "vfork+cgroup.procs" if fallback_errno else "clone3"
    return outcome_notes(s, outcome, oom, method, fallback_errno)


async def test_outcome_notes_say_what_the_outcome_alone_does_not() -> None:
    assert notes(stop(), Outcome.SUCCEEDED, None) == []
    assert notes(stop(), Outcome.SUCCEEDED, 0) == []
    assert notes(stop(StopReason.CANCEL, landed=False), Outcome.SUCCEEDED, None) == [
        "a stop (cancel) was requested after the main process ended"]
    assert notes(stop(StopReason.CANCEL, landed=True), Outcome.CANCELLED, None) == []
    assert notes(stop(), Outcome.FAILED, 2) == [
        "the OOM killer ended 2 process(es) in the task's cgroup"]
    assert notes(stop(), Outcome.OOM_KILLED, 2) == []
    assert notes(stop(), Outcome.SUCCEEDED, None, errno.ENOSYS) == [
        "spawned by vfork+cgroup.procs: clone3 into the cgroup was refused (ENOSYS)"]
    assert notes(stop(), Outcome.SUCCEEDED, None, 99999) == [
        "spawned by vfork+cgroup.procs: clone3 into the cgroup was refused (?)"]


def driver(leftovers: dict[int, ProcessInfo], killed: bool = False,
           signalled: bool = False) -> Any:
    return SimpleNamespace(tracker=SimpleNamespace(leftovers=leftovers), killed_tree=killed,
                           signalled_tree=signalled)


async def test_cleanup_names_the_leftovers_and_how_they_ended() -> None:
    left = {7: ProcessInfo(7, "sleep"), 8: ProcessInfo(8, "sh")}
    c = cleanup_of(driver({}), [])
    assert (c.state, c.leftovers, c.leftovers_ended_by, c.detail) == ("clean", (), None, None)
    c = cleanup_of(driver({}, killed=True, signalled=True), [])
    assert c.leftovers_ended_by is None  # nothing was left: nothing ended
    c = cleanup_of(driver(left), [])
    assert c.state == "clean" and c.leftovers == tuple(left.values())
    assert c.leftovers_ended_by == "exited"
    assert cleanup_of(driver(left, signalled=True), []).leftovers_ended_by == "stop signal"
    assert cleanup_of(driver(left, killed=True, signalled=True), []).leftovers_ended_by == \
        "killed"
    assert cleanup_of(driver(left, killed=True), []).leftovers_ended_by == "killed"
    c = cleanup_of(driver(left, killed=True), ["one", "two"])
    assert (c.state, c.detail, c.leftovers_ended_by) == ("incomplete", "one; two", "killed")
    assert c.leftovers == tuple(left.values())


def stats(cpu: CpuStat | None, events: MemoryEvents | None, peak: int | None = None,
          pids_peak: int | None = None) -> CgroupStats:
    return CgroupStats(cpu=cpu, memory_current=None, memory_peak=peak, memory_events=events,
                       pids_current=None, pids_peak=pids_peak, pids_events=None, cgroup=None)


async def test_usage_keeps_what_the_leaf_offered_and_nothing_it_did_not() -> None:
    u = usage_of(None, 1.23456789, None, paused_s=0.1234567)
    assert (u.wall_s, u.paused_s, u.cpu_total_s, u.memory_peak, u.oom_kills) == \
        (1.234568, 0.123457, None, None, None)
    assert u.memory_events is None and u.pressure is None and u.series is None
    u = usage_of(None, 2.0, None, pressure={"cpu": 1}, series={"t": []})
    assert u.pressure == {"cpu": 1} and u.series == {"t": []} and u.paused_s == 0.0

    s = stats(CpuStat(usage_usec=3_000_000, user_usec=2_000_000, system_usec=1_000_000),
              MemoryEvents(low=0, high=1, max=2, oom=3, oom_kill=4, oom_group_kill=5),
              peak=4096, pids_peak=7)
    u = usage_of(s, 0.123456789, 4, pressure={"io": 2}, series={"s": 1}, paused_s=2.0)
    assert (u.wall_s, u.cpu_total_s, u.cpu_user_s, u.cpu_system_s) == (0.123457, 3.0, 2.0, 1.0)
    assert (u.memory_peak, u.pids_peak, u.oom_kills, u.paused_s) == (4096, 7, 4, 2.0)
    assert u.memory_events == {"low": 0, "high": 1, "max": 2, "oom": 3, "oom_kill": 4,
                               "oom_group_kill": 5}
    partial = usage_of(stats(None, MemoryEvents(low=None, high=None, max=None, oom=None,
                                                oom_kill=1, oom_group_kill=None)), 1.0, 1)
    assert partial.memory_events == {"oom_kill": 1}  # what the kernel did not offer: absent
    assert u.pressure == {"io": 2} and u.series == {"s": 1}

    u = usage_of(stats(None, None), 1.0, None)
    assert (u.cpu_total_s, u.cpu_user_s, u.cpu_system_s, u.memory_events) == (None,) * 4
    u = usage_of(stats(CpuStat(usage_usec=5, user_usec=None, system_usec=None), None), 1.0,
                 None)
    assert (u.cpu_total_s, u.cpu_user_s, u.cpu_system_s) == (5e-6, None, None)


def test_read_usage_reads_only_the_record_files_and_never_fails(
        test_cgroup: cgroupfs.Cgroup, caplog: pytest.LogCaptureFixture) -> None:
    assert {"cpu.stat", "memory.peak", "memory.events", "pids.peak"} == USAGE_FILES
    leaf = test_cgroup.make_child("leaf")
    got = read_usage(leaf, frozenset())
    assert got is not None and got.cpu is not None and got.cpu.usage_usec is not None
    assert got.memory_current is None and got.pids_current is None  # not asked for
    assert got.cgroup is None and got.pids_events is None  # (cgroup.stat, pids.events)
    os.rmdir(leaf.path)
    gone = read_usage(leaf, frozenset())  # nothing to read: every figure absent, no error
    assert gone is not None and gone.cpu is None
    leaf.close()

    class Broken:
        path = "/broken"

        def __init__(self, error: Exception) -> None:
            self.error = error

        def read_stats(self, *args: object, **kwargs: object) -> None:
            raise self.error

    calls: list[tuple[object, object]] = []

    class Recorder:
        path = "/recorder"

        def read_stats(self, controllers: object, only: object = None) -> None:
            calls.append((controllers, only))

    assert read_usage(Recorder(), frozenset({"pids"})) is None  # type: ignore[arg-type]
    assert calls == [(frozenset({"pids"}), USAGE_FILES)]

    with caplog.at_level(logging.WARNING, logger="supervisor._life"):
        missing = Broken(cgroupfs.CgroupNotFound(errno.ENOENT, "gone", "/broken/cpu.stat"))
        assert read_usage(missing, frozenset()) is None  # type: ignore[arg-type]
        assert caplog.text == ""
        unreadable = Broken(cgroupfs.CgroupError("unreadable"))
        assert read_usage(unreadable, frozenset()) is None  # type: ignore[arg-type]
    assert caplog.messages == ["reading the usage of /broken: unreadable"]


async def test_the_classification_is_the_same_inside_trio() -> None:
    # (StopState.request reads trio's clock: the helpers above need a trio context)
    await trio.lowlevel.checkpoint()
    assert classify(stop(StopReason.CANCEL, landed=True), 0, None, None) == Outcome.CANCELLED
