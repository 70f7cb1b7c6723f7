"""What a tenant may ask for: checked on the parsed spec, denied by default.

A submission says what it wants as JSON fields and systemd properties; the core's one parser
(``supervisor.syntax.parse_properties``) turns the properties into normalized values
(``Isolation``, ``Limits`` fields, TaskSpec options).  The check here runs on those values,
never on the names as they were sent: a property name with a space, a tab or a no-break space
around it is read by the parser as the name it spells, and so is judged as that name.

Every value a non-root submitter set away from its default is looked up in :data:`RULES`;
what has no rule there is refused (403), so that a field the core learns later is root's until
someone decides otherwise.  A rule is:

- ``"any"``: it can only take away from what the task may do (a limit, a namespace, a dropped
  capability, no_new_privs) or it is the submitter's own business (environment, time limit,
  which signal stops it);
- ``"root"``: it would give the task more than its submitter has (another identity,
  capabilities);
- a function: allowed up to a bound (a resource limit up to the daemon's own hard limit, a
  weight up to the default share).

Root may ask for anything.  :func:`check_run_as` then checks the spec the daemon made (the
submitter's identity added) once more, as a guard against a bug of ours.
"""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .protocol import ApiError

if TYPE_CHECKING:
    from .. import Isolation, TaskSpec
    from .peers import Peer

__all__ = ["DEFAULT_WEIGHT", "RULES", "check_run_as", "check_tenant", "denied_paths"]

DEFAULT_WEIGHT = 100  # cpu.weight and io.weight as the kernel starts them

# The daemon's own hard limits, read once: what a tenant's Limit*= may reach.
_HARD: dict[str, int] = {}


def _hard_limit(name: str) -> int:
    from ..syntax import INFINITY, RLIMITS

    if name not in _HARD:
        hard = resource.getrlimit(RLIMITS[name][0])[1]
        _HARD[name] = int(INFINITY if hard == resource.RLIM_INFINITY else hard)
    return _HARD[name]


def _rlimits(value: Mapping[str, tuple[int, int]]) -> str | None:
    """``Limit*=`` up to the daemon's own hard limit (raising one needs CAP_SYS_RESOURCE:
    ``LimitRTPRIO=`` would give real-time scheduling, ``LimitNICE=`` a higher priority)."""
    from ..syntax import INFINITY

    for name, (soft, hard) in value.items():
        ceiling = _hard_limit(name)
        if max(soft, hard) > ceiling:
            shown = "infinity" if ceiling == INFINITY else str(ceiling)
            return (f"only root may raise Limit{name}= above the daemon's own hard limit "
                    f"({shown}); you asked for {soft}:{hard}")
    return None


def _weight(prop: str) -> Callable[[Any], str | None]:
    def check(value: int) -> str | None:
        if value > DEFAULT_WEIGHT:
            return (f"only root may give a task a {prop}= above the default {DEFAULT_WEIGHT} "
                    f"(a larger share than other users' tasks); you asked for {value}")
        return None
    return check


Rule = str | Callable[[Any], str | None]

# field path -> rule; a path not here is refused for a non-root submitter
RULES: dict[str, Rule] = {
    # TaskSpec options, from the request's fields or from properties
    "argv": "any", "env": "any", "cwd": "any", "stdin": "any", "name": "any",
    "time_limit": "any", "grace": "any", "stop_signal": "any",
    "tty": "any", "tty_size": "any",
    # cgroup limits: each can only lower what the task gets ...
    "limits.memory_max": "any", "limits.memory_high": "any", "limits.memory_swap_max": "any",
    "limits.pids_max": "any", "limits.cpu_max": "any",
    # ... but a weight is a share against everyone else's
    "limits.cpu_weight": _weight("CPUWeight"), "limits.io_weight": _weight("IOWeight"),
    # isolation (systemd.exec): taking away is anyone's, giving is root's
    "isolation.no_new_privileges": "any", "isolation.umask": "any",
    "isolation.private_network": "any", "isolation.private_tmp": "any",
    "isolation.protect_control_groups": "any", "isolation.capability_bounding_set": "any",
    "isolation.rlimits": _rlimits,
    "isolation.user": "root", "isolation.group": "root",
    "isolation.supplementary_groups": "root", "isolation.ambient_capabilities": "root",
}

