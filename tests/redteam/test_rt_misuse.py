"""The library as a careless or hostile user holds it: odd values, odd files, odd orders."""

from __future__ import annotations

import functools
import os

import pytest
import trio
from rt_util import run_program

import supervisor


async def test_a_negative_retain_results_is_refused_before_anything_runs(scratch: str) -> None:
    with pytest.raises(ValueError, match="retain_results"):
        async with supervisor.open_supervisor(cgroup_root=scratch, retain_results=-1) as sup:
            await sup.run(["true"])


def test_inherit_env_must_be_a_bool() -> None:
    """Held (since e179cfc): inherit_env="no" from a config file is refused, not truthy."""
    with pytest.raises(supervisor.SpecError, match="inherit_env"):
        supervisor.TaskSpec(["env"], inherit_env="no")


async def test_inherit_env_false_gives_only_env(sup: supervisor.Supervisor) -> None:
    """Held: with inherit_env=False the task sees only what env gives."""
    r = await sup.run(["/usr/bin/env"], env={"ONLY": "1"}, inherit_env=False)
    assert r.stdout == b"ONLY=1\n"


LOG_TO_FIFO = """
import os, sys, trio, supervisor
async def main(root, fifo):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        with trio.move_on_after(3):
            try:
                r = await sup.run(["echo", "hi"], log_file=fifo)
                print("record", r.outcome, flush=True)
            except ValueError as e:
                print("refused", flush=True)
        print("answered", flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def test_a_log_file_that_blocks_does_not_block_the_supervisor(scratch: str,
                                                               tmp_path: object) -> None:
    fifo = os.path.join(str(tmp_path), "fifo")
    os.mkfifo(fifo)
    ran = run_program(LOG_TO_FIFO, scratch, fifo, timeout=12)
    assert "answered" in ran.stdout, "the event loop stayed blocked in open() of the FIFO"


async def test_stop_pause_resume_stdin_tap_at_every_state(sup: supervisor.Supervisor) -> None:
    """Held: every verb at every state answers without raising what the docs do not say."""
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["cat"], stdin="pipe", grace="1s"))
        tap = task.tap()
        with pytest.raises(RuntimeError):
            task.tap()  # one tap per stream
        subs = [task.subscribe() for _ in range(50)]
        await task.write_stdin(b"hello\n")
        assert await tap.receive() == b"hello\n"
        assert task.pause() and not task.pause()
        await task.write_stdin(b"queued while paused\n")
        assert task.resume() and not task.resume()
        task.close_stdin()
        task.close_stdin()
        r = await task.wait()
    assert r.outcome == "succeeded" and r.stdout == b"hello\nqueued while paused\n"
    assert task.stop() is False and task.stop(force=True) is False
    assert task.pause() is False and task.resume() is False
    with pytest.raises(BrokenPipeError):
        await task.write_stdin(b"late")
    for s in subs:
        assert b"".join([c async for c in s]) == b"hello\nqueued while paused\n"


async def test_a_task_id_is_refused_while_live_or_retained_and_free_after(scratch: str) -> None:
    """Decided (the red team found the docstring promised "never reused"): an id is refused
    while its task is live or its record is in sup.results; the daemon, which numbers its own
    tasks, relies on ids being checked without a set that grows for ever."""
    async with supervisor.open_supervisor(cgroup_root=scratch, retain_results=1) as sup:
        first = await sup.run(["echo", "one"], task_id="job")
        with pytest.raises(supervisor.SpecError, match="task_id"):
            await sup.run(["true"], task_id="job")  # its record is retained
        await sup.run(["true"], task_id="other")  # the first record leaves sup.results
        second = await sup.run(["echo", "two"], task_id="job")
    assert (first.stdout, second.stdout) == (b"one\n", b"two\n")



async def test_a_start_scheduled_in_an_outer_nursery_ends_quietly(scratch: str) -> None:
    async with trio.open_nursery() as outer, \
            supervisor.open_supervisor(cgroup_root=scratch) as sup:
        outer.start_soon(sup.start, ["sleep", "1"])
    (r,) = sup.results.values()
    assert r.outcome == "cancelled" and not r.started
