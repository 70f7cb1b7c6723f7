"""Keeper benchmark: SIGKILL a supervisor holding tasks; how soon is every process gone?

Ours: a supervisor-like Python program (``SUPERVISOR``) guards its root with a keeper
(``supervisor._keeper.Keeper``) and starts ``--tasks`` tasks in leaves below it, each
``sh -c 'setsid sleep 600 & exec sleep 600'`` (a ``setsid`` escapee and the main process).  Once
it says it is ready, we open a pidfd for every process below the root, SIGKILL the program, and
time until every pidfd is readable (every process has exited), then until the root's directory
is gone and until the keeper has exited.  Survivors: processes still running 5 s after the
SIGKILL (target 0).

Baseline, in the same run, when installed: ``bwrap --die-with-parent --unshare-pid`` around the
same shell line, ``--tasks`` times, started by the same kind of program (PR_SET_PDEATHSIG kills
bwrap when its parent dies; the sandbox's PID namespace then takes the escapee along).  The two
alternate in rounds.  Target: every process gone within 1 s of the supervisor's death, 0
survivors.  Nothing is asserted about time.

The tasks outlive their parent by design, and this host's PID 1 reaps orphans only every few
seconds: the script makes itself a child subreaper (PR_SET_CHILD_SUBREAPER) and reaps exactly the
pids it saw, the keeper included (its exit status is reported).

    python benchmarks/bench_keeper.py [--quick] [--rounds 100] [--tasks 10]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import select
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field

from _common import host_note, median, scratch_cgroup, sync_sigterm_as_interrupt

from cgroupfs import Cgroup
from supervisor._spawn import Spawned, spawn

PR_SET_CHILD_SUBREAPER = 36
SURVIVOR_DEADLINE = 5.0
READY_TIMEOUT = 60.0
TASK = ["sh", "-c", "setsid sleep 600 & exec sleep 600"]

# argv: where (our root, or the baseline's counting leaf), n, "keeper" | "bwrap".  Prints the
# keeper's pid (0 for bwrap) once every process is there, then waits to be killed.
SUPERVISOR = r"""
import os, sys, time
from cgroupfs import Cgroup
from supervisor._keeper import Keeper
from supervisor._spawn import spawn

