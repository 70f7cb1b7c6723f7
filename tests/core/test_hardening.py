"""The hardening issue's promises, each tried the way a hostile task, a crash or a busy host
tried it (one test or more per numbered item; the item is named in each test's comment).

Tasks that attack the tree are given the cgroup2 mount as $MNT, so that they find their own
leaf from /proc/self/cgroup (``$MNT$(cgroup path)``) and their supervisor's root above it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import trio
from sup_util import HANG, IGNORE_TERM_READY, alive, wait_for, wait_ready

import cgroupfs
import supervisor
from supervisor import TaskSpec, _output
from supervisor._capture import StreamCapture
from supervisor._output import IoReactor

MNT = cgroupfs.find_cgroup2_mount().mount_point
LEAF = 'LEAF="$MNT$(sed -n "s/^0:://p" /proc/self/cgroup)"; '
ROOT = LEAF + 'ROOT="$(dirname "$LEAF")"; '


def env(**extra: str) -> dict[str, str]:
    return {"MNT": MNT, **extra}


# ---- 1. streams are removed by identity, never by fd number --------------------------------

async def test_a_stream_the_reactor_closed_at_eof_is_not_removed_again_under_its_number(
        ) -> None:
    reactor = IoReactor()
    async with trio.open_nursery() as n:
        n.start_soon(reactor.run)
        r1, w1 = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        first = reactor.add_reader(r1, StreamCapture(64, 64))
        os.close(w1)  # EOF: the reactor closes r1 itself
        with trio.fail_after(HANG):
            await first.done.wait()
        r2, w2 = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        assert r2 == r1  # the kernel hands out the lowest free number: the old one
        capture = StreamCapture(64, 64)
        second = reactor.add_reader(r2, capture)
        reactor.remove(first)  # the first task's late cleanup
        os.write(w2, b"still mine")  # would be EPIPE (or lost) had r2 been closed
        os.close(w2)
        with trio.fail_after(HANG):
            await second.done.wait()
        assert capture.result().data == b"still mine"
        reactor.stop()


async def test_writers_under_random_stops_lose_no_byte_and_die_of_no_sigpipe(
        sup: supervisor.Supervisor) -> None:
    size = 1 << 20
    writer = TaskSpec(["head", "-c", str(size), "/dev/zero"], output_head=0, output_tail=0)
    rng = random.Random(7)
    results: list[supervisor.TaskResult] = []

    async def one(stop_after: float | None) -> None:
        async with trio.open_nursery() as n:
            task = await n.start(sup.start, writer)
            if stop_after is not None:
                await trio.sleep(stop_after)
                task.stop(force=rng.random() < 0.5)
            results.append(await task.wait())

    with trio.fail_after(HANG * 4):
        limiter = trio.CapacityLimiter(32)
        async def run(stop: float | None) -> None:
            async with limiter:
                await one(stop)

        async with trio.open_nursery() as n:
            for _ in range(128):
                n.start_soon(run, rng.choice([None, 0, 0.001, 0.005]))
    assert len(results) == 128
    for r in results:
        assert r.signal != signal.SIGPIPE, r
        if r.outcome == "succeeded":
            assert r.output_stdout.total == size, r


# ---- 2. ownership without pids or clocks ---------------------------------------------------

async def test_a_second_supervisor_on_the_same_root_leaves_the_first_ones_tasks_alone(
        test_cgroup: cgroupfs.Cgroup) -> None:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as first, \
            trio.open_nursery() as n:
        task = await n.start(first.start, ["sleep", "600"])
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as second:
            assert second.cgroup_root != first.cgroup_root
            r = await second.run(["true"])
            assert r.outcome == "succeeded"
        assert task.pid is not None and alive(task.pid) and task.result is None
        task.stop()
        assert (await task.wait()).outcome == "cancelled"


async def test_a_supervisor_in_another_pid_namespace_keeps_its_tasks(
        test_cgroup: cgroupfs.Cgroup, tmp_path: os.PathLike[str]) -> None:
    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    ready = os.path.join(tmp_path, "ready")
    other = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", corral, "run",
         "--cgroup-root", test_cgroup.path, "-q", "--", "sh", "-c",
         f"echo $$ > {ready}; exec sleep 600"], stdout=subprocess.DEVNULL)
    try:
        await wait_for(lambda: os.path.exists(ready) and os.path.getsize(ready) > 0,
                       what="the other namespace's task")
        (theirs,) = test_cgroup.children()  # its pid there is small: it may exist here too
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as sup:
            assert (await sup.run(["true"])).outcome == "succeeded"
        with cgroupfs.Cgroup.open(os.path.join(test_cgroup.path, theirs)) as root:
            assert root.is_populated()  # untouched: we could not take its lock
    finally:
        # unshare ignores SIGTERM while it waits: stop its child, corral (PID 1 in there)
        with open(f"/proc/{other.pid}/task/{other.pid}/children") as f:
            for pid in f.read().split():
                os.kill(int(pid), signal.SIGTERM)
        other.wait(HANG)
    assert not test_cgroup.is_populated()


async def test_a_root_nobody_holds_is_cleared_by_the_next_supervisor(
        test_cgroup: cgroupfs.Cgroup) -> None:
    stale = test_cgroup.make_child("corral-4242-abcdef")
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        with stale.make_child("t-1") as leaf:
            leaf.add_proc(sleeper.pid)
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as sup:
            assert any("corral-4242-abcdef" in note and "1 process(es)" in note
                       for note in sup.placement_notes)
            assert not os.path.exists(stale.path)
        assert sleeper.wait(HANG) == -signal.SIGKILL
    finally:
        stale.close()
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


# ---- 4. inotify watches are released ---------------------------------------------------------

def kernel_inotify_watches() -> int:
    """Watches this process holds, as the kernel counts them (every inotify fd)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                count += sum(line.startswith("inotify wd:") for line in f)
        except OSError:
            continue
    return count


