"""`corral run --summary`: the rendering from results built by hand (pure), then end to end on
the host, where only CPU is sampled (the guest tier has the rest: tests/guest)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import pytest

import cgroupfs
from supervisor import TaskResult
from supervisor._result import (
    Cleanup,
    Containment,
    KillSnapshot,
    Outcome,
    SnapshotProcess,
    StopReason,
    StopRecord,
    StreamOutput,
    Usage,
)
from supervisor.cli.summary import (
    ASCII_BLOCKS,
    BLOCKS,
    SPARK_MAX,
    level_cells,
    rate_cells,
    sparkline,
    summary_lines,
    terminal_width,
)

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
SPARK = set(BLOCKS)
ALL = ("cpu", "io", "memory", "pids")
MiB = 1 << 20


def make_result(series: dict[str, Any] | None = None, controllers: tuple[str, ...] = ALL,
                **usage: Any) -> TaskResult:
    """A finished task's record as the core would make it, with this usage."""
    figures: dict[str, Any] = {"wall_s": 6.02, "cpu_user_s": 1.7, "cpu_system_s": 0.14,
                               "cpu_total_s": 1.84}
    figures.update(usage)
    return TaskResult(
        id="5d3f1a-1", argv=("sh", "-c", "work"), outcome=Outcome.SUCCEEDED, exit_code=0,
        signal=None, started=True, cleanup=Cleanup("clean"), stop=None,
        usage=Usage(series=series, **figures), output_stdout=StreamOutput(mode="inherit"),
        output_stderr=StreamOutput(mode="inherit"),
        containment=Containment("cgroup", controllers=controllers), time_limit=None,
        created_at=0.0, started_at=0.0, ended_at=6.0)


def uniform(n: int, **columns: list[float] | None) -> dict[str, Any]:
    """A series sampled every second, n points."""
    series: dict[str, Any] = {"t_s": [float(i + 1) for i in range(n)], "cpu_s": None,
                              "memory_bytes": None, "pids": None, "io_bytes": None}
    series.update(columns)
    return series


