"""The driver (supervisor/_drive.py), third round: what the full mutation run of issue 12 left
alive.  Each test names the rule it pins; all run on real processes and real cgroups.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import trio
from test_mutation_drive import HANG, IGNORE_TERM, LONG, gone, ready, start, wait_for

import cgroupfs
import supervisor


async def test_a_cancelled_scope_is_one_request_however_long_the_grace(
        sup: supervisor.Supervisor) -> None:
    # the waits after the caller's cancellation are shielded: unshielded, each one would meet
    # the same cancellation again, a second request, and kill at once
    with trio.move_on_after(0.3) as scope:
        await sup.run(["sh", "-c", IGNORE_TERM], grace="0.6s")
    assert scope.cancelled_caught
    (r,) = sup.results.values()
    s = r.stop
    assert s is not None and s.reason == "cancel" and s.kill_because == "grace_expired", s
    assert s.killed_after_s is not None and s.signalled_after_s is not None
    assert s.killed_after_s - s.signalled_after_s >= 0.6 - 0.05  # the grace, served


async def test_after_the_end_the_stop_is_gone_and_a_request_changes_nothing(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", "exit 0"])
        r = await task.wait()
    assert task.stop_level == "gone"
    assert not task.stop() and not task.stop(force=True)
    assert r.stop is None and task.result is r and r.outcome == "succeeded"


async def test_a_main_that_exited_before_its_limit_is_not_timed_out_when_seen_late(
        sup: supervisor.Supervisor) -> None:
    # The main exits leaving a process behind; the loop is held (blocking sleeps) until it
    # has exited and the 0.4 s limit has passed, so the exit and the limit are seen in the
    # same step: the exit wins, the leftover is cleaned up, there is no stop.
    async with trio.open_nursery() as nursery:
        t0 = time.monotonic()
        task = await start(sup, nursery,
                           ["sh", "-c", "sleep 60 >/dev/null 2>&1 & sleep 0.1; exit 0"],
                           time_limit="0.4s", grace=LONG)
        assert task.pid is not None
        while proc_state(task.pid) != "Z" or time.monotonic() < t0 + 0.8:
            assert time.monotonic() < t0 + HANG, "the main did not exit"
            time.sleep(0.01)  # (blocks trio: nothing is seen until it ends)
        r = await task.wait()
    assert r.outcome == "succeeded" and r.stop is None, (r.outcome, r.stop)
    assert [p.comm for p in r.cleanup.leftovers] == ["sleep"]
    assert r.cleanup.leftovers_ended_by == "stop signal"


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


async def test_the_stop_signal_is_repeated_at_its_interval_not_more_often(
        sup: supervisor.Supervisor) -> None:
    script = ("n=0; trap 'n=$((n+1)); echo term $n' TERM; echo ready; "
              "while :; do sleep 0.02; done")
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script], grace="1s",
                           stop_signal_repeat="0.3s")
        await ready(task)
        task.stop()
        r = await task.wait()
    terms = r.stdout.count(b"term ")
    # at 0, 0.3, 0.6, 0.9 s: 4 (a signal can merge with one still pending: fewer, never more)
    assert 2 <= terms <= 4, r.stdout
    assert r.stop is not None and r.stop.kill_because == "grace_expired"


async def test_a_leaf_that_does_not_empty_after_the_main_exited_ends_the_drive(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor._drive as drive

    # A kill that does nothing stands for a leftover stuck in the kernel.  The main has exited:
    # once the bound has passed there is nothing left to wait for, the record comes (it
    # says the cleanup is incomplete); then we end the leftover ourselves.
    monkeypatch.setattr(drive, "KILL_TIMEOUT", 0.2)
    script = "(trap '' TERM; exec sleep 60) >/dev/null 2>&1 & echo ready"
    with monkeypatch.context() as m:
        m.setattr(cgroupfs.Cgroup, "kill", lambda self, **kw: "cgroup.kill")
        r = None
        with trio.move_on_after(HANG / 3):
            r = await sup.run(["sh", "-c", script], grace=0)
    assert r is not None, "the drive waited on for a leaf nobody can empty"
    assert r.outcome == "succeeded" and r.cleanup == "incomplete"
    assert r.cleanup.detail is not None
    assert r.cleanup.detail.startswith("the leaf did not empty within 0s of cgroup.kill")
    assert r.cleanup.leftovers_ended_by == "killed"
    path = r.containment.cgroup
    assert path is not None and os.path.isdir(path)
    with cgroupfs.Cgroup.open(path) as leaf:
        leaf.kill()
        assert leaf.wait_unpopulated(HANG)
        leaf.remove(recursive=True, busy_timeout=2.0)


async def test_two_pauses_add_up_and_the_idle_clock_restarts_at_each_resume(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", "echo ready; sleep 1.2"],
                           idle_timeout="20s", grace=LONG)
        await ready(task)
        for _ in range(2):
            assert task.pause()
            await trio.sleep(0.25)
            assert task.resume()
        r = await task.wait()
    assert r.outcome == "succeeded" and r.stop is None, r.stop
    assert 0.5 <= r.usage.paused_s < HANG


async def test_a_main_killed_while_paused_ends_the_pause(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "60"], grace=LONG)
        assert task.pause()
        await trio.sleep(0.2)
        assert task.pid is not None
        os.kill(task.pid, signal.SIGKILL)  # (SIGKILL reaches a frozen process)
        r = await task.wait()
    assert r.outcome == "signaled" and r.signal == signal.SIGKILL and r.stop is None
    assert r.usage.paused_s >= 0.2 and r.cleanup == "clean"


async def test_what_dies_with_a_killed_main_is_no_leftover(sup: supervisor.Supervisor) -> None:
    n = 200
    script = f"i=0; while [ $i -lt {n} ]; do sleep 60 & i=$((i+1)); done; echo ready; wait"
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script], grace=LONG)
        await ready(task)
        task.stop(force=True)
        r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    assert r.cleanup == "clean" and r.cleanup.leftovers == (), r.cleanup.leftovers


async def test_every_column_of_the_usage_series_is_sampled(test_cgroup: cgroupfs.Cgroup) -> None:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          sample_interval="0.1s") as sup:
        r = await sup.run(["sh", "-c", "head -c 1000000 /dev/zero > /dev/null; sleep 0.5"])
    series = r.usage.series
    assert series is not None
    n = len(series["t_s"] or [])
    assert n >= 2
    controllers = sup_controllers(test_cgroup)
    for column, controller in (("memory_bytes", "memory"), ("pids", "pids"),
                               ("io_bytes", "io")):
        if controller in controllers:
            values = series[column]
            assert values is not None and len(values) == n, (column, values)
    assert series["pids"] is None or max(series["pids"]) >= 1


def sup_controllers(cg: cgroupfs.Cgroup) -> set[str]:
    with open(os.path.join(cg.path, "cgroup.controllers")) as f:
        return set(f.read().split())


@pytest.mark.parametrize("end", ["exit 0", "kill -KILL $$"])
async def test_a_main_that_left_its_leaf_and_ended_there_by_itself_is_named(
        sup: supervisor.Supervisor, test_cgroup: cgroupfs.Cgroup, end: str) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    try:
        r = await sup.run(["sh", "-c", f"echo $$ > {elsewhere.path}/cgroup.procs; {end}"])
        (e,) = r.containment.escaped
        assert e.comm == "sh" and e.cgroup is not None and e.cgroup.endswith("/elsewhere")
        assert e.ended == "exited"  # not "killed": corral killed nothing
        assert r.stop is None
    finally:
        elsewhere.remove()


async def test_a_running_task_handed_over_runs_on_undisturbed(
        test_cgroup: cgroupfs.Cgroup) -> None:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as sup, \
            trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", "echo ready; exec sleep 60"],
                           grace=LONG, task_id="carried")
        await ready(task)
        assert task.pid is not None
        pid = task.pid
        handover = await sup.hand_over()
    assert task.stop_level == "none"
    async with supervisor.open_supervisor(adopt=handover) as sup:
        (adopted,) = sup.tasks
        assert adopted.pid == pid and adopted.stop_level == "none"
        with open(f"/proc/{pid}/comm") as f:
            assert f.read().strip() == "sleep"  # neither stopped nor signalled
        await trio.sleep(0.2)
        assert adopted.result is None
        adopted.stop()
        r = await adopted.wait()
    assert r.outcome == "cancelled" and r.stop is not None and r.stop.reason == "cancel"
    assert r.signal == signal.SIGTERM and r.stop.reached == "signalled"
    assert gone(r) < HANG
    await wait_for(lambda: not test_cgroup.is_populated(), "the adopted task's end")


@pytest.mark.parametrize("end", ["stop", "exit"])
async def test_every_note_is_kept_when_the_task_froze_sub_cgroups_and_moved_corral_in(
        sup: supervisor.Supervisor, cgroup2_mount: str, tmp_path: object, end: str) -> None:
    # Two frozen sub-cgroups and corral's own process moved into the leaf (as a root task
    # could do): a stop thaws, then moves back; a main's exit moves back, then thaws the
    # leftovers to stop them.  Either way both notes are kept, the thawed ones all named.
    flag = os.path.join(str(tmp_path), "flag")
    script = ('cg="$1$(sed -n "s/^0:://p" /proc/self/cgroup)"; for s in a b; do '
              'mkdir "$cg/$s"; sh -c \'echo 0 > "$1/cgroup.procs"; exec sleep 60\' inner '
              '"$cg/$s" & done; echo ready; while [ ! -e "$2" ]; do sleep 0.02; done')
    home = cgroupfs.own_cgroup()
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script, "task", cgroup2_mount, flag],
                           grace=LONG)
        await ready(task)
        assert task.cgroup is not None
        subs = [os.path.join(task.cgroup, s) for s in ("a", "b")]
        for sub in subs:
            await wait_for(lambda sub=sub: _populated(sub), f"the process in {sub}")
            with cgroupfs.Cgroup.open(sub) as cg:
                cg.freeze()
                assert cg.wait_frozen(HANG)
        try:
            with cgroupfs.Cgroup.open(task.cgroup) as leaf:
                leaf.add_proc(os.getpid())
            if end == "stop":
                task.stop()
            else:
                open(flag, "w").close()
            r = await task.wait()
        finally:
            if cgroupfs.own_cgroup() != home:
                with cgroupfs.Cgroup.open(home) as back:
                    back.add_proc(os.getpid())
    assert cgroupfs.own_cgroup() == home
    thawed = f"the task had frozen {subs[0]}, {subs[1]}; corral thawed it to stop it"
    moved = [n for n in r.notes if f"moved corral's own process (pid {os.getpid()})" in n]
    assert thawed in r.notes and len(moved) == 1, r.notes


def _populated(path: str) -> bool:
    with open(os.path.join(path, "cgroup.procs")) as f:
        return bool(f.read().split())