async def test_watches_return_to_where_they_were_after_tasks_that_leave_processes(
        sup: supervisor.Supervisor) -> None:
    await sup.run(["sh", "-c", "sleep 0.05 & exit 0"])  # warm up: the supervisor's own
    before = kernel_inotify_watches()
    for _ in range(20):
        r = await sup.run(["sh", "-c", "sleep 0.05 & exit 0"], grace="5s")
        assert r.cleanup.leftovers
    assert kernel_inotify_watches() == before



def inotify_fds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return n


async def test_a_closed_supervisors_inotify_instance_is_released_off_the_event_loop(
        test_cgroup: cgroupfs.Cgroup) -> None:
    """Its last close waits for the kernel's grace period (~14 ms: a third of ``corral run
    -- true`` after its imports), so it is closed in a thread of its own: the instance is
    still released (no fd left behind, however many supervisors come and go), and the event
    loop's thread never made that call."""
    closes_here: list[int] = []
    real_close = os.close
    loop_thread = threading.get_ident()

    def close(fd: int) -> None:
        if threading.get_ident() == loop_thread:
            with contextlib.suppress(OSError):  # (not open: the real close says so)
                if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                    closes_here.append(fd)
        real_close(fd)

    before = inotify_fds()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "close", close)
        for _ in range(5):
            async with supervisor.open_supervisor(test_cgroup.path) as s:
                r = await s.run(["sh", "-c", "sleep 0.05 & exit 0"], grace="5s")
                assert r.cleanup.leftovers  # (a leaf waited for: the instance had a watch)
    assert closes_here == []
    with trio.fail_after(HANG):
        while inotify_fds() > before:
            await trio.sleep(0.01)


# ---- 5. names that are not UTF-8 -----------------------------------------------------------

BAD_NAME = ("( printf '\\377\\376bad' > /proc/self/comm; trap 'exit 0' TERM; "
            "while :; do sleep 0.05; done ) & sleep 0.2; exit 0")


