"""The driver's named states (supervisor/_drive.py) through a supervisor, on real processes:
what each state sends, when, and what the record then says.

RUNNING -> TERM at the time limit, the idle timeout or a stop; TERM -> KILL at the grace's
end, a second request or force; the stop signal repeated; SIGCONT with every stop signal; a
frozen leaf thawed; processes in sub-cgroups signalled; leftovers named and how they ended;
pause not counted by the limit; a main process that left its leaf stopped through its pidfd; a
process seen in the leaf and found outside it killed.  Timings are only ever lower bounds, or
upper bounds far above what a loaded machine needs (a 60 s grace that must not be served).
Written to judge mutants (tests/mutation/run_mutation.py); quick enough for every run.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
import trio

import cgroupfs
import supervisor
from supervisor import TaskHandle

HANG = 30.0
LONG = "60s"  # a grace no test may end up serving


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(HANG):
        while not condition():
            await trio.sleep(0.005)
        return
    pytest.fail(f"{what}: not within {HANG}s")


async def ready(task: TaskHandle, marker: bytes = b"ready") -> None:
    await wait_for(lambda: marker in task.output().data, f"{marker!r} from the task")


async def start(sup: supervisor.Supervisor, nursery: trio.Nursery, argv: list[str],
                **options: Any) -> TaskHandle:
    task: TaskHandle = await nursery.start(functools.partial(sup.start, argv, **options))
    return task


def gone(r: supervisor.TaskResult) -> float:
    assert r.usage.wall_s is not None
    return r.usage.wall_s


# ---- RUNNING -> TERM ---------------------------------------------------------------------


async def test_the_time_limit_sends_the_stop_signal_and_the_task_is_timed_out(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sleep", "60"], time_limit="0.3s", grace=LONG)
    assert r.outcome == "timed_out" and r.signal == signal.SIGTERM
    assert r.stop is not None and r.stop.reason == "time_limit" and r.stop.landed
    assert r.stop.reached == "signalled" and r.stop.kill_because is None
    assert r.stop.signalled_after_s is not None and r.stop.signalled_after_s >= 0.3
    assert r.stop.killed_after_s is None
    assert 0.3 <= gone(r) < HANG
    assert r.cleanup == "clean" and not r.containment.escaped and r.kill_snapshot is None
    assert r.usage.paused_s == 0.0


async def test_no_time_limit_and_no_stop_lets_the_task_run_out(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "sleep 0.3; exit 4"])
    assert r.outcome == "failed" and r.exit_code == 4 and r.stop is None
    assert r.cleanup == "clean" and r.cleanup.leftovers == () and gone(r) >= 0.3


async def test_the_idle_timeout_stops_a_silent_task_and_not_a_talking_one(
        sup: supervisor.Supervisor) -> None:
    silent = await sup.run(["sh", "-c", "echo hi; sleep 60"], idle_timeout="0.3s", grace=LONG)
    assert silent.outcome == "timed_out" and silent.stop is not None
    assert silent.stop.reason == "idle" and silent.stop.reached == "signalled"
    talking = await sup.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.1; "
                                         "done"], idle_timeout="5s", time_limit="60s")
    assert talking.outcome == "succeeded" and talking.stop is None


async def test_the_time_limit_does_not_count_paused_time(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "0.5"], time_limit="1s")
        assert task.pause() and not task.pause()
        await trio.sleep(1.2)  # past the limit, paused: it must not count
        assert task.resume() and not task.resume()
        r = await task.wait()
    assert r.outcome == "succeeded" and r.stop is None, r.stop
    assert r.usage.paused_s >= 1.2


async def test_a_stop_ends_a_pause_and_the_stop_lands(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "60"], grace=LONG)
        assert task.pause()
        task.stop()
        r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGTERM
    assert r.stop is not None and r.stop.reached == "signalled" and r.usage.paused_s > 0


# ---- TERM -> KILL --------------------------------------------------------------------------


IGNORE_TERM = "trap '' TERM; echo ready; sleep 60"


async def test_the_grace_is_served_then_cgroup_kill(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", IGNORE_TERM], grace="0.4s")
        await ready(task)
        task.stop()
        r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    s = r.stop
    assert s is not None and s.reached == "killed" and s.kill_because == "grace_expired"
    assert s.signalled_after_s is not None and s.killed_after_s is not None
    # (the grace counts from just before the stop signal went out, signalled_after_s from
    # just after: the pass itself, a millisecond or so, lies between)
    assert s.killed_after_s - s.signalled_after_s >= 0.4 - 0.05
    assert r.cleanup == "clean" and not r.containment.escaped


async def test_a_second_request_skips_the_rest_of_the_grace(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", IGNORE_TERM], grace=LONG)
        await ready(task)
        assert task.stop()
        await wait_for(lambda: task.stop_level == "signalled", "the stop signal")
        assert task.stop()
        r = await task.wait()
    s = r.stop
    assert s is not None and s.reached == "killed" and s.kill_because == "second_request"
    assert s.signalled_after_s is not None and gone(r) < HANG


async def test_force_kills_without_a_stop_signal(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", IGNORE_TERM], grace=LONG)
        await ready(task)
        task.stop(force=True)
        r = await task.wait()
    s = r.stop
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    assert s is not None and s.reached == "killed" and s.kill_because == "force"
    assert s.signalled_after_s is None and gone(r) < HANG


async def test_no_grace_kills_at_once_and_says_why(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", IGNORE_TERM], time_limit="0.2s", grace=0)
    s = r.stop
    assert r.outcome == "timed_out" and r.signal == signal.SIGKILL
    assert s is not None and s.reached == "killed" and s.kill_because == "no_grace"
    assert s.signalled_after_s is None and s.killed_after_s is not None
    assert s.killed_after_s >= 0.2


async def test_the_stop_signal_is_repeated_during_the_grace(sup: supervisor.Supervisor) -> None:
    script = ("n=0; trap 'n=$((n+1)); echo term $n' TERM; echo ready; "
              "while :; do sleep 0.02; done")
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script], grace="1.5s",
                           stop_signal_repeat="0.1s")
        await ready(task)
        task.stop()
        await wait_for(lambda: b"term 3" in task.output().data, "three stop signals")
        task.stop()
        r = await task.wait()
    assert r.stop is not None and r.stop.kill_because == "second_request"


async def test_the_stop_signal_is_the_one_asked_for(sup: supervisor.Supervisor) -> None:
    # (a loop of short sleeps, not one long one: a sleep forked just after the stop signal
    # went out would not get it, and the shell runs its trap only once its child is done)
    script = ("trap 'echo got-int; exit 7' INT; trap 'echo got-term' TERM; echo ready; "
              "while :; do sleep 0.05; done")
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script], stop_signal="INT", grace=LONG)
        await ready(task)
        task.stop()
        r = await task.wait()
    assert b"got-int" in r.stdout and b"got-term" not in r.stdout
    assert r.outcome == "cancelled" and r.exit_code == 7
    assert r.stop is not None and r.stop.signal == signal.SIGINT
    assert r.stop.reached == "signalled"


async def test_a_stopped_task_gets_sigcont_with_the_stop_signal(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", "echo ready; kill -STOP $$; sleep 60"],
                           grace=LONG)
        await ready(task)
        pid = task.pid
        assert pid is not None
        await wait_for(lambda: _state(pid) == "T", "the task stopped itself")
        task.stop()
        r = await task.wait()
    # without SIGCONT the TERM would wait for the 60 s grace's kill
    assert r.signal == signal.SIGTERM and r.stop is not None
    assert r.stop.reached == "signalled" and gone(r) < HANG
    assert r.cleanup == "clean" and not r.containment.escaped


def _procs(path: str) -> list[str]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


async def test_a_task_that_froze_its_leaf_is_thawed_to_be_stopped_and_the_record_says_so(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "60"], grace=LONG)
        assert task.cgroup is not None
        with cgroupfs.Cgroup.open(task.cgroup) as leaf:
            leaf.freeze()  # as the task itself could, with write access to its leaf
            assert leaf.wait_frozen(HANG)
        task.stop()
        r = await task.wait()
    assert r.signal == signal.SIGTERM and r.stop is not None and r.stop.reached == "signalled"
    assert any(f"the task had frozen {task.cgroup}; corral thawed it" in n for n in r.notes), \
        r.notes


async def test_processes_in_a_sub_cgroup_get_the_stop_signal_too(
        sup: supervisor.Supervisor, cgroup2_mount: str) -> None:
    # the task makes a cgroup in its leaf; a child moves there and says when the TERM comes
    inner = ('echo 0 > "$1/cgroup.procs" && trap "echo inner-term; exit 0" TERM && echo ready '
             "&& while :; do sleep 0.02; done")
    outer = ('cg="$1$(sed -n "s/^0:://p" /proc/self/cgroup)/made"; mkdir "$cg"; '
             'sh -c "$2" inner "$cg" & trap "" TERM; wait')
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", outer, "outer", cgroup2_mount, inner],
                           grace="0.3s")
        await ready(task)
        task.stop()
        r = await task.wait()
    assert b"inner-term" in r.stdout, r.stdout
    assert r.cleanup == "clean"


# ---- after the main process's exit ---------------------------------------------------------


async def test_leftovers_are_named_and_stopped_by_the_stop_signal(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "sleep 60 & echo $!; sleep 0.2"], grace=LONG)
    left = int(r.stdout.split()[0])
    assert r.outcome == "succeeded" and r.stop is None
    assert r.cleanup == "clean" and r.cleanup.leftovers_ended_by == "stop signal"
    assert [(p.pid, p.comm) for p in r.cleanup.leftovers] == [(left, "sleep")]


async def test_leftovers_that_ignore_the_stop_signal_are_killed_at_the_graces_end(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "(trap '' TERM; exec sleep 60) & echo $!; sleep 0.2"],
                      grace="0.3s")
    assert r.outcome == "succeeded" and r.cleanup.leftovers_ended_by == "killed"
    assert [p.pid for p in r.cleanup.leftovers] == [int(r.stdout.split()[0])]
    assert gone(r) < HANG


async def test_leftovers_with_no_grace_are_killed_at_once(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "sleep 60 & echo $!"], grace=0)
    assert r.outcome == "succeeded" and r.cleanup.leftovers_ended_by == "killed"
    assert r.stop is None and len(r.cleanup.leftovers) == 1


async def test_a_stop_after_the_main_exited_did_not_land(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", "(trap '' TERM; exec sleep 60) & exit 3"],
                           grace="0.3s")
        await wait_for(lambda: task.state == "stopping", "the main's exit")
        task.stop()
        r = await task.wait()
    assert r.outcome == "failed" and r.exit_code == 3
    assert r.stop is not None and not r.stop.landed and r.stop.reason == "cancel"
    assert "a stop (cancel) was requested after the main process ended" in r.notes


async def test_the_callers_cancelled_scope_is_a_graceful_stop(
        sup: supervisor.Supervisor) -> None:
    with trio.move_on_after(0.3) as scope:
        await sup.run(["sleep", "60"], grace=LONG)
    assert scope.cancelled_caught
    (r,) = sup.results.values()
    assert r.outcome == "cancelled" and r.stop is not None and r.stop.reason == "cancel"
    assert r.stop.reached == "signalled" and r.signal == signal.SIGTERM


# ---- escapes (root tasks with the cgroup tree writable) ------------------------------------


async def test_a_main_process_that_left_its_leaf_is_still_stopped_through_its_pidfd(
        sup: supervisor.Supervisor, test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    try:
        script = f'echo $$ > {elsewhere.path}/cgroup.procs && echo ready && exec sleep 60'
        r = await sup.run(["sh", "-c", script], time_limit="0.5s", grace=LONG)
        assert r.outcome == "timed_out" and r.signal == signal.SIGTERM
        assert r.stop is not None and r.stop.landed and r.stop.reached == "signalled"
        (e,) = r.containment.escaped
        assert e.comm == "sleep" and e.ended == "exited" and e.cgroup is not None
        assert e.cgroup.endswith("/elsewhere")
        assert r.cleanup == "incomplete" and r.containment.broken
    finally:
        assert not elsewhere.is_populated()
        elsewhere.remove()


async def test_a_main_process_that_left_and_ignores_the_stop_is_killed_through_its_pidfd(
        sup: supervisor.Supervisor, test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    try:
        # (exec: a child it forked out there would never have been in the leaf, and corral
        # does not know of it; see supervisor/_tracking.py)
        script = (f"trap '' TERM; echo $$ > {elsewhere.path}/cgroup.procs && echo ready && "
                  f"exec sleep 60")
        r = await sup.run(["sh", "-c", script], time_limit="0.3s", grace="0.3s")
        assert r.outcome == "timed_out" and r.signal == signal.SIGKILL
        (e,) = r.containment.escaped
        assert e.ended == "killed"
    finally:
        await wait_for(lambda: not elsewhere.is_populated(), "the sleep outside to end")
        elsewhere.remove()


async def test_a_process_seen_in_the_leaf_and_found_outside_it_is_killed_and_named(
        sup: supervisor.Supervisor, test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    # the child leaves its leaf when it gets the stop signal, and would live on there
    child = ('trap "echo \\$\\$ > $1/cgroup.procs" TERM; echo ready; '
             "while :; do sleep 0.02; done")
    try:
        async with trio.open_nursery() as nursery:
            task = await start(sup, nursery, ["sh", "-c", 'sh -c "$1" child "$2" & wait',
                                              "main", child, elsewhere.path], grace="0.3s")
            await ready(task)
            task.stop()
            r = await task.wait()
        escaped = [e for e in r.containment.escaped if e.ended == "killed"]
        assert escaped and all(e.cgroup and e.cgroup.endswith("/elsewhere") for e in escaped), \
            r.containment.escaped
        assert r.cleanup == "incomplete"
    finally:
        await wait_for(lambda: not elsewhere.is_populated(), "the escaped process to die")
        elsewhere.remove()


async def test_nothing_is_left_open_after_the_drive(sup: supervisor.Supervisor) -> None:
    await sup.run(["/bin/true"])
    fds = len(os.listdir("/proc/self/fd"))
    r = await sup.run(["sh", "-c", "sleep 60 & sleep 60 & echo $!"], grace=LONG)
    assert len(r.cleanup.leftovers) == 2
    assert len(os.listdir("/proc/self/fd")) == fds  # the pidfds kept of what was seen


# ---- second round: what the first mutation run left alive ----------------------------------


async def test_the_callers_cancelled_scope_counts_as_the_callers_first_request(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as outer:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                task = await start(sup, nursery, ["sh", "-c", IGNORE_TERM], grace=LONG)
                await ready(task)
                outer.start_soon(_stop_when_signalled, task)
                scope.cancel()  # the first request: graceful
    r = await task.wait()
    s = r.stop
    assert s is not None and s.reason == "cancel" and s.kill_because == "second_request"
    assert gone(r) < HANG


async def _stop_when_signalled(task: TaskHandle) -> None:
    await wait_for(lambda: task.stop_level == "signalled", "the stop signal")
    task.stop()  # the caller's second request


@pytest.mark.parametrize("limit", ["time_limit", "idle_timeout"])
async def test_the_supervisors_own_stop_leaves_the_caller_both_requests(
        sup: supervisor.Supervisor, limit: str) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", IGNORE_TERM], grace="1s",
                           **{limit: "0.2s"})
        await wait_for(lambda: task.stop_level == "signalled", "the limit's stop signal")
        assert task.stop()  # the caller's first request: it changes something, kills nothing
        r = await task.wait()
    s = r.stop
    assert r.outcome == "timed_out" and s is not None and s.kill_because == "grace_expired"
    assert s.killed_after_s is not None and s.signalled_after_s is not None
    assert s.killed_after_s - s.signalled_after_s >= 1.0 - 0.05  # the grace, served


async def test_the_limit_still_fires_after_a_pause_that_outlasted_it(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "60"], time_limit="0.5s", grace=LONG)
        assert task.pause()
        await trio.sleep(1.0)
        assert task.resume()
        r = await task.wait()
    s = r.stop
    assert r.outcome == "timed_out" and s is not None and s.reason == "time_limit"
    assert r.usage.paused_s >= 1.0
    assert s.requested_after_s is not None and s.requested_after_s >= 1.5  # 0.5 s running


async def test_a_resume_does_not_bring_the_limit_forward(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "0.6"], time_limit="1.5s")
        await trio.sleep(0.1)
        assert task.pause()
        await trio.sleep(0.5)
        assert task.resume()
        r = await task.wait()
    assert r.outcome == "succeeded" and r.stop is None


async def test_the_driver_sleeps_while_it_waits_for_the_limit(
        sup: supervisor.Supervisor) -> None:
    import resource

    def cpu() -> float:
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "60"], time_limit="1.2s", grace=LONG)
        assert task.pause()
        await trio.sleep(0.3)
        assert task.resume()
        before = cpu()
        r = await task.wait()
        used = cpu() - before
    assert r.outcome == "timed_out"
    assert used < 0.3, f"{used:.2f} s of CPU while waiting ~1.2 s: a busy loop"


async def test_a_stop_during_a_pause_records_the_pause(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sleep", "60"], grace=LONG)
        assert task.pause()
        await trio.sleep(0.2)
        task.stop(force=True)
        r = await task.wait()
    assert r.outcome == "cancelled" and r.usage.paused_s >= 0.2
    assert r.stop is not None and r.stop.kill_because == "force"


async def test_no_pause_during_the_grace(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", IGNORE_TERM], grace="0.5s")
        await ready(task)
        task.stop()
        await wait_for(lambda: task.stop_level == "signalled", "the stop signal")
        assert not task.pause()  # stopping: no pause may hold the grace
        r = await task.wait()
    assert r.usage.paused_s == 0.0 and r.stop is not None and r.stop.reached == "killed"


async def test_the_kill_is_recorded_with_a_snapshot_and_the_level_it_reached(
        sup: supervisor.Supervisor) -> None:
    n = 300
    script = f"i=0; while [ $i -lt {n} ]; do sleep 60 & i=$((i+1)); done; echo ready; wait"
    levels: list[str] = []
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script], grace=LONG)
        await ready(task)
        task.stop(force=True)
        while task.result is None:
            levels.append(task.stop_level)
            await trio.lowlevel.checkpoint()
        r = await task.wait()
    # (the KILL phase lasts a few ms: the poll sees it most of the time, not always)
    assert set(levels) <= {"requested", "killed", "gone"}, set(levels)
    snap, s = r.kill_snapshot, r.stop
    assert snap is not None and s is not None and s.killed_after_s is not None
    assert 0 <= snap.taken_after_s <= s.killed_after_s + 0.001
    assert s.killed_after_s - snap.taken_after_s < 1.0
    assert len(snap.processes) + snap.more == n + 1
    assert {p.comm for p in snap.processes} <= {"sh", "sleep"}
    assert r.cleanup == "clean" and not r.cleanup.detail  # emptied within the bound


async def test_a_leaf_that_does_not_empty_in_time_is_reported(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor._drive as drive

    # A kill that does nothing stands for a leaf that cannot be emptied (a process stuck in
    # the kernel): the bound passes, the record says so; then we end it ourselves.
    monkeypatch.setattr(drive, "KILL_TIMEOUT", 0.2)
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", "sleep 60 & echo ready; wait"],
                           grace=LONG)
        await ready(task)
        with monkeypatch.context() as m:
            m.setattr(cgroupfs.Cgroup, "kill", lambda self, **kw: "cgroup.kill")
            task.stop(force=True)
            await trio.sleep(0.6)  # three times the bound
            assert task.result is None  # the main process lives: the driver waits on
            assert task.stop_level == "killed"
        assert task.cgroup is not None
        with cgroupfs.Cgroup.open(task.cgroup) as leaf:
            leaf.kill()
        r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    assert r.cleanup == "incomplete", r.cleanup
    assert r.cleanup.detail == "the leaf did not empty within 0s of cgroup.kill"


async def test_a_process_forked_while_the_stop_went_out_gets_it_once_and_others_not_twice(
        sup: supervisor.Supervisor) -> None:
    counter = ("n=0; trap 'n=$((n+1)); echo count-$n' TERM; echo ready; "
               "while :; do sleep 0.02; done")
    late = "trap 'echo late-term; exit 0' TERM; while :; do sleep 0.02; done"
    # the main: on TERM, starts a late child, then exits after a moment
    main = ('sh -c "$1" counter & '
            'trap \'sh -c "$2" late & sleep 0.3; exit 0\' TERM; '
            "while :; do sleep 0.02; done")
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", main, "main", counter, late], grace="1s")
        await ready(task)
        task.stop()
        r = await task.wait()
    assert b"count-1" in r.stdout and b"count-2" not in r.stdout, r.stdout
    assert b"late-term" in r.stdout, r.stdout


async def test_a_frozen_sub_cgroup_is_thawed_and_named(sup: supervisor.Supervisor,
                                                       cgroup2_mount: str) -> None:
    script = ('cg="$1$(sed -n "s/^0:://p" /proc/self/cgroup)/made"; mkdir "$cg"; '
              'sh -c \'echo 0 > "$1/cgroup.procs"; exec sleep 60\' inner "$cg" & '
              'echo ready; wait')
    async with trio.open_nursery() as nursery:
        task = await start(sup, nursery, ["sh", "-c", script, "task", cgroup2_mount],
                           grace=LONG)
        await ready(task)
        assert task.cgroup is not None
        made = os.path.join(task.cgroup, "made")
        await wait_for(lambda: bool(_procs(made)), "the process in the sub-cgroup")
        with cgroupfs.Cgroup.open(made) as sub:
            sub.freeze()
            assert sub.wait_frozen(HANG)
        task.stop()
        r = await task.wait()
    assert f"the task had frozen {made}; corral thawed it to stop it" in r.notes, r.notes
    assert r.stop is not None and r.stop.reached == "signalled"


async def test_usage_is_sampled_while_the_task_runs(test_cgroup: cgroupfs.Cgroup) -> None:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          sample_interval="0.1s") as sup:
        r = await sup.run(["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; "
                                       "sleep 0.5"])
    series = r.usage.series
    assert series is not None, r.usage
    t = series["t_s"]
    assert t is not None and len(t) >= 2 and t == sorted(t)
    assert all(0 <= x <= gone(r) + 0.2 and x == round(x, 3) for x in t)
    assert series["cpu_s"] is not None and len(series["cpu_s"]) == len(t)
    assert series["cpu_s"] == sorted(series["cpu_s"]) and series["cpu_s"][-1] > 0


async def test_an_escape_seen_only_by_the_stop_signal_is_still_caught(
        test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    child = ('trap "echo \\$\\$ > $1/cgroup.procs" TERM; echo ready; '
             "while :; do sleep 0.02; done")
    try:
        # no sampler: the stop signal's pass is the only one that sees the child
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                              sample_interval=None) as sup, \
                trio.open_nursery() as nursery:
            task = await start(sup, nursery, ["sh", "-c", 'sh -c "$1" child "$2" & wait',
                                              "main", child, elsewhere.path], grace="0.3s")
            await ready(task)
            task.stop()
            r = await task.wait()
        assert [e.ended for e in r.containment.escaped] == ["killed"], r.containment.escaped
    finally:
        await wait_for(lambda: not elsewhere.is_populated(), "the escaped process to die")
        elsewhere.remove()


async def test_a_task_that_moves_corral_into_its_leaf_does_not_get_corral_stopped(
        sup: supervisor.Supervisor, cgroup2_mount: str) -> None:
    # the task's parent is this very process (the supervisor): it moves it into its leaf,
    # where the leftovers' stop (and a kill) would reach corral itself
    script = ('cg="$1$(sed -n "s/^0:://p" /proc/self/cgroup)"; echo $PPID > "$cg/cgroup.procs"; '
              "sleep 60 & echo moved")
    home = cgroupfs.own_cgroup()
    r = await sup.run(["sh", "-c", script, "task", cgroup2_mount], grace=0)
    assert cgroupfs.own_cgroup() == home, "corral was left in the task's leaf"
    assert r.outcome == "succeeded" and r.cleanup.leftovers_ended_by == "killed"
    moved = [n for n in r.notes if f"moved corral's own process (pid {os.getpid()})" in n]
    assert moved and moved[0].endswith(f"corral moved itself back to {home}"), r.notes
