"""The systemd-run style summary of a result: what happened, in a few plain lines."""

from __future__ import annotations

from .._result import TaskResult
from .._units import format_duration

__all__ = ["format_bytes", "summary_lines"]


def format_bytes(n: int) -> str:
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


def summary_lines(r: TaskResult, exit_status: int) -> list[str]:
    """Lines for stderr, each ``Name: value``; absent figures say why instead of showing 0."""
    lines = [f"corral: task {r.id} finished with result: {r.outcome}"]
    if not r.started:
        why = "failed to start" if r.error else "stopped before it started"
        lines.append(f"  Main process: never started ({why})")
    elif r.signal is not None:
        lines.append(f"  Main process: killed by {r.signal_name}")
    else:
        lines.append(f"  Main process: exited with code {r.exit_code}")
    u = r.usage
    if r.started:
        lines.append(f"  Runtime: {_seconds(u.wall_s)}"
                     + (f" (time limit {format_duration(r.time_limit)})" if r.time_limit else ""))
        cpu = _seconds(u.cpu_total_s)
        if u.cpu_user_s is not None and u.cpu_system_s is not None:
            cpu += f" (user {_seconds(u.cpu_user_s)}, system {_seconds(u.cpu_system_s)})"
        lines.append(f"  CPU time consumed: {cpu}")
        lines.append("  Memory peak: " + (format_bytes(u.memory_peak) if u.memory_peak is not None
                                          else "n/a (no memory controller here)"))
        if u.pids_peak is not None:
            lines.append(f"  Tasks peak: {u.pids_peak}")
        if u.oom_kills:
            lines.append(f"  OOM kills: {u.oom_kills}")
    if r.stop is not None:
        s = r.stop
        sent = f"{s.signal_name} sent"
        how = {"requested": "requested after the main process ended", "signalled": sent,
               "killed": "killed"}[s.reached]
        cause = {"grace_expired": "the grace ran out", "no_grace": "no grace",
                 "second_request": "asked twice", "force": "forced"}.get(s.kill_because or "")
        lines.append(f"  Stop: {s.reason}, {how}" + (f" ({cause})" if cause else ""))
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
    lines.append(f"  Cleanup: {text}")
    for note in r.notes:
        lines.append(f"  Note: {note}")
    lines.append(f"  Exit status: {exit_status}")
    return lines