async def test_a_process_named_in_invalid_utf8_is_recorded_and_serialised(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", BAD_NAME], grace="5s")
    assert r.outcome == "succeeded" and r.cleanup == "clean"
    assert "\ufffd\ufffdbad" in [p.comm for p in r.cleanup.leftovers]
    json.dumps(r.to_dict())  # the record is JSON, whatever the kernel said


def test_corral_run_writes_the_record_when_a_name_is_not_utf8(
        test_cgroup: cgroupfs.Cgroup, tmp_path: os.PathLike[str]) -> None:
    out = os.path.join(tmp_path, "r.json")
    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    p = subprocess.run([corral, "run", "--cgroup-root", test_cgroup.path, "--summary",
                        "--json-file", out, "--", "sh", "-c", BAD_NAME],
                       capture_output=True, timeout=HANG)
    assert p.returncode == 0, p.stderr
    assert b"Traceback" not in p.stderr and "\ufffd\ufffdbad".encode() in p.stderr
    with open(out, encoding="utf-8") as f:
        data = json.load(f)
    assert "\ufffd\ufffdbad" in [p["comm"] for p in data["cleanup"]["leftovers"]]


# ---- 6. a main process (or a child) that leaves its leaf -----------------------------------

async def test_a_main_process_that_leaves_its_leaf_is_still_stopped_and_the_record_says_so(
        sup: supervisor.Supervisor, test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    try:
        script = 'echo $$ > "$ELSEWHERE/cgroup.procs"; exec sleep 600'
        with trio.fail_after(HANG):
            r = await sup.run(["sh", "-c", script], env={"ELSEWHERE": elsewhere.path},
                              time_limit="0.3s", grace="0.3s")
        assert r.outcome == "timed_out" and r.signal == signal.SIGTERM
        assert r.stop is not None and r.stop.landed
        assert r.containment.broken and r.cleanup == "incomplete"
        (escaped,) = r.containment.escaped
        assert escaped.comm == "sleep" and escaped.cgroup is not None
        assert escaped.cgroup.endswith("/elsewhere")
        assert not elsewhere.is_populated()
    finally:
        elsewhere.destroy()


async def test_a_leftover_that_moves_itself_out_is_killed_and_reported(
        sup: supervisor.Supervisor, test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    try:
        mover = ('trap "" TERM; sleep 0.3; echo $$ > "$ELSEWHERE/cgroup.procs"; '
                 'exec sleep 600')
        script = f"sh -c '{mover}' & sleep 0.1; exit 0"
        with trio.fail_after(HANG):
            r = await sup.run(["sh", "-c", script], env={"ELSEWHERE": elsewhere.path},
                              grace="2s")
        assert r.outcome == "succeeded" and r.cleanup == "incomplete"
        (escaped,) = r.containment.escaped
        assert escaped.ended == "killed" and escaped.cgroup is not None
        assert escaped.cgroup.endswith("/elsewhere")
        await wait_for(lambda: not elsewhere.is_populated(), what="the escapee's death")
    finally:
        elsewhere.destroy()


async def test_a_child_that_leaves_while_the_main_runs_is_found_by_the_sampler(
        test_cgroup: cgroupfs.Cgroup) -> None:
    elsewhere = test_cgroup.make_child("elsewhere")
    try:
        # the sampler sees the sleep in the leaf; then it leaves; the main waits for it
        script = ('sleep 600 & child=$!; sleep 0.6; echo $child > "$ELSEWHERE/cgroup.procs"; '
                  'wait')
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                              sample_interval="0.1s") as sup:
            with trio.fail_after(HANG):
                r = await sup.run(["sh", "-c", script], env={"ELSEWHERE": elsewhere.path},
                                  time_limit="1.5s", grace="0.5s")
        assert r.outcome == "timed_out" and r.cleanup == "incomplete"
        (escaped,) = r.containment.escaped
        assert escaped.comm == "sleep" and escaped.ended == "killed"
        assert escaped.cgroup is not None and escaped.cgroup.endswith("/elsewhere")
        await wait_for(lambda: not elsewhere.is_populated(), what="the escapee's death")
    finally:
        elsewhere.destroy()


# ---- 7. sub-cgroups made inside a leaf ----------------------------------------------------

SUB_TERM = LEAF + textwrap.dedent("""\
    mkdir "$LEAF/sub"
    sh -c 'echo $$ > "$1/sub/cgroup.procs"; trap "echo sub-got-term; exit 0" TERM;
           echo ready; while :; do sleep 0.05; done' sub "$LEAF" &
    wait
""")


async def test_processes_in_a_sub_cgroup_get_the_stop_signal_and_the_subtree_goes(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", SUB_TERM], env=env(),
                                               grace="30s"))
        await wait_ready(task)
        task.stop()
        with trio.fail_after(HANG):
            r = await task.wait()
    assert b"sub-got-term" in r.stdout  # the stop signal, not the kill, reached it
    assert r.stop is not None and r.stop.reached == "signalled"
    assert r.cleanup == "clean" and r.containment.cgroup is not None
    assert not os.path.exists(r.containment.cgroup)


async def test_a_leftover_in_a_sub_cgroup_is_listed(sup: supervisor.Supervisor) -> None:
    script = LEAF + ('mkdir "$LEAF/sub"; sh -c \'echo $$ > "$1/sub/cgroup.procs"; '
                     'exec sleep 600\' sub "$LEAF" & sleep 0.2; exit 0')
    r = await sup.run(["sh", "-c", script], env=env(), grace="5s")
    assert [p.comm for p in r.cleanup.leftovers] == ["sleep"]
    assert r.cleanup.leftovers_ended_by == "stop signal" and r.cleanup == "clean"


# ---- 8. a task that freezes corral's cgroups ------------------------------------------------

FREEZER = """
import functools, json, sys, trio, supervisor

async def main(root, mnt):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        # it freezes the root (and so itself) over and over; corral thaws, spawns, stops on time
        freezer = ('LEAF="$MNT$(sed -n "s/^0:://p" /proc/self/cgroup)"; ROOT="$(dirname "$LEAF")"; '
                   'while :; do echo 1 > "$ROOT/cgroup.freeze"; done')
        async with trio.open_nursery() as n:
            hostile = await n.start(functools.partial(
                sup.start, ["sh", "-c", freezer], env={"MNT": mnt}, time_limit="3s",
                grace="0.5s"))
            others = [await sup.run(["sh", "-c", "echo ok"]) for _ in range(20)]
            limited = await sup.run(["sleep", "60"], time_limit="0.5s", grace="0.5s")
            r = await hostile.wait()
    print(json.dumps({"others": [[o.outcome, o.stdout.decode()] for o in others],
                      "limited": limited.outcome, "hostile": r.outcome,
                      "notes": [n for o in [*others, limited, r] for n in o.notes]}))

trio.run(main, *sys.argv[1:])
"""


def test_a_task_freezing_the_root_blocks_no_other_task(test_cgroup: cgroupfs.Cgroup) -> None:
    # in a process of its own: were the event loop wedged in a spawn, only a timeout ends it
    p = subprocess.run([sys.executable, "-c", FREEZER, test_cgroup.path, MNT],
                       capture_output=True, text=True, timeout=HANG * 2)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["others"] == [["succeeded", "ok\n"]] * 20
    assert out["limited"] == "timed_out" and out["hostile"] == "timed_out"
    frozen = [note for note in out["notes"] if "frozen" in note]
    assert frozen and all("thawed" in note for note in frozen)
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()


def test_a_freeze_of_corrals_own_after_the_spawn_returned_is_left_alone(
        test_cgroup: cgroupfs.Cgroup) -> None:
    """Found by an independent attack: a stop 33 us after a task started froze its leaf for
    the kill's snapshot while the guard, a turn late, was looking after the spawn that had
    just returned: it thawed the leaf and logged "someone wrote 1 to its cgroup.freeze: a
    task with write access to corral's cgroups?" into root's log.  A spawn over is the
    guard's no longer; one in flight is thawed, and its record says so."""
    from supervisor._guard import SpawnGuard

    root = test_cgroup.make_child("guarded")
    leaf = root.make_child("leaf")
    guard = SpawnGuard(root)  # (its thread not started: its turns are taken here)
    try:
        over = guard.begin(leaf)
        assert guard.end(over) == (None, [])
        leaf.freeze()  # (the stop's snapshot)
        guard._look_after(over, 1.0)  # the turn that had found it stalled
        assert leaf.read_file("cgroup.freeze").strip() == "1" and over.notes == []
        flying = guard.begin(leaf)
        guard._look_after(flying, 1.0)
        killed, notes = guard.end(flying)
        assert leaf.read_file("cgroup.freeze").strip() == "0"
        assert killed is None and len(notes) == 1 and "thawed it" in notes[0], notes
    finally:
        guard.close()
        leaf.remove()
        root.remove()


ABOVE = """
import json, sys, time, trio, supervisor

async def main(base, above):
    async with supervisor.open_supervisor(cgroup_root=base) as sup:
        with open(above + "/cgroup.freeze", "w") as f:  # an ancestor of the base: not ours
            f.write("1")
        t = time.monotonic()
        r = await sup.run(["echo", "ran"], time_limit="30s")
        with open(above + "/cgroup.freeze", "w") as f:
            f.write("0")
        after = await sup.run(["echo", "ran"])
    print(json.dumps({"outcome": r.outcome, "error": r.error, "notes": r.notes,
                      "took": time.monotonic() - t, "after": after.outcome}))

trio.run(main, *sys.argv[1:])
"""


def test_a_freeze_from_above_the_base_fails_the_spawn_instead_of_blocking(
        test_cgroup: cgroupfs.Cgroup) -> None:
    with test_cgroup.make_child("base") as base:
        p = subprocess.run([sys.executable, "-c", ABOVE, base.path, test_cgroup.path],
                           capture_output=True, text=True, timeout=HANG * 2)
        test_cgroup.write_file("cgroup.freeze", "0")
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["outcome"] == "spawn_failed" and out["took"] < 10, out
        assert "frozen before it could run" in out["error"], out
        assert any("frozen from above" in n and "killed" in n for n in out["notes"]), out
        assert out["after"] == "succeeded"
        assert base.children() == []
        base.remove()


async def test_a_task_that_freezes_its_own_leaf_is_thawed_to_be_stopped(
        sup: supervisor.Supervisor) -> None:
    script = LEAF + 'echo 1 > "$LEAF/cgroup.freeze"; sleep 600'
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", script], env=env(),
                                               grace="30s"))
        assert task.cgroup is not None
        with cgroupfs.Cgroup.open(task.cgroup) as leaf:
            await wait_for(lambda: leaf.read_events().frozen, what="the task's freeze")
        task.stop()
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "cancelled" and r.signal == signal.SIGTERM
    assert r.stop is not None and r.stop.reached == "signalled"
    assert any("had frozen" in note for note in r.notes)


