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

import collections
import time
from typing import Any

import pytest
import trio
from stress_util import (
    MARK,
    NATURAL,
    WRITE_SIZES,
    Job,
    check_output,
    describe,
    fd_count,
    inotify_watches,
    make_jobs,
    marked_pids,
    poll_until,
)

import supervisor
from supervisor import TaskResult, TaskSpec

CONCURRENCY = 32
CI_TASKS = 500
FULL_TASKS = 10_000
GRACE = "0.2s"
STOP_FATES = ("stop", "force", "stop_twice", "scope_cancel")


def spec_for(job: Job, mark: str, mount: str) -> TaskSpec:
    return TaskSpec(tuple(job.argv(mount)), env={MARK: mark}, grace=GRACE, name=job.name,
                    time_limit=job.time_limit)


async def run_job(sup: supervisor.Supervisor, job: Job, spec: TaskSpec) -> None:
    """Run one job to its record, doing to it what its fate says."""
    if job.fate == "scope_cancel":
        with trio.move_on_after(job.delay):
            await sup.run(spec)
        return
    if job.fate in ("run_out", "short_limit"):
        await sup.run(spec)
        return
    async with trio.open_nursery() as nursery:
        task: supervisor.TaskHandle = await nursery.start(sup.start, spec)
        await trio.sleep(job.delay)
        task.stop(force=job.fate == "force")
        if job.fate == "stop_twice":
            await trio.sleep(job.delay2)
            task.stop()
        await task.wait()


def check_record(job: Job, r: TaskResult) -> list[str]:
    """What one record must say, given what its task was and what was done to it."""
    problems = []
    natural = NATURAL.get(job.kind, "succeeded")
    allowed = {natural}
    if job.fate in STOP_FATES:
        allowed.add("cancelled")
    if job.fate == "short_limit":
        allowed.add("timed_out")
    if r.outcome not in allowed:
        problems.append(f"outcome {r.outcome}, expected one of {sorted(allowed)}")
    if r.cleanup != "clean":
        problems.append(f"cleanup {r.cleanup.state}: {r.cleanup.detail}")
    if r.containment.escaped:
        problems.append(f"escaped: {r.containment.escaped}")
    if r.outcome == "failed" and r.exit_code != 3:
        problems.append(f"failed with exit code {r.exit_code}")
    if r.stop is not None:
        want = "time_limit" if job.fate == "short_limit" else "cancel"
        if job.fate == "run_out" or r.stop.reason != want:
            problems.append(f"a stop record ({r.stop.reason}) for fate {job.fate}")
        if r.outcome in ("cancelled", "timed_out") and r.started and not r.stop.landed:
            problems.append(f"{r.outcome} although the stop did not land")
        if not r.started and (job.fate != "scope_cancel" or r.outcome != "cancelled"):
            problems.append(f"never started, {r.outcome}")
        if r.stop.landed and r.outcome not in ("cancelled", "timed_out"):
            problems.append(f"the stop landed but the outcome is {r.outcome}")
        if job.fate == "force" and r.stop.landed and r.stop.kill_because != "force":
            problems.append(f"a forced stop killed because {r.stop.kill_because}")
    elif r.outcome in ("cancelled", "timed_out") and r.started:
        problems.append(f"{r.outcome} without a stop record")
    if job.kind == "term_ignorer" and r.started and r.outcome == "cancelled" and \
            r.stop is not None and r.stop.reached != "killed" and r.signal != 15:
        # (SIGTERM before the shell had set its trap ends it, legitimately)
        problems.append(f"a TERM-ignorer ended by a stop that reached only {r.stop.reached}")
    problems += [f"stdout: {p}" for p in check_output(job, r.output_stdout)]
    if r.output_stderr.total:
        problems.append(f"stderr: {r.output_stderr.data[:200]!r}")
    size = WRITE_SIZES.get(job.kind)
    if size is not None and r.outcome == "succeeded" and r.output_stdout.total != size:
        problems.append(f"wrote {size} bytes, {r.output_stdout.total} counted")
    return [f"{job.name} ({job.kind}, {job.fate}): {p}" for p in problems]


async def random_stops(sup: supervisor.Supervisor, n: int, mark: str, mount: str,
                       seed: int) -> dict[str, Any]:
    # baseline: after one task, so that every lazily opened fd (trio's, the keeper's) exists
    await sup.run(["/bin/true"], env={MARK: mark})
    fds0, watches0 = fd_count(), inotify_watches()
    jobs = make_jobs(n, seed)
    pending = iter(jobs)
    t0 = time.monotonic()

    async def worker() -> None:
        for job in pending:
            await run_job(sup, job, spec_for(job, mark, mount))

    async with trio.open_nursery() as nursery:
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker)
    elapsed = time.monotonic() - t0

    by_name: dict[str | None, list[TaskResult]] = collections.defaultdict(list)
    for r in sup.results.values():
        by_name[r.name].append(r)
    problems = [f"{job.name}: {len(by_name[job.name])} records"
                for job in jobs if len(by_name[job.name]) != 1]
    for job in jobs:
        if len(by_name[job.name]) == 1:
            problems += check_record(job, by_name[job.name][0])
    assert not problems, f"{len(problems)} problems, the first 20:\n" + "\n".join(problems[:20])
    assert len(sup.results) == n + 1, "records for tasks that were never submitted"
    assert sup.tasks == []

    left = marked_pids(mark)
    assert not left, f"processes of the tasks survived: {describe(left)}"
    assert poll_until(lambda: not supervisor_children(sup), 5), supervisor_children(sup)
    assert fd_count() == fds0, f"fds: {fds0} before, {fd_count()} after"
    assert inotify_watches() == watches0, f"watches: {watches0} before, {inotify_watches()} after"
    outcomes = collections.Counter(str(r[0].outcome) for r in by_name.values() if r[0].name)
    figures = {"tasks": n, "records": n, "seconds": round(elapsed, 1), "fds": fds0,
               "inotify_watches": watches0, "outcomes": dict(sorted(outcomes.items()))}
    print(f"\nrandom stops: {figures}")
    return figures


def supervisor_children(sup: supervisor.Supervisor) -> list[str]:
    import os
    return [d for d in os.listdir(sup.cgroup_root)
            if os.path.isdir(os.path.join(sup.cgroup_root, d))]


async def test_random_stops_leave_one_record_each_and_nothing_behind(
        stress_sup: supervisor.Supervisor, mark: str, cgroup_mount: str) -> None:
    await random_stops(stress_sup, CI_TASKS, mark, cgroup_mount, seed=12)


@pytest.mark.stress
async def test_random_stops_at_full_size(stress_sup: supervisor.Supervisor, mark: str,
                                         cgroup_mount: str,
                                         pytestconfig: pytest.Config) -> None:
    n = pytestconfig.getoption("--stress-tasks") or FULL_TASKS
    await random_stops(stress_sup, n, mark, cgroup_mount, seed=int(time.time()))
