"""The systemd-run style summary of a result: what happened, in a few plain lines.

Besides the figures (runtime, CPU time, peaks), a task that ran at least one sampling interval
gets its usage over time as sparklines on one shared time axis, read at a glance::

      Usage over 21s, one cell per 1s:
        CPU:    910ms       █▄▃▁▁▁▁▁  up to 50% CPU
        Memory: 28.9M peak  ▄▆▇▇████
        Tasks:  3 peak      ▁▁███▁▁▁

Each sparkline runs from ▁ (nothing) to █ (its own largest cell); CPU and IO are rates (the
counters' growth per cell), memory and tasks the largest sample in each cell, so a peak is never
smoothed away.  Everything here is pure: a :class:`TaskResult` in, lines out.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import KillSnapshot, TaskResult, Usage
from ..syntax import format_duration
from .printable import printable

__all__ = ["format_bytes", "level_cells", "rate_cells", "sparkline", "summary_lines"]

BLOCKS = "▁▂▃▄▅▆▇█"
ASCII_BLOCKS = "_.-:=+*#"  # where stderr cannot encode the blocks (PYTHONIOENCODING=ascii)
SPARK_MAX = 40  # cells: a sparkline is read at a glance, not studied
SPARK_MIN = 8
SNAPSHOT_SHOWN = 5  # processes of a kill snapshot in the summary (the record keeps up to 32)
STATES = {"R": "running", "S": "sleeping", "D": "disk wait", "T": "stopped", "t": "traced",
          "Z": "zombie", "X": "dead", "I": "idle", "P": "parked", "W": "paging"}
MEMORY_EVENTS = ("high", "max", "oom", "oom_kill")  # shown whenever any event is not zero


def format_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    return format_duration(round(s, 3)) if s >= 0.001 else f"{s * 1e6:.0f}us"


def _approx(s: float) -> str:
    """A duration to two significant digits (whole seconds from 100 s): ``1s``, ``250ms``."""
    return format_duration(float(f"{s:.2g}") if s < 100 else round(s))


# ---- sparklines (pure) -----------------------------------------------------------------------

def sparkline(values: Sequence[float], blocks: str = BLOCKS) -> str:
    """One character per value, from ``blocks[0]`` (zero) to ``blocks[-1]`` (the largest)."""
    top = max(values, default=0.0)
    if top <= 0:
        return blocks[0] * len(values)
    steps = len(blocks) - 1
    return "".join(blocks[min(steps, max(0, round(v / top * steps)))] for v in values)


def level_cells(t: Sequence[float], values: Sequence[float], cells: int) -> list[float]:
    """A level (memory, pids) over ``cells`` equal spans of ``[0, t[-1]]``: the largest sample
    that covers at least half of a span (or half of its own interval, for samples finer than
    the spans).  Sample ``i`` covers ``(t[i-1], t[i]]``; every span gets at least one."""
    width = t[-1] / cells
    spans = list(zip([0.0, *t[:-1]], t, values, strict=True))
    out = []
    for j in range(cells):
        lo, hi = j * width, (j + 1) * width
        covering = []
        for start, end, value in spans:
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0 and overlap >= 0.5 * min(width, end - start):
                covering.append(value)
        out.append(max(covering, default=0.0))
    return out


def _counter_at(t: Sequence[float], counter: Sequence[float], x: float) -> float:
    """A counter that was 0 at the spawn, at time ``x``: linear between samples."""
    prev_t, prev_c = 0.0, 0.0
    for ti, ci in zip(t, counter, strict=True):
        if x <= ti:
            if ti <= prev_t:
                return ci
            return prev_c + (ci - prev_c) * (x - prev_t) / (ti - prev_t)
        prev_t, prev_c = ti, ci
    return prev_c


def rate_cells(t: Sequence[float], counter: Sequence[float], cells: int) -> list[float]:
    """A counter's (CPU seconds, IO bytes) growth per second in each of ``cells`` equal spans
    of ``[0, t[-1]]``; the counter starts at 0 at the spawn (t = 0)."""
    width = t[-1] / cells
    at = [_counter_at(t, counter, j * width) for j in range(cells)] + [counter[-1]]
    return [max(0.0, (b - a) / width) for a, b in itertools.pairwise(at)]


# ---- the usage over time ---------------------------------------------------------------------

class _Row(NamedTuple):
    label: str
    figure: str
    cells: list[float]
    trail: str = ""


def _series(series: dict[str, Any], name: str) -> tuple[list[float], list[float]] | None:
    """(times, values) of one column; None when the column is absent.  Columns shorter than
    the times (a read that failed) are paired with the latest times."""
    values, t = series.get(name), series.get("t_s") or []
    if not values or not t:
        return None
    n = min(len(values), len(t))
    return list(t[len(t) - n:]), list(values[len(values) - n:])


def _rate_row(label: str, u: Usage, t: list[float], values: list[float], n: int) -> _Row:
    """CPU or IO: the total, and the counter's growth per second in each cell."""
    cells = rate_cells(t, values, n)
    top = max(cells)
    if label == "CPU":
        figure = _seconds(u.cpu_total_s if u.cpu_total_s is not None else values[-1])
        trail = f"up to {top * 100:.0f}% CPU"
    else:
        figure, trail = format_bytes(values[-1]), f"up to {format_bytes(top)}/s"
    return _Row(label, figure, cells, trail if top > 0 else "")


