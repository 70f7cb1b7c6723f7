"""Run benchmark: a whole supervised task of /bin/true, against os.posix_spawn + waitpid.

What is measured, per task, in one process and one run:

* sequential: ``await sup.run(["/bin/true"])`` one after another -- the whole life: spec
  checks, a leaf made, pipes, clone3 into the leaf, pumps, pidfd wait, inotify wait for the
  empty leaf, stats read, rmdir, the final record.  Floor: ``os.posix_spawn`` of /bin/true
  (stdout to /dev/null) + ``os.waitpid``, one at a time.  Target: ratio <= 1.5x.
* concurrency 16, tasks per second: ``sup.run_batch`` of N ``TaskSpec(["/bin/true"])`` with
  ``max_concurrency=16``, and 16 worker tasks each awaiting ``sup.run`` in a loop in one
  nursery.  Floor: posix_spawn with 16 children in flight (a sliding window:
  ``waitpid(-1)`` then spawn the next).  No target is set at 16; the ratio is reported.
* the floors under the sequential row, in the same rounds, for information: what any trio
  program pays to wait for a child (posix_spawn, then ``await wait_readable`` on its pidfd and
  ``waitid``), and what a supervisor that puts each child in a cgroup of its own pays before
  any Python of its task's life (a leaf made, the native clone3 into it, the same pidfd wait,
  the leaf removed: bench_spawn's steps, awaited): ``sup.run`` above that last one is its
  task's Python life (spec, pipes, the driver, the accounting, the record).

Ours and the floor alternate in rounds (noise hits both alike); the figures are medians over
rounds; the ratio is the median of the rounds' ratios.  Nothing is asserted about time.

    python benchmarks/bench_run.py [--quick] [--tasks 160] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import trio
from _common import host_note, median, paired_ratio, run_trio, scratch_cgroup

import supervisor
from cgroupfs import Cgroup
from supervisor import TaskSpec
from supervisor.lowlevel import spawn

TRUE = "/bin/true"
CONC = 16


def floor_sequential(n: int, devnull: int, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pid = os.posix_spawn(TRUE, [TRUE], env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
        os.waitpid(pid, 0)
    return (time.perf_counter() - t0) / n


async def floor_trio(n: int, devnull: int, env: dict[str, str]) -> float:
    """posix_spawn, then the child's exit awaited on its pidfd under trio, and reaped."""
    t0 = time.perf_counter()
    for _ in range(n):
        pid = os.posix_spawn(TRUE, [TRUE], env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
        pidfd = os.pidfd_open(pid)
        try:
            await trio.lowlevel.wait_readable(pidfd)
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        finally:
            os.close(pidfd)
    return (time.perf_counter() - t0) / n


async def floor_leaf(parent: Cgroup, n: int, devnull: int, env: dict[str, str]) -> float:
    """A leaf made, the native clone3 into it, the pidfd awaited under trio, the child
    reaped, the leaf removed: a task's steps with none of its Python life."""
    t0 = time.perf_counter()
    for i in range(n):
        leaf = parent.make_child(f"t{i}")
        sp = spawn([TRUE], env=env, cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                   stderr=2)
        try:
            await trio.lowlevel.wait_readable(sp.pidfd)
            os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
        finally:
            os.close(sp.pidfd)
        leaf.remove()
    return (time.perf_counter() - t0) / n


def floor_window(n: int, conc: int, devnull: int, env: dict[str, str]) -> float:
    """n spawns with ``conc`` children in flight.  Only ever waits for our own pids."""
    live: set[int] = set()
    started = 0
    t0 = time.perf_counter()
    try:
        while started < n or live:
            while started < n and len(live) < conc:
                live.add(os.posix_spawn(TRUE, [TRUE], env,
                                        file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)]))
                started += 1
            # waitpid(-1) would also reap someone else's child if we had any: we don't
            # (no supervised task is live while the floor runs), but check anyway
            pid, _ = os.waitpid(-1, 0)
            if pid not in live:
                raise RuntimeError(f"reaped pid {pid}, which is not one of the floor's")
            live.discard(pid)
    finally:
        for pid in live:
            os.waitpid(pid, 0)
    return (time.perf_counter() - t0) / n


