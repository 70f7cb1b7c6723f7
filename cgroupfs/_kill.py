"""Killing every process in a cgroup subtree, with or without ``cgroup.kill``.

``cgroup.kill`` (Linux >= 5.14) kills the whole subtree in the kernel, with
no race against forks and no pid reuse. Older kernels need the dance crun and
systemd do: freeze the subtree, SIGKILL every pid its ``cgroup.procs`` files
list, thaw. Freezing first is what makes the signals safe: a frozen process
can neither fork a child we would miss nor exit and let its pid be reused
before our ``kill(2)`` lands. SIGKILL still gets through to frozen tasks
(cgroup v2's freezer lets fatal signals wake them to exit), so the thaw only
lets the dying run to the end; it is done in ``finally`` so that an error
half-way can never leave a tree frozen.

Both methods only *send*; processes vanish asynchronously (``populated 0``
can come ~10 ms after ``cgroup.kill`` returns). Wait for that separately.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal

from ._errors import CgroupError, CgroupNotFound, CgroupOSError
from ._fileio import (
    exists,
    join,
    poll_until,
    read_file,
    read_file_optional,
    walk,
    write_file,
)
from ._stats import parse_events

__all__ = ["KILL_METHODS", "kill_subtree"]

logger = logging.getLogger(__name__)

KILL_METHODS = ("cgroup.kill", "freeze+signal", "signal")

# How long the fallback waits for "frozen 1" before signalling anyway (a task
# in uninterruptible sleep delays freezing) and keeps sweeping without it.
_FREEZE_TIMEOUT = 1.0
_SWEEP_TIMEOUT = 2.0


def kill_subtree(dir_fd: int, path: str, *, force_fallback: bool = False) -> str:
    """SIGKILL every process in the cgroup at ``dir_fd`` and its descendants.

    Returns the method used: ``"cgroup.kill"``; ``"freeze+signal"`` where
    ``cgroup.kill`` is missing (or ``force_fallback``); ``"signal"`` (repeated
    sweeps, racy against forks) on kernels < 5.2 without the v2 freezer.
    """
    # The root cgroup has neither cgroup.kill nor cgroup.events; signalling
    # everything listed there would kill the machine, so refuse outright.
    if not exists(dir_fd, "cgroup.events"):
        if not exists(dir_fd, "cgroup.procs"):
            raise CgroupNotFound(
                errno.ENOENT, os.strerror(errno.ENOENT), path, "killing the processes of"
            )
        raise CgroupError(
            f"refusing to kill the processes of {path}: it is a root cgroup (it has no "
            "cgroup.events); kill a cgroup below it"
        )
    if not force_fallback:
        try:
            write_file(dir_fd, path, "cgroup.kill", "1")
            return "cgroup.kill"
        except CgroupNotFound:
            if not exists(dir_fd, "cgroup.procs"):
                raise  # the cgroup itself is gone
            logger.debug("%s has no cgroup.kill (kernel < 5.14): freezing instead", path)
    if not exists(dir_fd, "cgroup.freeze"):
        logger.warning("%s has no cgroup.freeze (kernel < 5.2): signalling unfrozen", path)
        _sweep_until_empty(dir_fd, path)
        return "signal"
    write_file(dir_fd, path, "cgroup.freeze", "1")
    try:
        frozen = poll_until(
            lambda: parse_events(read_file(dir_fd, path, "cgroup.events")).frozen,
            _FREEZE_TIMEOUT,
        )
        if frozen:
            _sweep(dir_fd, path)
        else:
            logger.warning("%s did not freeze in %.1f s: signalling anyway", path, _FREEZE_TIMEOUT)
            _sweep_until_empty(dir_fd, path)
    finally:
        _thaw(dir_fd, path)
    return "freeze+signal"


def _thaw(dir_fd: int, path: str) -> None:
    # Removed meanwhile (CgroupNotFound): nothing is left that could stay frozen.
    with contextlib.suppress(CgroupNotFound):
        write_file(dir_fd, path, "cgroup.freeze", "0")


def _sweep(dir_fd: int, path: str) -> int:
    """SIGKILL each pid listed in the subtree once; return how many were listed."""
    listed = 0
    for rel, fd in walk(dir_fd):
        procs_name = "cgroup.procs" if rel == "." else f"{rel}/cgroup.procs"
        text = read_file_optional(fd, join(path, rel), "cgroup.procs")
        if text is None:
            continue  # a sub-cgroup removed while we walked
        for pid in (int(p) for p in text.split()):
            listed += 1
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # exited between the read and the kill
            except OSError as exc:
                raise CgroupOSError(
                    exc.errno or errno.EPERM,
                    exc.strerror or os.strerror(errno.EPERM),
                    os.path.join(path, procs_name),
                    f"sending SIGKILL to pid {pid} listed in",
                ) from exc
    return listed


def _sweep_until_empty(dir_fd: int, path: str) -> None:
    # Without a (working) freezer a process can fork between our read of
    # cgroup.procs and its death, so sweep again until nothing is listed.
    if not poll_until(lambda: _sweep(dir_fd, path) == 0, _SWEEP_TIMEOUT):
        raise CgroupError(
            f"processes kept appearing in {path} for {_SWEEP_TIMEOUT} s of SIGKILL sweeps"
        )
