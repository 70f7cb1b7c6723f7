"""Many supervisors: 8 corrals at once, each in its own PID namespace, sharing one base.

Each ``corral run`` runs in its own PID namespace (``unshare --pid --fork --mount-proc``), the
first as its PID 1, the others at pids no other namespace uses, and none can see another's
processes in its ``/proc``: a reaper judging by the pid in a root's name would clear live
roots, so ownership must come from the flock alone.  They start staggered, so that each one's
start-up (which clears stale roots beside its own) runs while the others hold tasks; a stale
root made by hand, with a process in it, is there to be cleared.  None may touch another's
tasks: every task runs its full course and succeeds.  (The same with the clock stepped runs in
the user-mode Linux guest: tests/guest/guest_stress_clock_step.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from stress_util import CORRAL, MARK, describe, marked_pids, poll_until

import cgroupfs
from supervisor._spawn import spawn

SUPERVISORS = 8
TASK_SECONDS = 3.0
STAGGER = 0.15


def start_in_pid_namespace(i: int, base: str, mark: str, tmp: Path) -> subprocess.Popen[str]:
    script = (f"sleep {TASK_SECONDS} & setsid sleep {TASK_SECONDS} & sleep {TASK_SECONDS}; "
              f"wait; echo done-{i} $$")
    # corral 0 is PID 1 of its namespace; corral i > 0 gets about pid 20*i + 2 there (the
    # shell forks 20*i no-ops first), a pid that no other namespace has in use
    prelude = ["sh", "-c", 'i=0; while [ $i -lt "$1" ]; do (:); i=$((i + 1)); done; shift; '
               '"$@"; status=$?; exit $status', "prelude", str(20 * i)] if i else []
    argv = ["unshare", "--pid", "--fork", "--mount-proc", *prelude, CORRAL, "run",
            "--cgroup-root", base, "--json-file", str(tmp / f"result-{i}.json"),
            "--time-limit", "60s", "--", "sh", "-c", script]
    return subprocess.Popen(argv, env=dict(os.environ, **{MARK: mark}),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stale_root(base: cgroupfs.Cgroup, devnull: int) -> tuple[str, int]:
    """A root as a corral SIGKILLed before its keeper was armed would leave: named like
    corral 0's (pid 1), unlocked, a process still in it; its path and the process's pidfd."""
    with base.make_child("corral-1-5ca1e0") as root:
        spawned = spawn(["sleep", "600"], cgroup_fd=root.fd, stdin=devnull, stdout=devnull,
                        stderr=devnull)
        return root.path, spawned.pidfd


def reaped(pidfd: int) -> bool:
    """Our child behind ``pidfd`` has exited (and is reaped now)."""
    return os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG) is not None


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_supervisors_in_other_pid_namespaces_never_touch_each_others_tasks(
        test_cgroup: cgroupfs.Cgroup, mark: str, tmp_path: Path) -> None:
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        stale, stale_pidfd = stale_root(test_cgroup, devnull)
    finally:
        os.close(devnull)
    procs = []
    try:
        for i in range(SUPERVISORS):
            procs.append(start_in_pid_namespace(i, test_cgroup.path, mark, tmp_path))
            time.sleep(STAGGER)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()  # corral run stops its task on SIGTERM
                p.wait()
    problems = []
    roots = set()
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        result_file = tmp_path / f"result-{i}.json"
        if p.returncode != 0 or not result_file.exists():
            problems.append(f"corral {i}: exit {p.returncode}, stderr {err!r}")
            continue
        r = json.loads(result_file.read_text())
        root = os.path.dirname(r["containment"]["cgroup"])
        roots.add(os.path.basename(root))
        if r["outcome"] != "succeeded" or r["cleanup"]["state"] != "clean" or r["stop"] or \
                not out.startswith(f"done-{i} "):
            problems.append(f"corral {i}: {r['outcome']}, cleanup {r['cleanup']}, stop "
                            f"{r['stop']}, stdout {out!r}")
        elif r["usage"]["wall_s"] < TASK_SECONDS - 0.1:
            # (its clock starts once the spawn returned, a moment after the sleep began: a
            # full course may read 2.999 s; one cut short by another corral reads far less)
            problems.append(f"corral {i}: its task ran only {r['usage']['wall_s']} s")
    assert not problems, "\n".join(problems)
    assert len(roots) == SUPERVISORS, roots
    assert len({r.split("-")[1] for r in roots}) == SUPERVISORS, f"pids alike: {roots}"
    assert not os.path.exists(stale), "the stale root was not cleared"
    try:
        assert poll_until(lambda: reaped(stale_pidfd), 5), "the stale root's process lives"
    finally:
        os.close(stale_pidfd)
    assert poll_until(lambda: not marked_pids(mark), 5), describe(marked_pids(mark))
    assert test_cgroup.children() == []
    print(f"\nmany supervisors: {SUPERVISORS} corrals, each in its own PID namespace "
          f"({', '.join(sorted(roots))}), one base; every task ran its {TASK_SECONDS:g} s "
          f"and succeeded; the stale root (a live process in it) cleared; nothing left")
