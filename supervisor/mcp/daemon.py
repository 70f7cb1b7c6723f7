"""The daemon backend: ``corral serve``'s session API over its socket; tasks outlive the host.

Each MCP session is a daemon session (``POST /v1/sessions``), each run an exec in it with a
first ``wait`` bound (a short command is answered, with its result, in one round trip), then
long polls of ``GET /v1/tasks/ID/wait``; output is read by offset from
``GET /v1/tasks/ID/output``, signals go through ``POST /v1/tasks/ID/signal``, stops through
``.../stop``, listings through ``GET /v1/tasks?session=ID``.  The policy (time limit, ceiling,
properties) is the server's options, given to every session it opens and checked once at its
start (a session is opened then: the default one); the ceiling of ``/v1/limits`` caps it.

Threads: :class:`supervisor.client.Client` is synchronous and holds one connection, so every
call runs in a trio worker thread on a client of its own, taken from a pool and put back
after a clean answer.  A cancelled call abandons its thread (it ends at the latest with its
long poll, a second); its client is then closed, never reused.

Ownership: the sessions this server opened.  On exit each of them with nothing running is
closed; one with a task still running stays open, and its tasks go on under the daemon (the
instructions say so): ``corral ps`` lists them, ``corral stop`` ends them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

import trio

from ..client import ApiError, Client, new_key
from ..syntax import DEFAULT_GRACE, format_duration, parse_duration
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
from .local import DEFAULT_SESSION, KEEP, property_options, usable_shell
from .schemas import STATES

__all__ = ["DaemonBackend", "open_daemon_backend"]

log = logging.getLogger(__name__)

T = TypeVar("T")
CACHE = 256  # finished tasks whose full JSON is kept (a finished task does not change)
LIST_MAX = 1000  # tasks of a session a listing asks for (the daemon's most)


class _Refusal(Refused):
    """The daemon refused: its HTTP status and error code kept, to be told apart."""

    def __init__(self, e: ApiError) -> None:
        super().__init__(e.message)
        self.status, self.code = e.status, e.code


class DaemonBackend:
    """:class:`~supervisor.mcp.backend.Backend` over ``corral serve``.  Made by
    :func:`open_daemon_backend`."""

    def __init__(self, socket_path: str, limits: Limits, *, session_options: dict[str, Any],
                 ceiling: float | None) -> None:
        self.socket_path = socket_path
        self._limits = limits
        self._session_options = session_options  # shell, time_limit, properties
        self._ceiling = ceiling  # ours (--max-time-limit): a longer time_limit is capped
        self._idle: list[Client] = []
        self._sessions: dict[str, str] = {}  # daemon session id -> name shown (opened here)
        self._default: str | None = None  # the default session's daemon id
        self._background: dict[str, bool] = {}  # task id -> background (started here)
        self._notes: dict[str, list[str]] = {}  # task id -> our notes (a capped time limit)
        self._final: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    def limits(self) -> Limits:
        return self._limits

    # ---- calls in worker threads -----------------------------------------------------------

    async def _call(self, fn: Callable[[Client], T]) -> T:
        """``fn(client)`` in a worker thread, on a pooled client; an ApiError becomes a
        Refused (nothing was done), a 5xx other than 503 stays an error (OSError)."""
        def run() -> T:
            client = self._idle.pop() if self._idle else Client(self.socket_path, timeout=120)
            try:
                value = fn(client)
            except BaseException:
                client.close()
                raise
            self._idle.append(client)
            return value

        try:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        except ApiError as e:
            if e.status >= 500 and e.status != 503:
                raise OSError(f"corral serve at {self.socket_path}: {e.message}") from None
            raise _Refusal(e) from None

    async def _task(self, task_id: str) -> dict[str, Any]:
        """The task's whole JSON (finished ones from the cache)."""
        cached = self._final.get(task_id)
        if cached is not None:
            return cached
        try:
            obj = await self._call(lambda c: c.show(task_id)._asdict())
        except Refused as e:
            raise _no_task(task_id, e) from None
        self._remember(obj)
        return obj

    def _remember(self, obj: dict[str, Any]) -> None:
        if obj.get("state") == "finished" and obj.get("result") is not None:
            self._final[obj["id"]] = obj
            while len(self._final) > CACHE:
                self._final.popitem(last=False)

    # ---- sessions --------------------------------------------------------------------------

    async def open_default(self) -> None:
        """Open the default session now: the policy is checked before anything runs."""
        view = await self._open(SessionRequest(os.getcwd()), DEFAULT_SESSION)
        self._default = view["id"]

    async def new_session(self, request: SessionRequest) -> dict[str, Any]:
        obj = await self._open(request, None)
        return self._session_view(obj, 0)

    async def _open(self, request: SessionRequest, name: str | None) -> dict[str, Any]:
        cwd = session_cwd(request)
        options = {**self._session_options, "cwd": cwd, "env": dict(request.env) or None}
        obj = await self._call(lambda c: c.open_session(
            **{k: v for k, v in options.items() if v is not None}))
        self._sessions[obj["id"]] = name or obj["id"]
        return obj

    def _daemon_session(self, name: str | None) -> str:
        """The daemon's id of a session named as the model names it."""
        if name is None or name == DEFAULT_SESSION:
            if self._default is None:
                raise self._no_session(DEFAULT_SESSION)
            return self._default
        return name

    def _name(self, session_id: str | None) -> str | None:
        return None if session_id is None else self._sessions.get(session_id, session_id)

    async def _session_json(self, name: str) -> dict[str, Any]:
        session_id = self._daemon_session(name)
        try:
            return await self._call(lambda c: c.show_session(session_id))
        except _Refusal as e:
            if e.status == 404:
                raise self._no_session(name) from None
            raise

    def _no_session(self, name: str) -> Refused:
        known = ", ".join(self._sessions.values())
        return Refused(f"no session {name!r} (sessions of this server: {known}); new_session "
                       f"opens one, or leave session out for the default session")

    def _session_view(self, s: dict[str, Any], commands: int) -> dict[str, Any]:
        return {"session": self._name(s["id"]), "cwd": s["cwd"], "shell": s["shell"],
                "current": s.get("current"), "running": list(s.get("running") or []),
                "commands": commands}

    # ---- commands --------------------------------------------------------------------------

    async def start(self, request: RunRequest) -> str:
        name = request.session if request.session is not None else DEFAULT_SESSION
        if name == DEFAULT_SESSION and self._default is None:
            await self.open_default()  # (the model closed it: a new default session)
        session_id = self._daemon_session(name)
        options: dict[str, Any] = {"background": request.background}
        if request.cwd is not None:
            options["cwd"] = run_cwd(request.cwd)
        notes = []
        if request.time_limit is not None:
            options["time_limit"], note = self._capped(request.time_limit)
            notes += [note] if note else []
        if request.interactive:
            options["stdin"] = "pipe"  # (its first text is written once it runs, below)
        elif request.stdin is not None:
            options["stdin"] = request.stdin.encode()
        if request.wait > 0 and not request.background:
            options["wait"] = f"{request.wait:.3f}s"
        options["idempotency_key"] = new_key()
        try:
            obj = await self._call(lambda c: c.exec(session_id, request.command, **options))
        except _Refusal as e:
            raise await self._refused_exec(name, session_id, e) from None
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._stop_started(session_id, request.command, options)
            raise
        self._background[obj["id"]] = request.background
        if request.interactive and request.stdin:
            await self.input(str(obj["id"]), request.stdin, eof=False)
        if notes:
            self._notes[obj["id"]] = notes
        if "result" in obj:
            self._remember(obj)
        return str(obj["id"])

    async def _stop_started(self, session_id: str, command: str,
                            options: dict[str, Any]) -> None:
        """Stop the command an exec cancelled on our side may have started: asked again with
        the same idempotency key and no wait, the daemon names it (or starts nothing new).
        A foreground one makes the session busy first (the daemon checks that before the
        key): then it is the session's current task, if that one is ours."""
        again = {k: v for k, v in options.items() if k != "wait"}
        try:
            task_id = (await self._call(lambda c: c.exec(session_id, command, **again)))["id"]
        except _Refusal as e:
            if e.code != "busy":
                raise
            current = (await self._call(lambda c: c.show_session(session_id))).get("current")
            if current is None:
                return
            task = await self._call(lambda c: c.show(current)._asdict())
            spec = task.get("spec") or {}
            if spec.get("idempotency_key", again["idempotency_key"]) != \
                    again["idempotency_key"] or (spec.get("session") or {}).get(
                    "command") != command:
                return
            task_id = current
        await self._call(lambda c: c.stop(task_id))

    def _capped(self, value: float | str) -> tuple[float | str, str | None]:
        """The time limit to ask for: capped at our ceiling (with the note that says so)."""
        try:
            seconds = parse_duration(value, "time_limit")
        except ValueError as e:
            raise Refused(str(e)) from None
        if self._ceiling is None or seconds <= self._ceiling:
            return value, None
        return self._ceiling, (f"time_limit {format_duration(seconds)} was capped to this "
                               f"server's ceiling, {format_duration(self._ceiling)}")

    async def _refused_exec(self, name: str, session_id: str, e: _Refusal) -> Refused:
        if e.status == 404:
            return self._no_session(name)
        if e.code == "closed":
            return Refused(closed_session(name))
        if e.code == "busy":
            s = await self._session_json(name)
            return Refused(f"session {name} is running a command (task {s.get('current')}) "
                           f"and runs one at a time: wait for it (output with wait), stop it, "
                           f"or run this one with background: true or in another session")
        return e

    async def wait(self, task_id: str, timeout: float) -> bool:
        if task_id in self._final:
            await trio.lowlevel.checkpoint()
            return True
        try:
            info = await self._call(lambda c: c.wait(task_id, timeout, reconnect=0))
        except Refused as e:
            raise _no_task(task_id, e) from None
        return info.state == "finished"

    async def view(self, task_id: str) -> dict[str, Any]:
        obj = await self._task(task_id)
        if obj.get("result") is None:  # still running: its output so far, read now
            so_far = {s: await self._so_far(task_id, s) for s in STREAMS}
        else:
            so_far = None
        return self._task_view(obj, so_far)

    async def _so_far(self, task_id: str, stream: str) -> dict[str, Any]:
        """Head, tail and total of what a running task wrote to ``stream`` so far."""
        def read(c: Client) -> dict[str, Any]:
            head, tail, total = bytearray(), bytearray(), 0
            for frame in c.output(task_id, stream, 0):
                if frame.kind == "data":
                    total = frame.offset + len(frame.data)
                    room = KEEP - len(head)
                    head += frame.data[:room]
                    tail = (tail + frame.data[max(room, 0):])[-KEEP:]
            return _stream_view(bytes(head), bytes(tail), total)

        return await self._call(read)

    async def output(self, task_id: str, stream: str, offset: int,
                     max_bytes: int) -> dict[str, Any]:
        if stream not in STREAMS:
            raise Refused(f"stream must be stdout or stderr, got {stream!r}")
        obj = await self._task(task_id)
        result = obj.get("result")
        kept = (result or {}).get("output", {}).get(stream, {})
        start = offset
        if offset < 0:
            size = kept.get("total_bytes") if result else (
                await self._so_far(task_id, stream))["total_bytes"]
            start = max(0, size + offset)
        try:
            page = await self._call(lambda c: _read_page(c, task_id, stream, start, max_bytes))
        except Refused as e:
            raise _no_task(task_id, e) from None
        data, at, note, end = page
        finished = end is not None and end.finished
        total = kept.get("total_bytes") if result else None
        if total is None:
            total = end.result["output"][stream]["total_bytes"] if finished and end.result \
                else at + len(data)
        if note is None and at > total:
            note = f"offset {at} is past the {total} bytes written so far"
        elif note is None and end is None:
            note = "more follows: read on from next_offset"
        return {"task_id": task_id, "stream": stream, "offset": at,
                "next_offset": at + len(data), "text": data.decode(errors="replace"),
                "bytes": len(data), "total_bytes": total, "eof": finished,
                "state": "finished" if finished or result is not None else _state(obj["state"]),
                "log_truncated": bool(kept.get("log_truncated", False)), "note": note}

    async def signal(self, task_id: str, name: str) -> dict[str, Any]:
        if name not in SIGNALS:
            raise Refused(f"signal must be one of {', '.join(SIGNALS)}, got {name!r} (KILL: "
                          f"stop with force)")
        try:
            await self._call(lambda c: c.signal(task_id, name))
        except _Refusal as e:
            if e.code == "not_running":
                raise Refused(f"task {task_id} is not running ({e}): SIG{name} was not "
                              f"sent") from None
            raise _no_task(task_id, e) from None
        return {"task_id": task_id, "signal": name, "sent": True, "state": "running"}

    async def stop(self, task_id: str, *, force: bool) -> bool:
        try:
            return await self._call(lambda c: c.stop(task_id, force=force))
        except Refused as e:
            raise _no_task(task_id, e) from None

    async def input(self, task_id: str, text: str, eof: bool) -> dict[str, Any]:
        data = text.encode()
        try:
            await self._call(lambda c: c.write_stdin(task_id, data, eof=eof))
        except _Refusal as e:
            if e.code == "no_stdin_pipe":
                raise Refused(f"task {task_id} was not run with interactive: true: its stdin "
                              f"is not open to input (run it again with interactive: true)"
                              ) from None
            if e.status == 409:
                raise Refused(f"task {task_id} takes no more input ({e})") from None
            raise _no_task(task_id, e) from None
        state = (await self._call(lambda c: c.show(task_id))).state
        return {"task_id": task_id, "written": len(data), "eof": eof, "state": _state(state)}

    async def close_session(self, session: str) -> dict[str, Any]:
        await self._session_json(session)  # (Refused: no such session of ours)
        session_id = self._daemon_session(session)
        obj = await self._call(lambda c: c.close_session(session_id))
        self._sessions.pop(session_id, None)
        if session_id == self._default:
            self._default = None  # (the next run without a session opens a new one)
        return {"session": session, "stopped": [str(i) for i in obj.get("stopped") or ()]}

    async def listing(self, session: str | None) -> dict[str, Any]:
        names = [session] if session is not None else list(self._sessions.values())
        tasks, sessions = [], []
        for name in names:
            s = await self._session_json(name)
            rows = await self._call(functools.partial(_session_tasks, session_id=s["id"]))
            rows.reverse()  # (newest first from the daemon; oldest first here, as run made them)
            tasks += [self._brief_view(r) for r in rows]
            sessions.append(self._session_view(s, len(rows)))
        return {"tasks": tasks, "sessions": sessions}

    # ---- views: the dicts schemas.py declares -----------------------------------------------

    def _task_view(self, obj: dict[str, Any], so_far: dict[str, Any] | None) -> dict[str, Any]:
        spec = obj.get("spec") or {}
        of_session = spec.get("session") or {}
        r = obj.get("result")
        ended = r is not None
        exit_ = (r or {}).get("exit") or {}
        cleanup = (r or {}).get("cleanup") or {}
        usage = (r or {}).get("usage") or {}
        carried = obj.get("carried")
        stop = (r or {}).get("stop")
        return {
            "task_id": obj["id"], "session": self._name(of_session.get("id")),
            "command": of_session.get("command") or " ".join(obj.get("argv") or []),
            "background": bool(of_session.get("background", False)),
            "state": "finished" if ended else _state(obj["state"]),
            "outcome": obj.get("outcome") if ended else None,
            "exit_code": exit_.get("code"), "exit_signal": exit_.get("signal_name"),
            "exit_status": obj.get("exit_status") if ended else None,
            "time_limit_s": r.get("time_limit_s") if r else self._time_limit(spec),
            "runtime_s": round(usage["wall_s"], 3) if usage.get("wall_s") is not None
            else None,
            **{s: (_result_stream(r["output"][s]) if r else (so_far or {}).get(
                s, _stream_view(b"", b"", 0))) for s in STREAMS},
            "carried": carried,
            "cwd": carried["cwd"] if carried and "cwd" in carried else spec.get("cwd"),
            "stop": f"{stop['reason']}: {stop.get('reached', stop.get('level'))}" if stop
            else None,
            "cleanup": cleanup.get("state"),
            "leftovers": [p.get("comm") or str(p.get("pid")) for p in
                          cleanup.get("leftovers") or []],
            "signals": [{"signal": str(s.get("signal_name", s.get("signal"))).removeprefix(
                "SIG"), "after_s": float(s.get("after_s") or 0.0)}
                for s in ((r or {}).get("signals") or obj.get("signals") or [])],
            "notes": [*self._notes.get(obj["id"], []), *((r or {}).get("notes") or [])],
            "error": _error_text((r or {}).get("error")),
        }

    def _time_limit(self, spec: dict[str, Any]) -> float | None:
        value = spec.get("time_limit")
        if value is None:
            return self._limits.default_time_limit
        try:
            return parse_duration(value, "time_limit")
        except ValueError:
            return None

    def _brief_view(self, row: dict[str, Any]) -> dict[str, Any]:
        argv = row.get("argv") or []
        # (a session's command is listed as [shell, "-c", command]; before schema 9, as the
        # shell's whole argv: [shell, "-c", script, name, command])
        if row.get("session") is not None and len(argv) in (3, 5) and argv[1] == "-c":
            text = argv[-1]
        else:
            text = " ".join(argv)
        outcome = row.get("outcome")
        started, ended = row.get("started_at"), row.get("ended_at")
        return {
            "task_id": row["id"], "session": self._name(row.get("session")),
            "command": text if len(text) <= 200 else text[:199] + "…",
            "background": self._background.get(row["id"], False),
            "state": _state(row["state"]), "outcome": outcome,
            "exit_code": row.get("exit_status") if outcome in ("succeeded", "failed") else None,
            "runtime_s": round(ended - started, 3) if started and ended else None,
        }

    # ---- the end ---------------------------------------------------------------------------

    async def close_idle_sessions(self) -> None:
        """Close each session opened here with nothing running; name those left open."""
        for session_id in list(self._sessions):
            try:
                s = await self._call(functools.partial(Client.show_session,
                                                       session_id=session_id))
                if s.get("running"):
                    log.warning("session %s stays open under corral serve: its tasks %s are "
                                "still running (corral ps lists them, corral stop ends them)",
                                self._sessions[session_id], ", ".join(s["running"]))
                    continue
                await self._call(functools.partial(Client.close_session,
                                                   session_id=session_id))
            except (Refused, OSError) as e:
                log.warning("session %s: not closed: %s", self._sessions[session_id], e)
        for client in self._idle:
            client.close()
        self._idle.clear()


