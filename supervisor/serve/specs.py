"""A submission's meaning: the core's TaskSpec for a request, as its submitter.

Used at submit time (``verbs/submit.py``) and at start-up for tasks an earlier run accepted
and never started (``recover.py``): the same request and submitter make the same spec.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..placement import check_limits
from .peers import Peer, run_as_isolation, task_environment
from .policy import check_run_as, check_tenant
from .protocol import ApiError, SubmitRequest

if TYPE_CHECKING:
    from .. import TaskSpec

__all__ = ["build_spec"]


Rlimits = Mapping[str, tuple[int, int]]


def build_spec(peer: Peer, r: SubmitRequest, *, controllers: frozenset[str], root: str,
               output_cap: int, stdin_pipes: bool, log_file: str | None = None,
               rlimits: Rlimits | None = None, nofile_soft: int | None = None) -> TaskSpec:
    """The core's TaskSpec for a submission (its output to ``log_file``, capped at
    ``output_cap`` per stream); ApiError 400/403 naming the field.

    The request is parsed first (the core's property parser: the one place their syntax
    lives), then what was parsed is checked against what the submitter may have
    (``policy.py``), then the submitter's identity is added, and its resource limits
    (``rlimits``, :func:`peers.rlimits_of`: a non-root submitter's task starts with its
    submitter's limits, and may lower them, never raise them).  Without them (root, or a task
    an older corral accepted) the open-files soft limit is ``nofile_soft``, the daemon's own
    before it raised it for its connections (a program using select(2) needs at most
    1024)."""
    import supervisor

    if r.tty is not None and r.stdin is None and r.stdin_data is None:
        r = r._replace(stdin="pipe")  # (a terminal's keys come later: POST .../stdin)
    if r.stdin == "pipe" and not stdin_pipes:
        raise ApiError(400, "unsupported", "stdin \"pipe\" is not supported by this corral "
                       "build yet; give the bytes at submission: {\"text\": \"...\"}", "stdin")
    try:
        options, limits = _options(r)
        check_tenant(peer, options, limits)
        started = _rlimits_of_task(peer, options.get("isolation"), rlimits, nofile_soft)
        if r.session is not None and r.session.get("exact_env"):
            pass  # a session's environment as its last command left it: the whole of it
        else:
            options["env"] = task_environment(peer, options.get("env", {}))
        if limits:
            options["limits"] = supervisor.Limits(**limits)
        # (made once: each Isolation made checks and looks up all of it again, the user's
        # groups among it, and a tenant's `true` made three: a quarter of its request's time)
        isolation = run_as_isolation(peer, options.get("isolation"), started)
        if isolation is not None:
            options["isolation"] = isolation  # what was asked, as the submitter
        stdin: Any = "pipe" if r.stdin == "pipe" else r.stdin_data
        if r.tty is not None:
            options.update(tty=True, tty_size=(r.tty["rows"], r.tty["cols"]))
        spec = supervisor.TaskSpec(
            tuple(r.argv), inherit_env=False, cwd=options.pop("cwd", "/"), stdin=stdin,
            name=r.name, log_file=log_file, log_max_bytes=output_cap,
            log_lazy=True, **options)
        check_limits(spec.limits, controllers, root)
    except ValueError as e:
        field = getattr(e, "field", None) or getattr(e, "what", None)
        if field in (r.properties or {}):
            field = f"properties.{field}"
        raise ApiError(400, "invalid", str(e), field) from None
    check_run_as(spec, peer)
    return spec


def _rlimits_of_task(peer: Peer, asked: Any, rlimits: Rlimits | None,
                     nofile_soft: int | None) -> dict[str, tuple[int, int]] | None:
    """The task's starting resource limits (see build_spec), None if they are the ones
    ``asked`` (its properties' Isolation, or None) has; ApiError 403 for a limit asked above
    the submitter's own hard limit."""
    from ..syntax import INFINITY

    # (normalized by the parser: {name: (soft, hard)})
    own: dict[str, tuple[int, int]] = {} if asked is None else dict(asked.rlimits)
    given = dict(own)
    if rlimits is not None and not peer.is_root:
        for name, (soft, hard) in given.items():
            if hard > rlimits[name][1]:
                raise ApiError(403, "forbidden", f"Limit{name}={soft}:{hard} is above your "
                               f"own hard limit ({_shown(rlimits[name][1])}; uid {peer.uid}): "
                               f"a task gets no more than its submitter has; ask for at most "
                               f"that", f"properties.Limit{name}")
        given = {**_within_ours(rlimits), **given}
    elif nofile_soft is not None and "NOFILE" not in given:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if nofile_soft < hard or hard == resource.RLIM_INFINITY:
            given["NOFILE"] = (nofile_soft, INFINITY if hard == resource.RLIM_INFINITY
                               else hard)
    return None if given == own else given


def _within_ours(rlimits: Rlimits) -> dict[str, tuple[int, int]]:
    """``rlimits`` with no hard limit above the daemon's own unless it may raise one
    (CAP_SYS_RESOURCE; a container's root may lack it): a submitter's session may have more
    than the service, and its task then gets what the service can give."""
    from ..lowlevel import has_cap
    from ..syntax import INFINITY, RLIMITS

    if has_cap("CAP_SYS_RESOURCE"):
        return dict(rlimits)
    within = {}
    for name, (soft, hard) in rlimits.items():
        ours = resource.getrlimit(RLIMITS[name][0])[1]
        ours = INFINITY if ours == resource.RLIM_INFINITY else ours
        within[name] = (min(soft, ours), min(hard, ours))
    return within


def _shown(value: int) -> str:
    from ..syntax import INFINITY

    return "infinity" if value == INFINITY else str(value)


def _options(r: SubmitRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """TaskSpec keywords and Limits fields from the properties (parsed by the core) and the
    request's own fields; one setting given both ways is refused (400)."""
    from ..syntax import parse_properties

    named: dict[str, str] = {}
    for key in r.properties or {}:
        # (the parser trims a name's blanks: two spellings of one property were both taken,
        # and a filter in front of the daemon might judge the one the daemon does not use)
        name = key.partition("=")[0].strip(" \t")
        if name in named:
            raise ApiError(400, "invalid", f"properties name {name} twice ({named[name]!r} "
                           f"and {key!r}): give each property once, spelled without blanks",
                           f"properties.{key}")
        named[name] = key
    props = parse_properties(f"{k}={v}" for k, v in (r.properties or {}).items())
    options: dict[str, Any] = dict(props.options)
    # (a setting given both ways was the field's, silently: a filter in front of the daemon
    # judging the property was misled, as by a key given twice; an independent attack.  A
    # session's command is the session's fields, its directory and environment as its last
    # command left them, beside the properties it was opened with: its own, not twice)
    client = r.session is None
    for key, name in _SPELLED_TWICE.items():
        if client and getattr(r, key) is not None and key in options:
            raise ApiError(400, "invalid", f"{key} is given twice: as the field {key!r} and "
                           f"as the property {name}; give it once", f"properties.{name}")
        if getattr(r, key) is not None:
            options[key] = getattr(r, key)
    twice = sorted(set(options.get("env", {})) & set(r.env or {})) if client else []
    if twice:
        raise ApiError(400, "invalid", f"the variable {twice[0]!r} is given twice: in the "
                       f"field env and in the property Environment; give it once",
                       "properties.Environment")
    options["env"] = {**options.get("env", {}), **(r.env or {})}
    return options, dict(props.limits)


# a request's fields and the property that sets each too
_SPELLED_TWICE = {"time_limit": "RuntimeMaxSec", "grace": "TimeoutStopSec",
                  "stop_signal": "KillSignal", "cwd": "WorkingDirectory"}
