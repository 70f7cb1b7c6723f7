"""How cost grows: the work grown step by step, ours against the baseline measured beside it.

    python benchmarks/bench_growth.py [--quick] [--plot FILE.svg|FILE.png] [--only PARTS]

Parts (``--only``, comma-separated):

- ``rate``: tasks/s of ``/bin/true`` at concurrency 1, 4, 16, 64, 256: the library (one
  in-process supervisor, that many trio tasks each running ``sup.run`` in a loop) and the
  daemon (that many client processes, each ``Client.submit(wait=...)`` in a loop: one request
  a task).  Per task, flat is the goal: a rate that stops growing with the concurrency says
  where the first shared thing is (2 cores here: past 2 at once, a rate can only hold).
- ``held``: the daemon's VmRSS idle, holding 1,000 and 10,000 running tasks (``sleep``), and
  with 1,000 idle sessions: KiB per task and per session (flat: the same at both sizes).
- ``records``: ``GET /v1/tasks?limit=100`` (the Python client) and ``corral ps`` (the command,
  a new process each time) against a daemon whose records hold 1,000 and 100,000 finished
  tasks (rows made in its SQLite file before it starts, each as a real task's: its request
  and its kept result); the goal: the same at both sizes (a listing reads a page, not the
  table).
- ``bytes``: SQLite bytes per finished task: 500 tasks of ``echo hi`` through the daemon,
  then the database file's size after a checkpoint and VACUUM, per task.

``--quick``: fewer tasks and the smaller sizes only (10,000 held tasks become 2,000,
100,000 records 10,000).  ``--plot``: the figures as one figure (matplotlib, the ``plot``
extra), one panel per part.  Nothing is asserted about time.  Each daemon gets a scratch
cgroup and a temporary state directory in /var/lib, stopped (SIGTERM) and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import host_note, raise_nofile
from bench_serve import SCRIPT, daemon, in_process_rate, rss_kib, throughput

from supervisor.client import Client

PARTS = ("rate", "held", "records", "bytes")
CONCURRENCY = (1, 4, 16, 64, 256)
# a running task's fds in the daemon: its pidfd, its leaf's directory, two pipes' read ends,
# two output files (made at each stream's first byte: a silent task holds four)
FDS_A_TASK = 6


# ---- rate --------------------------------------------------------------------------------------

def part_rate(quick: bool) -> dict[str, Any]:
    levels = CONCURRENCY[:4] if quick else CONCURRENCY
    out: dict[str, Any] = {"concurrency": list(levels), "library": [], "daemon": []}
    top = str(max(levels))
    with daemon("--max-running", top, "--max-running-per-uid", top, "--max-queued-per-uid",
                str(4 * max(levels)), "--max-connections-per-uid", str(2 * max(levels))
                ) as (sock, proc):
        for c in levels:
            total = max(c * (4 if quick else 8), 200 if quick else 600)
            lib = in_process_rate(c, total)
            dmn = throughput(sock, c, max(1, total // c), proc.pid)
            out["library"].append(lib.per_s)
            out["daemon"].append(dmn.per_s)
            out.setdefault("library_cpu_ms", []).append(lib.cpu_ms)
            out.setdefault("daemon_cpu_ms", []).append(dmn.cpu_ms + dmn.client_cpu_ms)
            print(f"  concurrency {c:>3}: library {lib.per_s:7.0f}/s, daemon {dmn.per_s:7.0f}/s "
                  f"({dmn.per_s / lib.per_s:.2f}x the library); CPU a task: library "
                  f"{lib.cpu_ms:.2f} ms, daemon {dmn.cpu_ms:.2f} + clients "
                  f"{dmn.client_cpu_ms:.2f} ms", flush=True)
    return out


# ---- held --------------------------------------------------------------------------------------

def part_held(quick: bool) -> dict[str, Any]:
    sizes = (1000, 2000) if quick else (1000, 10000)
    top = max(sizes)
    print(f"  {raise_nofile(FDS_A_TASK * top + 1000)}", flush=True)
    room = (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1000) // FDS_A_TASK
    if room < top:  # (without CAP_SYS_RESOURCE even root cannot raise its hard limit)
        print(f"  {top} running tasks need {FDS_A_TASK * top + 1000} fds of the daemon; the "
              f"limit here allows {room}: measured at that many instead", flush=True)
        top = room
        sizes = (min(sizes[0], room // 2), room)
    out: dict[str, Any] = {"tasks": list(sizes), "task_kib": [], "sessions": 1000}
    with daemon("--max-running", str(top), "--max-running-per-uid", str(top),
                "--max-queued", str(top), "--max-queued-per-uid", str(top)) as (sock, proc), \
            Client(sock) as c:
        c.submit(["/bin/true"], wait=30)
        idle = rss_kib(proc.pid)
        out["idle_kib"] = idle
        held = 0
        for size in sizes:
            while held < size:
                c.submit(["sleep", "3600"], grace="0")
                held += 1
            _wait_running(c, size)
            time.sleep(1)
            rss = rss_kib(proc.pid)
            out["task_kib"].append(rss)
            print(f"  {size} running tasks: RSS {rss / 1024:.1f} MiB, "
                  f"{(rss - idle) / size:.2f} KiB a task", flush=True)
        for t in _every(c, "running"):
            c.stop(t.id, force=True)
        _wait_running(c, 0)
    with daemon() as (sock, proc), Client(sock) as c:
        c.submit(["/bin/true"], wait=30)
        idle = rss_kib(proc.pid)
        for _ in range(1000):
            c.open_session(cwd="/")
        time.sleep(0.5)
        rss = rss_kib(proc.pid)
        out["session_kib"] = [idle, rss]
        print(f"  1000 idle sessions: RSS {idle / 1024:.1f} -> {rss / 1024:.1f} MiB, "
              f"{(rss - idle) / 1000:.2f} KiB a session", flush=True)
    return out


def _wait_running(c: Client, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while (running := c.limits()["daemon"]["running"]) != n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{running} tasks running, not {n}, after {timeout:g} s")
        time.sleep(0.2)


def _every(c: Client, state: str) -> list[Any]:
    found, before = [], None
    while True:
        page = c.list(state, limit=1000, before=before)
        found += page
        if len(page) < 1000:
            return found
        before = page[-1].id


# ---- records -----------------------------------------------------------------------------------

def _sample_rows(sock: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A real finished task's row and request, as the daemon wrote them."""
    with Client(sock) as c:
        t = c.submit(["sh", "-c", "echo a typical task; echo its error >&2"], wait=30)
    state = os.path.join(os.path.dirname(sock), "state", "state.db")
    db = sqlite3.connect(state)
    db.row_factory = sqlite3.Row
    row = dict(db.execute("SELECT * FROM tasks WHERE seq = ?", (int(t.id),)).fetchone())
    req = dict(db.execute("SELECT * FROM requests WHERE seq = ?", (int(t.id),)).fetchone())
    db.close()
    return row, req