# ---- 9. the supervisor's own stop never turns the caller's first request into a kill -------

async def test_after_fail_fast_the_first_cancel_is_still_graceful(
        sup: supervisor.Supervisor) -> None:
    specs = [TaskSpec(["sh", "-c", IGNORE_TERM_READY], grace="1h"),
             TaskSpec(["sh", "-c", "sleep 0.3; exit 3"])]
    async with trio.open_nursery() as n:
        batch = await n.start(functools.partial(sup.start_batch, specs, 2, fail_fast=True))
        stubborn = batch.handles[0]
        await wait_ready(stubborn)
        await wait_for(lambda: stubborn.stop_level == "signalled", what="fail-fast stop")
        batch.cancel()  # the caller's first: still graceful
        await trio.sleep(0.3)
        assert stubborn.result is None and stubborn.stop_level == "signalled"
        batch.cancel()  # the caller's second: kill now
        with trio.fail_after(HANG):
            results = await batch.wait()
    r = results[0]
    assert r.stop is not None and r.stop.reason == "fail_fast"
    assert r.stop.reached == "killed" and r.stop.kill_because == "second_request"


async def test_after_the_time_limit_the_callers_first_stop_does_not_kill(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", IGNORE_TERM_READY],
                                               time_limit="0.3s", grace="1h"))
        await wait_for(lambda: task.stop_level == "signalled", what="time limit")
        assert task.stop() is True
        await trio.sleep(0.3)
        assert task.result is None
        assert task.stop() is True
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "timed_out" and r.stop is not None
    assert r.stop.kill_because == "second_request"


