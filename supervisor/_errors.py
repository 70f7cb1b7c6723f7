"""The supervisor's exceptions, in one tree.

::

    SupervisorError(Exception)
    ├── SpecError(SupervisorError, ValueError)      a task's arguments are wrong: raised by TaskSpec
    │                                               and run()/start() before anything is created
    ├── ConfigError(SupervisorError, ValueError)    the supervisor's own options are wrong
    │                                               (e.g. a ceiling below the default time limit)
    ├── PlacementError(SupervisorError)             no usable cgroup root: says what was found
    │                                               and what to change
    ├── KeeperError(SupervisorError)                the keeper (the process that ends our root
    │                                               if we die) could not start: why, and the fix
    └── InternalError(SupervisorError)              a bug in corral: report it

A task that fails to start is not an exception: its result says ``spawn_failed`` with the errno
and the step.  Errors of the cgroup filesystem (``cgroupfs.CgroupError``) keep their own tree;
the supervisor lets them through only where no task result can carry them (opening the root).
"""

from __future__ import annotations

__all__ = ["ConfigError", "InternalError", "PlacementError", "SpecError", "SupervisorError",
           "first_leaf"]


class SupervisorError(Exception):
    """Base of the supervisor's errors."""


class SpecError(SupervisorError, ValueError):
    """A task argument is invalid; the message names the field, the value, the rule and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ConfigError(SupervisorError, ValueError):
    """A supervisor option is invalid; the message names the option, the rule and the fix."""


class PlacementError(SupervisorError):
    """No cgroup root this supervisor may use: what was tried, what was found, what to change."""


class InternalError(SupervisorError):
    """Something corral believed impossible happened: a bug, to be reported."""


def first_leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups, or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
