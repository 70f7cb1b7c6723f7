"""(method, path) -> the verb that answers it.  One module per verb in ``verbs/``."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from .http import Handler, Request, Router
from .protocol import ApiError, canonical_id
from .state import not_found
from .verbs import (
    events,
    limits,
    list_tasks,
    metrics,
    output,
    resize,
    sessions,
    show,
    signal,
    stdin,
    stop,
    submit,
    wait,
)

if TYPE_CHECKING:
    from .state import Daemon

__all__ = ["ROUTES", "SMALL_BODY", "body_limit", "make_router"]

_ID = r"(?P<id>[0-9A-Za-z_.-]{1,64})"

# method, path pattern, verb module, long (a long poll or a stream: abandoned when the client
# leaves)
ROUTES: list[tuple[str, str, Any, bool]] = [
    ("POST", r"/v1/tasks", submit, False),
    ("GET", r"/v1/tasks", list_tasks, False),
    ("GET", rf"/v1/tasks/{_ID}", show, False),
    ("GET", rf"/v1/tasks/{_ID}/wait", wait, True),
    ("GET", rf"/v1/tasks/{_ID}/output", output, True),
    ("POST", rf"/v1/tasks/{_ID}/stop", stop, False),
    ("POST", rf"/v1/tasks/{_ID}/stdin", stdin, True),
    ("POST", rf"/v1/tasks/{_ID}/signal", signal, False),
    ("POST", rf"/v1/tasks/{_ID}/resize", resize, False),
    ("POST", r"/v1/sessions", (sessions, "create"), False),
    ("GET", r"/v1/sessions", (sessions, "list_sessions"), False),
    ("GET", rf"/v1/sessions/{_ID}", (sessions, "show"), False),
    ("DELETE", rf"/v1/sessions/{_ID}", (sessions, "close"), False),
    ("POST", rf"/v1/sessions/{_ID}/exec", (sessions, "exec_command"), True),
    ("GET", r"/v1/events", events, True),
    ("GET", r"/v1/limits", limits, False),
    ("GET", r"/metrics", metrics, False),
]
_COMPILED = [(m, re.compile(p), v, long) for m, p, v, long in ROUTES]
# the requests whose body may be up to --max-body (a command, stdin bytes); every other body
# is at most SMALL_BODY (a stop's {"force": true}): read and parsed before the route knows
# whether the task is the caller's, it must cost little
_LARGE_BODIES = [re.compile(p) for p in (r"/v1/tasks", rf"/v1/tasks/{_ID}/stdin",
                                          rf"/v1/sessions/{_ID}/exec")]
SMALL_BODY = 16 * 1024


def body_limit(method: str, path: str, max_body: int) -> int:
    """How large the body of ``method path`` may be."""
    if method == "POST" and any(p.fullmatch(path) for p in _LARGE_BODIES):
        return max_body
    return min(max_body, SMALL_BODY)


def make_router(d: Daemon) -> Router:
    def route(req: Request) -> tuple[Handler, bool, str]:
        allowed = []
        for method, pattern, verb, long in _COMPILED:
            match = pattern.fullmatch(req.path)
            if match is None:
                continue
            if method != req.method:
                allowed.append(method)
                continue
            module, function = verb if isinstance(verb, tuple) else (verb, "handle")
            name = module.__name__.rpartition(".")[2]
            if function != "handle":
                name = f"{name}.{function}"
            task_id = match.groupdict().get("id")
            if task_id is not None and not canonical_id(task_id):
                # (one spelling per task or session: "0123" is none)
                raise not_found(task_id, "session" if module is sessions else "task")
            return (functools.partial(getattr(module, function), d, **match.groupdict()),
                    long, name)
        if allowed:
            raise ApiError(405, "method_not_allowed", f"{req.method} is not allowed on "
                           f"{req.path}; use {' or '.join(allowed)}")
        raise ApiError(404, "no_such_path", f"no such path {req.path!r}; the API is under "
                       f"/v1 (see docs/api.md)")

    return route
