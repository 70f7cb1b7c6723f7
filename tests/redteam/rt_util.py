"""Red-team helpers and fixtures (conftest.py offers the fixtures): a supervisor in the test's
own cgroup, programs run in a session of their own (a task that signals its process group must
never reach pytest), and a cleanup that clears what a hostile task leaves behind even where
cgroupfs cannot (paths longer than PATH_MAX, frozen cgroups).

Every test here works in the ``test_cgroup`` scratch cgroup of tests/conftest.py and ends only
processes it started (by pid, or by cgroup.kill of that scratch cgroup)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest
import trio

import cgroupfs
import supervisor

HERE = os.path.dirname(os.path.abspath(__file__))
CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")


@pytest.fixture
async def sup(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[supervisor.Supervisor]:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
        yield s


# ---- waiting ------------------------------------------------------------------------------

async def wait_for(condition: Callable[[], bool], timeout: float = 20.0,
                   what: str = "condition") -> None:
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.01)
        return
    pytest.fail(f"{what} not reached within {timeout}s")


def poll(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def cgroup_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        return None
    return None


def procs(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


# ---- clearing what a hostile task leaves ----------------------------------------------------

def _rm_tree_at(parent_fd: int, name: str) -> None:
    """rmdir ``name`` below ``parent_fd`` depth-first, by directory fds only (no path is ever
    longer than one component, so PATH_MAX does not matter)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _rm_tree_at(fd, entry)
    finally:
        os.close(fd)
    for _ in range(200):
        try:
            os.rmdir(name, dir_fd=parent_fd)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            time.sleep(0.02)


def _thaw_all(fd: int) -> None:
    with contextlib.suppress(OSError):
        wfd = os.open("cgroup.freeze", os.O_WRONLY, dir_fd=fd)
        try:
            os.write(wfd, b"0")
        finally:
            os.close(wfd)
    for entry in os.listdir(fd):
        st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                _thaw_all(sub)
            finally:
                os.close(sub)


def clear_below(path: str) -> None:
    """Thaw and kill everything in the scratch cgroup ``path`` and remove every cgroup below
    it (it stays: the test_cgroup fixture removes it)."""
    assert os.path.basename(path).startswith("corral-test-"), path
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _thaw_all(fd)
        wfd = os.open("cgroup.kill", os.O_WRONLY, dir_fd=fd)
        try:
            os.write(wfd, b"1")
        finally:
            os.close(wfd)
        def emptied() -> bool:
            with open(os.path.join(path, "cgroup.events")) as f:
                return "populated 0" in f.read()
        poll(emptied, 10)
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _rm_tree_at(fd, entry)
    finally:
        os.close(fd)


@pytest.fixture
def scratch(test_cgroup: cgroupfs.Cgroup) -> Iterator[str]:
    """The test's scratch cgroup path; whatever a hostile task left below it is cleared
    before the test_cgroup fixture checks it."""
    try:
        yield test_cgroup.path
    finally:
        clear_below(test_cgroup.path)


# ---- programs in a session of their own -------------------------------------------------------

@dataclass
class Ran:
    rc: int | None  # None: it was still running at the deadline (then SIGKILLed)
    stdout: str
    stderr: str

    @property
    def hung(self) -> bool:
        return self.rc is None


def run_program(code: str, *args: str, timeout: float,
                rlimit_nofile: int | None = None) -> Ran:
    """Run Python ``code`` (the supervisor library) in a new session; SIGKILL it (by pid: its
    keeper then clears its root) if it has not ended after ``timeout`` seconds."""
    preexec = None
    if rlimit_nofile is not None:
        def preexec() -> None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (rlimit_nofile, rlimit_nofile))
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         stdin=subprocess.DEVNULL, preexec_fn=preexec)
    try:
        out, err = p.communicate(timeout=timeout)
        return Ran(p.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Ran(None, out, err)


def intocg_helper(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 20-line C program: ``intocg DIR CMD...`` runs CMD born in cgroup DIR by
    clone3(CLONE_INTO_CGROUP) (what any root program can do with an fd of a directory)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the clone3 helper")
    out = tmp_path_factory.mktemp("intocg") / "intocg"
    src = os.path.join(HERE, "intocg.c")
    subprocess.run(["gcc", "-O", "-o", str(out), src], check=True)
    return str(out)


@pytest.fixture(scope="session")
def intocg(tmp_path_factory: pytest.TempPathFactory) -> str:
    return intocg_helper(tmp_path_factory)


def leaf_path_script() -> str:
    """Shell: cd into the task's own leaf (through the cgroup2 mount)."""
    mount = cgroupfs.find_cgroup2_mount().mount_point
    return f'cd "{mount}$(sed -n "s/^0:://p" /proc/self/cgroup)" || exit 99'
