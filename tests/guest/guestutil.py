"""Helpers shared by the guest tests (a plain module: its name does not match ``guest_*.py``)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MiB = 1 << 20
CONTROLLERS = frozenset({"memory", "pids", "cpu", "io"})


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` every 10 ms until true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.01)


def read(cgroup_path: str | os.PathLike[str], name: str) -> str:
    """Raw content of one interface file, stripped: the ground truth to compare against."""
    return Path(cgroup_path, name).read_text().strip()


def spawn_in(
    add_proc: Callable[[int], object], argv: Sequence[str], **kwargs: Any
) -> subprocess.Popen[bytes]:
    """Start ``argv`` already inside a cgroup: the child waits on a pipe until ``add_proc(pid)``
    has moved it, then execs ``argv`` (so ``proc.pid`` and its exit status are argv's)."""
    gate = ["/bin/sh", "-c", 'read -r _ && exec "$@"', "gate", *argv]
    proc = subprocess.Popen(gate, stdin=subprocess.PIPE, **kwargs)
    assert proc.stdin is not None
    try:
        add_proc(proc.pid)
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        proc.stdin = None  # so that communicate() does not flush the closed gate pipe
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def own_cgroup_path() -> str:
    """This process's cgroup, from /proc/self/cgroup (``/`` is the guest's root cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError("no cgroup v2 line in /proc/self/cgroup")
