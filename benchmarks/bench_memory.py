"""Memory benchmark: the supervisor's own memory per running task.

Ours: a fresh Python process opens a supervisor, runs one warm-up task, and reads its own
``/proc/self/smaps_rollup`` (Rss, Pss) and ``/proc/self/status`` (VmRSS); then starts N
``sleep 600`` tasks with ``nursery.start(sup.start, ["sleep", "600"])`` and reads them again.
(after - before) / N is the figure.  Then ``sup.stop_all()`` (SIGTERM, which sleep obeys) and
every task is awaited; the time that takes is printed for information.

Floor, in the same run: a fresh Python process holds N ``sleep 600`` children the bare way:
``os.posix_spawn`` with stdout and stderr on pipes, a pidfd each, and three trio tasks per
child (one awaiting the pidfd, two awaiting the pipes) -- the same fds and waiters a supervised
task needs, without cgroups, records or capture buffers.

Each measurement runs in its own process (Python rarely gives freed memory back, so a second
measurement in one process would be skewed); ours and the floor alternate in rounds; medians.
Target: ours <= 9 KiB per task (the ratio to the floor is for information).  Nothing is
asserted.  On SIGINT or SIGTERM the parent passes the signal on and waits for the child to stop
its tasks and remove its cgroups (never SIGKILL it: its tasks and cgroups would stay behind).

File descriptors: a supervised task holds a pidfd, two pipe read ends and its leaf's directory
fd (4 per task); RLIMIT_NOFILE's soft limit is raised to the hard limit when N needs it, and the
script says so.  One inotify instance serves the supervisor (one watch per leaf).

    python benchmarks/bench_memory.py [--quick] [--tasks 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import time

import trio
from _common import host_note, median, raise_nofile, run_trio

SLEEP = ["sleep", "600"]


def mem() -> dict[str, int]:
    """Rss and Pss (smaps_rollup) and VmRSS (status), in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Private_Dirty", "Anonymous"):
                out[key] = int(rest.split()[0]) * 1024
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["VmRSS"] = int(line.split()[1]) * 1024
    return out


def settle() -> dict[str, int]:
    gc.collect()
    return mem()


# ---- the two children -------------------------------------------------------------------


async def child_ours(work: trio.CancelScope, n: int) -> dict[str, object] | None:
    import supervisor

    async with supervisor.open_supervisor() as sup:
        with work:
            await sup.run(["/bin/true"])  # warm-up
            async with trio.open_nursery() as nursery:
                warm = await nursery.start(sup.start, SLEEP)
                warm.stop()
                await warm.wait()
            before = settle()
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                handles = [await nursery.start(sup.start, SLEEP) for _ in range(n)]
                t_start = time.perf_counter() - t0
                running = sum(h.state == "running" for h in handles)
                after = settle()
                t1 = time.perf_counter()
                sup.stop_all()
                results = [await h.wait() for h in handles]
            t_stop = time.perf_counter() - t1
    if work.cancelled_caught:
        return None
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[str(r.outcome)] = outcomes.get(str(r.outcome), 0) + 1
    return {"before": before, "after": after, "running": running, "start_s": t_start,
            "stop_s": t_stop, "outcomes": outcomes}


async def child_floor(work: trio.CancelScope, n: int) -> dict[str, object] | None:
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    env = dict(os.environ)
    path = "/bin/sleep"

    async def wait_pidfd(pidfd: int) -> None:
        await trio.lowlevel.wait_readable(pidfd)
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)

    async def drain(fd: int) -> None:
        try:
            while True:
                await trio.lowlevel.wait_readable(fd)
                if not os.read(fd, 65536):
                    return
        finally:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    pidfds: list[int] = []
    before = settle()
    t0 = time.perf_counter()
    with work:
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(n):
                    r1, w1 = os.pipe2(os.O_CLOEXEC)
                    r2, w2 = os.pipe2(os.O_CLOEXEC)
                    try:
                        pid = os.posix_spawn(path, SLEEP, env, file_actions=[
                            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, w1, 1),
                            (os.POSIX_SPAWN_DUP2, w2, 2)])
                    finally:
                        os.close(w1)
                        os.close(w2)
                    pidfd = os.pidfd_open(pid)
                    pidfds.append(pidfd)
                    os.set_blocking(r1, False)
                    os.set_blocking(r2, False)
                    nursery.start_soon(wait_pidfd, pidfd)
                    nursery.start_soon(drain, r1)
                    nursery.start_soon(drain, r2)
                await trio.sleep(0.2)  # let every waiter reach its first wait
                t_start = time.perf_counter() - t0
                after = settle()
                t1 = time.perf_counter()
                for pidfd in pidfds:
                    signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        finally:
            for pidfd in pidfds:  # on an error: make sure none of them outlives us
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except OSError:
                    pass  # exited (ProcessLookupError) or already closed (EBADF)
    if work.cancelled_caught:
        return None
    t_stop = time.perf_counter() - t1
    return {"before": before, "after": after, "running": n, "start_s": t_start,
            "stop_s": t_stop, "outcomes": {}}


