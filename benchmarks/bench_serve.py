"""``corral serve`` against the library in-process, ratios in one run.

    python benchmarks/bench_serve.py [--rounds N] [--held N] [--clients N] [--venv DIR]
                                     [--only latency,rate,records,startup,rss]

1. submit-to-result of /bin/true over the socket (submit + wait, the Python client) against
   ``sup.run(["/bin/true"])`` in-process; target <= 1.5x + 1 ms.  Also against
   ``sup.run`` with a log file per stream (what the daemon asks of the core for every task,
   to keep output for reattach): the share of the gap that is the daemon's own.
2. tasks/s with 16 concurrent clients (processes, one connection each) against 16
   concurrent ``sup.run`` in one trio program.
3. the records alone (in-process ``Records``, a task's accept, running and end rows): per
   task at concurrency 1 and 16, ``synchronous=FULL`` (the daemon's) against ``NORMAL`` (no
   fsync per commit): what durability costs, and what group commit wins back.
4. the daemon's RSS holding 1000 running tasks (``sleep``); target <= 64 MiB.
5. ``corral ps`` start-up against ``python -c pass`` plus one request; target <= 1.3x.
   ``--venv DIR``: also for a normal (not editable) install in DIR (an editable checkout pays
   for setuptools' import hook at every start, which an install does not).

Each daemon gets a scratch cgroup and a temporary socket and state directory (in /var/lib,
where the daemon's records live: on this machine a file created in /var/tmp costs ~1 ms, in
/var/lib ~0.02 ms, and the daemon creates two output files per task); everything is stopped and
removed at the end, Ctrl-C included.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import compile_project, fmt_ratio, median, paired_ratio, raise_nofile, scratch_cgroup

from supervisor.client import Client

CORRAL = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
SCRIPT = os.path.join(os.path.dirname(sys.executable), "corral")
STATE_PARENT = "/var/lib"  # where the daemon's records live by default (/var/lib/corral)


@contextmanager
def daemon(*extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with scratch_cgroup("serve") as cg:
        tmp = tempfile.mkdtemp(prefix="corral-bench-serve-", dir=STATE_PARENT)
        sock = os.path.join(tmp, "sock")
        proc = subprocess.Popen([*CORRAL, "serve", "--socket", sock, "--state-dir",
                                 os.path.join(tmp, "state"), "--cgroup-root", cg.path,
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
    and one submit+wait over the socket, taken moments apart (a slow spell on this shared box
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
                c.wait(c.submit(["/bin/true"]).id)
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


def in_process_rate(concurrency: int, total: int) -> float:
    import trio

    import supervisor

    async def main(path: str) -> float:
        async with supervisor.open_supervisor(path) as sup:

            async def worker(k: int) -> None:
                for _ in range(k):
                    await sup.run(["/bin/true"])

            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker, total // concurrency)
            return (total // concurrency * concurrency) / (time.perf_counter() - t0)

    with scratch_cgroup("serve-rate") as cg:
        return trio.run(main, cg.path)


def throughput(sock: str, clients: int, per_client: int) -> float:
    """Tasks/s with ``clients`` client processes (forked: threads would measure the GIL of
    one client process more than the daemon), each submit+wait in a loop."""
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
                        c.wait(c.submit(["/bin/true"]).id)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    time.sleep(0.5)
    t0 = time.perf_counter()
    os.write(go_w, b"x" * clients)
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
    elapsed = time.perf_counter() - t0
    os.close(go_r)
    os.close(go_w)
    if failed:
        raise SystemExit(f"{failed} client processes failed")
    return clients * per_client / elapsed


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def held_rss(held: int) -> tuple[int, int]:
    """(idle RSS, RSS holding ``held`` running tasks), KiB."""
    with daemon("--max-running", str(held), "--max-queued-per-uid", str(held)) as (sock, proc):
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
    with daemon("--max-running", str(args.clients)) as (sock, _):
        if "latency" in only:
            lat = paired_latency(sock, args.rounds)
        if "rate" in only:
            rate = throughput(sock, args.clients, per_client)
            base_rate = in_process_rate(args.clients, per_client * args.clients)
        if "startup" in only:
            starts["checkout"] = startup(sock, 30)
            if args.venv:
                starts["installed"] = startup(sock, 30, args.venv)
    if "latency" in only:
        report_latency(*lat)
    if "rate" in only:
        print(f"tasks/s at {args.clients} concurrent: socket {rate:.0f}/s, in-process "
              f"{base_rate:.0f}/s: {fmt_ratio(rate, base_rate)}")
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
          f"{paired_ratio(sock_lat, base_lat):.2f}x); target 1.5x + 1 ms = "
          f"{(1.5 * b + 1e-3) * 1e3:.2f} ms: {'met' if o <= 1.5 * b + 1e-3 else 'NOT met'}")
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
