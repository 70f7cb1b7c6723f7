"""The little we read from /proc about a task's processes, robust to what a task can put there.

A process names itself (``prctl(PR_SET_NAME)``, or the kernel cuts its file name at 15 bytes,
possibly mid-character), so nothing read here is trusted to be UTF-8: text is decoded with
replacement, and a process that is gone (or never readable) reads as ``None`` / ``"?"``.
Callers hold the process (a pidfd, or an unreaped child) when the pid must not be reused.
"""

from __future__ import annotations

import os

__all__ = ["read_cgroup", "read_cmdline", "read_comm", "read_pgrp", "read_start", "read_stat",
           "read_state"]


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_comm(pid: int) -> str:
    """The process's name (``comm``), decoded with replacement; ``"?"`` if it is gone."""
    data = _read(f"/proc/{pid}/comm")
    return "?" if data is None else data.rstrip(b"\n").decode("utf-8", "replace")


def read_cmdline(pid: int, limit: int = 512) -> str | None:
    """The command line, arguments joined by spaces, cut at ``limit`` characters."""
    data = _read(f"/proc/{pid}/cmdline")
    if data is None:
        return None
    text = data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_cgroup(pid: int) -> str | None:
    """The process's cgroup v2 path as /proc/PID/cgroup gives it (relative to our cgroup
    namespace's root; zombies keep the cgroup they died in), or None if it is gone."""
    data = _read(f"/proc/{pid}/cgroup")
    if data is None:
        return None
    for line in data.splitlines():
        if line.startswith(b"0::"):
            return os.fsdecode(line[3:])
    return None


def read_state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T, Z...), or None if it is gone."""
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data.rpartition(b")")[2].split()  # comm may hold spaces and parentheses
    return fields[0].decode("ascii", "replace") if fields else None


_TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(pid: int) -> tuple[str, int, float, str] | None:
    """State letter, parent pid, CPU seconds (user + system) and name of the process, or None:
    one read of /proc/PID/stat, whose name (in parentheses, raw) is what /proc/PID/comm holds
    (decoded with replacement, like :func:`read_comm`)."""
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    head, _, rest = data.rpartition(b")")  # comm may hold spaces and parentheses
    fields = rest.split()
    try:
        return (fields[0].decode("ascii", "replace"), int(fields[1]),
                (int(fields[11]) + int(fields[12])) / _TICKS,
                head.partition(b"(")[2].rstrip(b"\n").decode("utf-8", "replace"))
    except (IndexError, ValueError):
        return None


def read_start(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with its pid, it names one process
    for good (a pid reused later has another start), without holding anything."""
    return _stat_number(pid, 19)


def read_pgrp(pid: int) -> int | None:
    """The process's process group, or None if it is gone."""
    return _stat_number(pid, 2)


def _stat_number(pid: int, index: int) -> int | None:
    """Field ``index`` of /proc/PID/stat after the name (0: the state letter), or None."""
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data.rpartition(b")")[2].split()
    try:
        return int(fields[index])
    except (IndexError, ValueError):
        return None