_PROPERTY = {  # what a field path is called in a request, for the refusal's "field"
    "isolation.user": "User", "isolation.group": "Group",
    "isolation.supplementary_groups": "SupplementaryGroups",
    "isolation.ambient_capabilities": "AmbientCapabilities",
    "isolation.capability_bounding_set": "CapabilityBoundingSet",
    "isolation.no_new_privileges": "NoNewPrivileges", "isolation.umask": "UMask",
    "isolation.private_network": "PrivateNetwork", "isolation.private_tmp": "PrivateTmp",
    "isolation.protect_control_groups": "ProtectControlGroups",
    "limits.cpu_weight": "CPUWeight", "limits.io_weight": "IOWeight",
    "limits.memory_max": "MemoryMax", "limits.memory_high": "MemoryHigh",
    "limits.memory_swap_max": "MemorySwapMax", "limits.pids_max": "TasksMax",
    "limits.cpu_max": "CPUQuota",
}


def asked_values(options: Mapping[str, Any], limits: Mapping[str, Any]) -> Iterator[
        tuple[str, Any]]:
    """(field path, value) for everything set away from its default: TaskSpec ``options``
    (``isolation`` an ``Isolation``, looked into field by field) and ``limits`` fields."""
    import supervisor

    for key, value in options.items():
        if key == "isolation":
            yield from _isolation_values(value, supervisor.Isolation())
        elif key != "limits":
            yield key, value
    for key, value in limits.items():
        if value is not None:
            yield f"limits.{key}", value


def _isolation_values(iso: Isolation, default: Isolation) -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(iso):
        if f.name.startswith("_"):
            continue
        value = getattr(iso, f.name)
        if value != getattr(default, f.name) and not (f.name == "rlimits" and not value):
            yield f"isolation.{f.name}", value


def denied_paths(values: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, str]]:
    """(field path, why) for each value a non-root submitter may not have."""
    for path, value in values:
        rule = RULES.get(path)
        if rule == "any":
            continue
        if rule is None:
            yield path, "it is not known to be harmless for a task of another user (only " \
                        "root may set it)"
        elif rule == "root":
            yield path, "tasks run as their submitter and get no more than it has"
        elif callable(rule):
            why = rule(value)
            if why is not None:
                yield path, why


def check_tenant(peer: Peer, options: Mapping[str, Any], limits: Mapping[str, Any]) -> None:
    """ApiError 403 for the first value of a non-root submitter's parsed request that its
    uid may not have (see the module docstring); nothing for root."""
    if peer.is_root:
        return
    for path, why in denied_paths(asked_values(options, limits)):
        name = _PROPERTY.get(path, path.rpartition(".")[2])
        field = f"properties.{name}" if path.startswith(("isolation.", "limits.")) else name
        if path == "isolation.rlimits":
            field = "properties.Limit*"
        raise ApiError(403, "forbidden", f"{name}: {why} (uid {peer.uid}); ask without it, or "
                       f"have root submit the task", field)


def check_run_as(spec: TaskSpec, peer: Peer) -> None:
    """The spec the daemon made for a non-root submitter runs as exactly that submitter, with
    no capability to raise; AssertionError otherwise (a bug of ours, never the client's)."""
    if peer.is_root:
        return
    iso = spec.isolation
    creds = (iso.user, iso.group, tuple(iso.supplementary_groups))
    if creds != (peer.uid, peer.gid, tuple(peer.groups)) or iso.ambient_capabilities:
        raise AssertionError(f"corral serve made a task of uid {peer.uid} that would run as "
                             f"{creds} with ambient capabilities {iso.ambient_capabilities}")