# ---- 10. Ctrl-C twice during run(): kill now, one KeyboardInterrupt --------------------------

TWO_CTRL_C = """
import json, os, signal, sys, threading, time, trio, supervisor

def interrupt(flag):
    # from a thread, as a terminal would: trio then raises KeyboardInterrupt in the main task
    # (sent from a trio task, it would be raised in that task instead)
    for wanted in ("ready", "got-term"):
        while not (os.path.exists(flag) and open(flag).read().strip() == wanted):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

async def main(root, flag):
    threading.Thread(target=interrupt, args=(flag,), daemon=True).start()
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        try:
            await sup.run(["sh", "-c", "trap 'echo got-term > $F' TERM; echo ready > $F; "
                                       "while :; do sleep 0.05; done"],
                          env={"F": flag}, grace="1h")
        finally:
            (r,) = sup.results.values()
            print(json.dumps({"outcome": str(r.outcome), "signal": r.signal,
                              "why": r.stop.kill_because}), flush=True)

try:
    trio.run(main, *sys.argv[1:])
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
except BaseException as e:
    print("other", repr(e), flush=True)
"""


def test_a_second_ctrl_c_during_run_kills_now_and_raises_one_keyboard_interrupt(
        test_cgroup: cgroupfs.Cgroup, tmp_path: os.PathLike[str]) -> None:
    flag = os.path.join(tmp_path, "flag")
    r = subprocess.run([sys.executable, "-c", TWO_CTRL_C, test_cgroup.path, flag],
                       capture_output=True, text=True, timeout=HANG)
    record, last = r.stdout.splitlines()
    assert last == "KeyboardInterrupt", r.stdout + r.stderr
    assert json.loads(record) == {"outcome": "cancelled", "signal": 9,
                                  "why": "second_request"}
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()


