"""The outcome rules: what a finished task's facts add up to in its record.

Rules over what the driver found (the main process's status, the stop, leftovers, escapes),
pure, and :func:`read_usage`, which reads the leaf's accounting files; the task's life calls
them once, at the end.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from cgroupfs import Cgroup, CgroupError, CgroupNotFound, CgroupStats

from ._drive import Driver
from ._result import Cleanup, Outcome, StopReason, Usage
from ._stop import StopState

__all__ = ["USAGE_FILES", "classify", "cleanup_of", "outcome_notes", "read_usage", "usage_of"]

log = logging.getLogger(__name__)

USAGE_FILES = frozenset({"cpu.stat", "memory.peak", "memory.events", "pids.peak"})


def read_usage(leaf: Cgroup, controllers: frozenset[str]) -> CgroupStats | None:
    """What the record keeps of the leaf's accounting (and only that: read at every end)."""
    try:
        return leaf.read_stats(controllers, only=USAGE_FILES)
    except CgroupNotFound:
        return None
    except CgroupError as e:
        log.warning("reading the usage of %s: %s", leaf.path, e)
        return None


def classify(stop: StopState, exit_code: int | None, sig: int | None,
              oom_kills: int | None) -> Outcome:
    """The outcome: a stop that landed first (stopped at its time limit is ``timed_out`` even
    if it then exits 0), then the OOM killer, then the exit itself."""
    if stop.landed:
        timed = stop.reason in (StopReason.TIME_LIMIT, StopReason.IDLE)
        return Outcome.TIMED_OUT if timed else Outcome.CANCELLED
    if sig == 9 and oom_kills:
        return Outcome.OOM_KILLED
    if sig is not None:
        return Outcome.SIGNALED
    return Outcome.FAILED if exit_code else Outcome.SUCCEEDED


def outcome_notes(stop: StopState, outcome: Outcome, oom_kills: int | None, method: str,
                   fallback_errno: int) -> list[str]:
    notes = []
    if stop.reason is not None and not stop.landed:
        notes.append(f"a stop ({stop.reason}) was requested after the main process ended")
    if oom_kills and outcome != Outcome.OOM_KILLED:
        notes.append(f"the OOM killer ended {oom_kills} process(es) in the task's cgroup")
    if fallback_errno:
        notes.append(f"spawned by {method}: clone3 into the cgroup was refused "
                     f"({errno.errorcode.get(fallback_errno, '?')})")
    return notes


def cleanup_of(d: Driver, problems: list[str]) -> Cleanup:
    leftovers = tuple(d.tracker.leftovers.values())
    ended_by = None
    if leftovers:
        ended_by = ("killed" if d.killed_tree else
                    "stop signal" if d.signalled_tree else "exited")
    if problems:
        return Cleanup("incomplete", leftovers, ended_by, "; ".join(problems))
    return Cleanup("clean", leftovers, ended_by)


def usage_of(stats: CgroupStats | None, wall: float, oom_kills: int | None, *,
             pressure: dict[str, Any] | None = None, series: dict[str, Any] | None = None,
             paused_s: float = 0.0) -> Usage:
    """The record's usage: the leaf's final accounting, the pressure totals and the series
    sampled while it ran; absent figures are None, never 0."""
    paused = round(paused_s, 6)
    if stats is None:
        return Usage(wall_s=round(wall, 6), pressure=pressure, series=series, paused_s=paused)
    cpu = stats.cpu
    events = stats.memory_events
    memory_events = None if events is None else {
        k: v for k, v in (("low", events.low), ("high", events.high), ("max", events.max),
                          ("oom", events.oom), ("oom_kill", events.oom_kill),
                          ("oom_group_kill", events.oom_group_kill)) if v is not None}

    def sec(usec: int | None) -> float | None:
        return None if usec is None else usec / 1e6

    return Usage(
        wall_s=round(wall, 6),
        cpu_user_s=sec(cpu.user_usec) if cpu else None,
        cpu_system_s=sec(cpu.system_usec) if cpu else None,
        cpu_total_s=sec(cpu.usage_usec) if cpu else None,
        memory_peak=stats.memory_peak,
        pids_peak=stats.pids_peak,
        oom_kills=oom_kills,
        memory_events=memory_events,
        pressure=pressure,
        series=series,
        paused_s=paused,
    )