def _session_tasks(c: Client, session_id: str) -> list[dict[str, Any]]:
    return [t._asdict() for t in c.list(limit=LIST_MAX, session=session_id)]


def _read_page(c: Client, task_id: str, stream: str, start: int,
               max_bytes: int) -> tuple[bytes, int, str | None, Any]:
    """(bytes from ``start``, where they start, a note, the end frame if reached: None when
    cut at ``max_bytes``); blocking."""
    data, at, note, end = bytearray(), start, None, None
    frames: Iterator[Any] = c.output(task_id, stream, start)
    try:
        for frame in frames:
            if frame.kind == "data":
                data += frame.data
                if len(data) >= max_bytes:
                    return whole_characters(bytes(data[:max_bytes])), at, note, None
            elif frame.kind == "gap":
                if data:
                    return bytes(data), at, note, None
                note = (f"bytes {frame.offset}..{frame.end} are no longer held (past the "
                        f"daemon's output cap): this starts after them")
                at = frame.end
            elif frame.kind == "end":
                end = frame
                break
    finally:
        close = getattr(frames, "close", None)
        if close is not None:
            close()
    return bytes(data), at, note, end


def _state(state: str) -> str:
    return state if state in STATES else "running"


def _stream_view(head: bytes, tail: bytes, total: int) -> dict[str, Any]:
    return {"head": head.decode(errors="replace"), "tail": tail.decode(errors="replace"),
            "total_bytes": total, "dropped_bytes": total - len(head) - len(tail)}