def _fill(state_db: str, row: dict[str, Any], req: dict[str, Any], n: int) -> None:
    """``n`` finished tasks like ``row`` in the records (the daemon stopped meanwhile)."""
    db = sqlite3.connect(state_db)
    names = [k for k in row if k != "seq"]
    first = db.execute("SELECT coalesce(max(seq), 0) FROM tasks").fetchone()[0] + 1
    rows = ((first + i, *[row[k] if k != "idempotency_key" else None for k in names])
            for i in range(n))
    db.executemany(f"INSERT INTO tasks (seq, {', '.join(names)}) VALUES "
                   f"({', '.join('?' * (len(names) + 1))})", rows)
    db.executemany("INSERT INTO requests (seq, spec) VALUES (?, ?)",
                   ((first + i, req["spec"]) for i in range(n)))
    db.commit()
    db.close()


def _listing_ms(sock: str, rounds: int) -> tuple[float, float]:
    with Client(sock) as c:
        c.list(limit=100)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            assert len(c.list(limit=100)) == 100
            times.append((time.perf_counter() - t0) * 1e3)
    ps = []
    env = dict(os.environ, CORRAL_SOCKET=sock)
    for _ in range(max(5, rounds // 4)):
        t0 = time.perf_counter()
        subprocess.run([SCRIPT, "ps"], env=env, check=True, capture_output=True)
        ps.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), statistics.median(ps)


def part_records(quick: bool) -> dict[str, Any]:
    sizes = (1000, 10000) if quick else (1000, 100000)
    out: dict[str, Any] = {"records": list(sizes), "list_ms": [], "ps_ms": []}
    keep = ("--retain-count", "infinity", "--retain-bytes", "infinity")
    with daemon(*keep) as (sock, _):
        row, req = _sample_rows(sock)
    for size in sizes:
        list_ms, ps_ms = _records_round(row, req, size, keep)
        out["list_ms"].append(list_ms)
        out["ps_ms"].append(ps_ms)
        print(f"  {size} finished records: GET /v1/tasks?limit=100 {list_ms:.2f} ms, "
              f"corral ps {ps_ms:.1f} ms", flush=True)
    return out


def _records_round(row: dict[str, Any], req: dict[str, Any], size: int,
                   keep: tuple[str, ...]) -> tuple[float, float]:
    """A daemon started on records of ``size`` finished tasks: its listing's latencies."""
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="corral-bench-growth-", dir="/var/lib")
    try:
        # the records made by a daemon of their own (the schema), then filled, then served
        with daemon(*keep, state_dir=os.path.join(tmp, "state")) as (sock, _), \
                Client(sock) as c:
            c.submit(["true"], wait=30)
        _fill(os.path.join(tmp, "state", "state.db"), row, req, size - 1)
        with daemon(*keep, state_dir=os.path.join(tmp, "state")) as (sock, _proc):
            return _listing_ms(sock, 40)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- bytes -------------------------------------------------------------------------------------

