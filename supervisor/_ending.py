"""How a task's life ended, and the one record made of it: an :class:`Ending` in, one
:class:`TaskResult` out (:func:`result_of`).

Every way a life ends builds an ``Ending``: the normal end (what the driver found, the leaf's
final accounting), a spawn that failed, a task stopped before it started, one lost to a bug of
ours or to a daemon that died, one that could not be adopted.  The rules that turn it into the
record live here and nowhere else: the outcome (:func:`classify`), the notes that explain it,
the cleanup, the usage.  Pure: nothing here reads a file or a clock (the life reads the leaf's
accounting, ``_life.read_usage``; ``_task.record`` stamps the end and keeps the result).
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

from cgroupfs import CgroupStats
from cgroupfs._record import record

from ._result import (
    Cleanup,
    Containment,
    Outcome,
    StopReason,
    StreamOutput,
    TaskResult,
    Usage,
)
from ._stop import StopState

if TYPE_CHECKING:
    from ._drive import Driver
    from ._task import Task

__all__ = ["Ending", "Launch", "classify", "cleanup_of", "outcome_notes", "result_of",
           "usage_of"]

_EMPTY = StreamOutput()


@record
class Launch:
    """How and when a task was spawned: the method, clone3's refusal if it fell back, and the
    moment (trio time, for the stop's times; wall clock, for the record)."""

    method: str
    fallback_errno: int
    t0: float
    started_at: float


@record
class Ending:
    """How a task's life ended: everything its record is made of.

    ``outcome``: the life's own word where the rules have none to say (``spawn_failed``,
    ``lost``, ``cancelled`` before a start); None: the rules decide from what ``driver``
    found.  ``driver``: the run, if the task was driven to its end (its exit, its stop's
    landing, leftovers, escapes, notes, series, snapshot), with ``stats`` (the leaf's final
    accounting), ``pressure``, ``problems`` of the cleanup and ``leaf_path``.  ``cleanup``:
    as known, when no driver saw the end.  ``started_at``: the wall-clock start, when no
    ``launch`` says it (a task another daemon process ran)."""

    outcome: Outcome | None = None
    started: bool = False
    launch: Launch | None = None
    driver: Driver | None = None
    stats: CgroupStats | None = None
    pressure: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()
    leaf_path: str | None = None
    cleanup: Cleanup | None = None
    notes: tuple[str, ...] = ()
    error: BaseException | None = None
    step: str | None = None
    started_at: float | None = None


def result_of(task: Task, e: Ending, ended_at: float) -> TaskResult:
    """The one final record of ``task`` that ended as ``e`` says (its captures closed)."""
    outcome, exit_code, sig, notes = e.outcome, None, None, list(e.notes)
    cleanup, usage, containment = e.cleanup or Cleanup("clean"), Usage(), Containment("cgroup")
    error, step = e.error, e.step
    d, launch = e.driver, e.launch
    if d is not None and launch is not None:
        exit_code = None if d.exit is None else d.exit.code
        sig = None if d.exit is None else d.exit.signal
        oom_kills = None
        if e.stats is not None and e.stats.memory_events is not None:
            oom_kills = e.stats.memory_events.oom_kill
        outcome = outcome or classify(task.stop, exit_code, sig, oom_kills)
        notes = [*d.notes, *outcome_notes(task.stop, outcome, oom_kills, launch.method,
                                          launch.fallback_errno), *notes]
        notes += [i.text for i in task.rt.incidents if i.at >= launch.t0]
        if d.exit is None and not task.stop.landed:
            outcome = Outcome.LOST  # it ran and ended; how, nobody can tell any more
            step = "adopt"
            error = RuntimeError("the main process ended while corral was handing it between "
                                 "processes and its exit status could not be learnt "
                                 "(PIDFD_INFO_EXIT needs Linux 6.15)")
        escaped = tuple(d.tracker.escaped.values())
        problems = list(e.problems)
        if escaped:
            problems.append(f"{len(escaped)} process(es) of the task left its cgroup: " +
                            ", ".join(f"{x.comm}[{x.pid}] to {x.cgroup} ({x.ended})"
                                      for x in escaped))
        cleanup = cleanup_of(d, problems)
        containment = Containment("cgroup", e.leaf_path, launch.method,
                                  tuple(sorted(task.rt.controllers)), escaped,
                                  task.spec.isolation.describe())
        usage = usage_of(e.stats, d.exited_at - launch.t0, oom_kills, pressure=e.pressure,
                         series=None if d.series is None else d.series.to_dict(),
                         paused_s=d.paused_s)
    assert outcome is not None, "an Ending without a driver says its outcome"
    started_at = launch.started_at if launch is not None else e.started_at
    return TaskResult(
        id=task.id, argv=task.spec.argv, outcome=outcome, exit_code=exit_code, signal=sig,
        started=e.started, cleanup=cleanup,
        stop=task.stop.result(None if launch is None else launch.t0), usage=usage,
        output_stdout=task.stdout.result() if task.stdout is not None else _EMPTY,
        output_stderr=task.stderr.result() if task.stderr is not None else _EMPTY,
        containment=containment, time_limit=task.time_limit, created_at=task.created_at,
        started_at=started_at if e.started else None, ended_at=ended_at,
        notes=(*task.notes, *notes), error=None if error is None else str(error),
        error_errno=getattr(error, "errno", None), error_step=step, name=task.spec.name,
        kill_snapshot=None if d is None else d.snapshot, signals=tuple(task.signals),
        signals_omitted=task.signals_omitted,
    )


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
    """What the driver found left behind, and what went wrong clearing it (``problems``)."""
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

