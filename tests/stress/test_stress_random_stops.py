"""Random stops: thousands of tasks from a hostile mix, each with a random fate.

The mix (``stress_util.KINDS``): ``/bin/true``, a short sleep, a ``setsid`` escapee, a task that
ignores SIGTERM, writers of 1 MiB and 16 MiB (``yes INDEX | head -c SIZE``: each task's bytes
are its own, so output that reached the wrong task shows), ``exit 3``, and a task that makes a
cgroup inside its own leaf and moves a process there.  The fates (``FATES``): run out, stop
after 0-50 ms, stop(force=True), stop twice, the caller's scope cancelled, a 10-100 ms time
limit.  32 at a time.

What must hold: exactly one record per task; every cleanup clean and nothing escaped; outcomes
that the fate allows; byte-exact output (counts add up, the kept bytes are the task's own, a
writer that ran out has exactly its size); no process of any task left; no cgroup left; the
process's fds and the kernel's inotify watches back to their baselines.
"""

from __future__ import annotations

import time

import pytest
from stress_util import (
    CONCURRENCY,
    MARK,
    describe,
    fd_count,
    inotify_watches,
    make_jobs,
    marked_pids,
    poll_until,
    run_jobs,
    sup_children,
)

import supervisor

CI_TASKS = 500
FULL_TASKS = 10_000


async def random_stops(sup: supervisor.Supervisor, n: int, mark: str, mount: str,
                       seed: int) -> None:
    # baseline: after one task, so that every lazily opened fd (trio's, the keeper's) exists
    await sup.run(["/bin/true"], env={MARK: mark})
    fds0, watches0 = fd_count(), inotify_watches()
    t0 = time.monotonic()
    outcomes = await run_jobs(sup, make_jobs(n, seed), mark, mount)
    elapsed = time.monotonic() - t0
    assert len(sup.results) == n + 1, "records for tasks that were never submitted"
    assert sup.tasks == []
    left = marked_pids(mark)
    assert not left, f"processes of the tasks survived: {describe(left)}"
    assert poll_until(lambda: not sup_children(sup), 5), sup_children(sup)
    assert fd_count() == fds0, f"fds: {fds0} before, {fd_count()} after"
    assert inotify_watches() == watches0, f"watches: {watches0} before, {inotify_watches()} after"
    print(f"\nrandom stops (seed {seed}): {n} tasks at concurrency {CONCURRENCY}, {n} records "
          f"(one each), in {elapsed:.1f} s; outcomes {dict(sorted(outcomes.items()))}; every "
          f"cleanup clean, output byte-exact; no process or cgroup left; fds {fds0} and "
          f"inotify watches {watches0} before and after")


async def test_random_stops_leave_one_record_each_and_nothing_behind(
        stress_sup: supervisor.Supervisor, mark: str, cgroup_mount: str) -> None:
    await random_stops(stress_sup, CI_TASKS, mark, cgroup_mount, seed=12)


@pytest.mark.stress
async def test_random_stops_at_full_size(stress_sup: supervisor.Supervisor, mark: str,
                                         cgroup_mount: str,
                                         pytestconfig: pytest.Config) -> None:
    n = pytestconfig.getoption("--stress-tasks") or FULL_TASKS
    await random_stops(stress_sup, n, mark, cgroup_mount, seed=int(time.time()))