def line(lines: list[str], start: str) -> str:
    found = [ln for ln in lines if ln.strip().startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


def spark_of(text: str) -> str:
    """The sparkline in a row: its run of block characters."""
    runs = "".join(c if c in BLOCKS else " " for c in text).split()
    assert len(runs) == 1, text
    return runs[0]


# ---- sparklines ------------------------------------------------------------------------------

def test_sparkline_runs_from_nothing_to_the_largest() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == BLOCKS
    assert sparkline([0, 0, 0]) == "▁▁▁"  # nothing at all: flat at the bottom, never a peak
    assert sparkline([5, 5]) == "██"
    assert sparkline([1, 2], ASCII_BLOCKS) == "=#"


def test_rate_cells_are_the_counters_growth_per_second() -> None:
    t = [1.0, 2.0, 3.0, 4.0]
    cpu = [1.0, 1.5, 1.5, 2.5]  # a counter: 1 CPU, half, idle, 1 CPU
    assert rate_cells(t, cpu, 4) == [1.0, 0.5, 0.0, 1.0]
    assert rate_cells(t, cpu, 2) == [0.75, 0.5]  # two seconds per cell: the average rate


def test_level_cells_keep_every_peak_when_downsampled() -> None:
    t = [float(i + 1) for i in range(64)]
    memory = [10.0] * 64
    memory[37] = 99.0  # one sample's spike
    cells = level_cells(t, memory, 16)
    assert len(cells) == 16 and max(cells) == 99.0 and cells.count(99.0) == 1


def test_cells_follow_time_not_sample_count_after_the_series_was_halved() -> None:
    # after a halving: 32 points 2 s apart, then 8 points 1 s apart (the core's Series)
    t = [2.0 * (i + 1) for i in range(32)] + [64.0 + i + 1 for i in range(8)]
    level = [1.0] * 32 + [9.0] * 8  # the last 8 seconds, high
    cells = level_cells(t, level, 9)  # 8 s per cell: the last cell is the high stretch
    assert cells == [1.0] * 8 + [9.0]
    counter = [2.0 * (i + 1) for i in range(32)] + [64.0] * 8  # 1 CPU, then idle 8 s
    assert rate_cells(t, counter, 9) == pytest.approx([1.0] * 8 + [0.0])


# ---- the usage over time ---------------------------------------------------------------------

def test_every_series_as_a_sparkline_on_one_time_axis() -> None:
    series = uniform(8, cpu_s=[0.2, 0.9, 1.6, 1.84, 1.84, 1.84, 1.84, 1.84],
                     memory_bytes=[m * MiB for m in (5, 10, 20, 30, 48, 40, 30, 20)],
                     pids=[1, 3, 12, 12, 6, 2, 1, 1],
                     io_bytes=[0, 0, 0, 8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB])
    lines = summary_lines(make_result(series, memory_peak=int(48.2 * MiB), pids_peak=12), 0,
                          width=100, unicode=True)
    assert line(lines, "Usage over").strip() == "Usage over 8s, one cell per 1s:"
    cpu, memory = line(lines, "CPU:"), line(lines, "Memory:")
    tasks, io = line(lines, "Tasks:"), line(lines, "IO:")
    assert "1.84s" in cpu and "up to 70% CPU" in cpu
    assert spark_of(cpu) == "▃██▃▁▁▁▁"
    assert "48.2M peak" in memory and spark_of(memory) == "▂▂▄▅█▇▅▄"
    assert "12 peak" in tasks and spark_of(tasks) == "▂▃██▅▂▂▂"
    assert "8.0M" in io and "up to 8.0M/s" in io and spark_of(io) == "▁▁▁█▁▁▁▁"
    # aligned: every sparkline starts in the same column
    assert len({row.index(spark_of(row)) for row in (cpu, memory, tasks, io)}) == 1
    # the figures systemd-run prints are still there
    assert line(lines, "CPU time consumed:").strip() == \
        "CPU time consumed: 1.84s (user 1.7s, system 140ms)"
    assert line(lines, "Memory peak:").strip() == "Memory peak: 48.2M"
    assert line(lines, "Tasks peak:").strip() == "Tasks peak: 12"


def test_where_there_is_no_controller_the_summary_says_so_instead_of_zero() -> None:
    series = uniform(3, cpu_s=[0.5, 1.0, 1.5])
    lines = summary_lines(make_result(series, controllers=()), 0, width=80, unicode=True)
    assert spark_of(line(lines, "CPU:")) == "███"
    assert line(lines, "Memory, Tasks, IO:").strip() == \
        "Memory, Tasks, IO: n/a (no memory, pids or io controller here)"
    assert line(lines, "Memory peak:").strip() == "Memory peak: n/a (no memory controller here)"
    assert not any(ln.strip().startswith(("Memory:", "Tasks:", "IO:")) for ln in lines)
    assert not any("Tasks peak" in ln for ln in lines)


def test_one_controller_missing_names_it() -> None:
    series = uniform(2, cpu_s=[0.5, 1.0], memory_bytes=[MiB, MiB], pids=[1, 1])
    lines = summary_lines(make_result(series, controllers=("cpu", "memory", "pids")), 0,
                          width=80)
    assert line(lines, "IO:").strip() == "IO: n/a (no io controller here)"


def test_a_task_never_sampled_has_the_figures_and_no_sparklines() -> None:
    lines = summary_lines(make_result(None), 0, width=80, unicode=True)
    assert not any(SPARK & set(ln) for ln in lines)
    assert not any("Usage over" in ln for ln in lines)
    assert line(lines, "CPU time consumed:")


def test_sparklines_fit_the_width_and_never_exceed_the_cap() -> None:
    n = 64
    series = uniform(n, cpu_s=[0.5 * (i + 1) for i in range(n)],
                     memory_bytes=[(i % 9) * MiB for i in range(n)], pids=[1] * n,
                     io_bytes=[i * MiB for i in range(n)])
    wide = summary_lines(make_result(series), 0, width=200, unicode=True)
    assert len(spark_of(line(wide, "Memory:"))) == SPARK_MAX
    assert line(wide, "Usage over").strip() == "Usage over 1min 4s, one cell per 1.6s:"
    narrow = summary_lines(make_result(series), 0, width=60, unicode=True)
    rows = [line(narrow, f"{name}:") for name in ("CPU", "Memory", "Tasks", "IO")]
    assert all(len(row) <= 60 for row in rows), rows
    assert 8 <= len(spark_of(rows[1])) < SPARK_MAX


def test_without_block_characters_the_sparklines_are_ascii() -> None:
    series = uniform(4, cpu_s=[1.0, 1.0, 2.0, 3.0])
    lines = summary_lines(make_result(series), 0, width=80, unicode=False)
    assert line(lines, "CPU:").split()[2] == "#_##"
    assert all(ln.isascii() for ln in lines)


def test_the_width_is_the_terminals_else_columns_else_80(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[os.terminal_size | None] = []

    def get_terminal_size(fd: int) -> os.terminal_size:
        answer = answers.pop(0)
        if answer is None:
            raise OSError(25, "Inappropriate ioctl for device")  # a pipe
        return answer

    monkeypatch.setattr(os, "get_terminal_size", get_terminal_size)
    monkeypatch.setenv("COLUMNS", "66")
    answers += [os.terminal_size((120, 40)), os.terminal_size((0, 0)), None, None]
    assert terminal_width() == 120
    assert terminal_width() == 66  # a VM's console says 0 columns: as good as nothing
    assert terminal_width() == 66
    monkeypatch.delenv("COLUMNS")
    assert terminal_width() == 80


# ---- pressure, memory events, paused time, the kill snapshot ---------------------------------

def test_memory_events_and_pressure_when_not_all_zero() -> None:
    events = {"low": 0, "high": 139, "max": 35, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}
    pressure = {"cpu": {"some": 1.2, "full": 0.0}, "memory": {"some": 0.3, "full": 0.1},
                "io": {"some": 0.0, "full": 0.0}}
    lines = summary_lines(make_result(None, memory_events=events, pressure=pressure), 0)
    assert line(lines, "Memory events:").strip() == \
        "Memory events: high 139, max 35, oom 1, oom_kill 1"
    assert line(lines, "Pressure").strip() == \
        "Pressure (time stalled): cpu some 1.2s, memory some 300ms full 100ms"


def test_all_zero_or_absent_events_and_pressure_say_nothing() -> None:
    zero_events = {"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0}
    zero_pressure = {"cpu": {"some": 0.0, "full": 0.0}}
    for usage in ({"memory_events": zero_events, "pressure": zero_pressure},
                  {"memory_events": None, "pressure": None}):
        lines = summary_lines(make_result(None, **usage), 0)
        assert not any(("Memory events" in ln or "Pressure" in ln) for ln in lines)


def test_paused_time_is_shown_only_when_there_was_any() -> None:
    assert not any("Paused" in ln for ln in summary_lines(make_result(None), 0))
    lines = summary_lines(make_result(None, paused_s=2.5), 0)
    assert line(lines, "Paused:").strip() == "Paused: 2.5s (not counted by the time limit)"


def killed(processes: list[SnapshotProcess], more: int = 0) -> TaskResult:
    stop = StopRecord(StopReason.TIME_LIMIT, "killed", 15, 2.0, 2.0, 7.0, "grace_expired", True)
    return dataclasses.replace(
        make_result(None), outcome=Outcome.TIMED_OUT, exit_code=None, signal=9, stop=stop,
        kill_snapshot=KillSnapshot(7.0, tuple(processes), more))


def test_a_killed_task_shows_what_hung_most_cpu_first() -> None:
    procs = [SnapshotProcess(4242, 4240, "S", "sh", 'sh -c trap "" TERM; sleep 600', 0.01),
             SnapshotProcess(4244, 4242, "R", "spin", "spin --forever", 6.5),
             SnapshotProcess(4245, 4242, "D", "dd", "dd if=/dev/sda of=/dev/null", 0.3),
             SnapshotProcess(4246, 4242, "Z", "defunct", None, 0.0)]
    lines = summary_lines(killed(procs), 124, width=80)
    i = lines.index(line(lines, "Before the kill"))
    assert lines[i].strip() == "Before the kill (7s after the start): 4 processes, most CPU first"
    assert lines[i + 1].split() == ["PID", "STATE", "CPU", "COMMAND"]
    assert lines[i + 2].split() == ["4244", "running", "6.5s", "spin", "--forever"]
    assert lines[i + 3].split()[:4] == ["4245", "disk", "wait", "300ms"]
    assert lines[i + 4].split()[:3] == ["4242", "sleeping", "10ms"]
    assert lines[i + 5].split() == ["4246", "zombie", "0us", "[defunct]"]
    assert line(lines, "Stop:").strip() == "Stop: time_limit, killed (the grace ran out)"
    assert line(lines, "Exit status:").strip() == "Exit status: 124"


def test_a_snapshot_shows_the_top_few_and_counts_the_rest_within_the_width() -> None:
    long = "python -c " + "x" * 300
    procs = [SnapshotProcess(100 + i, 1, "S", "python", long, i / 10) for i in range(32)]
    lines = summary_lines(killed(procs, more=8), 124, width=70, unicode=True)
    i = lines.index(line(lines, "Before the kill"))
    assert "40 processes" in lines[i]
    shown = lines[i + 2:i + 7]
    assert [ln.split()[0] for ln in shown] == ["131", "130", "129", "128", "127"]
    assert all(len(ln) == 70 and ln.endswith("…") for ln in shown)
    assert lines[i + 7].strip() == "... and 35 more"


def test_no_snapshot_when_nothing_was_killed() -> None:
    assert not any("Before the kill" in ln for ln in summary_lines(make_result(None), 0))


# ---- end to end on the host: only CPU is sampled here ----------------------------------------

BUSY_THEN_IDLE = ("import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass\n"
                  "time.sleep(1.8)\n")


def test_corral_run_summary_draws_the_cpu_and_says_why_the_rest_is_missing(
        test_cgroup: cgroupfs.Cgroup) -> None:
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "--summary", "--",
                        sys.executable, "-c", BUSY_THEN_IDLE],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "80", "PYTHONIOENCODING": "utf-8"})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert line(lines, "Usage over").strip().startswith("Usage over 3")
    cpu = line(lines, "CPU:")
    spark = spark_of(cpu)
    assert len(spark) == 3 and spark[0] == "█" and "% CPU" in cpu
    controllers = set(cgroupfs.Cgroup.open(test_cgroup.path).available_controllers())
    missing = [name for name, c in (("Memory", "memory"), ("Tasks", "pids"), ("IO", "io"))
               if c not in controllers]
    if missing:
        assert line(lines, f"{', '.join(missing)}:").strip().endswith("controller here)")
    assert line(lines, "CPU time consumed:") and line(lines, "Exit status: 0")