# ---- 11. a failing stdin feeder is a note, not a cancel ----------------------------------

async def test_a_failing_stdin_write_is_recorded_and_is_not_a_stop(
        sup: supervisor.Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int, data: bytes) -> int:
        raise OSError(errno.EFAULT, "simulated failure of the write")

    monkeypatch.setattr(_output, "_write_stdin", failing)  # the seam
    r = await sup.run(["cat"], stdin=b"hello")
    assert r.outcome == "succeeded" and r.stop is None
    assert any("writing the task's stdin failed" in n and "simulated" in n for n in r.notes)


# ---- 12. the small ones ---------------------------------------------------------------------

async def test_a_stopped_task_still_gets_the_stop_signal(sup: supervisor.Supervisor) -> None:
    with trio.fail_after(HANG):
        r = await sup.run(["sh", "-c", "kill -STOP $$; sleep 600"], time_limit="0.3s",
                          grace="1h")
    assert r.outcome == "timed_out" and r.signal == signal.SIGTERM
    assert r.stop is not None and r.stop.reached == "signalled"


@pytest.mark.parametrize("value", ["1us", "0.05s", 0.01])
def test_a_stop_signal_repeat_below_the_floor_is_refused(value: object) -> None:
    with pytest.raises(supervisor.SpecError, match=r"at least 0\.1s") as ei:
        TaskSpec(["true"], stop_signal_repeat=value)
    assert ei.value.field == "stop_signal_repeat"


@pytest.mark.parametrize("value", [10**400, -10**400, 1e308])
def test_an_absurd_time_limit_is_a_spec_error(value: object) -> None:
    with pytest.raises(supervisor.SpecError, match="time_limit"):
        TaskSpec(["true"], time_limit=value)


