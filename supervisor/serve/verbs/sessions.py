"""Sessions (``sessions.py`` has the model):

- ``POST /v1/sessions`` ``{"cwd", "env", "shell", "time_limit", "grace", "properties"}``:
  open one (201), owned by the caller's uid like a task; each at most
  :data:`~supervisor.serve.sessions.MAX_SESSIONS_PER_UID` open per uid.
- ``GET /v1/sessions``: the caller's (root: everyone's), newest first.
- ``GET /v1/sessions/ID``: one, with its directory, environment and running commands.
- ``DELETE /v1/sessions/ID``: close it: every command of it still queued or running is
  stopped (each still gets its record); it takes no more commands.
- ``POST /v1/sessions/ID/exec`` ``{"command": "cd src && make", "background", "wait",
  "time_limit", "grace", "stdin", "name", "idempotency_key"}``: run one command as a task of
  its own (as ``POST /v1/tasks`` answers; with ``wait``, when it ends or the bound passes).
  A foreground command handed back still running (answered at once, or at its wait bound)
  becomes background work when the session runs its next one, and then carries nothing; one
  whose exec is still waiting makes the session busy (409 ``busy`` names it).  Background ones
  run beside it and carry nothing.

A session's commands are checked exactly as a submission is (its properties, limits and
environment, as the caller): a session gives a tenant nothing a task would not.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..http import Request, Response, json_response
from ..protocol import (
    ApiError,
    SubmitRequest,
    body_work,
    parse_exec,
    parse_json_body,
    parse_session,
    pop_wait,
    query_int,
)
from ..records import RecordsError
from ..rows import json_bytes
from ..sessions import (
    MAX_SESSIONS_PER_UID,
    Session,
    env_weight,
    session_argv,
    usable_shell,
)
from ..state import not_found
from .submit import accept, answer_after

if TYPE_CHECKING:
    from ..state import Daemon

DEFAULT_SHELLS = ("/bin/bash", "/bin/sh")
KEEP_CLOSED = 100  # closed sessions a uid's records keep (the oldest go)


async def create(d: Daemon, req: Request) -> Response:
    r = parse_session(parse_json_body(req.body) if req.body.strip() else {})
    if d.handing_over or d.draining:
        raise ApiError(503, "shutting_down", "the daemon is shutting down or restarting: no "
                       "session was opened; retry once it is back")
    mine = sum(1 for s in d.sessions.values() if s.uid == req.peer.uid)
    if not req.peer.is_root and mine >= MAX_SESSIONS_PER_UID:
        raise ApiError(429, "too_many_sessions", f"uid {req.peer.uid} has {mine} open "
                       f"sessions, the most one uid may hold; close one first (DELETE "
                       f"/v1/sessions/ID)")
    shell = r.shell or next((s for s in DEFAULT_SHELLS if usable_shell(s)), "/bin/sh")
    defaults = {"time_limit": r.time_limit, "grace": r.grace,
                "properties": r.properties or None, "env": r.env or None}
    # the defaults are checked now, as the caller, as a command of them would be
    probe = SubmitRequest(argv=session_argv(shell, "true"), env=r.env, cwd=r.cwd or None,
                          time_limit=r.time_limit, grace=r.grace, properties=r.properties)
    d.spec_for(req.peer, probe, rlimits=None)
    s = Session("", req.peer.uid, req.peer.gid, req.peer.groups, shell=shell,
                cwd=r.cwd or _home(req.peer.uid), env=None, defaults=defaults,
                created_at=time.time())
    try:
        s.id = await d.records.open_session(s.row())
    except RecordsError as e:
        raise _unavailable(e, "no session was opened") from None
    d.sessions[s.id] = s
    return json_response(201, s.to_json(), s.weight())


async def list_sessions(d: Daemon, req: Request) -> Response:
    """Newest first, each without its environment (``GET /v1/sessions/ID`` has it)."""
    limit = query_int(req.query, "limit", 100, 1, 1000)
    async with d.shares.reading(req.peer.uid):
        rows = await d.records.list_sessions(None if req.peer.is_root else req.peer.uid,
                                             limit)
    # (each a directory of up to 4 KiB and its defaults of up to 16: a listing of a thousand
    # is encoded in pieces, at its uid's turn)
    weight = sum(json_bytes(row["cwd"]) + len(repr(row.get("defaults"))) for row in rows)
    return json_response(200, {"sessions": [{**_json(d, row), "env": None} for row in rows]},
                         weight)


async def show(d: Daemon, req: Request, id: str) -> Response:
    row = await _row(d, req, id)
    return json_response(200, _json(d, row), _weight(d, id, row))


def _weight(d: Daemon, id: str, row: dict[str, Any]) -> int:
    """What the session's JSON weighs: an open one's as kept (its environment weighed once,
    not walked on the loop at every show: 200,000 variables are ~30 ms), else its row's (a
    closed session keeps no environment)."""
    s = d.sessions.get(id)
    return s.weight() if s is not None else env_weight(row.get("env"))


async def close(d: Daemon, req: Request, id: str) -> Response:
    from ..dispatch import stop_queued

    row = await _row(d, req, id)
    s = d.sessions.get(id)
    if s is None:  # closed already
        return json_response(200, {**_json(d, row), "stopped": []}, env_weight(row.get("env")))
    stopped = []
    for task_id in sorted(s.running, key=int):
        t = d.tasks.get(task_id)
        if t is not None and (stop_queued(d, t) or t.stop(False)):
            stopped.append(task_id)
    closed_at = time.time()
    # (a closed session keeps no environment; a uid keeps its latest closed ones only)
    try:
        await d.records.close_session(id, closed_at, KEEP_CLOSED)
    except RecordsError as e:  # (still open: what it ran was asked to stop)
        raise _unavailable(e, f"session {id} is still open") from None
    s.closed_at = closed_at
    del d.sessions[id]
    d.keep_session_env(s.uid, -s.weigh(s.env), -len(s.env or ()))
    return json_response(200, {**s.to_json(), "stopped": stopped}, s.weight())


async def exec_command(d: Daemon, req: Request, id: str) -> Response:
    # (its body may be a MiB, parsed before the session's owner is known: off the event loop
    # as a submission's, at the uid's turn; parsed on it, a MiB of empty objects was 70-150
    # ms of everyone's loop a request)
    obj = await d.off_loop(req.peer.uid, body_work(req.body), parse_json_body, req.body)
    wait = pop_wait(obj)
    e = parse_exec(obj)
    s = d.sessions.get(id)
    # (an open session's owner is known here: its record, a MiB of environment decoded, is
    # read only for a closed or unknown one)
    mine = s is not None and req.peer.may_see(s.uid)
    owner = s.uid if s is not None and mine else (await _row(d, req, id))["uid"]
    if owner != req.peer.uid:
        # (root may see and close a tenant's session, never run in it: the tenant chose its
        # directory and environment, LD_PRELOAD included, and the command would run as root)
        raise ApiError(403, "forbidden", f"session {id} is uid {owner}'s: only its owner "
                       f"runs commands in it; open a session of your own")
    if s is None:
        raise ApiError(409, "closed", f"session {id} is closed: it takes no more commands; "
                       f"open a new one (POST /v1/sessions)")
    env = s.env if s.env is not None else s.defaults.get("env")
    r = SubmitRequest(
        argv=session_argv(s.shell, e.command), env=env, cwd=e.cwd or s.cwd,
        time_limit=e.time_limit if e.time_limit is not None else s.defaults.get("time_limit"),
        grace=e.grace if e.grace is not None else s.defaults.get("grace"),
        properties=s.defaults.get("properties"), name=e.name, stdin=e.stdin,
        stdin_data=e.stdin_data, idempotency_key=e.idempotency_key, tty=e.tty,
        session={"id": s.id, "command": e.command, "background": e.background,
                 "exact_env": s.env is not None})
    current = d.tasks.get(s.current) if s.current is not None else None
    waited_on = current is not None and not current.handed_back and current.outcome is None
    if not e.background and waited_on and not await _resent(d, req, r):
        raise ApiError(409, "busy", f"session {id} is running a command (task {s.current}) "
                       f"whose exec has not been answered yet; wait for that answer, stop it, "
                       f"or run this one with \"background\": true", "command")
    # (its size as held and recorded: the body, and the environment the session adds to it;
    # summed over its variables: the encoding of a MiB of environment is no longer made here)
    env_size = s.weigh(env)  # (kept: a MiB of it is not walked at each exec)
    size = len(req.body) + env_size
    earlier, t = await accept(d, req.peer, r, size)
    if earlier is not None:
        return json_response(200, earlier, size)
    assert t is not None
    s.running.add(t.id)
    if not e.background:
        before = d.tasks.get(s.current) if s.current is not None else None
        if before is not None and before.outcome is None and before is not t:
            before.demoted = True  # (handed back still running: now background work)
        s.current = t.id
    if wait is None:
        t.handed_back = True
        return json_response(201, {"id": t.id, "state": t.state, "session": s.id})
    return await answer_after(d, t, wait, req.received, env_left_out=env_size)


async def _resent(d: Daemon, req: Request, r: SubmitRequest) -> bool:
    """Whether ``r`` is a retry of a command already accepted (its idempotency key): then it
    gets that task back, busy or not."""
    if r.idempotency_key is None:
        return False
    if (req.peer.uid, r.idempotency_key) in d.keys:
        return True
    if not d.key_filter.may_hold(req.peer.uid, r.idempotency_key):
        return False  # (never taken: no read of the records)
    async with d.shares.reading(req.peer.uid):
        return await d.records.keyed(req.peer.uid, r.idempotency_key) is not None


async def _row(d: Daemon, req: Request, session_id: str) -> dict[str, Any]:
    """The session's record, if the caller may see it (404 otherwise: another uid's session
    is as good as none)."""
    async with d.shares.reading(req.peer.uid):
        row = await d.records.get_session(session_id)
    if row is None or not req.peer.may_see(row["uid"]):
        raise not_found(session_id, "session")
    return row


def _unavailable(e: RecordsError, what: str) -> ApiError:
    return ApiError(503, "records_unavailable", f"{what}: {e}")


def _json(d: Daemon, row: dict[str, Any]) -> dict[str, Any]:
    live = d.sessions.get(row["id"])
    return live.to_json() if live is not None else Session.from_row(row).to_json()


def _home(uid: int) -> str:
    """The user's home directory if it exists, else ``/``."""
    import os
    import pwd

    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"
    return home if home and os.path.isdir(home) else "/"
