"""Real processes for the cgroupfs tests, and the guarantee that none survives.

``processes`` starts processes that put themselves into a test cgroup before
doing anything else, so everything they fork is born inside it. For the test's
duration the pytest process is a child subreaper, so double-forked orphans are
re-parented to us instead of PID 1; at teardown the test cgroup is killed and
every new child of ours (zombie orphans included) is reaped, and the test
fails if one was still alive.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

import cgroupfs

_PR_SET_CHILD_SUBREAPER = 36


def wait_for(condition: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Poll ``condition`` until truthy; fail the test naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), "prctl(PR_SET_CHILD_SUBREAPER)")


def our_children() -> set[int]:
    """Pids whose parent is this process (from /proc/*/stat)."""
    me, kids = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The comm field is in parentheses and may contain spaces: split after it.
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == me:
            kids.add(int(entry))
    return kids


class Processes:
    """What the ``processes`` fixture gives a test (helpers included, to avoid
    importing from a conftest)."""

    wait_for = staticmethod(wait_for)
    comm = staticmethod(comm)
    our_children = staticmethod(our_children)

    def __init__(self, default: cgroupfs.Cgroup) -> None:
        self.default = default
        self.popens: list[subprocess.Popen[bytes]] = []

    def shell(
        self,
        script: str,
        cgroup: cgroupfs.Cgroup | None = None,
        *,
        stdout: int = subprocess.DEVNULL,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """``sh -c`` that first moves itself into ``cgroup`` ($1), then runs ``script``."""
        cg = cgroup or self.default
        popen = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$1/cgroup.procs" || exit 97\n' + script, "sh", cg.path],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            env=env,
        )
        self.popens.append(popen)
        wait_for(lambda: popen.pid in cg.procs() or popen.poll() is not None, "the shell")
        assert popen.poll() is None, f"shell exited with {popen.returncode}"
        return popen

    def sleep(
        self, cgroup: cgroupfs.Cgroup | None = None, *, user: int | None = None
    ) -> subprocess.Popen[bytes]:
        """A ``sleep 60`` moved into ``cgroup`` with ``add_proc`` (it never forks)."""
        cg = cgroup or self.default
        popen = subprocess.Popen(
            ["sleep", "60"],
            stdin=subprocess.DEVNULL,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
        )
        self.popens.append(popen)
        cg.add_proc(popen.pid)
        return popen


@pytest.fixture
def processes(test_cgroup: cgroupfs.Cgroup) -> Iterator[Processes]:
    before = our_children()
    _set_subreaper(True)
    procs = Processes(test_cgroup)
    survivors: list[int] = []
    try:
        yield procs
    finally:
        try:
            if os.path.isdir(test_cgroup.path):
                with cgroupfs.Cgroup.open(test_cgroup.path) as cg:
                    if cg.is_populated():
                        cg.kill()
                    assert cg.wait_unpopulated(5.0), f"{cg.path} still populated"
            for popen in procs.popens:
                if popen.poll() is None:
                    popen.kill()  # not reaped yet, so the pid is still this process
                popen.wait(timeout=5)
            survivors = _reap(our_children() - before)
        finally:
            _set_subreaper(False)
    assert not survivors, f"processes started by the test survived it: {survivors}"


def _reap(pids: set[int], timeout: float = 5.0) -> list[int]:
    """Reap our children ``pids``; kill and report any still alive at the deadline."""
    deadline = time.monotonic() + timeout
    pending = set(pids)
    alive: list[int] = []
    while pending:
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # reaped elsewhere or not ours after all
            if done:
                pending.discard(pid)
        if pending and time.monotonic() > deadline:
            for pid in pending:
                # Still our unreaped child, so the pid cannot have been reused.
                alive.append(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError as exc:
                    assert exc.errno in (errno.ESRCH, errno.ECHILD)
            break
        time.sleep(0.002)
    return alive
