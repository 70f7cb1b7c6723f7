"""A submission's meaning: the core's TaskSpec for a request, as its submitter.

Used at submit time (``verbs/submit.py``) and at start-up for tasks an earlier run accepted
and never started (``recover.py``): the same request and submitter make the same spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..placement import check_limits
from .peers import Peer, run_as_isolation, setpriv_prefix, task_environment
from .protocol import ApiError, SubmitRequest

if TYPE_CHECKING:
    from .. import TaskSpec

__all__ = ["ROOT_ONLY_PROPERTIES", "build_spec"]

ROOT_ONLY_PROPERTIES = ("User", "Group", "SupplementaryGroups", "DynamicUser")


def build_spec(peer: Peer, r: SubmitRequest, *, controllers: frozenset[str], root: str,
               output_cap: int, stdin_pipes: bool, log_file: str | None = None) -> TaskSpec:
    """The core's TaskSpec for a submission (its output to ``log_file``, capped at
    ``output_cap`` per stream); ApiError 400/403 naming the field."""
    import supervisor

    _check_allowed(peer, r, stdin_pipes)
    try:
        options = _options(peer, r)
        argv = tuple(r.argv)
        isolation = run_as_isolation(peer, options.get("isolation"))
        if isolation is not None:
            options["isolation"] = isolation  # what was asked, as the submitter
        elif not peer.is_root:
            argv = (*setpriv_prefix(peer), *argv)
        stdin: Any = "pipe" if r.stdin == "pipe" else r.stdin_data
        spec = supervisor.TaskSpec(
            argv, inherit_env=False, cwd=options.pop("cwd", "/"), stdin=stdin, name=r.name,
            log_file=log_file, log_max_bytes=output_cap, **options)
        check_limits(spec.limits, controllers, root)
    except ValueError as e:
        field = getattr(e, "field", None) or getattr(e, "what", None)
        if field in (r.properties or {}):
            field = f"properties.{field}"
        raise ApiError(400, "invalid", str(e), field) from None
    return spec


def _check_allowed(peer: Peer, r: SubmitRequest, stdin_pipes: bool) -> None:
    if not peer.is_root:
        for name in r.properties or {}:
            if name in ROOT_ONLY_PROPERTIES:
                raise ApiError(403, "forbidden", f"only root may set {name}=: tasks run as "
                               f"their submitter (uid {peer.uid})", f"properties.{name}")
    if r.stdin == "pipe" and not stdin_pipes:
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