# an agent's shell's environment, about as large as a login's here (~2.5 KiB of JSON)
SESSION_ENV = {**{k: v for k, v in os.environ.items() if k.isidentifier()},
               **{f"CI_VARIABLE_{i}": "x" * 40 for i in range(40)}}


def part_bytes(quick: bool) -> dict[str, Any]:
    """SQLite bytes per finished task: ``echo hi`` tasks, then as many commands of one session
    opened with an environment of ``SESSION_ENV``'s size (each command's request carries it)."""
    n = 200 if quick else 500
    out: dict[str, Any] = {}
    for label, run in (("tasks", _echo_tasks), ("session commands", _session_commands)):
        per, json_per = _bytes_per_row(run, n)
        print(f"  {n} finished {label}: {per / 1024:.2f} KiB a task after VACUUM (of which "
              f"result and request JSON {json_per / 1024:.2f} KiB)", flush=True)
        out[label] = {"tasks": n, "bytes_per_task": per, "json_per_task": json_per}
    env = len(json.dumps(SESSION_ENV)) / 1024
    print(f"  (the session's environment: {len(SESSION_ENV)} variables, {env:.2f} KiB of JSON)")
    return {"tasks": n, "bytes_per_task": out["tasks"]["bytes_per_task"],
            "json_per_task": out["tasks"]["json_per_task"],
            "session_bytes_per_task": out["session commands"]["bytes_per_task"]}


def _echo_tasks(c: Client, n: int) -> None:
    for _ in range(n):
        c.submit(["echo", "hi"], wait=30)


def _session_commands(c: Client, n: int) -> None:
    s = c.open_session(env=SESSION_ENV)
    for _ in range(n):
        c.exec(s["id"], "echo hi", wait=30)
    c.close_session(s["id"])


def _bytes_per_row(run: Any, n: int) -> tuple[float, float]:
    """(bytes of state.db per task row after VACUUM, of which its result and request JSON)
    once ``run(client, n)`` has made ``n`` finished tasks on a daemon of its own."""
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="corral-bench-growth-", dir="/var/lib")
    try:
        state = os.path.join(tmp, "state")
        with daemon(state_dir=state) as (sock, _proc), Client(sock) as c:
            run(c, n)
        db = sqlite3.connect(os.path.join(state, "state.db"))
        db.execute("VACUUM")
        size = os.path.getsize(os.path.join(state, "state.db"))
        rows = db.execute("SELECT count(*) FROM tasks").fetchone()[0]
        row_bytes = db.execute("SELECT sum(length(result)) + sum(length(r.spec)) FROM tasks t "
                               "JOIN requests r ON r.seq = t.seq").fetchone()[0]
        db.close()
        return size / rows, row_bytes / rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- the figure --------------------------------------------------------------------------------

def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in ("rate", "held", "records") if p in results]
    fig, axes = plt.subplots(1, len(parts), figsize=(5 * len(parts), 4), layout="constrained")
    axes = [axes] if len(parts) == 1 else list(axes)
    for ax, part in zip(axes, parts, strict=True):
        r = results[part]
        if part == "rate":
            ax.plot(r["concurrency"], r["library"], "o-", label="library (in-process)")
            ax.plot(r["concurrency"], r["daemon"], "s-", label="corral serve")
            ax.set_xscale("log", base=2)
            ax.set(xlabel="tasks at once", ylabel="tasks/s", title="/bin/true, tasks/s")
        elif part == "held":
            per = [(k - r["idle_kib"]) / n for k, n in zip(r["task_kib"], r["tasks"],
                                                            strict=True)]
            ax.plot(r["tasks"], per, "o-", label="KiB per running task")
            idle, full = r["session_kib"]
            ax.axhline((full - idle) / r["sessions"], color="gray", ls="--",
                       label="KiB per idle session (1000)")
            ax.set_xscale("log")
            ax.set(xlabel="running tasks held", ylabel="daemon RSS, KiB each",
                   title="memory per held task")
        else:
            ax.plot(r["records"], r["list_ms"], "o-", label="GET /v1/tasks?limit=100")
            ax.plot(r["records"], r["ps_ms"], "s-", label="corral ps (a new process)")
            ax.set_xscale("log")
            ax.set(xlabel="finished records", ylabel="ms", title="a listing")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle(host_note().strip("[]"), fontsize=8)
    fig.savefig(path)
    print(f"figure: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plot", metavar="FILE")
    ap.add_argument("--only", default=",".join(PARTS))
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    only = args.only.split(",")
    if set(only) - set(PARTS):
        ap.error(f"--only: known parts are {', '.join(PARTS)}")
    print(f"growth benchmark ({'quick' if args.quick else 'full'})\n{host_note()}", flush=True)
    results: dict[str, Any] = {}
    for part in only:
        print(f"{part}:", flush=True)
        results[part] = globals()[f"part_{part}"](args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    print(f"  at the end: {host_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
