"""What happened to a task: the final record, with its dimensions kept apart.

The outcome, the main process's exit, the cleanup of its leaf, the stop (who asked, how far it
went), the usage and the output are independent facts, so each has its own field; nothing is
folded into one flag.  A figure the kernel did not offer is ``None``, never 0.  Everything here is
plain frozen data with ``to_dict()`` for JSON, so the CLI, the daemon and SQLite share one shape.
"""

from __future__ import annotations

import enum
import signal as _signal
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Cleanup",
    "Containment",
    "Outcome",
    "ProcessInfo",
    "StopReason",
    "StopRecord",
    "StreamOutput",
    "TaskResult",
    "Usage",
]


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

    TIME_LIMIT = "time_limit"
    CANCEL = "cancel"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A process found in a leaf: enough to say what it was."""

    pid: int
    comm: str


@dataclass(frozen=True, slots=True, eq=False)
class Cleanup:
    """What became of the leaf: ``clean`` (empty and removed) or ``incomplete``.

    Compares equal to its state string, so ``result.cleanup == "clean"`` reads naturally.
    ``leftovers`` are the processes still in the leaf when the main process ended (background
    jobs, setsid escapees); ``leftovers_ended_by`` says how they went: ``"stop signal"`` (they
    ended within the grace after the stop signal), ``"killed"`` (cgroup.kill at the grace's end)
    or ``"exited"`` (on their own, before any signal).  ``detail`` says why it is incomplete.
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


@dataclass(frozen=True, slots=True)
class StopRecord:
    """The one stop of a task.  Times are seconds since the task started (``None``: not reached).

    ``level`` is how far it escalated: ``requested`` (the task had already ended, or had not
    started), ``signalled`` (the stop signal reached the leaf), ``killed`` (cgroup.kill).
    """

    reason: StopReason
    level: str
    requested_at: float
    signal: int
    signalled_at: float | None = None
    killed_at: float | None = None
    forced: bool = False  # a second request skipped the rest of the grace


@dataclass(frozen=True, slots=True)
class Usage:
    """What the leaf's accounting offered.  ``None`` means not available here, never zero."""

    wall_s: float | None = None
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    cpu_total_s: float | None = None
    memory_peak: int | None = None
    pids_peak: int | None = None
    oom_kills: int | None = None


@dataclass(frozen=True, slots=True)
class StreamOutput:
    """One stream: the first ``head`` bytes, the last ``tail`` bytes, and what fell between."""

    head: bytes = b""
    tail: bytes = b""
    total: int = 0
    dropped: int = 0
    log_path: str | None = None
    log_truncated: bool = False
    mode: str = "capture"  # "inherit": passed through, nothing kept or counted

    @property
    def data(self) -> bytes:
        """The kept bytes, head then tail (``dropped`` bytes are missing between them)."""
        return self.head + self.tail


@dataclass(frozen=True, slots=True)
class Containment:
    """How the task was really contained."""

    mode: str  # "cgroup"
    cgroup: str | None = None  # the leaf's path
    spawn_method: str | None = None  # "clone3", "vfork+cgroup.procs"
    controllers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TaskResult:
    """The final record of one task, exactly one per task.

    ``outcome`` and ``cleanup`` compare equal to the strings of the result model.
    ``exit_code`` is the main process's code when it exited, ``signal`` the signal number when
    a signal ended it (both ``None`` when it never ran).  ``stdout``/``stderr`` are the kept
    bytes; ``output_stdout``/``output_stderr`` hold counts, drops and the log file.
    Times are wall-clock UNIX timestamps.
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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def stdout(self) -> bytes:
        return self.output_stdout.data

    @property
    def stderr(self) -> bytes:
        return self.output_stderr.data

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return _signal.Signals(self.signal).name
        except ValueError:
            return f"SIG{self.signal}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: bytes become text (UTF-8, undecodable bytes replaced)."""
        d = asdict(self)
        d["cleanup"] = asdict(self.cleanup)
        for name in ("output_stdout", "output_stderr"):
            s = d[name]
            s["head"] = s["head"].decode("utf-8", "replace")
            s["tail"] = s["tail"].decode("utf-8", "replace")
        d["argv"] = list(self.argv)
        d["signal_name"] = self.signal_name
        d["outcome"] = str(self.outcome)
        if self.stop is not None:
            d["stop"]["reason"] = str(self.stop.reason)
        return d
