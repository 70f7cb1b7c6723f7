"""Supervisor crash: SIGKILL a supervisor at a random moment; nothing of its tasks survives.

Two kinds of supervisor, each SIGKILLed at a random moment of its life (start-up, starting
tasks, running them, stopping them at their limit):

- ``corral run`` of a shell that leaves a ``setsid`` escapee and a background job;
- a library program holding 20 tasks, each a ``setsid`` escapee and its shell.

After each kill, with no other corral started meanwhile (the keeper alone acts), every process
of its tasks must be gone by the task's time limit + grace + 2 s (in practice: milliseconds),
and the supervisor's root removed.  After all rounds a new corral on the same base starts and
runs cleanly, and nothing is left in the base.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from stress_util import CORRAL, MARK, describe, marked_pids, poll_until

import cgroupfs

LIMIT, GRACE = 3.0, 1.0
SURVIVOR_DEADLINE = LIMIT + GRACE + 2.0  # after the kill
CI_ROUNDS = 5  # of each kind: 10 SIGKILLs
FULL_ROUNDS = 50  # of each kind: 100 SIGKILLs
LIBRARY_TASKS = 20
LIBRARY_PROGRAM = r"""
import functools, sys, trio, supervisor
async def main():
    async with supervisor.open_supervisor(cgroup_root=sys.argv[1]) as sup:
        async with trio.open_nursery() as nursery:
            for _ in range(int(sys.argv[2])):
                await nursery.start(functools.partial(
                    sup.start, ["sh", "-c", "setsid sleep 600 & exec sleep 600"],
                    time_limit=sys.argv[3], grace=sys.argv[4]))
            print("ready", flush=True)
trio.run(main)
"""
SHELL_TASK = "setsid sleep 600 & sleep 600 & exec sleep 600"


@dataclass
class Round:
    kind: str
    kill_after: float  # seconds after the supervisor was started
    ready: bool  # it had started all its tasks when killed
    peak: int  # processes of its tasks seen just before the kill
    gone_after: float | None  # seconds after the kill until none was left (None: never)
    root_removed: bool  # the keeper removed the supervisor's root


def start_supervisor(kind: str, base: str, mark: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **{MARK: mark})
    if kind == "corral run":
        argv = [CORRAL, "run", "-q", "--cgroup-root", base, "--time-limit", f"{LIMIT}s",
                "--grace", f"{GRACE}s", "--", "sh", "-c", SHELL_TASK]
    else:
        argv = [sys.executable, "-c", LIBRARY_PROGRAM, base, str(LIBRARY_TASKS), f"{LIMIT}s",
                f"{GRACE}s"]
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)


def crash_round(kind: str, base: str, mark: str, rng: random.Random) -> Round:
    # random moments across the supervisor's whole life: its start-up (0.3-1.5 s here, with
    # the load), its tasks starting and running, up to their time limit and its stop
    kill_after = rng.uniform(0.0, 3.5)
    proc = start_supervisor(kind, base, mark)
    t0 = time.monotonic()
    try:
        time.sleep(max(0.0, t0 + kill_after - time.monotonic()))
        peak = len(marked_pids(mark)) - 1  # less the supervisor itself
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        proc.kill()
        out = proc.communicate()[0]
    gone = poll_until(lambda: not marked_pids(mark), SURVIVOR_DEADLINE, step=0.002)
    gone_after = time.monotonic() - killed_at if gone else None
    root_removed = poll_until(lambda: not instance_roots(base), 2.0)
    return Round(kind, kill_after, b"ready" in out, max(peak, 0), gone_after, root_removed)


def instance_roots(base: str) -> list[str]:
    return [d for d in os.listdir(base) if d.startswith("corral-")]


def crash_suite(base: str, mark: str, rounds: int, seed: int, tmp: Path) -> None:
    rng = random.Random(seed)
    done: list[Round] = []
    for _ in range(rounds):
        for kind in ("corral run", "library"):
            r = crash_round(kind, base, mark, rng)
            done.append(r)
            if r.gone_after is None:
                left = marked_pids(mark)
                pytest.fail(f"seed {seed}: {len(left)} processes survived {SURVIVOR_DEADLINE}s "
                            f"after SIGKILL of a {kind} supervisor at {r.kill_after:.3f}s: "
                            f"{describe(left)}")
    stale = sum(1 for r in done if not r.root_removed)

    # a new corral on the same base starts and runs cleanly
    result_file = tmp / "result.json"
    after = subprocess.run([CORRAL, "run", "--cgroup-root", base, "--json-file",
                            str(result_file), "--", "/bin/true"], capture_output=True,
                           text=True, timeout=60)
    assert after.returncode == 0, after.stderr
    assert json.loads(result_file.read_text())["outcome"] == "succeeded"
    assert instance_roots(base) == [], "the new corral left roots behind"
    with cgroupfs.Cgroup.open(base) as cg:
        assert not cg.is_populated()

    held = [r for r in done if r.peak]
    gone = sorted(r.gone_after for r in held if r.gone_after is not None) or [0.0]
    print(f"\nsupervisor crash (seed {seed}): {len(done)} SIGKILLs "
          f"({sum(r.ready for r in done)} after all tasks had started), "
          f"{sum(r.peak for r in done)} task processes held at the kills ({len(held)} kills "
          f"held some); survivors at limit + grace + 2 s: 0; every process gone after: "
          f"median {gone[len(gone) // 2] * 1e3:.1f} ms, max {gone[-1] * 1e3:.1f} ms; roots "
          f"left for the next corral (killed before its keeper was armed): {stale}; the "
          f"next corral: exit 0, "
          f"{after.stderr.count('left by a corral')} stale root(s) cleared")


def test_sigkilled_supervisors_leave_no_survivors(test_cgroup: cgroupfs.Cgroup, mark: str,
                                                  tmp_path: Path) -> None:
    crash_suite(test_cgroup.path, mark, CI_ROUNDS, seed=int(time.time()), tmp=tmp_path)


@pytest.mark.stress
def test_sigkilled_supervisors_at_full_size(test_cgroup: cgroupfs.Cgroup, mark: str,
                                            tmp_path: Path,
                                            pytestconfig: pytest.Config) -> None:
    rounds = pytestconfig.getoption("--stress-rounds") or FULL_ROUNDS
    crash_suite(test_cgroup.path, mark, rounds, seed=int(time.time()), tmp=tmp_path)
