"""What the MCP tools need from whatever runs the commands: the :class:`Backend` protocol.

The tools (``tools.py``) speak MCP and know nothing of supervisors; a backend runs commands
in sessions and answers in plain JSON-able dicts, the shapes the tools' output schemas
declare (``schemas.py``).  ``local.py`` is the in-process one.  A daemon backend (``corral
serve``'s session API, over its socket, through ``supervisor.client``) implements the same
protocol; then tasks outlive the MCP host.

Every method raises :class:`Refused` (a ``ValueError``) when the request is wrong and
nothing was done: an unknown task or session, a bad value.  Its message names the value,
the rule and the fix, and the tool turns it into a result with ``isError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["SIGNALS", "STREAMS", "Backend", "Limits", "Refused", "RunRequest", "SessionRequest",
           "closed_session", "session_cwd", "whole_characters"]

# what the signal tool may send: KILL is stop(force), STOP is the supervisor's pause
SIGNALS = ("INT", "TERM", "HUP", "QUIT", "USR1", "USR2", "WINCH", "CONT")
STREAMS = ("stdout", "stderr")


class Refused(ValueError):
    """The request was refused before anything was done (bad input, unknown id)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The policy in force, fixed when the server started: what the tool descriptions tell
    the model.  Nothing a tool is given changes it."""

    backend: str  # "in-process" or "daemon"
    default_time_limit: float | None  # seconds, for a run that gives none
    max_time_limit: float | None  # the ceiling: a longer time_limit is capped to it
    grace: float  # seconds between the stop signal and the kill
    controllers: tuple[str, ...]  # cgroup controllers enabled for tasks
    properties: tuple[str, ...]  # NAME=VALUE applied to every command (systemd names)
    shell: str  # each command runs as `shell -c ...`
    output_keep: int  # bytes of head and of tail a run's answer shows, per stream
    notes: tuple[str, ...] = ()  # what the backend wants said (placement notes)


@dataclass(frozen=True, slots=True)
class RunRequest:
    command: str
    session: str | None = None  # None: the default session, made on first use
    time_limit: float | str | None = None
    stdin: str | None = None  # text fed to the command, then end of file; None: /dev/null
    background: bool = False
    interactive: bool = False  # stdin a pipe the input tool writes (``stdin``: its first text)
    wait: float = 0.0  # seconds start may wait for the end (a backend may answer sooner)
    cwd: str | None = None  # its directory instead of the session's (what it leaves carries)


@dataclass(slots=True)
class SessionRequest:
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class Backend(Protocol):
    """Runs commands in sessions.  Async throughout (a daemon backend does I/O); every
    method may raise :class:`Refused`.  Views are the dicts ``schemas.py`` declares."""

    def limits(self) -> Limits:
        """The policy in force."""
        ...

    async def new_session(self, request: SessionRequest) -> dict[str, Any]:
        """Open a session; its view (``SESSION``)."""
        ...

    async def start(self, request: RunRequest) -> str:
        """Start a command; its task id once it runs (or once it is known it never will),
        at most ``request.wait`` seconds later if it ended meanwhile (a daemon answers a
        short command in one round trip)."""
        ...

    async def wait(self, task_id: str, timeout: float) -> bool:
        """Wait until the task has ended and its session was updated, at most ``timeout``
        seconds; whether it has."""
        ...

    async def view(self, task_id: str) -> dict[str, Any]:
        """The task now (``TASK``): running, or its outcome and what carried over."""
        ...

    async def output(self, task_id: str, stream: str, offset: int,
                     max_bytes: int) -> dict[str, Any]:
        """Bytes of a stream from ``offset`` (``OUTPUT``), while it runs and after."""
        ...

    async def signal(self, task_id: str, name: str) -> dict[str, Any]:
        """Send one of :data:`SIGNALS` to every process of the task's tree."""
        ...

    async def stop(self, task_id: str, *, force: bool) -> bool:
        """Stop the whole tree: gracefully (stop signal, grace, kill) or kill now; whether
        the request changed anything."""
        ...

    async def listing(self, session: str | None) -> dict[str, Any]:
        """Tasks and sessions (``LIST``), of one session or all."""
        ...

    async def input(self, task_id: str, text: str, eof: bool) -> dict[str, Any]:
        """Write ``text`` to an interactive task's stdin (then close it, with ``eof``)
        (``INPUT``); Refused for a task that is not interactive or has ended."""
        ...

    async def close_session(self, session: str) -> dict[str, Any]:
        """Close a session: every command of it still running is stopped (``CLOSED``)."""
        ...


def closed_session(name: str) -> str:
    """What a run in a closed session is told."""
    return (f"session {name} is closed: it takes no more commands; new_session opens a new "
            f"one, or leave session out for the default session")


def run_cwd(cwd: str) -> str:
    """A command's own directory (``run``'s ``cwd``), made absolute as a new session's is;
    Refused if it is not a directory here."""
    import os

    path = os.path.abspath(cwd)
    if not os.path.isdir(path):
        raise Refused(f"cwd {cwd!r} is not a directory here; give an existing directory, "
                      f"absolute or relative to this server's")
    return path


def session_cwd(request: SessionRequest) -> str:
    """A new session's working directory (the server's own if none is asked), after checking
    it and the environment asked for; Refused naming what is wrong."""
    import os

    cwd = os.path.abspath(request.cwd) if request.cwd is not None else os.getcwd()
    if not os.path.isdir(cwd):
        raise Refused(f"cwd {request.cwd!r} is not a directory here; give an existing "
                      f"directory (an absolute path)")
    for key, value in request.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise Refused(f"env name {key!r} must be non-empty, without '=' or NUL, and its "
                          f"value without NUL")
    return cwd


def whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 sequence its end cut short (the next read starts there)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # ASCII or a lead byte: how long its sequence is
            need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else \
                4 if b >> 3 == 0b11110 else 1
            return data[:-back] if need > back else data
    return data
