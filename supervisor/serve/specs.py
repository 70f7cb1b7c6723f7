"""A submission's meaning: the core's TaskSpec for a request, as its submitter.

Used at submit time (``verbs/submit.py``) and at start-up for tasks an earlier run accepted
and never started (``recover.py``): the same request and submitter make the same spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..placement import check_limits
from .peers import Peer, run_as_isolation, task_environment
from .policy import check_run_as, check_tenant
from .protocol import ApiError, SubmitRequest

if TYPE_CHECKING:
    from .. import TaskSpec

__all__ = ["build_spec"]


def build_spec(peer: Peer, r: SubmitRequest, *, controllers: frozenset[str], root: str,
               output_cap: int, stdin_pipes: bool, log_file: str | None = None) -> TaskSpec:
    """The core's TaskSpec for a submission (its output to ``log_file``, capped at
    ``output_cap`` per stream); ApiError 400/403 naming the field.

    The request is parsed first (the core's property parser: the one place their syntax
    lives), then what was parsed is checked against what the submitter may have
    (``policy.py``), then the submitter's identity is added."""
    import supervisor

    if r.stdin == "pipe" and not stdin_pipes:
        raise ApiError(400, "unsupported", "stdin \"pipe\" is not supported by this corral "
                       "build yet; give the bytes at submission: {\"text\": \"...\"}", "stdin")
    try:
        options, limits = _options(r)
        check_tenant(peer, options, limits)
        options["env"] = task_environment(peer, options.get("env", {}))
        if limits:
            options["limits"] = supervisor.Limits(**limits)
        isolation = run_as_isolation(peer, options.get("isolation"))
        if isolation is not None:
            options["isolation"] = isolation  # what was asked, as the submitter
        stdin: Any = "pipe" if r.stdin == "pipe" else r.stdin_data
        spec = supervisor.TaskSpec(
            tuple(r.argv), inherit_env=False, cwd=options.pop("cwd", "/"), stdin=stdin,
            name=r.name, log_file=log_file, log_max_bytes=output_cap, **options)
        check_limits(spec.limits, controllers, root)
    except ValueError as e:
        field = getattr(e, "field", None) or getattr(e, "what", None)
        if field in (r.properties or {}):
            field = f"properties.{field}"
        raise ApiError(400, "invalid", str(e), field) from None
    check_run_as(spec, peer)
    return spec


def _options(r: SubmitRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """TaskSpec keywords and Limits fields from the properties (parsed by the core) and the
    request's own fields, which win."""
    from supervisor._properties import parse_properties

    props = parse_properties(f"{k}={v}" for k, v in (r.properties or {}).items())
    options: dict[str, Any] = dict(props.options)
    options["env"] = {**options.get("env", {}), **(r.env or {})}
    for key in ("time_limit", "grace", "stop_signal", "cwd"):
        if getattr(r, key) is not None:
            options[key] = getattr(r, key)
    return options, dict(props.limits)
