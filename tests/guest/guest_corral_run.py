"""`corral run` and the supervisor with real limits: OOM kills, fork loops, usage figures.

Runs inside the user-mode Linux guest (every controller); see tests/guest/conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

import supervisor

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
HOG = ("import sys; b = bytearray(int(sys.argv[1]) << 20); "
       "b[::4096] = b'x' * (len(b) // 4096); print('survived')")


def corral_run(*args: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp / "result.json"
    r = subprocess.run([CORRAL, "run", "--json-file", str(out), *args], capture_output=True,
                       text=True, timeout=120)
    return r, json.loads(out.read_text()) if out.exists() else {}


def test_memory_max_ends_a_hog_oom_killed_with_137(tmp_path: Path) -> None:
    r, result = corral_run("-p", "MemoryMax=24M", "-p", "MemorySwapMax=0", "--",
                           sys.executable, "-c", HOG, "64", tmp=tmp_path)
    assert r.returncode == 137, r.stderr
    assert "survived" not in r.stdout
    assert "finished with result: oom_killed" in r.stderr and "OOM kills:" in r.stderr
    assert result["outcome"] == "oom_killed" and result["exit"]["signal"] == 9
    assert result["usage"]["oom_kills"] >= 1
    assert result["usage"]["memory_peak_bytes"] <= 24 << 20
    assert result["cleanup"]["state"] == "clean"


def test_tasks_max_stops_a_fork_loop_at_the_limit(tmp_path: Path) -> None:
    r, result = corral_run("-p", "TasksMax=16", "--summary", "--", "sh", "-c",
                           "for i in $(seq 40); do sleep 1 & done; wait", tmp=tmp_path)
    assert result["usage"]["pids_peak"] == 16, r.stderr
    assert "fork" in r.stderr.lower()  # the shell said it could not fork
    assert "Tasks peak: 16" in r.stderr
    assert result["cleanup"]["state"] == "clean"


def test_limits_within_bounds_let_the_task_succeed_and_report_usage(tmp_path: Path) -> None:
    r, result = corral_run("-p", "MemoryMax=64M", "-p", "TasksMax=32", "-p", "CPUQuota=50%",
                           "-p", "CPUWeight=50", "--", sys.executable, "-c", HOG, "8",
                           tmp=tmp_path)
    assert r.returncode == 0 and r.stdout == "survived\n", r.stderr
    u = result["usage"]
    assert u["memory_peak_bytes"] >= 8 << 20 and u["pids_peak"] >= 1 and u["oom_kills"] == 0
    assert u["cpu_total_s"] > 0
    assert sorted(result["containment"]["controllers"]) == ["cpu", "io", "memory", "pids"]


def test_supervisor_reports_oom_killed_through_the_library() -> None:
    async def main() -> supervisor.TaskResult:
        async with supervisor.open_supervisor() as sup:
            assert {"memory", "pids"} <= sup.controllers
            return await sup.run([sys.executable, "-c", HOG, "64"],
                                 limits=supervisor.Limits(memory_max=24 << 20,
                                                          memory_swap_max=0))

    r = trio.run(main)
    assert r.outcome == "oom_killed" and r.signal == 9
    assert r.usage.oom_kills and r.usage.oom_kills >= 1
    assert r.cleanup == "clean"
