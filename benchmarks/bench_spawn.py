"""Spawn benchmark: native spawn into a fresh leaf against os.posix_spawn, in one run.

Per task, corral's path is: mkdir a leaf, open it, clone3 /bin/true straight into it, wait on the
pidfd, rmdir the leaf.  The floor is os.posix_spawn + waitpid of the same /bin/true in our own
cgroup.  Both run interleaved in rounds so that machine noise hits them alike; the figures are
medians over rounds, and the ratio is what to read (target: <= 1.3x at concurrency 1).

    python benchmarks/bench_spawn.py [--tasks 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

from cgroupfs import Cgroup, find_cgroup2_mount
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
        batch = []
        for i in range(conc):
            leaf = parent.make_child(f"t{r}-{i}")
            sp = spawn([TRUE], env=env, cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                       stderr=2)
            batch.append((leaf, sp))
        for leaf, sp in batch:
            os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
            os.close(sp.pidfd)
            leaf.remove()
    return (time.perf_counter() - t0) / (n // conc * conc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    mount = find_cgroup2_mount().mount_point
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    with Cgroup.open(mount) as root:
        parent = root.make_child(f"corral-bench-{uuid.uuid4().hex[:8]}")
        try:
            print(f"spawn benchmark: {args.tasks} tasks x {args.rounds} rounds, /bin/true")
            for conc in (1, 16):
                floor, ours = [], []
                for _ in range(args.rounds):
                    floor.append(floor_posix_spawn(args.tasks, conc, devnull))
                    ours.append(native_into_leaf(parent, args.tasks, conc, devnull))
                f, o = statistics.median(floor), statistics.median(ours)
                print(f"  concurrency {conc:2d}: posix_spawn+waitpid {f * 1e6:7.0f} us/task "
                      f"({1 / f:6.0f}/s) | leaf+clone3+pidfd wait+rmdir {o * 1e6:7.0f} us/task "
                      f"({1 / o:6.0f}/s) | ratio {o / f:.2f}x")
        finally:
            parent.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
