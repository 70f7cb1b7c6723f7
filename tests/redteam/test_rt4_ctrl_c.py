"""Ctrl-C, every way a library program starts a task: the rule ``run()`` has, everywhere.

The first Ctrl-C stops the task gracefully, the second kills it now, and exactly one
KeyboardInterrupt comes out once the record exists.  Each way is driven by real SIGINTs sent
to a real program at random moments (before the spawn, while the task runs, during its
graceful stop), against a task whose trap makes the graceful stop last the whole 20 s grace:
a lost second Ctrl-C shows as a 20 s wait.  Before: with ``nursery.start(sup.start, ...)`` the
second was lost and trio raised a group of two KeyboardInterrupts after the grace; with
``await sup.start(...)`` in the main task a Ctrl-C left a ``lost`` record and no stop."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

PROGRAM = r"""
import functools, json, sys, trio, supervisor
mode, root = sys.argv[1], sys.argv[2]
CMD = ["sh", "-c", "trap 'sleep 30' TERM; echo up; sleep 600 & wait"]
out = {"raised": []}

async def body(sup):
    if mode == "run":
        await sup.run(CMD, grace="20s")
    elif mode == "start_awaited":
        await sup.start(CMD, grace="20s")
    elif mode == "nursery_wait":
        async with trio.open_nursery() as n:
            task = await n.start(functools.partial(sup.start, CMD, grace="20s"))
            await task.wait()
    elif mode == "nursery_exit":
        async with trio.open_nursery() as n:
            await n.start(functools.partial(sup.start, CMD, grace="20s"))
    elif mode == "handle_wait":
        async with trio.open_nursery() as n:
            task = await n.start(functools.partial(sup.start, CMD, grace="20s"))
            await task.wait()
            n.cancel_scope.cancel()

async def main():
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        print("ready", flush=True)
        try:
            await body(sup)
        except BaseException as e:
            out["raised"] = leaves(e)
            raise
        finally:
            out["records"] = [[str(r.outcome), r.started,
                               None if r.stop is None else r.stop.kill_because,
                               None if r.stop is None else r.stop.requested_by,
                               r.exit_status] for r in sup.results.values()]

def leaves(e):
    if isinstance(e, BaseExceptionGroup):
        return [x for sub in e.exceptions for x in leaves(sub)]
    return [type(e).__name__]

try:
    trio.run(main)
except BaseException as e:
    out["out_of_trio_run"] = leaves(e)
print(json.dumps(out), flush=True)
"""

MODES = ["run", "start_awaited", "nursery_wait", "nursery_exit", "handle_wait"]


def _ctrl_c_twice(mode: str, scratch: str, first: float, second: float) -> tuple[dict, float]:
    p = subprocess.Popen([sys.executable, "-c", PROGRAM, mode, scratch],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        time.sleep(first)
        os.kill(p.pid, signal.SIGINT)
        started = time.monotonic()
        time.sleep(second)
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    lines = out.strip().splitlines()
    assert lines, err
    return json.loads(lines[-1]), took


@pytest.mark.parametrize("mode", MODES)
def test_two_ctrl_c_stop_then_kill_and_one_keyboard_interrupt_comes_out(
        scratch: str, mode: str) -> None:
    rng = random.Random(f"{mode}-{os.getpid()}")
    for _ in range(3):
        first, second = rng.uniform(0.05, 0.6), rng.uniform(0.1, 0.5)
        out, took = _ctrl_c_twice(mode, scratch, first, second)
        # one KeyboardInterrupt (in a group where the caller's own nursery wraps it, as trio
        # wraps whatever leaves a nursery)
        assert out.get("out_of_trio_run") == ["KeyboardInterrupt"], out
        assert out["raised"] in (["KeyboardInterrupt"], []), out
        assert len(out["records"]) == 1, out
        outcome, started, kill_because, requested_by, status = out["records"][0]
        assert outcome == "cancelled", out
        assert requested_by == signal.SIGINT and status == 130, out
        if started:  # (a Ctrl-C before the spawn: it never started, nothing to kill)
            assert kill_because == "second_request", out
        assert took < 15, (mode, took, out)  # the second Ctrl-C killed: no 20 s grace