def _result_stream(out: dict[str, Any]) -> dict[str, Any]:
    """A result's stream cut to :data:`KEEP` bytes of head and of tail, as the in-process
    backend shows it (the daemon keeps more)."""
    head, tail = out.get("head", "").encode(), out.get("tail", "").encode()
    total, dropped = int(out.get("total_bytes", 0)), int(out.get("dropped_bytes", 0))
    if len(head) <= KEEP and len(tail) <= KEEP:
        return {"head": out.get("head", ""), "tail": out.get("tail", ""),
                "total_bytes": total, "dropped_bytes": dropped}
    if dropped == 0:  # all of it is known: the tail is what follows the head
        whole = head + tail
        return _stream_view(whole[:KEEP], whole[KEEP:][-KEEP:], total)
    return _stream_view(head[:KEEP], tail[-KEEP:], total)


def _no_task(task_id: str, e: Refused) -> Refused:
    if isinstance(e, _Refusal) and e.status in (400, 404, 410) and e.code != "invalid":
        return Refused(f"no task {task_id!r} of yours under corral serve (list shows this "
                       f"server's tasks; corral ps all of yours)")
    return e


@contextlib.asynccontextmanager
async def open_daemon_backend(socket_path: str, *, time_limit: str | None,
                              max_time_limit: str | None,
                              properties: Sequence[str] = ()) -> AsyncIterator[DaemonBackend]:
    """The daemon backend, live for the block: its limits read from ``/v1/limits`` and the
    default session opened (the policy refused now if the daemon refuses it); on exit the
    sessions opened here with nothing running are closed, the rest left to the daemon.
    Bad options raise a ``ValueError``; an unreachable daemon ``DaemonUnavailable`` (an
    ``OSError``)."""
    options = property_options(properties)  # refused as in-process, before the daemon is asked
    shell = usable_shell()
    default = parse_duration(time_limit, "--time-limit") if time_limit else None
    ceiling = parse_duration(max_time_limit, "--max-time-limit") if max_time_limit else default
    with Client(socket_path, timeout=60) as c:
        daemon_limits = await trio.to_thread.run_sync(c.limits)
    theirs = daemon_limits.get("max_time_limit")
    effective_ceiling = min((x for x in (ceiling, theirs) if x is not None), default=None)
    effective_default = default if default is not None else daemon_limits.get(
        "default_time_limit")
    if effective_default is not None and effective_ceiling is not None:
        effective_default = min(effective_default, effective_ceiling)
    props = {name.strip(): value.strip() for name, _, value in
             (p.partition("=") for p in properties)}
    quotas = daemon_limits.get("quotas") or {}
    notes = [f"The daemon runs at most {quotas['max_running']} of your commands at once; "
             f"more wait in its queue (state queued)." if quotas.get("max_running") else "",
             "A session runs one foreground command at a time: while one runs past its wait "
             "bound, run others with background or in another session, or stop it."]
    limits = Limits("daemon", effective_default, effective_ceiling,
                    float(options.get("grace", DEFAULT_GRACE)),
                    tuple(daemon_limits.get("controllers") or ()), tuple(properties), shell,
                    KEEP, tuple(n for n in notes if n))
    session_options = {"shell": shell, "properties": props or None,
                       "time_limit": f"{effective_default}s" if effective_default else None}
    backend = DaemonBackend(socket_path, limits, session_options=session_options,
                            ceiling=effective_ceiling)
    try:
        try:
            await backend.open_default()
        except Refused as e:
            raise ValueError(f"corral serve refused this server's policy: {e}") from None
        yield backend
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await backend.close_idle_sessions()


def answering(socket_path: str, timeout: float = 2.0) -> bool:
    """Whether a daemon answers at ``socket_path`` (``GET /v1/limits``); blocking."""
    from ..client import DaemonUnavailable

    deadline = time.monotonic() + timeout
    try:
        with Client(socket_path, timeout=max(0.1, deadline - time.monotonic())) as c:
            c.limits()
        return True
    except (DaemonUnavailable, ApiError, OSError):
        return False


def _error_text(error: Any) -> str | None:
    """A result's ``error`` (``{"message", "errno", "step"}``) as the text a view shows."""
    if error is None or isinstance(error, str):
        return error
    return str(error.get("message") or error)