def test_corral_run_summary_shows_what_hung_when_it_had_to_kill(
        test_cgroup: cgroupfs.Cgroup) -> None:
    script = "trap '' TERM; sleep 600 & wait"
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "--time-limit",
                        "0.5s", "--grace", "0.3s", "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 124, r.stderr
    lines = r.stderr.splitlines()
    i = lines.index(line(lines, "Before the kill"))
    assert "2 processes" in lines[i]
    commands = {" ".join(ln.split()[3:]) for ln in lines[i + 2:i + 4]}
    assert commands == {"sleep 600", f"sh -c {script}"}


def test_a_tasks_own_text_reaches_the_terminal_as_escapes_never_as_control() -> None:
    forged = "sleep\x1b[2J\x1b]0;pwned\x07\n  Exit status: 0\u202e"
    r = dataclasses.replace(
        killed([SnapshotProcess(4242, 1, "S", "x\x1bcomm", forged + " 60", 0.0)]),
        notes=("the task made /sys/fs/cgroup/x/\x1b[31mred",), name="n\rame")
    lines = summary_lines(r, 137, width=200, unicode=True)
    text = "\n".join(lines)
    assert not any(c in text for c in "\x1b\x07\r\u202e")
    assert sum(line.lstrip().startswith("Exit status:") for line in lines) == 1
    assert "sleep\\x1b[2J\\x1b]0;pwned\\x07\\n  Exit status: 0\\u202e 60" in text
    assert "/x/\\x1b[31mred" in text
