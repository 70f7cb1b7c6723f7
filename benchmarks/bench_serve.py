"""``corral serve`` against the library in-process, ratios in one run.

    python benchmarks/bench_serve.py [--rounds N] [--held N] [--clients N] [--venv DIR]
                                     [--only latency,rate,records,startup,rss]

1. submit-to-result of /bin/true over the socket (one request: ``submit(wait=)``, the Python
   client) against
   ``sup.run(["/bin/true"])`` in-process; target <= in-process + 1.5 ms.  Also against
   ``sup.run`` with a log file per stream (what the daemon asks of the core for every task,
   to keep output for reattach): the share of the gap that is the daemon's own.
2. tasks/s with 16 concurrent clients (processes, one connection each) against 16
   concurrent ``sup.run`` in one trio program; target >= 0.7x.
3. the records alone (in-process ``Records``, a task's accept, running and end rows): per
   task at concurrency 1 and 16, ``synchronous=FULL`` (the daemon's) against ``NORMAL`` (no
   fsync per commit): what durability costs, and what group commit wins back.
4. the daemon's RSS holding 1000 running tasks (``sleep``); target <= 64 MiB.
5. ``corral ps`` start-up against ``python -c pass`` plus one request; target <= 1.3x.
   ``--venv DIR``: also for a normal (not editable) install in DIR (an editable checkout pays
   for setuptools' import hook at every start, which an install does not).

Each daemon gets a scratch cgroup and a temporary socket and state directory (in /var/lib,
where the daemon's records live: on this machine a file created in /var/tmp costs ~1 ms, in
/var/lib ~0.02-0.16 ms, and the daemon creates an output file for each stream a task prints
on); everything is stopped and removed at the end, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import compile_project, fmt_ratio, median, paired_ratio, raise_nofile, scratch_cgroup

from supervisor.client import Client

CORRAL = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
SCRIPT = os.path.join(os.path.dirname(sys.executable), "corral")
STATE_PARENT = "/var/lib"  # where the daemon's records live by default (/var/lib/corral)


@contextmanager
def daemon(*extra: str, state_dir: str | None = None
           ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A daemon on a socket and state directory of its own (``state_dir``: one the caller
    keeps), stopped (SIGTERM) and removed on the way out."""
    with scratch_cgroup("serve") as cg:
        tmp = tempfile.mkdtemp(prefix="corral-bench-serve-", dir=STATE_PARENT)
        sock = os.path.join(tmp, "sock")
        proc = subprocess.Popen([*CORRAL, "serve", "--socket", sock, "--state-dir",
                                 state_dir or os.path.join(tmp, "state"), "--cgroup-root",
                                 cg.path,
                                 "--log-level", "warning", *extra],
                                stdin=subprocess.DEVNULL, cwd=tmp)
        try:
            deadline = time.monotonic() + 30
            while not _connectable(sock):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not start (status {proc.poll()})")
                time.sleep(0.02)
            yield sock, proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)  # the second one kills every task now
                proc.wait(60)
            shutil.rmtree(tmp, ignore_errors=True)


