"""Usage over time with every controller: the series follow the task, memory.events after a
squeeze, and `corral run --summary` draws every series as sparklines.

Runs inside the user-mode Linux guest (see tests/guest/conftest.py).  IO is counted per block
device (io.stat), and the guest's files live on hostfs and tmpfs, which have none: the IO tests
write to a RAM disk (brd, loaded from the UML kernel's modules).  Memory stays at tens of MiB
(page faults are slow here), and each task runs a few seconds at most.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from guestutil import CONTROLLERS, MiB, wait_until

import supervisor
from cgroupfs import Cgroup

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
RAM_DISK = "/dev/ram0"
SPARK = set("▁▂▃▄▅▆▇█")

# Allocates N MiB in steps of STEP MiB (every page touched), PAUSE s apart, then holds it
# HOLD s (the fourth argument, 0 if none) before it prints and exits.
STEPS = ("import sys, time\n"
         "total, step, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])\n"
         "hold = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0\n"
         "held = []\n"
         "for _ in range(total // step):\n"
         "    b = bytearray(step << 20); b[::4096] = b'x' * (len(b) // 4096); held.append(b)\n"
         "    time.sleep(pause)\n"
         "time.sleep(hold)\n"
         "print('survived', flush=True)\n")


@pytest.fixture(scope="module")
def ram_disk() -> str:
    """A 16 MiB block device (brd) whose writes io.stat counts; skips if none can be had."""
    if not os.path.exists(RAM_DISK):
        module = Path("/usr/lib/uml/modules", os.uname().release, "kernel/drivers/block/brd.ko")
        if not module.is_file():
            pytest.skip(f"no RAM disk: {module} is missing (io.stat counts block devices only)")
        r = subprocess.run(["/bin/busybox", "insmod", str(module), "rd_nr=1", "rd_size=16384"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"no RAM disk: insmod {module} failed: {r.stderr.strip()}")
        wait_until(lambda: os.path.exists(RAM_DISK), what=f"{RAM_DISK} to appear")
    return RAM_DISK


def run_sampled(cgroup: Cgroup, argv: list[str], **spec: Any) -> supervisor.TaskResult:
    """Run ``argv`` under a supervisor in ``cgroup``, sampled every 0.2 s."""
    async def main() -> supervisor.TaskResult:
        async with supervisor.open_supervisor(cgroup_root=cgroup.path,
                                              sample_interval="0.2s") as sup:
            assert sup.controllers >= CONTROLLERS
            with trio.fail_after(60):
                return await sup.run(argv, **spec)

    return trio.run(main)


def column(r: supervisor.TaskResult, name: str) -> list[float]:
    series = r.usage.series
    assert series is not None, "the task was never sampled"
    values = series[name]
    assert values is not None and len(values) == len(series["t_s"]), (name, series)
    return values


def test_memory_series_rises_as_the_task_allocates_in_steps(cgroup: Cgroup) -> None:
    r = run_sampled(cgroup, [sys.executable, "-c", STEPS, "24", "4", "0.3", "0.8"])
    assert r.outcome == "succeeded", r
    memory = column(r, "memory_bytes")
    assert len(memory) >= 4
    # a level, sampled: it follows the task up to the whole 24 MiB, and never falls by more
    # than noise while the task holds it (0.8 s, four samples; the last sample may be taken
    # as the task exits and frees it, so it is not counted)
    first_full = next(i for i, m in enumerate(memory) if m >= 24 * MiB)
    holding = memory[first_full:-1]
    assert len(holding) >= 2 and all(m >= 24 * MiB - MiB for m in holding), memory
    assert any(memory[0] + 4 * MiB <= m < 24 * MiB for m in memory[:first_full]), memory  # steps
    assert r.usage.memory_peak is not None and r.usage.memory_peak >= max(memory)


def test_pids_series_counts_the_sleepers_forked(cgroup: Cgroup) -> None:
    script = ("for i in 1 2 3 4; do sleep 1.5 & done; sleep 0.8; "
              "for i in 1 2 3 4; do sleep 1 & done; wait")
    r = run_sampled(cgroup, ["/bin/sh", "-c", script])
    assert r.outcome == "succeeded", r
    pids = column(r, "pids")
    assert max(pids) == 9 and r.usage.pids_peak == 9  # sh and 8 sleepers
    top = pids.index(9)
    assert any(5 <= p <= 6 for p in pids[:top]), pids  # sh, 4 sleepers (and its sleep 0.8)
    assert pids[-1] < 9  # the first four ended first


def test_io_series_counts_the_bytes_written_to_a_block_device(cgroup: Cgroup,
                                                              ram_disk: str) -> None:
    script = (f"sleep 0.6; dd if=/dev/zero of={ram_disk} bs=1M count=8 oflag=direct "
              f"2>/dev/null; sleep 0.6")
    r = run_sampled(cgroup, ["/bin/sh", "-c", script])
    assert r.outcome == "succeeded", r
    io = column(r, "io_bytes")
    assert io[0] == 0  # nothing written before the dd
    assert io[-1] >= 8 * MiB
    assert io == sorted(io)  # a counter


def corral_run(cgroup: Cgroup, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str],
                                                                 dict[str, Any]]:
    out = tmp / "result.json"
    r = subprocess.run([CORRAL, "run", "--cgroup-root", cgroup.path, "--json-file", str(out),
                        *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "100", "PYTHONIOENCODING": "utf-8"})
    return r, json.loads(out.read_text()) if out.exists() else {}


def test_memory_events_after_a_squeeze_show_high_max_and_the_oom_kill(
        cgroup: Cgroup, tmp_path: Path) -> None:
    r, result = corral_run(cgroup, tmp_path, "-p", "MemoryHigh=22M", "-p", "MemoryMax=24M",
                           "-p", "MemorySwapMax=0", "--",
                           sys.executable, "-c", STEPS, "48", "2", "0.05")
    assert r.returncode == 137 and "survived" not in r.stdout, r.stderr
    events = result["usage"]["memory_events"]
    assert events["high"] > 0 and events["max"] > 0 and events["oom_kill"] >= 1, events
    line = next(ln.strip() for ln in r.stderr.splitlines() if "Memory events:" in ln)
    assert line == (f"Memory events: high {events['high']}, max {events['max']}, "
                    f"oom {events['oom']}, oom_kill {events['oom_kill']}")
    assert "OOM kills:" in r.stderr  # the line people rely on is still there


# memory in steps, sleepers forked, a block device written: every series moves
EVERYTHING = (
    "import subprocess, sys, time\n"
    "held = []\n"
    "for _ in range(4):\n"
    "    b = bytearray(4 << 20); b[::4096] = b'x' * (len(b) // 4096); held.append(b)\n"
    "    time.sleep(0.3)\n"
    "sleepers = [subprocess.Popen(['sleep', '1.6']) for _ in range(6)]\n"
    "subprocess.run(['dd', 'if=/dev/zero', 'of=' + sys.argv[1], 'bs=1M', 'count=8',\n"
    "                'oflag=direct'], stderr=subprocess.DEVNULL, check=True)\n"
    "for p in sleepers: p.wait()\n"
)


def test_corral_run_summary_draws_every_series_as_sparklines(
        cgroup: Cgroup, tmp_path: Path, ram_disk: str) -> None:
    r, result = corral_run(cgroup, tmp_path, "--summary", "--",
                           sys.executable, "-c", EVERYTHING, ram_disk)
    assert r.returncode == 0, r.stderr
    series = result["usage"]["series"]
    points = len(series["t_s"])
    assert points >= 2
    rows = {}
    for ln in r.stderr.splitlines():
        label = ln.strip().split(":", 1)[0]
        if label in ("CPU", "Memory", "Tasks", "IO"):
            rows[label] = ln
    assert set(rows) == {"CPU", "Memory", "Tasks", "IO"}, r.stderr
    for label, row in rows.items():
        sparkline = "".join(c for c in row if c in SPARK)
        assert len(sparkline) == min(points, 40), (label, row)
    assert "n/a" not in r.stderr
    assert "peak" in rows["Memory"] and "peak" in rows["Tasks"]
    assert max(series["pids"]) >= 7 and max(series["memory_bytes"]) >= 16 * MiB
    assert series["io_bytes"][-1] >= 8 * MiB
    assert "Memory peak:" in r.stderr and "Tasks peak:" in r.stderr  # kept as they were


# -- groups: a group's tasks weigh as one ----------------------------------------------------


def spin_together(cgroup: Cgroup, groups: list[str | None]) -> list[supervisor.TaskResult]:
    """One task spinning for 3 s per entry of ``groups`` (its group, or None: the root), all
    at once, on the guest's one CPU."""
    spin = ["/bin/sh", "-c", "while :; do :; done"]

    async def main() -> list[supervisor.TaskResult]:
        results: list[supervisor.TaskResult] = []
        async with supervisor.open_supervisor(cgroup_root=cgroup.path) as sup:
            assert "cpu" in sup.controllers

            async def one(group: str | None) -> None:
                results.append(await sup.run(spin, group=group, time_limit="3s", grace="0.1s"))

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for group in groups:
                        nursery.start_soon(one, group)
        return results

    return trio.run(main)


def test_a_groups_tasks_weigh_as_one_against_another_groups(cgroup: Cgroup) -> None:
    """The daemon puts each uid's tasks in a group of their own: with the cpu controller, a
    tenant's four busy tasks then take half the CPU beside another's one, not four fifths."""
    # (the control: all five in the root, each a fifth)
    ungrouped = spin_together(cgroup, [None] * 5)
    assert all(r.outcome == "timed_out" for r in ungrouped), ungrouped
    cpu = sorted(r.usage.cpu_total_s or 0.0 for r in ungrouped)
    assert cpu[-1] < 0.4 * sum(cpu[:-1]), cpu
    grouped = spin_together(cgroup, ["many"] * 4 + ["one"])
    assert all(r.outcome == "timed_out" for r in grouped), grouped
    where = {r.id: os.path.basename(os.path.dirname(r.containment.cgroup or "")) for r in grouped}
    assert sorted(where.values()) == ["@many"] * 4 + ["@one"], where
    one = sum(r.usage.cpu_total_s or 0.0 for r in grouped if where[r.id] == "@one")
    many = sum(r.usage.cpu_total_s or 0.0 for r in grouped if where[r.id] == "@many")
    assert 0.6 * many < one < 1.6 * many, (one, many)