def _level_row(label: str, u: Usage, t: list[float], values: list[float], n: int) -> _Row:
    """Memory or tasks: the peak (the kernel's, when it kept one), the largest in each cell."""
    kept = u.memory_peak if label == "Memory" else u.pids_peak
    peak = max(values) if kept is None else max(kept, max(values))
    figure = format_bytes(peak) if label == "Memory" else f"{int(peak)}"
    return _Row(label, f"{figure} peak", level_cells(t, values, n))


_KINDS = (("CPU", "cpu_s", _rate_row), ("Memory", "memory_bytes", _level_row),
          ("Tasks", "pids", _level_row), ("IO", "io_bytes", _rate_row))


def _rows(u: Usage, series: dict[str, Any], cells: int) -> tuple[list[_Row], list[str]]:
    """The sparkline rows, and the labels of the columns that were not sampled."""
    rows, missing = [], []
    for label, name, row in _KINDS:
        column = _series(series, name)
        if column is None:
            missing.append(label)
        else:
            t, values = column
            rows.append(row(label, u, t, values, min(cells, len(t))))
    return rows, missing


_CONTROLLER = {"Memory": "memory", "Tasks": "pids", "IO": "io", "CPU": "cpu"}


def _missing_line(missing: list[str], controllers: Sequence[str]) -> str | None:
    if not missing:
        return None
    absent = [_CONTROLLER[m] for m in missing if _CONTROLLER[m] not in controllers]
    why = f"no {_or(absent)} controller here" if len(absent) == len(missing) else "not sampled"
    return f"    {', '.join(missing)}: n/a ({why})"


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def over_time_lines(r: TaskResult, width: int, blocks: str = BLOCKS) -> list[str]:
    """The usage series as aligned sparklines on one time axis, at most ``width`` columns
    (sparklines of at most SPARK_MAX cells); nothing for a task that was never sampled."""
    series = r.usage.series
    t = (series or {}).get("t_s") or []
    if not series or not t or t[-1] <= 0:
        return []
    cells = min(len(t), SPARK_MAX)
    rows, missing = _rows(r.usage, series, cells)
    label_w = max((len(row.label) for row in rows), default=0) + 1
    figure_w = max((len(row.figure) for row in rows), default=0)
    trail_w = max((len(row.trail) + 3 for row in rows if row.trail), default=0)  # +1: slack
    room = width - (4 + label_w + 1 + figure_w + 2) - trail_w
    if room < cells:  # a narrow terminal: fewer, wider cells
        cells = max(min(SPARK_MIN, cells), room)
        rows, _ = _rows(r.usage, series, cells)
    lines = [f"  Usage over {_approx(t[-1])}, one cell per {_approx(t[-1] / cells)}:"]
    for row in rows:
        text = f"    {row.label + ':':<{label_w}} {row.figure:<{figure_w}}  " \
               + sparkline(row.cells, blocks)
        lines.append(text + (f"  {row.trail}" if row.trail else ""))
    missing_line = _missing_line(missing, r.containment.controllers)
    return lines + ([missing_line] if missing_line else [])


