"""``corral serve`` against the library in-process, ratios in one run.

    python benchmarks/bench_serve.py [--rounds N] [--held N] [--clients N]

1. submit-to-result of /bin/true over the socket (submit + wait, the Python client) against
   ``sup.run(["/bin/true"])`` in-process; target <= 1.5x + 1 ms.
2. tasks/s with 16 concurrent clients (processes, one connection each) against 16
   concurrent ``sup.run`` in one trio program.
3. the daemon's RSS holding 1000 running tasks (``sleep``); target <= 64 MiB.
4. ``corral ps`` start-up against ``python -c pass`` plus one request; target <= 1.3x.

Each daemon gets a scratch cgroup and a temporary socket and state directory; everything is
stopped and removed at the end, Ctrl-C included.
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
from _common import fmt_ratio, median, paired_ratio, raise_nofile, scratch_cgroup

from supervisor.client import Client

CORRAL = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
SCRIPT = os.path.join(os.path.dirname(sys.executable), "corral")


@contextmanager
def daemon(*extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with scratch_cgroup("serve") as cg:
        # (not /tmp: a crowded /tmp makes each file creation cost ~0.5 ms here)
        tmp = tempfile.mkdtemp(prefix="corral-bench-serve-", dir="/var/tmp")
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


def paired_latency(sock: str, n: int) -> tuple[list[float], list[float]]:
    """Rounds of one ``sup.run(/bin/true)`` in-process and one submit+wait over the socket,
    taken moments apart (a slow spell on this shared box hits both)."""
    import trio

    import supervisor

    async def main(path: str) -> tuple[list[float], list[float]]:
        base: list[float] = []
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
                    far = await trio.to_thread.run_sync(remote)
                    if i >= 10:  # warm-up rounds dropped
                        base.append(local)
                        ours.append(far)
        return base, ours

    with scratch_cgroup("serve-base") as cg:
        return trio.run(main, cg.path)


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


def startup(sock: str, n: int) -> tuple[float, float, float]:
    """Medians: ``corral ps``, ``python -c pass``, one list request in-process (seconds).

    Bytecode is compiled first, as an installed package has it: with
    PYTHONDONTWRITEBYTECODE=1 in the environment every start would compile the client."""
    import compileall

    import supervisor

    compileall.compile_dir(os.path.dirname(supervisor.__file__), quiet=1)
    ps = [SCRIPT, "ps"] if os.access(SCRIPT, os.X_OK) else [*CORRAL, "ps"]
    env = dict(os.environ, CORRAL_SOCKET=sock)

    def timed(argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t0

    ours, base = [], []
    for _ in range(n):
        ours.append(timed(ps))
        base.append(timed([sys.executable, "-c", "pass"]))
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
    args = p.parse_args()
    print(raise_nofile(args.held * 8 + 1000))
    per_client = max(20, args.rounds * 2 // args.clients)
    with daemon("--max-running", str(args.clients)) as (sock, _):
        base_lat, sock_lat = paired_latency(sock, args.rounds)
        rate = throughput(sock, args.clients, per_client)
        base_rate = in_process_rate(args.clients, per_client * args.clients)
        ps, py, req = startup(sock, 30)
    b, o = median(base_lat), median(sock_lat)
    print(f"submit-to-result /bin/true, {args.rounds} paired rounds: socket {o * 1e3:.2f} ms, "
          f"in-process sup.run {b * 1e3:.2f} ms: {fmt_ratio(o, b)} (paired "
          f"{paired_ratio(sock_lat, base_lat):.2f}x); target 1.5x + 1 ms = "
          f"{(1.5 * b + 1e-3) * 1e3:.2f} ms: {'met' if o <= 1.5 * b + 1e-3 else 'NOT met'}")
    print(f"tasks/s at {args.clients} concurrent: socket {rate:.0f}/s, in-process "
          f"{base_rate:.0f}/s: {fmt_ratio(rate, base_rate)}")
    print(f"corral ps start-up {ps * 1e3:.1f} ms; python -c pass {py * 1e3:.1f} ms + request "
          f"{req * 1e3:.2f} ms = {(py + req) * 1e3:.1f} ms: {fmt_ratio(ps, py + req)} "
          f"(target 1.3x)")
    idle, full = held_rss(args.held)
    print(f"daemon RSS: idle {idle / 1024:.1f} MiB, holding {args.held} running tasks "
          f"{full / 1024:.1f} MiB ({(full - idle) / args.held:.1f} KiB per task); target "
          f"64 MiB: {'met' if full <= 64 * 1024 else 'NOT met'}")


if __name__ == "__main__":
    main()
