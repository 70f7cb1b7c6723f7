"""What happened to a task: the final record, with its dimensions kept apart.

The outcome, the main process's exit, the cleanup of its leaf, the stop (who asked, how far it
went), the usage and the output are independent facts, so each has its own field; nothing is
folded into one flag.  A figure the kernel did not offer is ``None``, never 0.  Everything here is
plain frozen data; ``TaskResult.to_dict()`` is the documented JSON format (docs/result.md, with a
JSON Schema in docs/result.schema.json) that ``corral run --json-file``, the daemon and its
records share.
"""

from __future__ import annotations

import datetime
import enum
import errno as _errno
import signal as _signal
from dataclasses import field
from typing import Any

from cgroupfs._record import record

__all__ = [
    "SCHEMA_VERSION",
    "Cleanup",
    "Containment",
    "EscapedProcess",
    "KillSnapshot",
    "Outcome",
    "ProcessInfo",
    "SignalSent",
    "SnapshotProcess",
    "StopReason",
    "StopRecord",
    "StreamOutput",
    "TaskResult",
    "Usage",
    "signal_name",
]

SCHEMA_VERSION = 1


class Outcome(enum.StrEnum):
    """How a task ended; compares equal to its string ("timed_out" == Outcome.TIMED_OUT)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SIGNALED = "signaled"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    OOM_KILLED = "oom_killed"
    SPAWN_FAILED = "spawn_failed"
    LOST = "lost"


class StopReason(enum.StrEnum):
    """Who asked a task to stop.  The first request fixes it."""

    TIME_LIMIT = "time_limit"  # the supervisor: the task's time limit
    IDLE = "idle"  # the supervisor: no output for the task's idle timeout
    CANCEL = "cancel"  # the caller: stop(), a cancelled scope, Ctrl-C, Batch.cancel()
    FAIL_FAST = "fail_fast"  # the supervisor: another task of a fail-fast batch failed
    SHUTDOWN = "shutdown"  # the supervisor is closing


def signal_name(number: int | None) -> str | None:
    """``"SIGTERM"`` for 15; ``"SIG64"`` for a number Python has no name for."""
    if number is None:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


@record
class ProcessInfo:
    """A process found in a leaf: enough to say what it was (``comm`` as it was when seen)."""

    pid: int
    comm: str


@record
class SnapshotProcess:
    """One process as it was just before a kill."""

    pid: int
    ppid: int
    state: str  # R running, S sleeping, D disk wait, T stopped, Z zombie...
    comm: str
    cmdline: str | None
    cpu_s: float


@record
class KillSnapshot:
    """The task's processes, frozen and recorded just before corral killed them (what hung):
    ``taken_after_s`` after the spawn; ``more`` processes were there but not recorded."""

    taken_after_s: float
    processes: tuple[SnapshotProcess, ...]
    more: int = 0


@record
class EscapedProcess:
    """A process of the task found outside its leaf: ``cgroup`` is where it had gone (as
    /proc/PID/cgroup says, relative to corral's cgroup namespace), ``ended`` how it ended:
    ``"exited"`` on its own, ``"killed"`` by corral through its pidfd, or ``"running"``."""

    pid: int
    comm: str
    cgroup: str | None
    ended: str


@record(eq=False)
class Cleanup:
    """What became of the leaf: ``clean`` (empty and removed) or ``incomplete``.

    Compares equal to its state string, so ``result.cleanup == "clean"`` reads naturally.
    ``leftovers`` are the processes the main process left in the leaf (background jobs, setsid
    escapees, and any that appeared while they were being stopped), named as they were when
    stopped; ``leftovers_ended_by`` says how they went: ``"stop signal"`` (they ended within the
    grace after the stop signal), ``"killed"`` (cgroup.kill at the grace's end) or ``"exited"``
    (on their own, before any signal).  ``detail`` says why it is incomplete.
    """

    state: str
    leftovers: tuple[ProcessInfo, ...] = ()
    leftovers_ended_by: str | None = None
    detail: str | None = None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.state == other
        if isinstance(other, Cleanup):
            return (self.state, self.leftovers, self.leftovers_ended_by, self.detail) == (
                other.state, other.leftovers, other.leftovers_ended_by, other.detail)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.state)

    def __str__(self) -> str:
        return self.state


@record
class StopRecord:
    """The one stop of a task.  ``*_after_s``: seconds after the spawn (``None``: never).

    ``reached`` is how far it went: ``requested`` (the main process had already ended, or
    never started), ``signalled`` (the stop signal reached the leaf) or ``killed``
    (cgroup.kill).  ``kill_because`` says why a kill came: ``"grace_expired"``, ``"no_grace"``
    (grace 0), ``"second_request"`` (the caller asked twice) or ``"force"`` (``stop(force=True)``
    or a forced shutdown); ``None`` when there was no kill.  ``landed``: the stop reached the
    main process while it was running (otherwise it had ended on its own first).
    ``requested_by``: the signal to the program that made the request (SIGINT: a Ctrl-C;
    SIGTERM: ``kill``, a daemon's drain), ``None`` for a call (``stop()``, a cancelled scope, a
    daemon's stop request) or the supervisor's own stop.
    """

    reason: StopReason
    reached: str
    signal: int
    requested_after_s: float | None
    signalled_after_s: float | None = None
    killed_after_s: float | None = None
    kill_because: str | None = None
    landed: bool = False
    requested_by: int | None = None

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal)


@record
class Usage:
    """What the leaf's accounting offered.  ``None`` means not available here, never zero."""

    wall_s: float | None = None
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    cpu_total_s: float | None = None
    memory_peak: int | None = None
    pids_peak: int | None = None
    oom_kills: int | None = None
    memory_events: dict[str, int] | None = None  # memory.events: low, high, max, oom, oom_kill
    pressure: dict[str, Any] | None = None  # PSI totals (s): {"cpu": {"some", "full"}, ...}
    series: dict[str, Any] | None = None  # sampled while it ran (see docs/result.md)
    paused_s: float = 0.0  # how long pause() held it (not counted by the time limit)


@record
class StreamOutput:
    """One stream: the first ``head`` bytes, the last ``tail`` bytes, and what fell between.

    ``mode``: ``"capture"``; ``"inherit"`` (passed through to the supervisor's own fd: nothing
    kept or counted); ``"tty"`` (stdout holds the pseudo-terminal's output, stderr included).
    """

    head: bytes = b""
    tail: bytes = b""
    total: int = 0
    dropped: int = 0
    log_path: str | None = None
    log_truncated: bool = False
    mode: str = "capture"

    @property
    def data(self) -> bytes:
        """The kept bytes, head then tail (``dropped`` bytes are missing between them)."""
        return self.head + self.tail


@record
class Containment:
    """How the task was really contained.

    ``broken``: a process of the task was found outside its leaf (``escaped``); then the
    cleanup is ``incomplete`` too, since corral cannot vouch for what such a process started.
    ``isolation``: what the task had besides its cgroup (user, namespaces, capabilities).
    """

    mode: str  # "cgroup"
    cgroup: str | None = None  # the leaf's path
    spawn_method: str | None = None  # "clone3", "vfork+cgroup.procs"
    controllers: tuple[str, ...] = ()
    escaped: tuple[EscapedProcess, ...] = ()
    isolation: dict[str, Any] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return bool(self.escaped)


@record
class SignalSent:
    """A signal sent to a running task without stopping it (``TaskHandle.signal``): which,
    when (seconds after the spawn), to what (``"tree"``: every process of its leaf;
    ``"foreground"``: its terminal's foreground process group, as a key would), and who
    asked (the caller's words, e.g. ``"uid 1000"``; None: not said)."""

    signal: int
    after_s: float
    to: str
    by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the record's ``signals`` list has it (docs/result.md)."""
        return {"signal": int(self.signal), "signal_name": signal_name(self.signal),
                "after_s": self.after_s, "to": self.to,
                "by": None if self.by is None else _text(self.by)}


@record
class TaskResult:
    """The final record of one task, exactly one per task.

    ``outcome`` and ``cleanup`` compare equal to the strings of the result model.
    ``exit_code`` is the main process's code when it exited, ``signal`` the signal number when
    a signal ended it (both ``None`` when it never ran).  ``stdout``/``stderr`` are the kept
    bytes; ``output_stdout``/``output_stderr`` hold counts, drops and the log file.
    ``created_at``/``started_at``/``ended_at`` are wall-clock UNIX timestamps; durations
    (``usage.wall_s``, the stop's ``*_after_s``) come from the monotonic clock.
    """

    id: str
    argv: tuple[str, ...]
    outcome: Outcome
    exit_code: int | None
    signal: int | None
    started: bool
    cleanup: Cleanup
    stop: StopRecord | None
    usage: Usage
    output_stdout: StreamOutput
    output_stderr: StreamOutput
    containment: Containment
    time_limit: float | None
    created_at: float
    started_at: float | None
    ended_at: float
    notes: tuple[str, ...] = ()
    error: str | None = None  # spawn_failed / lost: what went wrong, with errno text
    error_errno: int | None = None
    error_step: str | None = None
    name: str | None = None
    kill_snapshot: KillSnapshot | None = None
    signals: tuple[SignalSent, ...] = ()  # what TaskHandle.signal() sent, in order
    signals_omitted: int = 0  # sent between the first and the last 32 listed, not listed

    @property
    def stdout(self) -> bytes:
        return self.output_stdout.data

    @property
    def stderr(self) -> bytes:
        return self.output_stderr.data

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal)

    @property
    def exit_status(self) -> int:
        """The exit status for this record, the one rule of ``corral run`` and the daemon's
        clients: the task's own code; 128+N if signal N ended it; 124 stopped at its time
        limit; stopped otherwise, 128+N of the signal that asked (130 Ctrl-C, 143 SIGTERM,
        129 SIGHUP), 143 for a stop asked by a call (as ``kill`` would); 125 corral's own
        failure (a task corral could not run or follow, ``lost``); 126 the command cannot
        be run, 127 not found."""
        if self.outcome == Outcome.SPAWN_FAILED:
            if self.error_step == "exec":
                return 127 if self.error_errno == _errno.ENOENT else 126
            return 125
        if self.outcome == Outcome.TIMED_OUT:
            return 124
        if self.outcome == Outcome.CANCELLED:
            by = None if self.stop is None else self.stop.requested_by
            return 128 + (by if by is not None else _signal.SIGTERM)
        if self.outcome == Outcome.LOST:
            return 125
        if self.signal is not None:
            return 128 + self.signal
        if self.exit_code is not None:
            return self.exit_code
        return 125

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON format (docs/result.md): text is UTF-8 with undecodable bytes
        replaced; wall-clock times are ISO 8601 UTC strings (``*_at``), durations seconds
        (``*_s``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "name": None if self.name is None else _text(self.name),
            "argv": _texts(self.argv),
            "outcome": str(self.outcome),
            "started": self.started,
            "exit": {"code": self.exit_code, "signal": self.signal,
                     "signal_name": self.signal_name},
            "time_limit_s": self.time_limit,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "stop": _stop_dict(self.stop),
            "cleanup": _cleanup_dict(self.cleanup),
            "usage": _usage_dict(self.usage),
            "output": {"stdout": _stream_dict(self.output_stdout),
                       "stderr": _stream_dict(self.output_stderr)},
            "containment": _containment_dict(self.containment),
            "notes": [_text(n) for n in self.notes],
            "error": _error_dict(self),
            "kill_snapshot": _snapshot_dict(self.kill_snapshot),
            "signals": [x.to_dict() for x in self.signals],
            **({"signals_omitted": self.signals_omitted} if self.signals_omitted else {}),
        }


def _text(value: str) -> str:
    """A str that JSON can carry: lone surrogates (undecodable bytes from os.fsdecode) become
    U+FFFD; any other lone surrogate does too."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # "\ud800": not one os.fsdecode makes
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _texts(values: tuple[str, ...]) -> list[str]:
    """:func:`_text` of each, in one pass when none needs it (a command may have tens of
    thousands of arguments: one encode of them all, not one each)."""
    try:
        "".join(values).encode("utf-8")
        return list(values)
    except UnicodeEncodeError:
        return [_text(v) for v in values]


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    moment = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _stop_dict(stop: StopRecord | None) -> dict[str, Any] | None:
    if stop is None:
        return None
    return {"reason": str(stop.reason), "reached": stop.reached,
            "requested_after_s": stop.requested_after_s,
            "signal": stop.signal, "signal_name": stop.signal_name,
            "signalled_after_s": stop.signalled_after_s, "killed_after_s": stop.killed_after_s,
            "kill_because": stop.kill_because, "landed": stop.landed,
            "requested_by": signal_name(stop.requested_by)}


def _process(p: ProcessInfo) -> dict[str, Any]:
    return {"pid": p.pid, "comm": _text(p.comm)}


def _cleanup_dict(c: Cleanup) -> dict[str, Any]:
    return {"state": c.state, "leftovers": [_process(p) for p in c.leftovers],
            "leftovers_ended_by": c.leftovers_ended_by,
            "detail": None if c.detail is None else _text(c.detail)}


def _usage_dict(u: Usage) -> dict[str, Any]:
    return {"wall_s": u.wall_s, "cpu_user_s": u.cpu_user_s, "cpu_system_s": u.cpu_system_s,
            "cpu_total_s": u.cpu_total_s, "memory_peak_bytes": u.memory_peak,
            "pids_peak": u.pids_peak, "oom_kills": u.oom_kills,
            "memory_events": u.memory_events, "pressure": u.pressure, "series": u.series,
            "paused_s": u.paused_s}


def _snapshot_dict(snap: KillSnapshot | None) -> dict[str, Any] | None:
    if snap is None:
        return None
    return {"taken_after_s": snap.taken_after_s, "more": snap.more,
            "processes": [{"pid": p.pid, "ppid": p.ppid, "state": p.state,
                           "comm": _text(p.comm),
                           "cmdline": None if p.cmdline is None else _text(p.cmdline),
                           "cpu_s": p.cpu_s} for p in snap.processes]}


def _stream_dict(s: StreamOutput) -> dict[str, Any]:
    return {"mode": s.mode, "total_bytes": s.total, "dropped_bytes": s.dropped,
            "head": s.head.decode("utf-8", "replace"), "tail": s.tail.decode("utf-8", "replace"),
            "log_path": None if s.log_path is None else _text(s.log_path),
            "log_truncated": s.log_truncated}


def _containment_dict(c: Containment) -> dict[str, Any]:
    return {"mode": c.mode, "cgroup": None if c.cgroup is None else _text(c.cgroup),
            "spawn_method": c.spawn_method, "controllers": list(c.controllers),
            "broken": c.broken,
            "escaped": [{"pid": e.pid, "comm": _text(e.comm),
                         "cgroup": None if e.cgroup is None else _text(e.cgroup),
                         "ended": e.ended} for e in c.escaped],
            "isolation": dict(c.isolation)}


def _error_dict(r: TaskResult) -> dict[str, Any] | None:
    if r.error is None:
        return None
    name = None if r.error_errno is None else _errno.errorcode.get(r.error_errno)
    return {"message": _text(r.error), "errno": r.error_errno, "errno_name": name,
            "step": r.error_step}
