"""A task's life on real processes in real cgroup leaves: outcomes, stops, leftovers, output."""

from __future__ import annotations

import errno
import functools
import gc
import math
import os
import pathlib
import signal

import pytest
import trio
from sup_util import HANG, IGNORE_TERM_READY, alive, wait_for, wait_ready

import supervisor
from supervisor import TaskSpec

IGNORE_TERM = "trap '' TERM; "


async def test_run_reports_exit_output_and_usage(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert r.outcome == "failed" and r.exit_code == 3 and r.signal is None
    assert (r.stdout, r.stderr) == (b"out\n", b"err\n")
    assert r.cleanup == "clean" and r.started and r.stop is None
    assert r.containment.mode == "cgroup" and r.containment.spawn_method == "clone3"
    assert r.usage.wall_s is not None and r.usage.cpu_total_s is not None
    # this host has no memory/pids controller: those figures are absent, not zero
    if "memory" not in sup.controllers:
        assert r.usage.memory_peak is None and r.usage.oom_kills is None
    assert r.created_at <= (r.started_at or 0) <= r.ended_at
    assert r is sup.results[r.id]


async def test_success_and_signal_outcomes(sup: supervisor.Supervisor) -> None:
    ok = await sup.run(["true"])
    assert ok.outcome == "succeeded" and ok.exit_code == 0
    killed = await sup.run(["sh", "-c", "kill -USR1 $$"])
    assert killed.outcome == "signaled" and killed.signal == signal.SIGUSR1
    assert killed.exit_code is None and killed.signal_name == "SIGUSR1"


async def test_task_ids_are_never_reused(sup: supervisor.Supervisor) -> None:
    ids = [(await sup.run(["true"])).id for _ in range(5)]
    assert len(set(ids)) == 5


async def test_a_finished_task_is_freed_without_the_cyclic_collector(
        sup: supervisor.Supervisor) -> None:
    """A task that kept its handle, which keeps the task, was a reference cycle: each
    finished task, its command and its output stayed until the cyclic collector ran (the
    daemon held tens of them, 4.7 MiB each for a command of 65,000 arguments)."""
    from supervisor._task import Task

    def tasks_held() -> int:
        return sum(isinstance(o, Task) for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            async with trio.open_nursery() as n:
                handle = await n.start(sup.start, ["sleep", "60"])
                assert handle in sup.tasks  # (a handle made again: equal, by its task)
                handle.stop(force=True)
                assert (await handle.wait()).outcome == "cancelled"
            del handle
        assert tasks_held() == 0
    finally:
        gc.enable()


async def test_lowering_retain_results_lets_the_oldest_records_go_now(
        sup: supervisor.Supervisor) -> None:
    ids = [(await sup.run(["true"])).id for _ in range(3)]
    assert list(sup.results) == ids and sup.retain_results == 1000
    sup.retain_results = 1
    assert list(sup.results) == ids[-1:]
    sup.retain_results = 0
    assert not sup.results
    assert (await sup.run(["true"])).outcome == "succeeded" and not sup.results
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="retain_results must be a count"):
            sup.retain_results = bad  # type: ignore[assignment]


async def test_time_limit_stops_gracefully(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sleep", "60"], time_limit="0.3s", grace="20s")
    assert r.outcome == "timed_out" and r.signal == signal.SIGTERM
    assert r.stop is not None and r.stop.reason == "time_limit"
    assert r.stop.reached == "signalled" and r.stop.killed_after_s is None
    assert r.time_limit == pytest.approx(0.3)


async def test_time_limit_kills_a_task_ignoring_sigterm_after_the_grace(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", IGNORE_TERM + "sleep 60"], time_limit="1s", grace="0.3s")
    assert r.outcome == "timed_out" and r.signal == signal.SIGKILL
    assert r.stop is not None and r.stop.reached == "killed"
    assert r.stop.killed_after_s is not None and r.stop.signalled_after_s is not None
    assert r.stop.killed_after_s - r.stop.signalled_after_s >= 0.3 - 0.01
    assert r.cleanup == "clean"


async def test_stopped_at_time_limit_is_timed_out_even_if_it_exits_zero(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "trap 'exit 0' TERM; sleep 60 & wait"], time_limit="0.3s")
    assert r.outcome == "timed_out" and r.exit_code == 0


async def test_stop_signal_is_configurable_and_can_repeat(sup: supervisor.Supervisor) -> None:
    # an interrupt-first tool: exits only on the second SIGINT
    script = ("n=0; trap 'n=$((n+1)); [ $n -ge 2 ] && exit 7' INT; "
              "while :; do sleep 0.05; done")
    r = await sup.run(["sh", "-c", script], time_limit="0.2s", grace="20s",
                      stop_signal="SIGINT", stop_signal_repeat="0.2s")
    assert r.outcome == "timed_out" and r.exit_code == 7
    assert r.stop is not None and r.stop.signal == signal.SIGINT and r.stop.reached == "signalled"


async def test_caller_cancellation_stops_gracefully_and_records_before_reraising(
        sup: supervisor.Supervisor) -> None:
    with trio.move_on_after(0.3) as scope:
        await sup.run(["sleep", "60"])
    assert scope.cancelled_caught
    r = next(reversed(sup.results.values()))
    assert r.outcome == "cancelled" and r.signal == signal.SIGTERM
    assert r.stop is not None and r.stop.reason == "cancel" and r.stop.reached == "signalled"
    assert r.cleanup == "clean"


async def test_stop_before_spawn_never_starts(sup: supervisor.Supervisor) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await sup.run(["touch", "/nonexistent-should-not-run"])
    r = next(reversed(sup.results.values()))
    assert r.outcome == "cancelled" and not r.started and r.exit_code is None
    assert r.started_at is None


async def test_second_stop_skips_the_grace_and_kills(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", IGNORE_TERM_READY],
                                               grace="1h"))
        await wait_ready(task)
        assert task.stop() is True
        await wait_for(lambda: task.stop_level == "signalled", what="signalled")
        with trio.fail_after(HANG):
            assert task.stop() is True  # escalates
            r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    assert r.stop is not None and r.stop.reached == "killed"
    assert r.stop.kill_because == "second_request"
    assert task.stop() is False and task.stop(force=True) is False
    assert await task.wait() is r


async def test_stop_force_kills_at_once(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sleep", "60"], grace="1h"))
        assert task.stop(force=True)
        r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGKILL
    assert r.stop is not None and r.stop.signalled_after_s is None and r.stop.reached == "killed"


async def test_stop_of_a_finished_task_changes_nothing(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(sup.start, ["true"])
        r = await task.wait()
    assert task.stop() is False and task.stop(force=True) is False
    assert await task.wait() is r and r.outcome == "succeeded" and r.stop is None


async def test_main_exit_ends_the_command_and_leftovers_are_stopped(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & sleep 60 & echo bg=$!"],
                      grace="20s")
    assert r.outcome == "succeeded" and r.exit_code == 0
    assert len(r.cleanup.leftovers) == 2 and r.cleanup.leftovers_ended_by == "stop signal"
    assert r.cleanup == "clean"
    for p in r.cleanup.leftovers:
        assert not alive(p.pid)


async def test_leftovers_ignoring_sigterm_are_killed_after_the_grace(
        sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    ready = tmp_path / "ready"
    r = await sup.run(["sh", "-c", f"setsid sh -c \"trap '' TERM; touch {ready}; sleep 60\" & "
                                   f"while [ ! -e {ready} ]; do sleep 0.01; done"], grace="0.3s")
    assert r.outcome == "succeeded"
    assert r.cleanup.leftovers and r.cleanup.leftovers_ended_by == "killed"
    assert r.stop is None  # nobody asked the task to stop: this was cleanup


async def test_setsid_grandchild_holding_the_pipe_does_not_hold_the_result(
        sup: supervisor.Supervisor) -> None:
    with trio.fail_after(HANG):
        r = await sup.run(["sh", "-c", "setsid sleep 600 & echo done"], grace="0.2s")
    assert r.stdout == b"done\n" and r.outcome == "succeeded"
    assert r.cleanup.leftovers


async def test_exec_failure_is_spawn_failed_with_errno(sup: supervisor.Supervisor,
                                                       tmp_path: pathlib.Path) -> None:
    r = await sup.run(["corral-no-such-command"])
    assert r.outcome == "spawn_failed" and not r.started
    assert r.error_errno == errno.ENOENT and r.error_step == "exec"
    assert "corral-no-such-command" in (r.error or "")
    assert r.cleanup == "clean"
    r = await sup.run(["true"], cwd=str(tmp_path / "missing"))
    assert r.outcome == "spawn_failed" and r.error_step == "chdir"


async def test_large_output_is_drained_with_bounded_memory(sup: supervisor.Supervisor) -> None:
    size = 256 << 20
    r = await sup.run(["head", "-c", str(size), "/dev/zero"])
    out = r.output_stdout
    assert r.outcome == "succeeded"
    assert out.total == size
    assert len(out.head) == 16 * 1024 and len(out.tail) == 48 * 1024
    assert out.dropped == size - 64 * 1024


async def test_head_and_tail_keep_the_ends(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "seq 1 100000"], output_head=10, output_tail=12)
    assert r.output_stdout.head == b"1\n2\n3\n4\n5\n"
    assert r.output_stdout.tail == b"\n99999\n100000\n"[-12:]
    assert r.output_stdout.dropped == r.output_stdout.total - 22


async def test_stdin_env_and_cwd(sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    r = await sup.run(["sh", "-c", "cat; echo \"$FOO\"; pwd"], stdin=b"fed\n",
                      env={"FOO": "bar"}, cwd=str(tmp_path))
    assert r.stdout == f"fed\nbar\n{tmp_path}\n".encode()
    r = await sup.run(["/usr/bin/env"], env={"ONLY": "1"}, inherit_env=False)
    assert r.stdout == b"ONLY=1\n"


async def test_a_log_file_that_could_block_is_refused_never_opened_blocking(
        sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(supervisor.SpecError, match="log_file must be a plain file"):
        supervisor.TaskSpec(["true"], log_file=str(fifo))
    spec = supervisor.TaskSpec(["true"], log_file=str(tmp_path / "later"))
    os.mkfifo(tmp_path / "later")  # made after the check: the spawn must not block on it
    with trio.fail_after(HANG):
        r = await sup.run(spec)
    assert r.outcome == "spawn_failed" and "not a regular file" in (r.error or "")


async def test_log_file_keeps_full_output_up_to_its_cap(sup: supervisor.Supervisor,
                                                        tmp_path: pathlib.Path) -> None:
    log = tmp_path / "task.log"
    r = await sup.run(["seq", "1", "20000"], log_file=str(log), log_max_bytes=1000)
    assert log.read_bytes() == b"".join(b"%d\n" % i for i in range(1, 20001))[:1000]
    assert r.output_stdout.log_truncated and r.output_stdout.log_path == str(log)


async def test_live_subscriber_sees_output_before_the_task_ends(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(sup.start, ["sh", "-c", "echo first; sleep 60"])
        stream = task.subscribe("stdout")
        with trio.fail_after(HANG):
            chunk = await stream.receive()
        assert chunk == b"first\n" and task.result is None
        task.stop()
    r = await task.wait()
    assert r.outcome == "cancelled"


async def test_shutdown_stops_live_tasks(test_cgroup: object) -> None:
    import cgroupfs
    assert isinstance(test_cgroup, cgroupfs.Cgroup)
    async with trio.open_nursery() as n:
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
            task = await n.start(s.start, ["sleep", "60"])
            pid = task.pid
        r = await task.wait()
    assert r.outcome == "cancelled" and r.stop is not None and r.stop.reason == "shutdown"
    assert pid is not None and not alive(pid)
    assert test_cgroup.children() == []


async def test_slow_cleanup_that_starts_an_escapee_during_the_grace(
        sup: supervisor.Supervisor) -> None:
    script = ("trap 'setsid sh -c \"trap \\\"\\\" TERM; sleep 60\" & sleep 0.3; exit 0' TERM; "
              "sleep 60 & wait")
    r = await sup.run(["sh", "-c", script], time_limit="0.2s", grace="1s")
    assert r.outcome == "timed_out" and r.exit_code == 0
    assert r.cleanup.leftovers and r.cleanup.leftovers_ended_by == "killed"
    assert r.cleanup == "clean"


async def test_every_leaf_is_removed(sup: supervisor.Supervisor) -> None:
    tasks = sup.cgroup_root
    for _ in range(3):
        r = await sup.run(["true"])
        assert r.containment.cgroup and not os.path.exists(r.containment.cgroup)
    assert [d for d in os.listdir(tasks) if os.path.isdir(os.path.join(tasks, d))] == []


@pytest.mark.parametrize("value", ["-5s", "0", "nan", "abc", math.inf, True, "5 parsecs"])
async def test_bad_time_limit_is_refused_before_anything_runs(
        sup: supervisor.Supervisor, value: object) -> None:
    before = os.listdir(sup.cgroup_root)
    with pytest.raises(supervisor.SpecError) as ei:
        await sup.run(["true"], time_limit=value)
    assert "time_limit" in str(ei.value) and ei.value.field == "time_limit"
    assert isinstance(ei.value, ValueError)
    assert os.listdir(sup.cgroup_root) == before


async def test_bad_arguments_name_the_value_rule_and_fix(sup: supervisor.Supervisor) -> None:
    with pytest.raises(supervisor.SpecError, match=r"list of strings.*sh.*-c"):
        await sup.run("make test")  # type: ignore[arg-type]
    with pytest.raises(supervisor.SpecError, match="unknown task option 'timelimit'"):
        await sup.run(["true"], timelimit="5s")
    with pytest.raises(supervisor.SpecError, match="stop_signal"):
        TaskSpec(["true"], stop_signal="SIGFOO")


async def test_limits_needing_a_missing_controller_are_refused_before_anything_runs(
        sup: supervisor.Supervisor) -> None:
    if "memory" in sup.controllers:
        pytest.skip("this machine delegates the memory controller: nothing to refuse")
    with pytest.raises(supervisor.SpecError, match=r"memory controller.*not enabled") as ei:
        await sup.run(["true"], limits=supervisor.Limits(memory_max=1 << 30))
    assert ei.value.field == "limits"
    assert not [d for d in os.listdir(sup.cgroup_root)
                if os.path.isdir(os.path.join(sup.cgroup_root, d))]


async def test_time_limit_ceiling_caps_and_says_so(test_cgroup: object) -> None:
    import cgroupfs
    assert isinstance(test_cgroup, cgroupfs.Cgroup)
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          default_time_limit="30s",
                                          max_time_limit="1min") as s:
        r = await s.run(["true"], time_limit="2h")
        assert r.time_limit == 60 and any("capped" in n and "1min" in n for n in r.notes)
        r = await s.run(["true"])
        assert r.time_limit == 30 and r.notes == ()


async def test_ceiling_below_default_is_refused_at_open(test_cgroup: object) -> None:
    import cgroupfs
    assert isinstance(test_cgroup, cgroupfs.Cgroup)
    with pytest.raises(supervisor.ConfigError, match="below default_time_limit"):
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                              default_time_limit="10min",
                                              max_time_limit="5min"):
            pass
    assert test_cgroup.children() == []


async def test_an_internal_failure_still_gives_one_record_and_kills_the_leaf(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor._main import MainProcess

    def broken(self: MainProcess) -> bool:
        raise RuntimeError("simulated bug in the supervisor")

    monkeypatch.setattr(MainProcess, "has_exited", broken)  # the one seam
    with pytest.raises(supervisor.InternalError, match="simulated bug"):
        await sup.run(["sleep", "60"], time_limit="0.2s")  # wakes the driver
    r = next(reversed(sup.results.values()))
    assert r.outcome == "lost" and r.started and "simulated bug" in (r.error or "")
    assert r.cleanup == "incomplete" and "supervision failed" in (r.cleanup.detail or "")
    assert r.containment.cgroup is None or not os.path.exists(r.containment.cgroup)


async def test_when_even_the_recovery_fails_run_returns_with_one_lost_record(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    import cgroupfs
    from supervisor._main import MainProcess

    def broken(self: MainProcess) -> bool:
        raise RuntimeError("simulated bug in the supervisor")

    real_destroy = cgroupfs.Cgroup.destroy
    destroyed: list[str] = []

    def destroy_broken(self: cgroupfs.Cgroup, **kw: float) -> cgroupfs.Destroyed:
        destroyed.append(self.path)
        done = real_destroy(self, **kw)  # (the leaf goes: the test leaves nothing behind)
        if len(destroyed) == 1:  # the task's leaf; not the supervisor's root at the end
            raise RuntimeError("simulated bug in the recovery")
        return done

    monkeypatch.setattr(MainProcess, "has_exited", broken)
    monkeypatch.setattr(cgroupfs.Cgroup, "destroy", destroy_broken)
    with trio.fail_after(HANG):  # (it used to wait forever, shielded, for a record)
        with pytest.raises(supervisor.InternalError, match="simulated bug"):
            await sup.run(["sleep", "60"], time_limit="0.2s")
    r = next(reversed(sup.results.values()))
    assert r.outcome == "lost" and destroyed
    assert "destroying it raised" in (r.cleanup.detail or "")


async def test_a_life_that_raises_past_its_recovery_still_ends_in_one_record(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor import _life
    from supervisor._main import MainProcess

    def broken(self: MainProcess) -> bool:
        raise RuntimeError("simulated bug in the supervisor")

    real_lost = _life._lost

    def lost_broken(task: object, leaf: object, exc: BaseException, started: object) -> None:
        leaf.destroy()  # type: ignore[attr-defined]
        raise RuntimeError("simulated bug in the recovery")

    monkeypatch.setattr(MainProcess, "has_exited", broken)
    monkeypatch.setattr(_life, "_lost", lost_broken)
    with trio.fail_after(HANG):
        with pytest.raises(supervisor.InternalError, match="simulated bug in the supervisor"):
            await sup.run(["sleep", "60"], time_limit="0.2s")
    r = next(reversed(sup.results.values()))
    assert r.outcome == "lost" and r.cleanup == "incomplete" and r.started
    assert "could not tell" in (r.cleanup.detail or "") and real_lost is not lost_broken


async def test_subscribing_to_a_task_that_failed_to_spawn_ends_at_once(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(sup.start, ["/nonexistent/corral-cmd"])
        r = await task.wait()
        with trio.fail_after(HANG):
            chunks = [c async for c in task.subscribe()]
    assert r.outcome == "spawn_failed" and chunks == []


async def test_unencodable_arguments_are_refused_before_anything_runs(
        sup: supervisor.Supervisor) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    for bad in ({"argv": ["echo", "\ud800"]}, {"env": {"X": "\ud800"}}, {"cwd": "/\ud800"}):
        argv = bad.pop("argv", ["true"])
        with pytest.raises(supervisor.SpecError, match="encodable"):
            await sup.run(argv, **bad)
    assert len(os.listdir("/proc/self/fd")) == fds and not sup.results


async def test_cancelling_around_the_supervisor_still_stops_and_records(
        test_cgroup: object) -> None:
    import cgroupfs
    assert isinstance(test_cgroup, cgroupfs.Cgroup)
    with trio.move_on_after(0.3) as scope:
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
            await s.run(["sleep", "60"])
    assert scope.cancelled_caught
    (r,) = s.results.values()
    assert r.outcome == "cancelled" and r.signal == signal.SIGTERM and r.cleanup == "clean"
    assert test_cgroup.children() == []


async def test_a_late_subscriber_gets_the_kept_output_first(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(sup.start, ["sh", "-c", "echo early; sleep 60"])
        await wait_for(lambda: task.output().total == 6, what="early output read")
        stream = task.subscribe("stdout")
        with trio.fail_after(HANG):
            assert await stream.receive() == b"early\n"
        task.stop()
    r = await task.wait()
    assert r.outcome == "cancelled" and [c async for c in stream] == []


async def test_a_start_coroutine_never_run_does_not_hold_the_supervisor(
        test_cgroup: object) -> None:
    import cgroupfs
    assert isinstance(test_cgroup, cgroupfs.Cgroup)
    with trio.fail_after(HANG):
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
            dropped = s.start(["true"])  # made, never awaited nor given to a nursery
            dropped.close()
    (r,) = s.results.values()
    assert r.outcome == "cancelled" and not r.started


async def test_a_caller_chosen_task_id_names_the_task_and_is_never_reused(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["true"], task_id="job-42")
    assert r.id == "job-42" and r.containment.cgroup is not None
    assert r.containment.cgroup.endswith("/job-42")
    with pytest.raises(supervisor.SpecError, match="taken"):
        await sup.run(["true"], task_id="job-42")
    for bad in ("", "a/b", "cgroup.procs", "x" * 65, 42):
        with pytest.raises(supervisor.SpecError, match="task_id"):
            await sup.run(["true"], task_id=bad)  # type: ignore[arg-type]


async def test_a_groups_leaves_are_in_its_cgroup_made_once_with_the_roots_controllers(
        sup: supervisor.Supervisor) -> None:
    """``group``: the leaf in ``@group`` of the root (made at the group's first task, the
    root's controllers enabled in it, kept while the supervisor lives), so that one group's
    tasks weigh as one against another's (the CPU shares themselves: tests/guest)."""
    root = sup.cgroup_root
    first = await sup.run(["true"], task_id="g-1", group="tenant-a")
    async with trio.open_nursery() as nursery:
        held = await nursery.start(functools.partial(sup.start, ["sleep", "60"],
                                                     task_id="g-2", group="tenant-a"))
        assert held.cgroup == os.path.join(root, "@tenant-a", "g-2")
        assert os.path.isdir(held.cgroup)
        held.stop(force=True)
    other = await sup.run(["true"], task_id="g-3", group="tenant-b")
    plain = await sup.run(["true"], task_id="g-4")
    assert first.containment.cgroup == os.path.join(root, "@tenant-a", "g-1")
    assert other.containment.cgroup == os.path.join(root, "@tenant-b", "g-3")
    assert plain.containment.cgroup == os.path.join(root, "g-4")
    for group in ("@tenant-a", "@tenant-b"):  # (the leaves gone, the groups kept)
        wanted = pathlib.Path(root, "cgroup.subtree_control").read_text().split()
        assert pathlib.Path(root, group, "cgroup.subtree_control").read_text().split() == wanted
        assert not [n for n in os.listdir(os.path.join(root, group)) if n.startswith("g-")]
    for bad in ("", "a/b", "x" * 65, "a@b", 42):
        with pytest.raises(supervisor.SpecError, match="group"):
            await sup.run(["true"], group=bad)  # type: ignore[arg-type]


async def test_a_task_that_will_never_run_gets_its_record_with_the_reason(
        sup: supervisor.Supervisor) -> None:
    r = sup.record_unstarted(["sleep", "60"], reason="shutdown", task_id="q-1")
    assert r.id == "q-1" and r.outcome == "cancelled" and not r.started
    assert r.stop is not None and r.stop.reason == "shutdown" and r.stop.reached == "requested"
    assert sup.results["q-1"] is r and sup.tasks == []


async def test_a_change_to_our_environment_reaches_the_next_task(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_VAR", "first")
    assert (await sup.run(["sh", "-c", "echo $CORRAL_TEST_VAR"])).stdout == b"first\n"
    monkeypatch.setenv("CORRAL_TEST_VAR", "second")  # the spawn's cached copy must not stay
    assert (await sup.run(["sh", "-c", "echo $CORRAL_TEST_VAR"])).stdout == b"second\n"


async def test_the_ceiling_bounds_the_grace_too(test_cgroup: object) -> None:
    import cgroupfs
    assert isinstance(test_cgroup, cgroupfs.Cgroup)
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          max_time_limit="1s") as sup:
        with trio.fail_after(HANG):
            r = await sup.run(["sh", "-c", IGNORE_TERM_READY + "; exec sleep 60"], grace="1h")
    assert r.outcome == "timed_out" and r.stop is not None and r.stop.reached == "killed"
    assert any("grace 1h capped to the 1s ceiling" in n for n in r.notes), r.notes
    assert r.usage.wall_s is not None and r.usage.wall_s < 10
