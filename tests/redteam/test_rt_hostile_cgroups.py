"""Hostile root tasks (no isolation) playing with the cgroup tree in and around their leaf.

Without isolation a root task can write the tree: that it can is expected.  What these check
is what corral promises even then: the supervisor survives and keeps answering, every task gets
its one true record, and the next corral can still start on the same --cgroup-root."""

from __future__ import annotations

import functools
import os

import trio
from rt_util import alive, leaf_path_script, procs, run_program, wait_for

import supervisor

# (bash: dash's cd gives up once the absolute path passes PATH_MAX)
# 18 nested sub-cgroups of 250-byte names: every path to the deepest is longer than PATH_MAX
# (4096) counted from the leaf, while each single name is a valid cgroup name.
DEEP = r"""
n=$(printf 'x%.0s' $(seq 1 250))
for i in $(seq 1 18); do mkdir "$n$i" && cd "$n$i" || exit 9; done
"""


def deep_task(sleeper: str) -> str:
    """Shell for a task that leaves ``sleeper`` running in the deepest of DEEP and exits."""
    return (leaf_path_script() + DEEP
            + f"sh -c 'echo $$ > cgroup.procs; exec {sleeper} </dev/null >/dev/null 2>&1' &\n"
            + "sleep 0.3\n")


def find_sleepers(name: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == name.encode().replace(b" ", b"\0") + b"\0":
                        out.append(int(pid))
            except OSError:
                pass
    return out


async def test_a_deep_subcgroup_tree_still_gets_a_record_and_is_cleared(scratch: str) -> None:
    sleeper = "sleep 61.5"
    raised: BaseException | None = None
    handle = None
    try:
        async with supervisor.open_supervisor(cgroup_root=scratch) as sup, \
                trio.open_nursery() as n:
            handle = await n.start(functools.partial(sup.start, ["bash", "-c",
                                                                 deep_task(sleeper)],
                                                     grace="1s", time_limit="20s"))
            with trio.fail_after(30):
                await handle.wait()
    except BaseException as e:  # what escapes is part of the finding
        raised = e
    survivors = find_sleepers(sleeper)
    assert raised is None, f"the supervisor raised {raised!r}; survivors {survivors}"
    assert handle is not None and handle.result is not None, "the task has no record"
    assert survivors == []


async def test_the_next_corral_starts_beside_a_deep_stale_root(scratch: str) -> None:
    # what a crashed corral leaves after a task like the one above: an unlocked root
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir("corral-1-abcdef", dir_fd=fd)
    for i in range(18):
        nfd = os.open("corral-1-abcdef" if i == 0 else "x" * 250 + str(i - 1),
                      os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
        os.mkdir("x" * 250 + str(i), dir_fd=fd)
    os.close(fd)
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup:
        r = await sup.run(["true"])
        notes = sup.placement_notes
    assert r.outcome == "succeeded"
    assert any("corral-1-abcdef" in n for n in notes)


RUN_AFTER_DEEP = """
import sys, trio, supervisor
async def main(root, script):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        try:
            r = await sup.run(["bash", "-c", script], grace="1s", time_limit="20s")
            print("record", r.outcome, flush=True)
        except Exception as e:
            print("raised", type(e).__name__, flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def test_run_returns_when_supervising_a_task_fails(scratch: str) -> None:
    ran = run_program(RUN_AFTER_DEEP, scratch, deep_task("sleep 62.5"), timeout=12)
    for pid in find_sleepers("sleep 62.5"):
        os.kill(pid, 9)
    assert not ran.hung, "run() never returned (the program was SIGKILLed after 12 s)"


FREEZE_BASE = """
import sys, time, trio, supervisor
async def main(root):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        async with trio.open_nursery() as n:
            a = await n.start(sup.start, ["sh", "-c", f"echo 1 > {root}/cgroup.freeze; sleep 60"])
            await trio.sleep(0.5)
            print("spawning", flush=True)
            with trio.move_on_after(3):
                r = await sup.run(["true"], time_limit="2s")
                print("second", r.outcome, flush=True)
            print("answered", flush=True)
            a.stop(force=True)
trio.run(main, sys.argv[1])
"""


def test_a_frozen_base_does_not_block_the_supervisor(scratch: str) -> None:
    ran = run_program(FREEZE_BASE, scratch, timeout=15)
    with open(os.path.join(scratch, "cgroup.freeze"), "w") as f:
        f.write("0")
    assert "spawning" in ran.stdout, ran.stderr
    assert "answered" in ran.stdout, (
        "the supervisor's event loop stayed blocked in the spawn (no move_on_after, no time "
        "limit, no Ctrl-C) until it was SIGKILLed after 15 s")


MOVE_SUPERVISOR_IN = """
import sys, trio, supervisor
async def main(root, leaf_cd):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        r = await sup.run(["sh", "-c", leaf_cd + "; echo $PPID > cgroup.procs; echo moved"],
                          time_limit="10s")
        print("record", r.outcome, r.cleanup, flush=True)
    print("closed", flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def test_a_supervisor_moved_into_a_leaf_does_not_stop_itself(scratch: str) -> None:
    ran = run_program(MOVE_SUPERVISOR_IN, scratch, leaf_path_script(), timeout=30)
    assert ran.rc == 0 and "closed" in ran.stdout, (
        f"the supervisor ended with status {ran.rc} (-15: its own SIGTERM) and printed "
        f"{ran.stdout!r}; {ran.stderr[-300:]!r}")


async def test_a_task_freezing_corral_root_is_thawed_and_noted(
        sup: supervisor.Supervisor) -> None:
    """Held: the root guard thaws corral's own root and says so in the records."""
    root = sup.cgroup_root
    r = await sup.run(["sh", "-c", f"echo 1 > {root}/cgroup.freeze; sleep 0.3; echo alive"],
                      time_limit="20s")
    assert r.outcome == "succeeded" and r.stdout == b"alive\n"
    assert any("was frozen" in n for n in r.notes)


async def test_an_escaping_main_process_is_recorded_and_killed(
        sup: supervisor.Supervisor, scratch: str) -> None:
    """Held: a main process that moves itself out is followed by its pidfd, stopped, named."""
    script = f"echo $$ > {scratch}/cgroup.procs; trap '' TERM; exec sleep 60"
    with trio.fail_after(30):
        r = await sup.run(["sh", "-c", script], time_limit="1s", grace="0.3s")
    assert r.outcome == "timed_out" and r.containment.broken
    assert [e.pid for e in r.containment.escaped] and r.cleanup == "incomplete"
    assert all(not alive(e.pid) for e in r.containment.escaped)
    assert procs(scratch) == []


async def test_a_child_that_leaves_after_being_seen_is_caught(
        sup: supervisor.Supervisor, scratch: str) -> None:
    """Held: a child seen by the sampler that later moves out is killed and named."""
    script = (f"sh -c 'sleep 1.6; echo $$ > {scratch}/cgroup.procs; exec sleep 60' "
              "</dev/null >/dev/null 2>&1 & sleep 2.2")
    with trio.fail_after(30):
        r = await sup.run(["sh", "-c", script], time_limit="20s")
    assert r.containment.broken and r.cleanup == "incomplete"
    await wait_for(lambda: procs(scratch) == [], what="the escapee gone")


async def test_a_child_that_leaves_before_being_seen_but_holds_stdout_is_caught(
        sup: supervisor.Supervisor, scratch: str) -> None:
    """A root task's child that writes itself into another cgroup at once (before corral ever
    lists it) and keeps the task's stdout: the record said ``clean`` and the child lived on.
    The pipe still held open once the leaf is empty is the proof: the child is found by its
    fd, killed, named, and the cleanup is incomplete."""
    script = (f"sh -c 'echo $$ > {scratch}/cgroup.procs; exec sleep 60' & "
              f"sleep 0.2; echo started")
    with trio.fail_after(30):
        r = await sup.run(["sh", "-c", script], time_limit="20s")
    assert r.outcome == "succeeded" and r.stdout == b"started\n"
    assert r.cleanup == "incomplete" and "still held open" in (r.cleanup.detail or ""), r.cleanup
    assert r.containment.broken
    assert [(e.comm, e.ended) for e in r.containment.escaped] == [("sleep", "killed")]
    await wait_for(lambda: procs(scratch) == [], what="the escapee gone")
