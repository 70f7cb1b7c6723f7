"""Supervisors that die: SIGKILLed at random moments, or killed together with their keeper."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest
from rt_util import CORRAL, alive, poll, procs

import cgroupfs

SPAWN_LOOP = """
import functools, sys, trio, supervisor
async def main(root):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        async with trio.open_nursery() as n:
            i = 0
            while True:
                i += 1
                t = await n.start(functools.partial(
                    sup.start, ["sh", "-c", "setsid sleep 300 & trap '' TERM; sleep 300"],
                    grace="0.05s", time_limit="0.1s"))
                if i % 3 == 0:
                    t.stop()
                await trio.sleep(0.01)
trio.run(main, sys.argv[1])
"""


def test_a_supervisor_sigkilled_at_random_moments_leaves_nothing(scratch: str) -> None:
    """Held: mid-spawn, mid-stop, mid-cleanup, the keeper clears the root at once."""
    rng = random.Random(1234)
    for _ in range(8):
        p = subprocess.Popen([sys.executable, "-c", SPAWN_LOOP, scratch],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        time.sleep(rng.uniform(0.3, 1.2))
        p.kill()
        p.wait()

        def cleared() -> bool:
            with cgroupfs.Cgroup.open(scratch) as cg:
                return not cg.is_populated() and cg.children() == []
        assert poll(cleared, 3.0), f"after the SIGKILL: {os.listdir(scratch)}"


@pytest.mark.xfail(strict=True, reason="known limit: the keeper lives in its supervisor's "
                   "cgroup, so a kill of that whole cgroup takes both; a corral whose root is "
                   "elsewhere (an explicit --cgroup-root outside the outer leaf, as here) then "
                   "leaves its task running until the next corral on that base reaps it.  (By "
                   "default a corral run by a task nests inside its leaf, marked delegated: "
                   "tests/core/test_hardening.py)")
def test_a_nested_corral_killed_with_its_keeper_leaves_no_task(scratch: str,
                                                               tmp_path: object) -> None:
    # The inner corral's tasks live outside the outer task's leaf (here an explicit
    # --cgroup-root; by default, a corral inside a leaf that is not delegated picks the top of
    # the cgroup2 mount): exactly what happens when a CI job run by corral runs corral itself.
    outer = os.path.join(scratch, "outer")
    inner = os.path.join(scratch, "inner")
    os.mkdir(outer)
    os.mkdir(inner)
    sleeper = "sleep 47.5"
    r = subprocess.run([CORRAL, "run", "--cgroup-root", outer, "--time-limit", "1s", "--grace",
                        "0.3s", "-q", "--", CORRAL, "run", "--cgroup-root", inner,
                        "--grace", "30s", "-q", "--", "sh", "-c", f"trap '' TERM; exec {sleeper}"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60, start_new_session=True)
    assert r.returncode == 124  # the outer corral stopped its task at the time limit
    time.sleep(0.5)  # the keeper would have acted in milliseconds
    survivors = [p for p in procs(inner) + [q for d in os.listdir(inner)
                                            if os.path.isdir(os.path.join(inner, d))
                                            for q in _all_procs(os.path.join(inner, d))]
                 if alive(p)]
    for pid in survivors:
        os.kill(pid, 9)
    assert survivors == [], f"{sleeper} outlived both corrals"


def _all_procs(path: str) -> list[int]:
    out = procs(path)
    for d in os.listdir(path):
        if os.path.isdir(os.path.join(path, d)):
            out += _all_procs(os.path.join(path, d))
    return out


HOLD_A_TASK = """
import sys, trio, supervisor
async def main(root):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        async with trio.open_nursery() as n:
            await n.start(sup.start, ["sh", "-c", "exec sleep 48.5"])
            print("started", flush=True)
            await trio.sleep(60)
trio.run(main, sys.argv[1])
"""


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def test_a_supervisor_whose_keeper_died_is_still_guarded(scratch: str) -> None:
    p = subprocess.Popen([sys.executable, "-c", HOLD_A_TASK, scratch], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "started\n"
        keepers = [c for c in _children(p.pid) if _comm(c) == "corral-keeper"]
        assert len(keepers) == 1
        os.kill(keepers[0], 9)
        time.sleep(1.0)  # a supervisor that watched its keeper would have a new one by now
        p.kill()
        p.wait()
        time.sleep(0.5)
        survivors = [q for q in _all_procs(scratch) if alive(q)]
        for q in survivors:
            os.kill(q, 9)
        assert survivors == [], "the task outlived its SIGKILLed supervisor"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
