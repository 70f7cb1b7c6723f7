"""``POST /v1/tasks``: accept a task (201), or say why not (400/403/409/429/503).

Order: the body's shape (protocol), the meaning (the core's TaskSpec and property parser), the
idempotency key (a retried request gets the first task back, 200), the queue's limits (429),
then the accept record (SQLite), and only then the task is queued and the answer sent.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from ...placement import check_limits
from ..http import Request, Response, json_response
from ..peers import Peer, run_as_isolation, setpriv_prefix, task_environment
from ..protocol import ApiError, SubmitRequest, parse_json_body, parse_submit
from ..tasks import DaemonTask

if TYPE_CHECKING:
    from ... import TaskSpec
    from ..daemon import Daemon

ROOT_ONLY_PROPERTIES = ("User", "Group", "SupplementaryGroups", "DynamicUser")


async def handle(d: Daemon, req: Request) -> Response:
    r = parse_submit(parse_json_body(req.body))
    if d.draining:
        raise ApiError(503, "shutting_down", "the daemon is shutting down and accepts no new "
                       "tasks; retry once it is back")
    if r.idempotency_key is not None:
        earlier = await _earlier(d, req.peer, r)
        if earlier is not None:
            return json_response(200, earlier)
    spec = build_spec(d, req.peer, r)
    d.scheduler.admit(req.peer.uid)
    key = None if r.idempotency_key is None else (req.peer.uid, r.idempotency_key)
    if key is not None:
        d.keys[key] = ""  # reserved: a concurrent retry is told to retry in a moment
    try:
        task_id = await d.records.accept(_row(req.peer, r))
    except BaseException:
        if key is not None:
            d.keys.pop(key, None)
        raise
    output = os.path.join(d.output_dir, task_id)
    spec = spec.from_call(spec, {"log_file": output})
    t = DaemonTask(task_id, req.peer.uid, req.peer.gid, req.peer.pid, r, spec, output,
                   time.time())
    d.add(t)
    return json_response(201, {"id": t.id, "state": t.state})


async def _earlier(d: Daemon, peer: Peer, r: SubmitRequest) -> dict[str, Any] | None:
    """The task an earlier request with this key made (409 if it asked for another thing)."""
    assert r.idempotency_key is not None
    task_id = d.keys.get((peer.uid, r.idempotency_key))
    if task_id == "":
        raise ApiError(409, "in_progress", f"a request with idempotency_key "
                       f"{r.idempotency_key!r} is being accepted right now; retry in a moment",
                       "idempotency_key")
    if task_id is not None and task_id in d.tasks:
        t = d.tasks[task_id]
        spec = t.request.to_json()
        state = t.live_state
    else:
        row = await d.records.find_key(peer.uid, r.idempotency_key)
        if row is None:
            return None
        task_id, spec, state = row["id"], row["spec"], row["state"]
    if spec != r.to_json():
        raise ApiError(409, "idempotency_conflict", f"idempotency_key "
                       f"{r.idempotency_key!r} was used for task {task_id} with another "
                       f"request; use a new key for a new task", "idempotency_key")
    return {"id": task_id, "state": state, "existing": True}


def _row(peer: Peer, r: SubmitRequest) -> dict[str, Any]:
    return {"uid": peer.uid, "gid": peer.gid, "peer_pid": peer.pid, "name": r.name,
            "idempotency_key": r.idempotency_key, "spec": r.to_json(),
            "created_at": time.time()}


def build_spec(d: Daemon, peer: Peer, r: SubmitRequest) -> TaskSpec:
    """The core's TaskSpec for a submission; ApiError 400/403 naming the field."""
    import supervisor

    _check_allowed(d, peer, r)
    try:
        options = _options(peer, r)
        argv = tuple(r.argv)
        isolation = run_as_isolation(peer)
        if isolation is not None:
            options["isolation"] = isolation
        elif not peer.is_root:
            argv = (*setpriv_prefix(peer), *argv)
        stdin: Any = "pipe" if r.stdin == "pipe" else r.stdin_data
        spec = supervisor.TaskSpec(
            argv, inherit_env=False, cwd=options.pop("cwd", "/"), stdin=stdin, name=r.name,
            log_max_bytes=d.config.output_cap, **options)
        check_limits(spec.limits, d.sup.controllers, d.sup.cgroup_root)
    except ValueError as e:
        field = getattr(e, "field", None) or getattr(e, "what", None)
        if field in (r.properties or {}):
            field = f"properties.{field}"
        raise ApiError(400, "invalid", str(e), field) from None
    return spec


def _check_allowed(d: Daemon, peer: Peer, r: SubmitRequest) -> None:
    if not peer.is_root:
        for name in r.properties or {}:
            if name in ROOT_ONLY_PROPERTIES:
                raise ApiError(403, "forbidden", f"only root may set {name}=: tasks run as "
                               f"their submitter (uid {peer.uid})", f"properties.{name}")
    if r.stdin == "pipe" and not d.stdin_pipes:
        raise ApiError(400, "unsupported", "stdin \"pipe\" is not supported by this corral "
                       "build yet; give the bytes at submission: {\"stdin\": {\"text\": "
                       "\"...\"}}", "stdin")


def _options(peer: Peer, r: SubmitRequest) -> dict[str, Any]:
    """TaskSpec keywords from the properties (the core's parser: the one place their syntax
    lives) and the request's own fields, which win."""
    import supervisor
    from supervisor._properties import parse_properties

    props = parse_properties(f"{k}={v}" for k, v in (r.properties or {}).items())
    options: dict[str, Any] = dict(props.options)
    env = {**options.pop("env", {}), **(r.env or {})}
    options["env"] = task_environment(peer, env)
    for key in ("time_limit", "grace", "stop_signal", "cwd"):
        if getattr(r, key) is not None:
            options[key] = getattr(r, key)
    if props.limits:
        options["limits"] = supervisor.Limits(**props.limits)
    return options
