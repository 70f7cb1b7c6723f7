"""Many supervisors under a clock that jumps: runs inside the user-mode Linux guest.

The host's clock is shared and may not be stepped; the guest's is its own.  Corrals in their own
PID namespaces share one base while the wall clock is stepped a year forward and then two
years back; corrals started after each step clear stale roots beside their own.  Ownership is
an flock, never a time or a pid: no live task is touched, and a time limit (monotonic) fires
on time whatever the wall clock did.  (The eight-corral version without the clock runs on the
host: tests/stress/test_stress_many.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from guestutil import wait_until

if TYPE_CHECKING:
    from cgroupfs import Cgroup

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
YEAR = 365 * 86400
LIMIT = 3.0


@pytest.fixture
def wall_clock() -> Iterator[None]:
    """Put the guest's wall clock back where it would be, however the test ended."""
    wall0, mono0 = time.time(), time.monotonic()
    try:
        yield
    finally:
        time.clock_settime(time.CLOCK_REALTIME, wall0 + time.monotonic() - mono0)


def corral(base: str, result: Path, *args: str) -> subprocess.Popen[str]:
    """``corral run`` in a PID namespace of its own."""
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", CORRAL, "run",
                             "--cgroup-root", base, "--json-file", str(result), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def roots_with_a_task(base: str) -> int:
    """Roots below ``base`` whose task has started (its leaf exists)."""
    return sum(1 for d in os.listdir(base) if d.startswith("corral-") and any(
        e.is_dir() for e in os.scandir(os.path.join(base, d))))


def step_clock(seconds: float) -> None:
    time.clock_settime(time.CLOCK_REALTIME, time.time() + seconds)


def test_clock_steps_never_make_a_live_supervisor_look_stale(cgroup: Cgroup, tmp_path: Path,
                                                             wall_clock: None) -> None:
    base = cgroup.path
    long_task = corral(base, tmp_path / "long.json", "--time-limit", "60s", "--", "sh", "-c",
                       "sleep 5 & setsid sleep 5 & wait; echo done")
    limited = corral(base, tmp_path / "limited.json", "--time-limit", f"{LIMIT}s", "--grace",
                     "1s", "--", "sleep", "600")
    try:
        wait_until(lambda: roots_with_a_task(base) == 2, 30, "both tasks running")
        step_clock(YEAR)
        forward = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", CORRAL, "run",
                                  "--cgroup-root", base, "--", "/bin/true"],
                                 capture_output=True, text=True, timeout=60)
        step_clock(-2 * YEAR)
        backward = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", CORRAL, "run",
                                   "--cgroup-root", base, "--", "/bin/true"],
                                  capture_output=True, text=True, timeout=60)
        long_out, long_err = long_task.communicate(timeout=60)
        _, limited_err = limited.communicate(timeout=60)
    finally:
        for p in (long_task, limited):
            if p.poll() is None:
                p.terminate()
                p.wait()
    assert forward.returncode == 0, forward.stderr
    assert backward.returncode == 0, backward.stderr
    assert "left by a corral" not in forward.stderr + backward.stderr

    assert long_task.returncode == 0, long_err
    long = json.loads((tmp_path / "long.json").read_text())
    assert long["outcome"] == "succeeded" and long["stop"] is None, long
    assert long["cleanup"]["state"] == "clean" and long_out == "done\n"
    assert long["usage"]["wall_s"] >= 5

    assert limited.returncode == 124, limited_err
    timed = json.loads((tmp_path / "limited.json").read_text())
    assert timed["outcome"] == "timed_out" and timed["stop"]["reason"] == "time_limit"
    # the limit counts monotonic time: neither a year early nor a year late
    assert LIMIT <= timed["stop"]["requested_after_s"] < LIMIT + 10, timed["stop"]
    assert LIMIT <= timed["usage"]["wall_s"] < LIMIT + 10
    assert cgroup.children() == []


# ---- found while writing the above ---------------------------------------------------------

ROOT = "/sys/fs/cgroup"


@pytest.fixture
def processes_put_back() -> Iterator[None]:
    """Move whatever corral moved into <root>/supervisor back to the root cgroup (the guest's
    other tests expect to live there), and remove it."""
    yield
    moved = os.path.join(ROOT, "supervisor")
    if not os.path.isdir(moved):
        return
    for pid in Path(moved, "cgroup.procs").read_text().split():
        fd = os.open(os.path.join(ROOT, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, pid.encode())
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    os.rmdir(moved)


def test_cgroup_root_may_name_the_root_cgroup_we_live_in(processes_put_back: None) -> None:
    # The root cgroup is exempt from the no-internal-process rule: nothing needs moving.
    r = subprocess.run([CORRAL, "run", "--cgroup-root", ROOT, "--", "/bin/true"],
                       capture_output=True, text=True, timeout=60)
    moved = Path(ROOT, "supervisor", "cgroup.procs")
    others = moved.read_text().split() if moved.exists() else []
    assert not others, f"corral moved {len(others)} processes (pid 1 among them: " \
                       f"{'1' in others}) into {moved.parent}; it said: {r.stderr.strip()}"
    assert r.returncode == 0, r.stderr
