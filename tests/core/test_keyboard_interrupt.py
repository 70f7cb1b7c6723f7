"""Ctrl-C in a library user's program: trio raises KeyboardInterrupt in the main task, whatever
shields are up.  The task must still be stopped, recorded once, and its leaf removed."""

from __future__ import annotations

import json
import subprocess
import sys

import cgroupfs

PROGRAM = """
import json, os, signal, sys, threading, trio, supervisor

async def main(root):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            await sup.run(["sh", "-c", "echo $$; exec sleep 60"], grace="5s")
        finally:
            (r,) = sup.results.values()
            print(json.dumps({"outcome": str(r.outcome), "signal": r.signal,
                              "cleanup": str(r.cleanup), "stop": str(r.stop.reason),
                              "pid": int(r.stdout)}), flush=True)

try:
    trio.run(main, sys.argv[1])
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
"""


def test_ctrl_c_stops_records_and_then_propagates(test_cgroup: cgroupfs.Cgroup) -> None:
    # -P: the installed package, not the checkout's uncompiled supervisor/ in the cwd
    r = subprocess.run([sys.executable, "-P", "-c", PROGRAM, test_cgroup.path],
                       capture_output=True, text=True, timeout=60)
    record, last = r.stdout.splitlines()
    assert last == "KeyboardInterrupt", r.stderr  # as itself, not wrapped in a group
    data = json.loads(record)
    assert data["outcome"] == "cancelled" and data["signal"] == 15  # gracefully: SIGTERM
    assert data["cleanup"] == "clean" and data["stop"] == "cancel"
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()