def _connectable(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def paired_latency(sock: str, n: int) -> tuple[list[float], list[float], list[float]]:
    """Rounds of one ``sup.run(/bin/true)`` in-process, the same with a log file per stream,
    and one submit-with-wait over the socket, taken moments apart (a slow spell on this shared box
    hits all three)."""
    import trio

    import supervisor

    async def main(path: str, logs: str) -> tuple[list[float], list[float], list[float]]:
        base: list[float] = []
        logged: list[float] = []
        ours: list[float] = []
        with Client(sock) as c:

            def remote() -> float:
                t0 = time.perf_counter()
                c.submit(["/bin/true"], wait=60)
                return time.perf_counter() - t0

            async with supervisor.open_supervisor(path) as sup:
                for i in range(n + 10):
                    t0 = time.perf_counter()
                    await sup.run(["/bin/true"])
                    local = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    await sup.run(["/bin/true"], log_file=os.path.join(logs, str(i)))
                    with_log = time.perf_counter() - t0
                    far = await trio.to_thread.run_sync(remote)
                    if i >= 10:  # warm-up rounds dropped
                        base.append(local)
                        logged.append(with_log)
                        ours.append(far)
        return base, logged, ours

    logs = tempfile.mkdtemp(prefix="corral-bench-logs-", dir=STATE_PARENT)
    try:
        with scratch_cgroup("serve-base") as cg:
            return trio.run(main, cg.path, logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def records_cost(tasks: int) -> dict[tuple[str, int], float]:
    """Seconds per task of the records alone (accept, running, end rows) by (synchronous,
    concurrency), in-process."""
    import trio

    from supervisor.serve.records import Records

    async def one(records: Records, i: int) -> None:
        task_id = await records.accept({"uid": 0, "gid": 0, "peer_pid": 1, "spec": {
            "argv": ["/bin/true"]}, "state": "starting", "created_at": time.time()})
        records.started(task_id, time.time(), 4242, task_id)
        await records.ended(task_id, {"outcome": "succeeded", "exit_status": 0,
                                      "started_at": time.time(), "ended_at": time.time(),
                                      "pid": 4242, "result": "{}" * 2000, "bytes": 4000,
                                      "notified": None})

    async def run(sync: str, concurrency: int) -> float:
        state = tempfile.mkdtemp(prefix="corral-bench-records-", dir=STATE_PARENT)
        try:
            records = await Records.open(state, synchronous=sync)
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for w in range(concurrency):
                    async def worker(w: int = w) -> None:
                        for i in range(tasks // concurrency):
                            await one(records, w * tasks + i)
                    nursery.start_soon(worker)
            took = (time.perf_counter() - t0) / (tasks // concurrency * concurrency)
            await records.close()
            return took
        finally:
            shutil.rmtree(state, ignore_errors=True)

    out: dict[tuple[str, int], float] = {}
    for _ in range(2):  # alternate: a slow spell hits both
        for sync in ("FULL", "NORMAL"):
            for concurrency in (1, 16):
                took = trio.run(run, sync, concurrency)
                out[(sync, concurrency)] = min(took, out.get((sync, concurrency), took))
    return out


@dataclass
class Rate:
    """Tasks a second, and the CPU each task took of every process involved (ms): the
    supervisor's (with its tasks', reaped by it), and for the daemon its clients' too.  On a
    host of N cores a rate times its CPU per task near N * 1000 ms says the run was CPU-bound."""

    per_s: float
    cpu_ms: float
    client_cpu_ms: float = 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of the children it reaped (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def in_process_rate(concurrency: int, total: int) -> Rate:
    import trio

    import supervisor

    async def main(path: str) -> Rate:
        async with supervisor.open_supervisor(path) as sup:

            async def worker(k: int) -> None:
                for _ in range(k):
                    await sup.run(["/bin/true"])

            n = total // concurrency * concurrency
            cpu0, t0 = cpu_s(os.getpid()), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker, total // concurrency)
            took = time.perf_counter() - t0
            return Rate(n / took, (cpu_s(os.getpid()) - cpu0) / n * 1e3)

    with scratch_cgroup("serve-rate") as cg:
        return trio.run(main, cg.path)


def throughput(sock: str, clients: int, per_client: int, daemon_pid: int) -> Rate:
    """Tasks/s with ``clients`` client processes (forked: threads would measure the GIL of
    one client process more than the daemon), each submit-with-wait (one request) in a loop."""
    go_r, go_w = os.pipe()
    pids = []
    for _ in range(clients):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(go_w)
                with Client(sock) as c:
                    os.read(go_r, 1)  # all start together
                    for _ in range(per_client):
                        if c.submit(["/bin/true"], wait=60).state != "finished":
                            code = 2
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(go_r)
    time.sleep(0.5 + clients / 200)
    cpu0, t0 = cpu_s(daemon_pid), time.perf_counter()
    os.write(go_w, b"x" * clients)
    failed, client_cpu = 0, 0.0
    for pid in pids:
        _, status, usage = os.wait4(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
        client_cpu += usage.ru_utime + usage.ru_stime
    elapsed = time.perf_counter() - t0
    daemon_cpu = cpu_s(daemon_pid) - cpu0
    os.close(go_w)
    if failed:
        raise SystemExit(f"{failed} of {clients} client processes failed")
    n = clients * per_client
    return Rate(n / elapsed, daemon_cpu / n * 1e3, client_cpu / n * 1e3)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def held_rss(held: int) -> tuple[int, int]:
    """(idle RSS, RSS holding ``held`` running tasks), KiB."""
    with daemon("--max-running", str(held), "--max-running-per-uid", str(held),
                "--max-queued-per-uid", str(held)) as (sock, proc):
        with Client(sock) as c:
            c.wait(c.submit(["/bin/true"]).id)
            idle = rss_kib(proc.pid)
            ids = [c.submit(["sleep", "600"], grace="0").id for _ in range(held)]
            deadline = time.monotonic() + 120
            while c.limits()["daemon"]["running"] < held:
                if time.monotonic() > deadline:
                    raise SystemExit("the tasks did not all start within 120 s")
                time.sleep(0.2)
            time.sleep(1)
            full = rss_kib(proc.pid)
            for i in ids:
                c.stop(i, force=True)
        return idle, full


def startup(sock: str, n: int, venv: str | None = None) -> tuple[float, float, float]:
    """Medians: ``corral ps``, ``python -c pass``, one list request in-process (seconds);
    with ``venv``, that installation's ``corral`` and ``python``.

    Bytecode is compiled first, as an installed package has it: with
    PYTHONDONTWRITEBYTECODE=1 in the environment every start would compile the client."""
    import compileall

    import supervisor

    compileall.compile_dir(os.path.dirname(supervisor.__file__), quiet=1)
    if venv is not None:
        ps, python = [os.path.join(venv, "bin", "corral"), "ps"], os.path.join(venv, "bin",
                                                                                "python")
    else:
        ps = [SCRIPT, "ps"] if os.access(SCRIPT, os.X_OK) else [*CORRAL, "ps"]
        python = sys.executable
    env = dict(os.environ, CORRAL_SOCKET=sock)
    env.pop("PYTHONPATH", None)

    def timed(argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t0

    ours, base = [], []
    for _ in range(n):
        ours.append(timed(ps))
        base.append(timed([python, "-c", "pass"]))
    with Client(sock) as c:
        req = []
        for _ in range(n):
            t0 = time.perf_counter()
            c.list()
            req.append(time.perf_counter() - t0)
    return median(ours), median(base), median(req)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--held", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--venv", metavar="DIR", help="also time `corral ps` of the corral "
                   "installed (pip install, not -e) in this virtual environment")
    p.add_argument("--only", metavar="PARTS", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default all): {', '.join(PARTS)}")
    args = p.parse_args()
    only = set(args.only.split(","))
    if only - set(PARTS):
        p.error(f"--only: unknown parts {sorted(only - set(PARTS))}; known: {PARTS}")
    run_parts(args, only)


PARTS = ("latency", "rate", "records", "startup", "rss")


def run_parts(args: argparse.Namespace, only: set[str]) -> None:
    print(raise_nofile(args.held * 8 + 1000))
    print(compile_project())
    per_client = max(20, args.rounds * 2 // args.clients)
    starts = {}
    with daemon("--max-running", str(args.clients)) as (sock, proc):
        if "latency" in only:
            lat = paired_latency(sock, args.rounds)
        if "rate" in only:
            rate = throughput(sock, args.clients, per_client, proc.pid)
            base_rate = in_process_rate(args.clients, per_client * args.clients)
        if "startup" in only:
            starts["checkout"] = startup(sock, 30)
            if args.venv:
                starts["installed"] = startup(sock, 30, args.venv)
    if "latency" in only:
        report_latency(*lat)
    if "rate" in only:
        print(f"tasks/s at {args.clients} concurrent: socket {rate.per_s:.0f}/s, in-process "
              f"{base_rate.per_s:.0f}/s: {fmt_ratio(rate.per_s, base_rate.per_s)} (target "
              f">= 0.7x: {'met' if rate.per_s >= 0.7 * base_rate.per_s else 'NOT met'})")
        print(f"  CPU per task: the daemon {rate.cpu_ms:.2f} ms (its tasks' included) + its "
              f"clients {rate.client_cpu_ms:.2f} ms, in-process {base_rate.cpu_ms:.2f} ms; "
              f"rate x CPU: {rate.per_s * (rate.cpu_ms + rate.client_cpu_ms) / 1e3:.2f} and "
              f"{base_rate.per_s * base_rate.cpu_ms / 1e3:.2f} cores busy of "
              f"{os.cpu_count()}")
    if "records" in only:
        report_records(records_cost(max(64, args.rounds)))
    for where, (ps, py, req) in starts.items():
        print(f"corral ps start-up ({where}) {ps * 1e3:.1f} ms; python -c pass {py * 1e3:.1f} "
              f"ms + request {req * 1e3:.2f} ms = {(py + req) * 1e3:.1f} ms: "
              f"{fmt_ratio(ps, py + req)} (target 1.3x)")
    if "rss" in only:
        report_rss(args.held)


def report_rss(held: int) -> None:
    idle, full = held_rss(held)
    print(f"daemon RSS: idle {idle / 1024:.1f} MiB, holding {held} running tasks "
          f"{full / 1024:.1f} MiB ({(full - idle) / held:.1f} KiB per task); target "
          f"64 MiB: {'met' if full <= 64 * 1024 else 'NOT met'}")


def report_latency(base_lat: list[float], logged_lat: list[float],
                   sock_lat: list[float]) -> None:
    b, lg, o = median(base_lat), median(logged_lat), median(sock_lat)
    print(f"submit-to-result /bin/true, {len(sock_lat)} paired rounds: socket {o * 1e3:.2f} "
          f"ms, in-process sup.run {b * 1e3:.2f} ms: {fmt_ratio(o, b)} (paired "
          f"{paired_ratio(sock_lat, base_lat):.2f}x); target in-process + 1.5 ms = "
          f"{(b + 1.5e-3) * 1e3:.2f} ms: {'met' if o <= b + 1.5e-3 else 'NOT met'}")
    print(f"  in-process sup.run with a log file per stream (as every daemon task) "
          f"{lg * 1e3:.2f} ms: the socket costs {fmt_ratio(o, lg)} of that (paired "
          f"{paired_ratio(sock_lat, logged_lat):.2f}x)")


def report_records(cost: dict[tuple[str, int], float]) -> None:
    full1, norm1 = cost[("FULL", 1)], cost[("NORMAL", 1)]
    full16, norm16 = cost[("FULL", 16)], cost[("NORMAL", 16)]
    print(f"records per task (accept + running + end rows): synchronous=FULL "
          f"{full1 * 1e3:.2f} ms one at a time, {full16 * 1e3:.2f} ms at 16 concurrent "
          f"(group commit: {fmt_ratio(full1, full16)} fewer per task); NORMAL "
          f"{norm1 * 1e3:.2f} / {norm16 * 1e3:.2f} ms: durability costs "
          f"{(full1 - norm1) * 1e3:.2f} ms per task alone, {(full16 - norm16) * 1e3:.2f} ms "
          f"at 16")


if __name__ == "__main__":
    main()
