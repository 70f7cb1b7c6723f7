"""Soak: the random-stop mix for MINUTES, with the supervisor's memory, fds and inotify
watches sampled after every round of 1000 tasks.

    pytest tests/stress --soak 30

Prints one line per round and, at the end, the growth per 1000 tasks (least-squares slope of
RSS over tasks, the first round left out as warm-up).  Target: flat.  What must hold: fds and
watches back to their baselines after every round (exact); over 10 rounds or more, RSS growth
below 256 KiB per 1000 tasks (a leaked record or handle is ~10 KiB per task: 40 times that)
and fewer than 100 more live Python objects per 1000 tasks.  The
records of each round are checked as in the random-stop suite, then dropped from
``sup.results`` so that kept records do not count as growth.
"""

from __future__ import annotations

import gc
import time

import pytest
from stress_util import (
    MARK,
    describe,
    fd_count,
    inotify_watches,
    make_jobs,
    marked_pids,
    rss_bytes,
    run_jobs,
    sup_children,
)

import supervisor

ROUND = 1000
GROWTH_BOUND = 256 * 1024  # bytes of RSS per 1000 tasks


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


@pytest.mark.soak
async def test_soak_keeps_memory_fds_and_watches_flat(stress_sup: supervisor.Supervisor,
                                                      mark: str, cgroup_mount: str,
                                                      pytestconfig: pytest.Config) -> None:
    minutes = pytestconfig.getoption("--soak")
    sup = stress_sup
    await sup.run(["/bin/true"], env={MARK: mark})
    sup.results.clear()
    fds0, watches0 = fd_count(), inotify_watches()
    t0 = time.monotonic()
    samples: list[tuple[int, int, int]] = []  # (tasks so far, RSS, Python objects)
    done, seed = 0, int(t0)
    print(f"\nsoak (seed {seed}) for {minutes:g} min: rounds of {ROUND} tasks")
    while time.monotonic() - t0 < minutes * 60 or len(samples) < 3:
        await run_jobs(sup, make_jobs(ROUND, seed + done, first=done), mark, cgroup_mount)
        done += ROUND
        sup.results.clear()
        left = marked_pids(mark)
        assert not left, f"after {done} tasks, processes survived: {describe(left)}"
        assert sup_children(sup) == []
        gc.collect()
        fds, watches, rss, objects = fd_count(), inotify_watches(), rss_bytes(), \
            len(gc.get_objects())
        samples.append((done, rss, objects))
        print(f"  {done:7d} tasks, {time.monotonic() - t0:6.0f} s: RSS {rss / 2**20:6.1f} MiB, "
              f"Python objects {objects}, fds {fds}, inotify watches {watches}", flush=True)
        assert (fds, watches) == (fds0, watches0), f"after {done} tasks: fds {fds} (baseline " \
                                                   f"{fds0}), watches {watches} ({watches0})"
    steady = samples[1:]
    tasks = [float(d) for d, _, _ in steady]
    growth = slope(tasks, [float(r) for _, r, _ in steady]) * 1000
    objects_growth = slope(tasks, [float(o) for _, _, o in steady]) * 1000
    print(f"soak: {done} tasks in {(time.monotonic() - t0) / 60:.1f} min; RSS "
          f"{samples[0][1] / 2**20:.1f} -> {samples[-1][1] / 2**20:.1f} MiB, growth "
          f"{growth / 1024:+.1f} KiB per 1000 tasks; Python objects {objects_growth:+.0f} per "
          f"1000 tasks (both after the first round); fds {fds0} and inotify watches "
          f"{watches0} flat (every round)")
    if len(steady) >= 10:  # fewer rounds: the slope is mostly the allocator's noise
        assert growth < GROWTH_BOUND, f"RSS grows {growth / 1024:.0f} KiB per 1000 tasks"
        assert objects_growth < 100, f"{objects_growth:.0f} more Python objects per 1000 tasks"