async def test_leftovers_are_named_as_they_were_when_stopped_and_late_ones_are_included(
        sup: supervisor.Supervisor) -> None:
    # the leftover becomes "sleep" by exec after the main's exit, then forks a latecomer
    late = ("trap '' TERM; sleep 0.2; exec sh -c 'trap \"\" TERM; sleep 600 & "
            "exec sleep 600'")
    r = await sup.run(["sh", "-c", f"sh -c \"{late}\" & sleep 0.05; exit 0"], grace="1s")
    # the shell (exec'd into sleep), its "sleep 0.2" seen at the main's exit, the latecomer
    first, *rest = r.cleanup.leftovers
    assert first.comm == "sleep" and len(rest) == 2, r.cleanup
    assert all(p.comm == "sleep" for p in rest)
    assert r.cleanup.leftovers_ended_by == "killed"


# ---- 13. without an explicit ceiling the default is the ceiling ---------------------------

async def test_without_a_ceiling_the_default_caps_longer_limits(
        test_cgroup: cgroupfs.Cgroup) -> None:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          default_time_limit="0.5s") as sup:
        with trio.fail_after(HANG):
            r = await sup.run(["sleep", "600"], time_limit="1h", grace="0.2s")
        assert r.outcome == "timed_out" and r.time_limit == 0.5
        assert any("capped to the 500ms ceiling" in n for n in r.notes)
        r = await sup.run(["true"], time_limit="0.2s")
        assert r.time_limit == 0.2 and r.notes == ()


# ---- a task signalling its process group --------------------------------------------------

KILL_ZERO = """
import json, os, sys, trio, supervisor

async def main(root, shared):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        async with trio.open_nursery() as n:
            sibling = await n.start(sup.start, ["sleep", "30"])
            # `trap 'kill 0' EXIT`, the usual way for a script to end its background jobs
            r = await sup.run(["sh", "-c", "sleep 60 & trap 'kill 0' EXIT; sleep 0.2; exit 3"],
                              process_group="shared" if shared == "1" else None)
            sibling.stop()
        print(json.dumps({"task": [r.outcome, r.exit_code, r.signal],
                          "cleanup": str(r.cleanup), "sibling": sibling.result.outcome,
                          "sibling_stop": sibling.result.stop.reason}), flush=True)

trio.run(main, *sys.argv[1:])
"""


def test_a_task_signalling_its_process_group_reaches_only_its_own(
        test_cgroup: cgroupfs.Cgroup) -> None:
    # in a session of its own: with process_group="shared" the SIGTERM reaches this program
    p = subprocess.run([sys.executable, "-c", KILL_ZERO, test_cgroup.path, "0"],
                       capture_output=True, text=True, timeout=HANG * 2,
                       start_new_session=True)
    assert p.returncode == 0, (p.returncode, p.stderr)
    out = json.loads(p.stdout)
    assert out["task"] == ["signaled", None, signal.SIGTERM]  # its own kill 0 ended it
    assert out["cleanup"] == "clean"  # the background sleep died of the same kill 0
    assert out["sibling"] == "cancelled" and out["sibling_stop"] == "cancel"
    shared = subprocess.run([sys.executable, "-c", KILL_ZERO, test_cgroup.path, "1"],
                            capture_output=True, text=True, timeout=HANG * 2,
                            start_new_session=True)
    assert shared.returncode == -signal.SIGTERM  # what "shared" means, and why it is no default


async def test_a_task_leads_its_own_process_group_unless_told_to_share_ours(
        sup: supervisor.Supervisor) -> None:
    def pgid(r: supervisor.TaskResult) -> int:
        return int(r.stdout.split()[0])

    own = await sup.run(["sh", "-c", "cut -d' ' -f5 /proc/$$/stat"])
    assert own.outcome == "succeeded" and pgid(own) != os.getpgrp()
    shared = await sup.run(["sh", "-c", "cut -d' ' -f5 /proc/$$/stat"], process_group="shared")
    assert pgid(shared) == os.getpgrp()
    with pytest.raises(supervisor.SpecError, match="process_group"):
        TaskSpec(["true"], process_group="mine")  # type: ignore[arg-type]
    with pytest.raises(supervisor.SpecError, match="session of its own"):
        TaskSpec(["true"], tty=True, process_group="shared")


