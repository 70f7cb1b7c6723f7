"""A submission's meaning: the core's TaskSpec for a request, as its submitter.

Used at submit time (``verbs/submit.py``) and at start-up for tasks an earlier run accepted
and never started (``recover.py``): the same request and submitter make the same spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..placement import check_limits
from .peers import Peer, run_as_isolation, setpriv_prefix, task_environment
from .protocol import ApiError, SubmitRequest

if TYPE_CHECKING:
    from .. import TaskSpec

__all__ = ["ROOT_ONLY_PROPERTIES", "build_spec"]

# What would give a task more than its submitter has: another identity, or capabilities
ROOT_ONLY_PROPERTIES = ("User", "Group", "SupplementaryGroups", "DynamicUser",
                        "AmbientCapabilities")
DEFAULT_WEIGHT = 100  # cpu.weight and io.weight as the kernel starts them


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
        if not peer.is_root:
            _no_more_than_the_submitter(spec, peer)
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


def _no_more_than_the_submitter(spec: TaskSpec, peer: Peer) -> None:
    """A non-root submitter's task runs with the daemon's (root's) privileges dropped: it may
    lower what it gets, never raise it.  A resource limit above the daemon's own hard limit
    (which only CAP_SYS_RESOURCE may set: LimitRTPRIO= for real-time scheduling, LimitNICE=,
    LimitMEMLOCK=...) and a CPU or IO weight above the default (a larger share than every other
    user's tasks) are root's to give."""
    import resource

    from .._isovalues import INFINITY, RLIMITS

    for name, value in spec.isolation.rlimits.items():
        soft, hard = cast("tuple[int, int]", value)  # (normalized when the Isolation was made)
        ours = resource.getrlimit(RLIMITS[name][0])[1]
        ceiling = INFINITY if ours == resource.RLIM_INFINITY else ours
        if max(soft, hard) > ceiling:
            shown = "infinity" if ceiling == INFINITY else str(ceiling)
            raise ApiError(403, "forbidden", f"only root may raise Limit{name}= above the "
                           f"daemon's own hard limit ({shown}); uid {peer.uid} asked for "
                           f"{soft}:{hard}", f"properties.Limit{name}")
    for field, prop in (("cpu_weight", "CPUWeight"), ("io_weight", "IOWeight")):
        weight = getattr(spec.limits, field)
        if weight is not None and weight > DEFAULT_WEIGHT:
            raise ApiError(403, "forbidden", f"only root may give a task a {prop}= above the "
                           f"default {DEFAULT_WEIGHT} (a larger share than other users' tasks); "
                           f"uid {peer.uid} asked for {weight}", f"properties.{prop}")


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
