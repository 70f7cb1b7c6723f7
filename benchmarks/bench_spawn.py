"""Spawn benchmark: native spawn into a fresh leaf against os.posix_spawn, in one run.

Per task, corral's path is: mkdir a leaf, open it, clone3 /bin/true straight into it, wait on the
pidfd, rmdir the leaf.  The floor is os.posix_spawn + waitpid of the same /bin/true in our own
cgroup.  Both run interleaved in rounds so that machine noise hits them alike; the figures are
medians over rounds, the ratio is the median of the rounds' ratios, and it is what to read
(target: <= 1.3x at concurrency 1; none is set at 16).  Nothing is asserted about time.

    python benchmarks/bench_spawn.py [--quick] [--tasks 208] [--rounds 9]

``--quick``: 32 tasks x 2 rounds (a smoke test, seconds).  The scratch cgroup
``corral-bench-spawn-<pid>-<hex>`` is emptied and removed on every exit path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import host_note, paired_ratio, scratch_cgroup, sync_sigterm_as_interrupt

from cgroupfs import Cgroup
from supervisor._spawn import spawn

TRUE = "/bin/true"


def floor_posix_spawn(n: int, conc: int, devnull: int) -> float:
    env = dict(os.environ)
    t0 = time.perf_counter()
    for _ in range(n // conc):
        pids = [
            os.posix_spawn(TRUE, [TRUE], env, file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 1)])
            for _ in range(conc)
        ]
        for pid in pids:
            os.waitpid(pid, 0)
    return (time.perf_counter() - t0) / (n // conc * conc)


def native_into_leaf(parent: Cgroup, n: int, conc: int, devnull: int) -> float:
    env = dict(os.environ)
    t0 = time.perf_counter()
    for r in range(n // conc):
        leaves: list[Cgroup] = []
        pidfds: list[int] = []
        try:
            for i in range(conc):
                leaf = parent.make_child(f"t{r}-{i}")
                leaves.append(leaf)
                sp = spawn([TRUE], env=env, cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                           stderr=2)
                pidfds.append(sp.pidfd)
            while pidfds:
                pidfd = pidfds.pop(0)
                try:
                    os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
                finally:
                    os.close(pidfd)
                leaves.pop(0).remove()
        finally:
            for pidfd in pidfds:
                os.close(pidfd)
            # on an error, the scratch cgroup's exit kills and removes the leaves left
    return (time.perf_counter() - t0) / (n // conc * conc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32 tasks x 2 rounds: a smoke test")
    ap.add_argument("--tasks", type=int, default=208)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.rounds = 32, 2
    args.tasks = max(16, args.tasks // 16 * 16)

    sync_sigterm_as_interrupt()
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    print(host_note())
    print("target: ratio <= 1.3x at concurrency 1 (none set at 16); no assertion on time")
    with scratch_cgroup("spawn") as parent:
        print(f"spawn benchmark: {args.tasks} tasks x {args.rounds} rounds, /bin/true")
        for conc in (1, 16):
            floor: list[float] = []
            ours: list[float] = []
            for _ in range(args.rounds):
                floor.append(floor_posix_spawn(args.tasks, conc, devnull))
                ours.append(native_into_leaf(parent, args.tasks, conc, devnull))
            f, o = statistics.median(floor), statistics.median(ours)
            print(f"  concurrency {conc:2d}: posix_spawn+waitpid {f * 1e6:7.0f} us/task "
                  f"({1 / f:6.0f}/s) | leaf+clone3+pidfd wait+rmdir {o * 1e6:7.0f} us/task "
                  f"({1 / o:6.0f}/s) | ratio {paired_ratio(ours, floor):.2f}x")
    print(f"  at the end: {host_note()}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # (SIGTERM too) the scratch cgroup was cleaned on the way out
        print("\ninterrupted; the scratch cgroup was removed", file=sys.stderr)
        sys.exit(130)