# ---- the other lines -------------------------------------------------------------------------

def _figure_lines(r: TaskResult) -> list[str]:
    """Runtime, CPU time, peaks: the lines systemd-run prints too."""
    u = r.usage
    lines = [f"  Runtime: {_seconds(u.wall_s)}"
             + (f" (time limit {format_duration(r.time_limit)})" if r.time_limit else "")]
    cpu = _seconds(u.cpu_total_s)
    if u.cpu_user_s is not None and u.cpu_system_s is not None:
        cpu += f" (user {_seconds(u.cpu_user_s)}, system {_seconds(u.cpu_system_s)})"
    lines.append(f"  CPU time consumed: {cpu}")
    if u.memory_peak is not None:
        lines.append(f"  Memory peak: {format_bytes(u.memory_peak)}")
    elif "memory" in r.containment.controllers:
        lines.append("  Memory peak: n/a (this kernel has no memory.peak)")
    else:
        lines.append("  Memory peak: n/a (no memory controller here)")
    if u.pids_peak is not None:
        lines.append(f"  Tasks peak: {u.pids_peak}")
    if u.oom_kills:
        lines.append(f"  OOM kills: {u.oom_kills}")
    return lines


def _events_line(events: dict[str, int] | None) -> list[str]:
    """memory.events, when any counter is not zero: the four that matter, then the rest that
    are not zero."""
    if not events or not any(events.values()):
        return []
    shown = [k for k in MEMORY_EVENTS if k in events]
    shown += [k for k, v in events.items() if v and k not in MEMORY_EVENTS]
    return ["  Memory events: " + ", ".join(f"{k} {events[k]}" for k in shown)]


def _pressure_line(pressure: dict[str, Any] | None) -> list[str]:
    """PSI totals that are not zero (``cpu some 1.2s, memory some 0.3s full 0.1s``)."""
    stalls = []
    for resource, kinds in (pressure or {}).items():
        said = [f"{kind} {_seconds(s)}" for kind, s in kinds.items() if s]
        if said:
            stalls.append(f"{resource} {' '.join(said)}")
    return [f"  Pressure (time stalled): {', '.join(stalls)}"] if stalls else []


def _accounting_lines(u: Usage) -> list[str]:
    """Memory events, pressure and paused time: only when there is something to say."""
    lines = _events_line(u.memory_events) + _pressure_line(u.pressure)
    if u.paused_s > 0:
        lines.append(f"  Paused: {_seconds(u.paused_s)} (not counted by the time limit)")
    return lines


def _main_line(r: TaskResult) -> str:
    if not r.started:
        why = "failed to start" if r.error else "stopped before it started"
        return f"  Main process: never started ({why})"
    if r.signal is not None:
        return f"  Main process: killed by {r.signal_name}"
    return f"  Main process: exited with code {r.exit_code}"


def _stop_line(r: TaskResult) -> list[str]:
    s = r.stop
    if s is None:
        return []
    sent = f"{s.signal_name} sent"
    how = {"requested": "requested after the main process ended", "signalled": sent,
           "killed": "killed"}[s.reached]
    cause = {"grace_expired": "the grace ran out", "no_grace": "no grace",
             "second_request": "asked twice", "force": "forced"}.get(s.kill_because or "")
    return [f"  Stop: {s.reason}, {how}" + (f" ({cause})" if cause else "")]