GROUP_FLOODED = """
import json, sys, trio, supervisor

async def main(root, n):
    # as corral run: SIGINT blocked from the start (read from a signalfd there; here never)
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        print("open", flush=True)
        rs = [await sup.run(["true"]) for _ in range(int(n))]
    print(json.dumps(sorted({(r.outcome, r.signal) for r in rs}, key=str)), flush=True)

trio.run(main, *sys.argv[1:])
"""


def test_keys_sent_to_the_supervisors_group_during_a_spawn_are_not_the_childs(
        test_cgroup: cgroupfs.Cgroup) -> None:
    """A Ctrl-C typed at corral run reaches its whole foreground group, a child just cloned
    into it as well; the child blocks signals until its exec, so the key stayed pending after
    it left for a group of its own, and killed it at its exec: the keeper (dead before it was
    armed: corral could not start) or the task (signaled, of a key that was corral's)."""
    p = subprocess.Popen([sys.executable, "-c", GROUP_FLOODED, test_cgroup.path, "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,  # (blocked from its exec, as corral's launcher)
                         preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK,
                                                                   [signal.SIGINT]))
    try:
        deadline = time.monotonic() + HANG
        while p.poll() is None and time.monotonic() < deadline:
            try:
                os.killpg(p.pid, signal.SIGINT)  # the group, as a terminal's key does
            except ProcessLookupError:
                break
            time.sleep(0.0002)
        out, err = p.communicate(timeout=HANG)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert out.split("\n")[0] == "open" and json.loads(out.split("\n")[1]) == \
        [["succeeded", None]], (out, err)


AT_A_TERMINAL = """
import os, sys, trio, supervisor

async def main(root):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        inherit = await sup.run(["sh", "-c", "cut -d' ' -f5 /proc/$$/stat"], stdin="inherit")
        alone = await sup.run(["sh", "-c", "cut -d' ' -f5 /proc/$$/stat"])
    print(os.getpgrp(), int(inherit.stdout), int(alone.stdout), flush=True)

trio.run(main, sys.argv[1])
"""


def test_an_interactive_command_shares_the_terminals_foreground_group(
        test_cgroup: cgroupfs.Cgroup) -> None:
    import fcntl
    import termios

    master, slave = os.openpty()

    def controlling_terminal() -> None:  # a session whose terminal is the pty, in front
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    try:
        p = subprocess.run([sys.executable, "-c", AT_A_TERMINAL, test_cgroup.path],
                           stdin=slave, capture_output=True, text=True, timeout=HANG * 2,
                           preexec_fn=controlling_terminal)
    finally:
        os.close(slave)
        os.close(master)
    assert p.returncode == 0, p.stderr
    ours, inherit, alone = map(int, p.stdout.split())
    assert inherit == ours  # stdin is the terminal, ours in front: it may read it
    assert alone != ours  # nothing of the terminal's: a group of its own


async def test_a_corral_run_by_a_task_nests_inside_it_and_dies_with_it(
        sup: supervisor.Supervisor) -> None:
    # a CI job run by corral that runs corral itself: the leaf is marked delegated, so the
    # inner corral makes its root inside it, and the outer kill covers the inner task too
    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    inner = "sed -n 's/^0:://p' /proc/self/cgroup; trap '' TERM; exec sleep 47.25"
    r = await sup.run([corral, "run", "-q", "--grace", "30s", "--", "sh", "-c", inner],
                      time_limit="1.5s", grace="0.3s")
    assert r.outcome == "timed_out" and r.cleanup == "clean", (r.outcome, r.cleanup, r.stderr)
    leaf_view = r.containment.cgroup.removeprefix(MNT)
    where = r.stdout.decode().strip()
    assert where.startswith(leaf_view + "/corral-"), (where, leaf_view)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p)) ==
                b"sleep\x0047.25\x00"]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
