"""The in-process backend: a supervisor of our own, and sessions held in memory.

Each command is a task of its own (own leaf, time limit, stop, record), run by
``sessions.session_argv`` in its session's working directory and environment; its shell
reports what it left on a pipe (its fd 3), read here, and ``sessions.carried_state`` decides
what carries over.  The shell side is the daemon's (``supervisor/serve/sessions.py``), so a
session behaves the same whichever backend runs it.

Ownership: :func:`open_local_backend` owns the supervisor, a nursery every command's life
runs in, and a private directory (mode 0700) with every command's full output (its
``log_file``), so that ``output`` reads any offset while the task runs and after.  On exit
every task still running is stopped (reason ``shutdown``), the records are awaited, and the
directory is removed: tasks end with the server.

Which command carries: the session's foreground command (not ``background``) when it ends by
itself.  One handed back still running (its ``wait`` bound passed) still carries when it
ends, unless the session ran another command meanwhile: then it became background work,
carries nothing, and says so.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from .. import (
    StopReason,
    StreamOutput,
    Supervisor,
    TaskHandle,
    TaskResult,
    TaskSpec,
    open_supervisor,
)
from ..placement import check_limits
from ..serve.sessions import (
    DEMOTED,
    MAX_SESSIONS_PER_UID,
    MAX_STATE,
    Session,
    carried_state,
    session_argv,
    state_pipe,
    unenterable,
    weigh,
)
from ..syntax import parse_properties
from .backend import (
    SIGNALS,
    STREAMS,
    Limits,
    Refused,
    RunRequest,
    SessionRequest,
    closed_session,
    run_cwd,
    session_cwd,
    whole_characters,
)

__all__ = ["LocalBackend", "open_local_backend", "property_options", "usable_shell"]

DEFAULT_SESSION = "default"
KEEP = 8 * 1024  # bytes of head and of tail an answer shows, per stream
LOG_MAX = 64 << 20  # bytes of each stream kept for `output`
RETAIN = 1000  # finished tasks remembered (their logs with them); the oldest go first
REPORT_WAIT = 2.0  # seconds a state report may lag its task's end (an escapee holding fd 3)


@dataclass(eq=False, slots=True)
class _Command:
    """One command of a session, as this backend follows it."""

    session: Session
    command: str
    background: bool
    log: str  # stdout's log file; stderr's is log + ".stderr"
    cwd: str  # the directory it was started in (the session's, unless run gave one)
    handle: TaskHandle | None = None
    result: TaskResult | None = None
    carried: dict[str, Any] | None = None
    demoted: bool = False  # the session ran another command before this one ended
    state: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    signals: list[dict[str, Any]] = field(default_factory=list)  # what the signal tool sent
    started_at: float = 0.0  # trio.current_time() at the start
    ended: trio.Event = field(default_factory=trio.Event)  # record made, session updated

    @property
    def id(self) -> str:
        assert self.handle is not None
        return self.handle.id


def usable_shell() -> str:
    """bash if there is one (what agents' commands assume), else sh."""
    return next((p for p in ("/bin/bash", "/usr/bin/bash") if os.access(p, os.X_OK)), "/bin/sh")


class LocalBackend:
    """:class:`~supervisor.mcp.backend.Backend` on an in-process supervisor (trio, one
    thread: no locks).  Made by :func:`open_local_backend`."""

    def __init__(self, sup: Supervisor, nursery: trio.Nursery, logs: str, *,
                 properties: Sequence[str], options: dict[str, Any], shell: str) -> None:
        self._sup = sup
        self._nursery = nursery
        self._logs = logs
        self._properties = tuple(properties)
        self._options = options  # from the properties: limits, isolation, grace, ...
        self._shell = shell
        self._sessions: dict[str, Session] = {}
        self._closed: set[str] = set()  # sessions closed (close_session), by id
        self._counts: collections.Counter[str] = collections.Counter()  # commands per session
        self._tasks: collections.OrderedDict[str, _Command] = collections.OrderedDict()
        self._made = 0

    def limits(self) -> Limits:
        sup = self._sup
        grace = self._options.get("grace", 5.0)
        return Limits("in-process", sup.default_time_limit, sup.max_time_limit,
                      float(grace), tuple(sorted(sup.controllers)), self._properties,
                      self._shell, KEEP, tuple(sup.placement_notes))

    # ---- sessions --------------------------------------------------------------------------

    async def new_session(self, request: SessionRequest) -> dict[str, Any]:
        session = self._open_session(f"s{len(self._sessions) + 1}", request)
        await trio.lowlevel.checkpoint()
        return self._session_view(session)

    def _open_session(self, session_id: str, request: SessionRequest) -> Session:
        if len(self._sessions) >= MAX_SESSIONS_PER_UID:
            raise Refused(f"this server holds {MAX_SESSIONS_PER_UID} sessions already, the "
                          f"most it opens; run in one of them (list shows them)")
        cwd = session_cwd(request)
        env = {**os.environ, **request.env}
        session = Session(session_id, os.getuid(), os.getgid(), tuple(os.getgroups()),
                          shell=self._shell, cwd=cwd, env=env, defaults={},
                          created_at=time.time())
        self._sessions[session_id] = session
        return session

    def _session(self, session_id: str | None) -> Session:
        if session_id is None:
            found = self._sessions.get(DEFAULT_SESSION)
            return found if found is not None else self._open_session(DEFAULT_SESSION,
                                                                      SessionRequest())
        found = self._sessions.get(session_id)
        if found is None and session_id in self._closed:
            raise Refused(closed_session(session_id))
        if found is None:
            known = ", ".join(self._sessions) or "none yet"
            raise Refused(f"no session {session_id!r} (sessions: {known}); new_session opens "
                          f"one, or leave session out for the default session")
        return found

    def _session_view(self, s: Session) -> dict[str, Any]:
        return {"session": s.id, "cwd": s.cwd, "shell": s.shell, "current": s.current,
                "running": sorted(s.running), "commands": self._counts[s.id]}

    # ---- commands --------------------------------------------------------------------------

    async def start(self, request: RunRequest) -> str:
        session = self._session(request.session)
        self._made += 1
        cwd = session.cwd if request.cwd is None else run_cwd(request.cwd)
        cmd = _Command(session, request.command, request.background,
                       os.path.join(self._logs, f"{self._made}.log"), cwd)
        first = None if request.stdin is None else request.stdin.encode()
        stdin: Literal["pipe"] | bytes | None = "pipe" if request.interactive else first
        r, w = state_pipe()
        options: dict[str, Any] = dict(self._options)
        if request.time_limit is not None:
            options["time_limit"] = request.time_limit
        try:
            spec = TaskSpec(tuple(session_argv(session.shell, request.command)),
                            env=session.env, inherit_env=False, cwd=cwd, stdin=stdin,
                            output_head=KEEP, output_tail=KEEP, log_file=cmd.log,
                            log_max_bytes=LOG_MAX, pass_fds=(w,), **options)
        except ValueError as e:
            os.close(r)
            os.close(w)
            raise Refused(str(e)) from None
        # the life owns both ends from here on
        try:
            task_id: str = await self._nursery.start(self._life, cmd, spec, r, w)
        except* ValueError as group:  # the supervisor's refusal at its start (a SpecError)
            raise Refused("; ".join(str(e) for e in group.exceptions)) from None
        if request.interactive and first:
            await self.input(task_id, request.stdin or "", eof=False)
        return task_id

    async def _life(self, cmd: _Command, spec: TaskSpec, r: int, w: int,
                    task_status: trio.TaskStatus[str]) -> None:
        """One command: its task, its state report read meanwhile, then what carries."""
        try:
            async with trio.open_nursery() as nursery:
                reported = trio.Event()
                nursery.start_soon(self._read_report, cmd, r, reported)
                try:
                    handle: TaskHandle = await nursery.start(
                        functools.partial(self._sup.start, spec))
                finally:
                    os.close(w)  # the task has its own copy (fd 3), or never will
                cmd.handle, cmd.started_at = handle, trio.current_time()
                self._admitted(cmd)
                task_status.started(handle.id)
                cmd.result = await handle.wait()
                with trio.move_on_after(REPORT_WAIT):
                    await reported.wait()
                nursery.cancel_scope.cancel()
        finally:
            os.close(r)
            if cmd.handle is not None:
                self._finished(cmd)

    async def _read_report(self, cmd: _Command, r: int, reported: trio.Event) -> None:
        """Read the state pipe to its end (every holder of fd 3 gone), keeping at most
        MAX_STATE bytes: the rest is read and dropped, so that no shell blocks on it."""
        while True:
            await trio.lowlevel.wait_readable(r)
            try:
                chunk = os.read(r, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                reported.set()
                return
            room = MAX_STATE - len(cmd.state)
            if len(chunk) > room:
                cmd.truncated = True
            cmd.state += chunk[:max(room, 0)]

    def _admitted(self, cmd: _Command) -> None:
        session = cmd.session
        self._tasks[cmd.id] = cmd
        self._counts[session.id] += 1
        session.running.add(cmd.id)
        if not cmd.background:
            before = self._tasks.get(session.current) if session.current else None
            if before is not None and not before.ended.is_set():
                before.demoted = True
            session.current = cmd.id
        self._forget_old()

    def _finished(self, cmd: _Command) -> None:
        session, result = cmd.session, cmd.result
        session.running.discard(cmd.id)
        if session.current == cmd.id:
            session.current = None
        if result is None:  # (cancelled before its record: the supervisor is closing)
            cmd.carried = {"nothing": "the server closed before its record was made"}
        elif cmd.demoted:
            cmd.carried = {"nothing": DEMOTED}
        else:
            state = weigh(bytes(cmd.state), cmd.truncated, session.env or {}) \
                if result.started else None
            cmd.carried = carried_state(session, str(result.outcome), cmd.background,
                                        state if state is not None else "it never ran")
            if result.error_step == "chdir":
                error = {"step": "chdir", "errno_name": errno.errorcode.get(
                    result.error_errno or 0)}
                cmd.carried = unenterable(session, cmd.cwd, error) or cmd.carried
        cmd.ended.set()

    def _forget_old(self) -> None:
        """Keep at most RETAIN finished tasks; an older one goes with its logs."""
        finished = [k for k, c in self._tasks.items() if c.ended.is_set()]
        for task_id in finished[:max(0, len(finished) - RETAIN)]:
            cmd = self._tasks.pop(task_id)
            for path in (cmd.log, cmd.log + ".stderr"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def _command(self, task_id: str) -> _Command:
        cmd = self._tasks.get(task_id)
        if cmd is None:
            raise Refused(f"no task {task_id!r} of this server (list shows them; the oldest "
                          f"of more than {RETAIN} finished ones are forgotten)")
        return cmd

    async def wait(self, task_id: str, timeout: float) -> bool:
        cmd = self._command(task_id)
        with trio.move_on_after(timeout):
            await cmd.ended.wait()
        return cmd.ended.is_set()

    async def view(self, task_id: str) -> dict[str, Any]:
        cmd = self._command(task_id)
        await trio.lowlevel.checkpoint()
        return task_view(cmd)

    async def output(self, task_id: str, stream: str, offset: int,
                     max_bytes: int) -> dict[str, Any]:
        cmd = self._command(task_id)
        if stream not in STREAMS:
            raise Refused(f"stream must be stdout or stderr, got {stream!r}")
        assert cmd.handle is not None
        kept = cmd.handle.output(stream) if cmd.result is None else (
            cmd.result.output_stdout if stream == "stdout" else cmd.result.output_stderr)
        path = cmd.log if stream == "stdout" else cmd.log + ".stderr"
        data, size = await trio.to_thread.run_sync(_read_log, path, offset, max_bytes)
        start = max(0, size + offset) if offset < 0 else offset
        end = start + len(data)
        note = None
        if kept.log_truncated or (kept.total > size and cmd.ended.is_set()):
            note = (f"only the first {size} of {kept.total} bytes were kept for reading "
                    f"({LOG_MAX} at most per stream)")
        elif start > size:
            note = f"offset {start} is past the {size} bytes written so far"
        return {"task_id": task_id, "stream": stream, "offset": start, "next_offset": end,
                "text": data.decode(errors="replace"), "bytes": len(data),
                "total_bytes": kept.total, "eof": cmd.ended.is_set() and end >= size,
                "state": state_of(cmd), "log_truncated": kept.log_truncated, "note": note}

    async def signal(self, task_id: str, name: str) -> dict[str, Any]:
        cmd = self._command(task_id)
        if name not in SIGNALS:
            raise Refused(f"signal must be one of {', '.join(SIGNALS)}, got {name!r} (KILL: "
                          f"stop with force)")
        assert cmd.handle is not None
        sent = not cmd.ended.is_set() and await cmd.handle.deliver_signal(
            getattr(signal, "SIG" + name), by="mcp client")
        if not sent:
            raise Refused(f"task {task_id} is not running ({state_of(cmd)}"
                          f"{', ' + str(cmd.result.outcome) if cmd.result else ''}): "
                          f"SIG{name} was not sent")
        cmd.signals.append({"signal": name,
                            "after_s": round(trio.current_time() - cmd.started_at, 3)})
        return {"task_id": task_id, "signal": name, "sent": True, "state": state_of(cmd)}

    async def stop(self, task_id: str, *, force: bool) -> bool:
        cmd = self._command(task_id)
        assert cmd.handle is not None
        changed = cmd.handle.stop(force=force)
        await trio.lowlevel.checkpoint()
        return changed

    async def input(self, task_id: str, text: str, eof: bool) -> dict[str, Any]:
        cmd = self._command(task_id)
        assert cmd.handle is not None
        if cmd.handle.spec.stdin != "pipe":
            raise Refused(f"task {task_id} was not run with interactive: true: its stdin is "
                          f"not open to input (run it again with interactive: true)")
        data = text.encode()
        try:
            await cmd.handle.write_stdin(data)
            if eof:
                cmd.handle.close_stdin()
        except BrokenPipeError:
            raise Refused(f"task {task_id} takes no more input: its stdin is closed (it "
                          f"ended, closed it, or input was ended with eof)") from None
        return {"task_id": task_id, "written": len(data), "eof": eof, "state": state_of(cmd)}

    async def close_session(self, session: str) -> dict[str, Any]:
        s = self._session(session)
        stopped = [c.id for c in self._tasks.values() if c.session is s
                   and not c.ended.is_set() and c.handle is not None and c.handle.stop()]
        del self._sessions[s.id]
        if s.id != DEFAULT_SESSION:  # (the default one is made anew by the next run)
            self._closed.add(s.id)
        await trio.lowlevel.checkpoint()
        return {"session": s.id, "stopped": stopped}

    async def listing(self, session: str | None) -> dict[str, Any]:
        sessions = [self._session(session)] if session is not None else \
            list(self._sessions.values())
        ids = {s.id for s in sessions}
        await trio.lowlevel.checkpoint()
        return {"tasks": [brief_view(c) for c in self._tasks.values() if c.session.id in ids],
                "sessions": [self._session_view(s) for s in sessions]}


@contextlib.asynccontextmanager
async def open_local_backend(*, cgroup_root: str | None, time_limit: str | None,
                             max_time_limit: str | None, properties: Sequence[str] = (),
                             shell: str | None = None) -> AsyncIterator[LocalBackend]:
    """The in-process backend, live for the block; on exit every task it started is stopped
    and recorded, its supervisor's root and its output directory removed.  Bad properties
    or durations raise a ``ValueError`` (``SpecError``, ``ConfigError``) first."""
    options = property_options(properties)
    logs = tempfile.mkdtemp(prefix="corral-mcp-")
    try:
        async with open_supervisor(cgroup_root, default_time_limit=time_limit,
                                   max_time_limit=max_time_limit) as sup:
            if "limits" in options:  # refused now, not at each command
                check_limits(options["limits"], sup.controllers, sup.cgroup_root)
            async with trio.open_nursery() as nursery:
                try:
                    yield LocalBackend(sup, nursery, logs, properties=properties,
                                       options=options, shell=shell or usable_shell())
                finally:
                    sup.stop_all(reason=StopReason.SHUTDOWN)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def property_options(properties: Sequence[str]) -> dict[str, Any]:
    """TaskSpec options from the server's NAME=VALUE properties; those a session decides
    (its directory and environment) and the time limit (the server's options) are refused."""
    from cgroupfs import Limits as CgroupLimits

    collected = parse_properties(properties)
    options = dict(collected.options)
    for key, why in (("env", "a session's environment is its own: new_session takes env"),
                     ("cwd", "a session's directory is its own: new_session takes cwd"),
                     ("time_limit", "use --time-limit / --max-time-limit")):
        if key in options:
            raise Refused(f"property for {key} is not taken here: {why}")
    if collected.limits:
        options["limits"] = CgroupLimits(**collected.limits)
    TaskSpec(("true",), **options)  # refused now, not at the first command
    return options


def _read_log(path: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """(bytes of ``path`` from ``offset``, negative: from the end; the file's size); a file
    not made yet is empty.  Cut back to whole UTF-8 characters when the read was cut."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size + offset) if offset < 0 else offset
            f.seek(start)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return b"", 0
    if len(data) == max_bytes:
        data = whole_characters(data)
    return data, size


# ---- views: the dicts schemas.py declares ---------------------------------------------------


def state_of(cmd: _Command) -> str:
    if cmd.ended.is_set() or cmd.handle is None:
        return "finished"
    state = cmd.handle.state
    return "running" if state == "finished" else state  # (recorded; session not updated yet)


def _stream(out: StreamOutput) -> dict[str, Any]:
    return {"head": out.head.decode(errors="replace"), "tail": out.tail.decode(errors="replace"),
            "total_bytes": out.total, "dropped_bytes": out.dropped}


def task_view(cmd: _Command) -> dict[str, Any]:
    assert cmd.handle is not None
    h, r = cmd.handle, cmd.result if cmd.ended.is_set() else None
    stdout, stderr = (h.output("stdout"), h.output("stderr")) if r is None else \
        (r.output_stdout, r.output_stderr)
    return {
        "task_id": h.id, "session": cmd.session.id, "command": cmd.command,
        "background": cmd.background, "state": state_of(cmd),
        "outcome": str(r.outcome) if r else None,
        "exit_code": r.exit_code if r else None,
        "exit_signal": signal.Signals(r.signal).name if r and r.signal else None,
        "exit_status": r.exit_status if r else None,
        "time_limit_s": h.time_limit,
        "runtime_s": round(r.usage.wall_s, 3) if r and r.usage.wall_s is not None else None,
        "stdout": _stream(stdout), "stderr": _stream(stderr),
        "carried": cmd.carried,
        "cwd": cmd.session.cwd,
        "stop": _stop_text(r),
        "cleanup": str(r.cleanup.state) if r else None,
        "leftovers": [p.comm or str(p.pid) for p in r.cleanup.leftovers] if r else [],
        "signals": list(cmd.signals),
        "notes": list(r.notes) if r else [],
        "error": r.error if r else None,
    }


def _stop_text(r: TaskResult | None) -> str | None:
    if r is None or r.stop is None:
        return None
    return f"{r.stop.reason}: {r.stop.reached}"


def brief_view(cmd: _Command) -> dict[str, Any]:
    full = task_view(cmd)
    brief = {k: full[k] for k in ("task_id", "session", "background", "state", "outcome",
                                  "exit_code", "runtime_s")}
    text = cmd.command
    brief["command"] = text if len(text) <= 200 else text[:199] + "…"
    return brief
