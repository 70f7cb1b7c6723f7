"""The exceptions cgroupfs raises, one hierarchy for the whole package.

Callers (the supervisor, the CLI) need to tell apart "the kernel said no to
this file" from "this machine has no usable cgroup v2" from "you passed a bad
value", and each message has to carry enough to act on: the exact file, the
errno, what was found and what to change::

    CgroupError(Exception)
    ├── CgroupOSError(CgroupError, OSError)   errno, strerror, filename (the file)
    │   ├── CgroupBusy                        EBUSY
    │   └── CgroupNotFound                    ENOENT
    ├── NoCgroup2Error                        no cgroup2 mount / v1 only / not locatable
    ├── ControllerUnavailable                 a controller is not offered where needed
    ├── InvalidLimit(CgroupError, ValueError) a bad Limits field
    └── InvalidName(CgroupError, ValueError)  a bad child cgroup (or file) name

``CgroupOSError`` is an ``OSError``, so ``except OSError`` and ``.errno``
keep working; its message leads with what was being done, e.g.
``writing 'max' to /sys/fs/cgroup/x/memory.max: [Errno 16] Device or resource busy``.
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Iterable
from typing import Self

__all__ = [
    "CgroupBusy",
    "CgroupError",
    "CgroupNotFound",
    "CgroupOSError",
    "ControllerUnavailable",
    "InvalidLimit",
    "InvalidName",
    "NoCgroup2Error",
]


class CgroupError(Exception):
    """Base class of every error cgroupfs raises on purpose."""


class CgroupOSError(CgroupError, OSError):
    """The kernel refused an operation on a cgroup file or directory.

    ``errno`` and ``strerror`` are the kernel's; ``filename`` is the absolute
    path of the file (or directory) involved; ``action`` says what was being
    done (``"writing '1' to"``, ``"reading"``, ``"removing directory"``);
    ``hint``, when present, explains the kernel rule behind the error and the fix.
    """

    action: str
    hint: str | None

    def __init__(
        self,
        errno: int,
        strerror: str,
        filename: str,
        action: str = "accessing",
        hint: str | None = None,
    ) -> None:
        super().__init__(errno, strerror, filename)
        self.action = action
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.action} {self.filename}: [Errno {self.errno}] {self.strerror}"
        if self.hint:
            text += f"; {self.hint}"
        return text

    def __reduce__(self) -> tuple[type[CgroupOSError], tuple[object, ...]]:
        return (type(self), (self.errno, self.strerror, self.filename, self.action, self.hint))

    def with_hint(self, hint: str) -> Self:
        """A copy of this error (same class, errno, path) that explains ``hint``."""
        return type(self)(
            self.errno if self.errno is not None else _errno.EIO,
            self.strerror or "",
            self.filename,
            self.action,
            hint,
        )


class CgroupBusy(CgroupOSError):
    """EBUSY: the cgroup is populated, has children, or a rule forbids the change now."""


class CgroupNotFound(CgroupOSError):
    """ENOENT: the cgroup (or one of its interface files) does not exist."""


class NoCgroup2Error(CgroupError):
    """No usable cgroup v2 here; the message says what was found and what to change."""


class ControllerUnavailable(CgroupError):
    """A controller is not offered in a cgroup where it is needed.

    ``controller`` is the first missing one (``controllers`` has them all),
    ``path`` the cgroup, ``available`` what its ``cgroup.controllers`` offers,
    ``needed_by`` the limit fields that needed it (may be empty).
    """

    def __init__(
        self,
        controllers: Iterable[str],
        path: str,
        available: Iterable[str],
        *,
        fix: str,
        needed_by: Iterable[str] = (),
        verb: str = "available under",
    ) -> None:
        self.controllers = tuple(controllers)
        self.controller = self.controllers[0]
        self.path = path
        self.available = frozenset(available)
        self.needed_by = tuple(needed_by)
        self.fix = fix
        names = ", ".join(repr(c) for c in self.controllers)
        noun = "controller" if len(self.controllers) == 1 else "controllers"
        be = "is" if len(self.controllers) == 1 else "are"
        offered = " ".join(sorted(self.available)) or "empty"
        message = f"{noun} {names} {be} not {verb} {path} (cgroup.controllers: {offered})"
        if self.needed_by:
            message += f", needed by {', '.join(self.needed_by)}"
        super().__init__(f"{message}; {fix}")


class InvalidLimit(CgroupError, ValueError):
    """A ``Limits`` field has a value the kernel would refuse (or we refuse first)."""

    def __init__(self, field: str, value: object, rule: str, fix: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} must be {rule}, got {value!r}; {fix}")


class InvalidName(CgroupError, ValueError):
    """A child cgroup name that is not a single, safe path component."""

    def __init__(self, name: object, rule: str, fix: str, *, what: str = "cgroup name") -> None:
        self.name = name
        super().__init__(f"{what} must be {rule}, got {name!r}; {fix}")


def os_error(
    exc: OSError,
    *,
    action: str,
    path: str,
    hint: str | None = None,
) -> CgroupOSError:
    """Translate an ``OSError`` from a cgroup file operation into our hierarchy."""
    code = exc.errno if exc.errno is not None else _errno.EIO
    strerror = exc.strerror or os.strerror(code)
    cls: type[CgroupOSError]
    if code == _errno.EBUSY:
        cls = CgroupBusy
    elif code == _errno.ENOENT:
        cls = CgroupNotFound
    else:
        cls = CgroupOSError
    return cls(code, strerror, path, action, hint)
