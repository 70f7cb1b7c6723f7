"""Kill benchmark: forced stop of a task whose leaf holds 1000 sleeping processes.

Ours: a task ``sh -c 'for i in $(seq 1000); do sleep 600 & done; wait'`` started with
``nursery.start(sup.start, ...)``; once its leaf lists 1001 processes, the clock runs from
``task.stop(force=True)`` to the return of ``await task.wait()`` (the final record: leaf
killed, empty, usage read, leaf removed).

Floor, in the same run: the same shell line spawned (clone3, the same native helper) into a
leaf of our own scratch cgroup; once it lists 1001 processes, the clock runs from writing
``1`` to ``cgroup.kill`` to ``populated 0`` in ``cgroup.events`` (inotify IN_MODIFY, blocking
poll(2), re-read).  Its rmdir is timed separately, for information.

Target: ours / floor <= 1.2x.  The two alternate in rounds; medians.  Nothing is asserted
about time.

The sleeps are grandchildren: when the shell dies they are reparented.  This host's PID 1
reaps orphans only every few seconds, so the script makes itself a child subreaper
(PR_SET_CHILD_SUBREAPER) and reaps exactly the pids it saw in the leaf, by pid.

    python benchmarks/bench_kill.py [--quick] [--procs 1000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import select
import sys
import time

import trio
from _common import (
    host_note,
    median,
    paired_ratio,
    raise_nofile,
    run_trio,
    scratch_cgroup,
)

import supervisor
from cgroupfs import Cgroup, own_cgroup
from supervisor._spawn import inotify_add_watch, inotify_init, spawn

PR_SET_CHILD_SUBREAPER = 36
READY_TIMEOUT = 60.0


def shell_line(n: int) -> list[str]:
    return ["sh", "-c", f"for i in $(seq {n}); do sleep 600 & done; wait"]


def count_procs(path: str) -> int:
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def list_procs(path: str) -> list[int]:
    with open(os.path.join(path, "cgroup.procs"), "rb") as f:
        return [int(p) for p in f.read().split()]


async def wait_count(path: str, want: int) -> None:
    deadline = trio.current_time() + READY_TIMEOUT
    while count_procs(path) < want:
        if trio.current_time() > deadline:
            raise RuntimeError(f"{path} holds {count_procs(path)} processes after "
                               f"{READY_TIMEOUT}s, wanted {want}")
        await trio.sleep(0.02)


def reap(pids: list[int], main_pid: int | None, timeout: float = 10.0) -> None:
    """Reap the orphaned sleeps (our children now, as subreaper), only by their pids."""
    left = {p for p in pids if p != main_pid}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                got, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                left.discard(pid)  # reaped by the shell before it died, or not ours
                continue
            if got:
                left.discard(pid)
        if left:
            time.sleep(0.005)
    if left:
        print(f"WARNING: {len(left)} orphans not reaped in {timeout}s", file=sys.stderr)


def inotify_wait_empty(leaf: Cgroup, ifd: int) -> None:
    p = select.poll()
    p.register(ifd, select.POLLIN)
    while leaf.read_events().populated:
        p.poll(10_000)
        try:
            while os.read(ifd, 4096):
                pass
        except BlockingIOError:
            pass


async def floor_round(parent: Cgroup, n: int, rnd: int, devnull: int) -> tuple[float, float]:
    leaf = parent.make_child(f"floor-{rnd}")
    pidfd = -1
    ifd = inotify_init()
    try:
        sp = spawn(shell_line(n), cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                   stderr=devnull)
        pidfd = sp.pidfd
        await wait_count(leaf.path, n + 1)
        pids = list_procs(leaf.path)
        inotify_add_watch(ifd, leaf.events_path)
        kill_fd = os.open(os.path.join(leaf.path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            t0 = time.perf_counter()
            os.write(kill_fd, b"1")
            inotify_wait_empty(leaf, ifd)
            t1 = time.perf_counter()
        finally:
            os.close(kill_fd)
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        t2 = time.perf_counter()
        leaf.remove()
        t3 = time.perf_counter()
        reap(pids, sp.pid)
        return t1 - t0, t3 - t2
    finally:
        os.close(ifd)
        if pidfd >= 0:
            try:
                os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                pass
            os.close(pidfd)
        if not leaf.closed:  # an error on the way: the scratch cgroup's exit also cleans up
            try:
                leaf.kill()
                leaf.wait_unpopulated(10.0)
                leaf.remove()
            except OSError as e:
                if e.errno != errno.ENOENT:
                    print(f"WARNING: cleaning {leaf.path}: {e}", file=sys.stderr)


async def ours_round(sup: supervisor.Supervisor, nursery: trio.Nursery,
                     n: int) -> tuple[float, supervisor.TaskResult]:
    task = await nursery.start(sup.start, shell_line(n))
    if task.pid is None:
        raise RuntimeError(f"the task did not start: {await task.wait()}")
    try:
        path = own_cgroup(task.pid)
        await wait_count(path, n + 1)
        pids = list_procs(path)
        t0 = time.perf_counter()
        task.stop(force=True)
        result = await task.wait()
        t1 = time.perf_counter()
    finally:
        task.stop(force=True)  # a no-op once ended; on an error, kill now
        await task.wait()
    reap(pids, task.pid)
    return t1 - t0, result


async def amain(work: trio.CancelScope, args: argparse.Namespace) -> None:
    print(host_note())
    print(raise_nofile(4 * args.procs + 256))
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    floor: list[float] = []
    rmdirs: list[float] = []
    ours: list[float] = []
    last: supervisor.TaskResult | None = None
    with scratch_cgroup("kill") as parent:
        async with supervisor.open_supervisor() as sup:
            print(f"supervisor cgroup: {sup.cgroup_root}; floor cgroup: {parent.path}")
            with work:
                async with trio.open_nursery() as tasks:
                    for rnd in range(args.rounds):
                        f, rm = await floor_round(parent, args.procs, rnd, devnull)
                        floor.append(f)
                        rmdirs.append(rm)
                        o, last = await ours_round(sup, tasks, args.procs)
                        ours.append(o)
                        print(f"  round {rnd + 1}/{args.rounds}: floor {f * 1e3:7.1f} ms, "
                              f"ours {o * 1e3:7.1f} ms, {o / f:.2f}x", flush=True)
        if work.cancelled_caught:
            return

    assert last is not None
    print(f"  last result: outcome {last.outcome}, cleanup {last.cleanup.state}, "
          f"{len(last.cleanup.leftovers)} leftovers listed, stop {last.stop}")
    print()
    print(f"kill benchmark: {args.procs} sleeping processes + 1 shell, {args.rounds} rounds, "
          f"medians")
    f, o = median(floor), median(ours)
    print(f"  floor: cgroup.kill -> populated 0 (inotify)  {f * 1e3:8.1f} ms "
          f"(then rmdir {median(rmdirs) * 1e3:.2f} ms)")
    print(f"  ours:  task.stop(force=True) -> task.wait()  {o * 1e3:8.1f} ms")
    print(f"  ratio ours/floor {paired_ratio(ours, floor):.2f}x (median of the rounds' ratios)"
          f"   target <= 1.2x")
    print(f"  at the end: {host_note()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 processes x 2 rounds")
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.quick:
        args.procs, args.rounds = 100, 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"WARNING: PR_SET_CHILD_SUBREAPER failed: {os.strerror(ctypes.get_errno())}",
              file=sys.stderr)
    status, _ = run_trio(amain, args)
    return status


if __name__ == "__main__":
    sys.exit(main())