where, n, how = Cgroup.open(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
task = ["sh", "-c", "setsid sleep 600 & exec sleep 600"]
null = os.open(os.devnull, os.O_RDWR)
keeper = Keeper.start(where) if how == "keeper" else None
if keeper:
    tasks = where.make_child("tasks")
for i in range(n):
    if keeper:
        leaf = tasks.make_child(f"t-{i}")
        spawn(task, cgroup_fd=leaf.fd, stdin=null, stdout=null, stderr=null)
    else:
        spawn(["bwrap", "--die-with-parent", "--unshare-pid", "--dev-bind", "/", "/", *task],
              cgroup_fd=where.fd, stdin=null, stdout=null, stderr=null)
def count():
    return sum(len(open(os.path.join(d, "cgroup.procs")).read().split())
               for d, _, _ in os.walk(where.path))
while count() < n * (2 if keeper else 4):  # bwrap: itself, the sandbox's pid 1, 2 sleeps
    time.sleep(0.001)
print(keeper.pid if keeper else 0, flush=True)
os.read(0, 1)
"""


@dataclass
class Round:
    gone: float | None = None  # s from SIGKILL until every process had exited
    removed: float | None = None  # s until the root was gone (ours)
    keeper_exit: float | None = None  # s until the keeper exited (ours)
    survivors: int = 0
    survivor_names: list[str] = field(default_factory=list)  # "comm (ppid N)" of each
    keeper_status: int | None = None
    report: str = ""


@dataclass
class Series:
    rounds: list[Round] = field(default_factory=list)

    def figures(self, attr: str) -> list[float]:
        return [v for r in self.rounds if (v := getattr(r, attr)) is not None]


def tree_pids(path: str) -> list[int]:
    """Every pid listed in ``path`` and below."""
    pids = []
    for d, _, _ in os.walk(path):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return pids


def start_program(home: Cgroup, where: str, n: int, how: str) -> tuple[Spawned, int, int, int]:
    """Start SUPERVISOR in leaf ``home``; return (it, its stdin, its stderr, the keeper pid)
    once it said it is ready."""
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = spawn([sys.executable, "-P", "-c", SUPERVISOR, where, str(n), how],
                     cgroup_fd=home.fd, cwd="/", stdin=in_r, stdout=out_w, stderr=err_w)
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    try:
        if not select.select([out_r], [], [], READY_TIMEOUT)[0]:
            raise RuntimeError(f"the {how} supervisor did not get ready in {READY_TIMEOUT}s")
        line = os.read(out_r, 100)
        if not line.strip().isdigit():
            raise RuntimeError(f"the {how} supervisor failed: {line!r} "
                               f"{os.read(err_r, 65536).decode(errors='replace')}")
    finally:
        os.close(out_r)
    return proc, in_w, err_r, int(line)


def wait_all_exited(pidfds: list[int], deadline: float) -> tuple[float, set[int]]:
    """Block until every pidfd is readable or ``deadline``; (monotonic time of the last exit,
    the pidfds of those still running)."""
    poller = select.poll()
    left = set(pidfds)
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    last = time.monotonic()
    while left:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            break
        for fd, _ in poller.poll(timeout * 1000):
            poller.unregister(fd)
            left.discard(fd)
        last = time.monotonic()
    return last, left


def wait_path_gone(path: str, deadline: float) -> float | None:
    while os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0002)
    return time.monotonic()


def describe_pid(pid: int) -> str:
    """``comm (ppid N)`` of a live process, for the survivors' list."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, tail = f.read().rsplit(")", 1)
        return f"{head.split('(', 1)[1]} (ppid {tail.split()[1]})"
    except (OSError, IndexError):
        return f"pid {pid} (gone meanwhile)"


def reap(pids: list[int], timeout: float = 10.0) -> dict[int, int]:
    """Reap the orphans we are subreaper of, by pid only; their exit statuses."""
    left, statuses = set(pids), {}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                left.discard(pid)  # reaped by its own parent before that died
                continue
            if got:
                statuses[pid] = os.waitstatus_to_exitcode(status)
                left.discard(pid)
        if left:
            time.sleep(0.002)
    return statuses


def one_round(scratch: Cgroup, rnd: int, n: int, how: str) -> Round:
    """Start a supervisor (keeper or bwrap) holding n tasks, SIGKILL it, time the deaths."""
    home = scratch.make_child(f"{how}-sup-{rnd}")
    where = scratch.make_child(f"{how}-root-{rnd}")
    result = Round()
    proc, stdin, stderr, keeper_pid = start_program(home, where.path, n, how)
    pids = tree_pids(where.path)
    pidfds = [os.pidfd_open(p) for p in pids]
    keeper_fd = os.pidfd_open(keeper_pid) if keeper_pid else -1
    try:
        t0 = time.monotonic()
        signal.pidfd_send_signal(proc.pidfd, signal.SIGKILL)
        last, left = wait_all_exited(pidfds, t0 + SURVIVOR_DEADLINE)
        result.gone = None if left else last - t0
        result.survivors = len(left)
        result.survivor_names = [describe_pid(pids[pidfds.index(fd)]) for fd in left]
        if keeper_pid:
            gone = wait_path_gone(where.path, t0 + SURVIVOR_DEADLINE)
            result.removed = None if gone is None else gone - t0
            k_last, k_left = wait_all_exited([keeper_fd], t0 + SURVIVOR_DEADLINE)
            result.keeper_exit = None if k_left else k_last - t0
        os.waitid(os.P_PIDFD, proc.pidfd, os.WEXITED)
        statuses = reap([*pids, keeper_pid] if keeper_pid else pids)
        result.keeper_status = statuses.get(keeper_pid)
        if keeper_pid and select.select([stderr], [], [], 0)[0]:
            result.report = os.read(stderr, 65536).decode(errors="replace").strip()
    finally:
        for fd in [*pidfds, keeper_fd, stdin, stderr, proc.pidfd]:
            if fd >= 0:
                os.close(fd)
        where.close()
        home.close()
    return result


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def describe(name: str, s: Series, n_procs: int) -> None:
    gone = s.figures("gone")
    survivors = sum(r.survivors for r in s.rounds)
    print(f"  {name}:")
    if gone:
        print(f"    every process gone after the SIGKILL: median {median(gone) * 1e3:7.1f} ms, "
              f"p95 {pct(gone, 95) * 1e3:7.1f} ms, max {max(gone) * 1e3:7.1f} ms "
              f"({len(gone)} of {len(s.rounds)} rounds)")
    names = collections.Counter(n for r in s.rounds for n in r.survivor_names)
    print(f"    survivors {SURVIVOR_DEADLINE:g} s after the SIGKILL: {survivors} "
          f"(of {n_procs * len(s.rounds)} processes) in "
          f"{sum(1 for r in s.rounds if r.survivors)} rounds   target 0"
          + (f"; they were: {', '.join(f'{k} x{v}' for k, v in names.items())}" if names
             else ""))
    for attr, what in (("removed", "root removed"), ("keeper_exit", "keeper exited")):
        xs = s.figures(attr)
        if xs:
            print(f"    {what}: median {median(xs) * 1e3:7.1f} ms, p95 {pct(xs, 95) * 1e3:7.1f} "
                  f"ms, max {max(xs) * 1e3:7.1f} ms ({len(xs)} of {len(s.rounds)})")


def run(args: argparse.Namespace) -> int:
    bwrap = shutil.which("bwrap")
    ours, base = Series(), Series()
    with scratch_cgroup("keeper") as scratch:
        print(f"scratch cgroup: {scratch.path}")
        for rnd in range(args.rounds):
            ours.rounds.append(one_round(scratch, rnd, args.tasks, "keeper"))
            if bwrap:
                base.rounds.append(one_round(scratch, rnd, args.tasks, "bwrap"))
            if (rnd + 1) % 10 == 0 or rnd + 1 == args.rounds:
                o, b = ours.rounds[-1], base.rounds[-1] if base.rounds else None
                print(f"  round {rnd + 1}/{args.rounds}: ours {fmt_ms(o.gone)}"
                      + (f", bwrap {fmt_ms(b.gone)}" if b else ""), flush=True)
    print()
    print(f"keeper benchmark: SIGKILL of a supervisor holding {args.tasks} tasks "
          f"({2 * args.tasks} processes: a setsid escapee and its parent each), "
          f"{args.rounds} rounds")
    describe("ours: corral-keeper (cgroup.kill of the root)", ours, 2 * args.tasks)
    statuses = collections.Counter(r.keeper_status for r in ours.rounds)
    reports = collections.Counter(r.report.split(";", 1)[-1].split(" of ")[0].strip()
                                  for r in ours.rounds)
    print(f"    keeper exit statuses: {dict(statuses)}; reports: {dict(reports)}")
    if bwrap:
        describe(f"baseline: {bwrap} --die-with-parent --unshare-pid", base, 4 * args.tasks)
        print(f"    (each bwrap task is 4 processes: bwrap, the sandbox's pid 1, 2 sleeps; "
              f"{4 * args.tasks} per round)")
    else:
        print("  baseline: bwrap is not installed (apt-get install bubblewrap): none this run")
    gone = ours.figures("gone")
    met = len(gone) == len(ours.rounds) and gone and max(gone) < 1.0
    print(f"  target: every process gone within 1 s of the supervisor's death, 0 survivors: "
          f"{'met' if met else 'NOT met'}")
    print(f"  at the end: {host_note()}")
    return 0


def fmt_ms(x: float | None) -> str:
    return "survivors!" if x is None else f"{x * 1e3:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 rounds of 3 tasks")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=10)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.tasks = 10, 3
    print(host_note())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"WARNING: PR_SET_CHILD_SUBREAPER failed: {os.strerror(ctypes.get_errno())}",
              file=sys.stderr)
    sync_sigterm_as_interrupt()
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted: the scratch cgroup was emptied and removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