async def ours_sequential(sup: supervisor.Supervisor, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        r = await sup.run([TRUE])
        if r.outcome != "succeeded":
            raise RuntimeError(f"/bin/true did not succeed: {r}")
    return (time.perf_counter() - t0) / n


async def ours_batch(sup: supervisor.Supervisor, n: int) -> float:
    specs = [TaskSpec([TRUE]) for _ in range(n)]
    t0 = time.perf_counter()
    results = await sup.run_batch(specs, max_concurrency=CONC)
    dt = time.perf_counter() - t0
    bad = [r for r in results if r.outcome != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} batch tasks did not succeed, e.g. {bad[0]}")
    return dt / n


async def ours_nursery(sup: supervisor.Supervisor, n: int) -> float:
    per = n // CONC
    failed: list[object] = []

    async def worker() -> None:
        for _ in range(per):
            r = await sup.run([TRUE])
            if r.outcome != "succeeded":
                failed.append(r)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(CONC):
            nursery.start_soon(worker)
    dt = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"{len(failed)} tasks did not succeed, e.g. {failed[0]}")
    return dt / (per * CONC)


async def amain(work: trio.CancelScope, args: argparse.Namespace) -> None:
    print(host_note())
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    env = dict(os.environ)
    rows: dict[str, tuple[list[float], list[float]]] = {
        "sequential": ([], []), "run_batch c=16": ([], []), "nursery c=16": ([], [])}
    floors: dict[str, list[float]] = {"trio": [], "leaf": []}
    with scratch_cgroup("run") as parent:  # (the floor's leaves; it outlives the supervisor)
        await _measure(work, args, devnull, env, rows, floors, parent)
    if work.cancelled_caught:
        return
    _report(args, rows, floors)


async def _measure(work: trio.CancelScope, args: argparse.Namespace, devnull: int,
                   env: dict[str, str], rows: dict[str, tuple[list[float], list[float]]],
                   floors: dict[str, list[float]], parent: Cgroup) -> None:
    async with supervisor.open_supervisor(retain_results=16) as sup:
        print(f"supervisor cgroup: {sup.cgroup_root}")
        with work:
            # warm-up: imports, first leaf, first pipes, caches
            await ours_sequential(sup, 10)
            floor_sequential(10, devnull, env)
            await floor_trio(10, devnull, env)
            await floor_leaf(parent, 10, devnull, env)
            for rnd in range(args.rounds):
                n = args.tasks
                rows["sequential"][0].append(floor_sequential(n, devnull, env))
                rows["sequential"][1].append(await ours_sequential(sup, n))
                floors["trio"].append(await floor_trio(n, devnull, env))
                floors["leaf"].append(await floor_leaf(parent, n, devnull, env))
                # the c=16 floor is shared by both c=16 rows (measured twice per round)
                rows["run_batch c=16"][0].append(floor_window(n, CONC, devnull, env))
                rows["run_batch c=16"][1].append(await ours_batch(sup, n))
                rows["nursery c=16"][0].append(floor_window(n, CONC, devnull, env))
                rows["nursery c=16"][1].append(await ours_nursery(sup, n))
                print(f"  round {rnd + 1}/{args.rounds}: " + ", ".join(
                    f"{k} {v[1][-1] / v[0][-1]:.2f}x" for k, v in rows.items()), flush=True)


def _report(args: argparse.Namespace, rows: dict[str, tuple[list[float], list[float]]],
            floors: dict[str, list[float]]) -> None:
    print()
    print(f"run benchmark: {args.tasks} tasks x {args.rounds} rounds, /bin/true, medians")
    print(f"{'':16s} {'floor (posix_spawn)':>26s} {'ours (supervisor)':>26s} {'ratio':>7s}"
          f"  target")
    for name, (floor, ours) in rows.items():
        f, o = median(floor), median(ours)
        target = "<= 1.5x" if name == "sequential" else "(none; report)"
        print(f"{name:16s} {f * 1e6:9.0f} us/task {1 / f:6.0f}/s {o * 1e6:9.0f} us/task "
              f"{1 / o:6.0f}/s {paired_ratio(ours, floor):6.2f}x  {target}")
    floor, ours = rows["sequential"]
    t, lf, o = median(floors["trio"]), median(floors["leaf"]), median(ours)
    print(f"  sequential floors (information): the pidfd wait under trio {t * 1e6:.0f} us/task "
          f"({paired_ratio(floors['trio'], floor):.2f}x posix_spawn); a leaf + native clone3 + "
          f"that wait + rmdir {lf * 1e6:.0f} us/task ({paired_ratio(floors['leaf'], floor):.2f}x); "
          f"sup.run above the latter, its task's Python life: {(o - lf) * 1e6:.0f} us/task")
    print(f"  at the end: {host_note()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32 tasks x 2 rounds: a smoke test")
    ap.add_argument("--tasks", type=int, default=160, help="tasks per measurement (x16)")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.rounds = 32, 2
    args.tasks = max(CONC, args.tasks // CONC * CONC)
    status, _ = run_trio(amain, args)
    return status


if __name__ == "__main__":
    sys.exit(main())