_child: list[subprocess.Popen[str]] = []
_parent_interrupted: list[int] = []


def _forward(sig: int, _frame: object) -> None:
    # Never kill the child: it holds N tasks and a supervisor cgroup.  Pass the signal on
    # (a terminal's Ctrl-C reaches it anyway) and let it stop its tasks and clean up.
    if not _parent_interrupted:
        print(f"\n{signal.Signals(sig).name}: waiting for the measuring process to stop its "
              f"tasks and remove its cgroups", file=sys.stderr)
    _parent_interrupted.append(sig)
    for proc in _child:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


def run_child(kind: str, n: int) -> dict[str, object] | None:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", kind,
                             "--tasks", str(n)], stdout=subprocess.PIPE, text=True)
    _child.append(proc)
    try:
        out, _ = proc.communicate()  # no timeout: the child must finish its own cleanup
    finally:
        _child.remove(proc)
    if _parent_interrupted:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"the {kind} measurement failed (exit status {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def per_task(r: dict[str, object], key: str, n: int) -> float:
    b, a = r["before"], r["after"]
    assert isinstance(b, dict) and isinstance(a, dict)
    return (a[key] - b[key]) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 tasks x 1 round")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=("ours", "floor"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.rounds = 100, 1
    note = raise_nofile(4 * args.tasks + 256)
    if args.child:
        fn = child_ours if args.child == "ours" else child_floor
        status, res = run_trio(fn, args.tasks)
        if status == 0:
            print(json.dumps(res))
        return status

    print(host_note())
    print(note)
    signal.signal(signal.SIGINT, _forward)
    signal.signal(signal.SIGTERM, _forward)
    ours: list[dict[str, object]] = []
    floor: list[dict[str, object]] = []
    for rnd in range(args.rounds):
        for kind, rows in (("floor", floor), ("ours", ours)):
            got = run_child(kind, args.tasks)
            if got is None:
                return 128 + _parent_interrupted[0]
            rows.append(got)
        fo = per_task(floor[-1], "Rss", args.tasks) / 1024
        ou = per_task(ours[-1], "Rss", args.tasks) / 1024
        print(f"  round {rnd + 1}/{args.rounds}: floor {fo:.2f} KiB/task, ours {ou:.2f} "
              f"KiB/task (Rss); ours: {ours[-1]['running']} running, started in "
              f"{ours[-1]['start_s']:.2f}s, stopped in {ours[-1]['stop_s']:.2f}s, "
              f"{ours[-1]['outcomes']}", flush=True)

    n = args.tasks
    print()
    print(f"memory benchmark: {n} sleep tasks held, {args.rounds} rounds, medians, per task")
    print(f"  {'':28s} {'Rss':>10s} {'Pss':>10s} {'Anonymous':>10s} {'VmRSS':>10s}")
    for name, rows in (("floor (bare trio + fds)", floor), ("ours (supervisor)", ours)):
        cells = [median([per_task(r, k, n) for r in rows]) / 1024
                 for k in ("Rss", "Pss", "Anonymous", "VmRSS")]
        print(f"  {name:28s} " + " ".join(f"{c:7.2f} KiB" for c in cells))
    base = median([float(r["before"]["Rss"]) for r in ours]) / 2**20  # type: ignore[index]
    o = median([per_task(r, "Rss", n) for r in ours])
    f = median([per_task(r, "Rss", n) for r in floor])
    print(f"  supervisor Rss with no task: {base:.1f} MiB")
    print(f"  ours {o / 1024:.2f} KiB/task (Rss)   target <= 9 KiB/task   "
          f"ratio to floor {o / f:.2f}x")
    print(f"  at the end: {host_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
