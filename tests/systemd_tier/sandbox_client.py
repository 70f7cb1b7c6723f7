"""Runs inside the systemd sandbox: asks supervisor.placement.systemd for scopes; reports JSON.

    python sandbox_client.py create [--bus B] [--name N] [--layout] [--stray] [--hold]
    python sandbox_client.py twice  [--bus B]         # the same name twice: the error, as JSON
    python sandbox_client.py measure N

``create`` prints one JSON line (the ScopeInfo plus what this process sees), then with
``--hold`` waits for a line on stdin before exiting, so the test can look at the live scope.
``--layout`` makes what the supervisor makes below its scope (``supervisor/`` holding this
process, ``tasks/t1``); ``--stray`` also leaves a ``sleep`` running in ``tasks/t1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from supervisor.placement import systemd as _systemd


def _v2_line() -> str:
    with open("/proc/self/cgroup") as f:
        return next(line.strip() for line in f if line.startswith("0::"))


async def create(args: argparse.Namespace) -> None:
    info = await _systemd.create_delegated_scope(os.getpid(), bus=args.bus, name=args.name)
    out: dict[str, object] = {**dataclasses.asdict(info), "proc_cgroup": _v2_line(),
                              "running": _systemd.systemd_running(),
                              "version": await _systemd.probe(args.bus)}
    probe = os.path.join(info.cgroup, "probe")
    os.mkdir(probe)
    os.rmdir(probe)
    out["writable"] = True
    if args.layout or args.stray:
        for sub in ("supervisor", "tasks", "tasks/t1"):
            os.mkdir(os.path.join(info.cgroup, sub))
        with open(os.path.join(info.cgroup, "supervisor", "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        out["proc_cgroup_after_move"] = _v2_line()
    if args.stray:
        leaf = os.path.join(info.cgroup, "tasks", "t1")
        stray = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {leaf}/cgroup.procs && exec sleep 300'],
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 5
        while str(stray.pid) not in Path(leaf, "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline, "the stray never reached its leaf"
            time.sleep(0.01)
        out["stray_pid"] = stray.pid
    print(json.dumps(out), flush=True)
    if args.hold:
        sys.stdin.readline()


async def twice(args: argparse.Namespace) -> None:
    first = await _systemd.create_delegated_scope(os.getpid(), bus=args.bus)
    try:
        await _systemd.create_delegated_scope(os.getpid(), bus=args.bus, name=first.unit)
    except _systemd.SystemdError as e:
        print(json.dumps({"unit": first.unit, "message": str(e), "socket": e.socket,
                          "error_unit": e.unit, "dbus_name": e.dbus_name}))
    else:
        print(json.dumps({"unit": first.unit, "message": None}))


async def measure(args: argparse.Namespace) -> None:
    ours = []
    for _ in range(args.n):
        t = time.perf_counter()
        await _systemd.create_delegated_scope(os.getpid())
        ours.append(time.perf_counter() - t)
    theirs = []
    for _ in range(args.n):
        t = time.perf_counter()
        subprocess.run(["systemd-run", "--quiet", "--scope", "true"], check=True)
        theirs.append(time.perf_counter() - t)
    print(json.dumps({"n": args.n, "create_delegated_scope_ms": statistics.median(ours) * 1e3,
                      "systemd_run_scope_true_ms": statistics.median(theirs) * 1e3}))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("create")
    p.add_argument("--bus", default="auto")
    p.add_argument("--name")
    p.add_argument("--layout", action="store_true")
    p.add_argument("--stray", action="store_true")
    p.add_argument("--hold", action="store_true")
    p = sub.add_parser("twice")
    p.add_argument("--bus", default="auto")
    p = sub.add_parser("measure")
    p.add_argument("n", type=int)
    args = parser.parse_args()
    trio.run({"create": create, "twice": twice, "measure": measure}[args.cmd], args)


if __name__ == "__main__":
    main()