def _clip(text: str, room: int, ellipsis: str) -> str:
    return text if len(text) <= room else text[:max(0, room - 1)] + ellipsis


def snapshot_lines(snap: KillSnapshot | None, width: int, ellipsis: str = "…") -> list[str]:
    """What was running just before the kill: the few processes with the most CPU time."""
    if snap is None or not snap.processes:
        return []
    total = len(snap.processes) + snap.more
    top = sorted(snap.processes, key=lambda p: -p.cpu_s)[:SNAPSHOT_SHOWN]
    lines = [f"  Before the kill ({_seconds(snap.taken_after_s)} after the start): "
             f"{total} process{'es' if total != 1 else ''}, most CPU first"]
    pid_w = max(3, *(len(str(p.pid)) for p in top))
    cpus = [_seconds(p.cpu_s) for p in top]
    cpu_w = max(3, *(len(c) for c in cpus))
    lines.append(f"    {'PID':>{pid_w}}  {'STATE':<9}  {'CPU':>{cpu_w}}  COMMAND")
    for p, cpu in zip(top, cpus, strict=True):
        state = STATES.get(p.state, p.state)
        head = f"    {p.pid:>{pid_w}}  {state:<9}  {cpu:>{cpu_w}}  "
        command = p.cmdline if p.cmdline else f"[{p.comm}]"
        lines.append(head + _clip(command, width - len(head), ellipsis))
    if total > len(top):
        lines.append(f"    ... and {total - len(top)} more")
    return lines


def _cleanup_line(r: TaskResult) -> str:
    c = r.cleanup
    text = str(c)
    if c.leftovers:
        names = ", ".join(f"{p.comm}[{p.pid}]" for p in c.leftovers[:5])
        more = f" and {len(c.leftovers) - 5} more" if len(c.leftovers) > 5 else ""
        how = {"stop signal": "ended on the stop signal", "killed": "killed",
               "exited": "exited on their own"}.get(c.leftovers_ended_by or "", "")
        text += (f"; {len(c.leftovers)} process(es) left behind by the main process "
                 f"({names}{more}) {how}")
    if c.detail:
        text += f": {c.detail}"
    return f"  Cleanup: {text}"


def terminal_width(fd: int = 2) -> int:
    """Columns of the terminal on ``fd``; else ``$COLUMNS``; else 80.  A terminal that says
    0 (a console whose size was never set, as a VM's) says nothing."""
    try:
        columns = os.get_terminal_size(fd).columns
    except OSError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return int(os.environ.get("COLUMNS", "")) or 80
    except ValueError:
        return 80


def _blocks_fit(stream: Any) -> bool:
    try:
        (BLOCKS + "…").encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeError, LookupError):
        return False
    return True


def summary_lines(r: TaskResult, exit_status: int, *, width: int | None = None,
                  unicode: bool | None = None) -> list[str]:
    """Lines for stderr, each ``Name: value``; absent figures say why instead of showing 0.

    ``width``: the columns to fit (default: stderr's terminal, ``$COLUMNS``, 80);
    ``unicode``: draw with block characters (default: if stderr's encoding has them)."""
    width = terminal_width() if width is None else width
    fancy = _blocks_fit(sys.stderr) if unicode is None else unicode
    blocks, ellipsis = (BLOCKS, "…") if fancy else (ASCII_BLOCKS, "~")
    lines = [f"corral: task {r.id} finished with result: {r.outcome}", _main_line(r)]
    if r.started:
        lines += _figure_lines(r)
        lines += over_time_lines(r, width, blocks)
        lines += _accounting_lines(r.usage)
    lines += _stop_line(r)
    lines += snapshot_lines(r.kill_snapshot, width, ellipsis)
    lines.append(_cleanup_line(r))
    lines += [f"  Note: {note}" for note in r.notes]
    lines.append(f"  Exit status: {exit_status}")
    # command lines, process names, notes naming its paths: the task's text, never run by
    # the terminal, never a line of ours
    return [printable(line) for line in lines]
