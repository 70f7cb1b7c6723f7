"""The keeper, on real processes: a supervisor that dies without warning takes its tasks along.

The supervisor here is a small separate Python program (``SUPERVISOR``) that makes nothing but
what the keeper guards: a root with a leaf, a ``setsid`` escapee, and a sub-cgroup a task made
inside its leaf.  The test SIGKILLs it and watches everything go.  Tests of the keeper's own
behaviour (signals, close, release, a dead keeper) start it in the test process, watching a
``sleep`` child instead of us (``supervisor_pid``), so that its exit status can be read.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sup_util import HANG, alive

from cgroupfs import Cgroup, own_cgroup
from supervisor._keeper import Keeper, KeeperError
from supervisor._spawn import Spawned, spawn

# A supervisor-like program: guards argv[1] with a keeper, starts 4 processes below it (one a
# setsid escapee, one in a sub-cgroup made inside a leaf), prints the keeper's pid and waits.
SUPERVISOR = r"""
import os, sys, time
from cgroupfs import Cgroup
from supervisor._keeper import Keeper
from supervisor._spawn import spawn

root, mode = Cgroup.open(sys.argv[1]), sys.argv[2]
keeper = Keeper.start(root)
leaf = root.make_child("tasks").make_child("t-1")
null = os.open(os.devnull, os.O_RDWR)
spawn(["sleep", "600"], cgroup_fd=leaf.fd, stdin=null, stdout=null, stderr=null)
spawn(["sh", "-c", "setsid sleep 600 & exec sleep 600"], cgroup_fd=leaf.fd, stdin=null,
      stdout=null, stderr=null)
inner = leaf.make_child("made-by-the-task")
spawn(["sleep", "600"], cgroup_fd=inner.fd, stdin=null, stdout=null, stderr=null)
def count():
    return sum(len(open(os.path.join(d, "cgroup.procs")).read().split())
               for d, _, _ in os.walk(root.path))
while count() < 4:  # the setsid one comes a bit later
    time.sleep(0.001)
if mode == "freeze":
    root.child("tasks").freeze()
if mode == "release":
    keeper.release()
if mode == "fork" and os.fork() == 0:
    os.read(0, 1)  # a forked child holding copies of every fd, the keeper's pipe too
    os._exit(0)
print(keeper.pid, flush=True)
if mode == "exec":  # the control pipe is close-on-exec: the keeper sees EOF, and must wait on
    os.execv(sys.executable, [sys.executable, "-c", "import os; print('exec', flush=True); "
                              "os.read(0, 1)"])
os.read(0, 1)
"""
TASK_PROCESSES = 4


@pytest.fixture
def devnull() -> Iterator[int]:
    fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    yield fd
    os.close(fd)


@dataclass
class Sup:
    """The supervisor program, started in its own leaf of the test's cgroup."""

    proc: Spawned
    stdin: int
    stdout: int
    stderr: int
    keeper_pid: int

    def kill(self) -> None:
        """SIGKILL the supervisor program and reap it."""
        signal.pidfd_send_signal(self.proc.pidfd, signal.SIGKILL)
        os.waitid(os.P_PIDFD, self.proc.pidfd, os.WEXITED)


@pytest.fixture
def start_supervisor(test_cgroup: Cgroup) -> Iterator[Callable[[Cgroup, str], Sup]]:
    """Start SUPERVISOR guarding a root in a given mode; return once it printed its keeper's
    pid.  At teardown it is killed and reaped if it still runs."""
    started: list[Sup] = []

    def start(root: Cgroup, mode: str) -> Sup:
        home = test_cgroup.make_child(f"supervisor-{len(started)}")
        fds = [*os.pipe2(os.O_CLOEXEC), *os.pipe2(os.O_CLOEXEC), *os.pipe2(os.O_CLOEXEC)]
        in_r, in_w, out_r, out_w, err_r, err_w = fds
        try:
            # -P and cwd /: the installed package, not the checkout's uncompiled supervisor/
            proc = spawn([sys.executable, "-P", "-c", SUPERVISOR, root.path, mode],
                         cgroup_fd=home.fd, cwd="/", stdin=in_r, stdout=out_w, stderr=err_w)
        finally:
            home.close()
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        sup = Sup(proc, in_w, out_r, err_r, 0)
        started.append(sup)
        line = read_until(out_r, b"\n", HANG)
        assert line.strip().isdigit(), (line, read_until(err_r, b"\0", 1.0))
        sup.keeper_pid = int(line)
        return sup

    yield start
    for sup in started:
        try:
            signal.pidfd_send_signal(sup.proc.pidfd, signal.SIGKILL)
            os.waitid(os.P_PIDFD, sup.proc.pidfd, os.WEXITED)
        except (ProcessLookupError, ChildProcessError):
            pass
        for fd in (sup.proc.pidfd, sup.stdin, sup.stdout, sup.stderr):
            os.close(fd)


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    """Read ``fd`` until ``needle`` appears, EOF, or ``timeout`` s; returns what was read."""
    data = b""
    deadline = time.monotonic() + timeout
    while needle not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def tree_pids(cg: Cgroup) -> list[int]:
    """Every pid in ``cg`` and below."""
    pids = []
    for rel in [".", *cg.descendants()]:
        with open(os.path.join(cg.path, rel, "cgroup.procs")) as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def wait_until(condition: Callable[[], bool], what: str, timeout: float = HANG) -> None:
    """Poll ``condition``; fail the test after ``timeout`` s (a hang)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout}s")
        time.sleep(0.002)


def pidfds_of(pids: list[int]) -> list[int]:
    """A pidfd for each pid (not our children: opened while they live, so never recycled)."""
    return [os.pidfd_open(pid) for pid in pids]


def all_exited(pidfds: list[int]) -> bool:
    """Whether every process behind ``pidfds`` has exited (a pidfd turns readable then)."""
    return all(select.select([fd], [], [], 0)[0] for fd in pidfds)


def watched_sleep(devnull: int) -> Spawned:
    """A child standing in for the supervisor: the keeper acts when it dies."""
    return spawn(["sleep", "600"], stdin=devnull, stdout=devnull, stderr=devnull)


def end(proc: Spawned) -> None:
    """SIGKILL (by pidfd) and reap a child of ours; close its pidfd."""
    try:
        signal.pidfd_send_signal(proc.pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitid(os.P_PIDFD, proc.pidfd, os.WEXITED)
    os.close(proc.pidfd)


# -- the supervisor dies ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "freeze", "fork", "exec"])
def test_sigkilled_supervisor_takes_every_process_of_its_tasks_along(
        test_cgroup: Cgroup, start_supervisor: Callable[[Cgroup, str], Sup],
        mode: str) -> None:
    # freeze: a frozen subtree dies too.  fork: a forked child holds the keeper's control pipe,
    # so no EOF comes: the pidfd alone says the supervisor died.  exec: EOF comes while the
    # supervisor lives on: the keeper keeps waiting, and acts only when it dies.
    root = test_cgroup.make_child("root")
    sup = start_supervisor(root, mode)
    wait_until(lambda: len(tree_pids(root)) == TASK_PROCESSES, "all task processes started")
    tasks = pidfds_of(tree_pids(root))
    keeper = os.pidfd_open(sup.keeper_pid)
    try:
        if mode == "exec":
            assert read_until(sup.stdout, b"exec\n", HANG).endswith(b"exec\n")
            # a negative check has only a bounded wait: the keeper must not act on EOF
            assert not select.select([keeper], [], [], 0.3)[0], "the keeper left on EOF"
            assert not all_exited(tasks)
        t0 = time.monotonic()
        signal.pidfd_send_signal(sup.proc.pidfd, signal.SIGKILL)
        wait_until(lambda: all_exited(tasks), "every task process gone")
        took = time.monotonic() - t0
        wait_until(lambda: not os.path.exists(root.path), f"{root.path} removed")
        wait_until(lambda: all_exited([keeper]), "the keeper exited")
        report = read_until(sup.stderr, b"removed it\n", HANG).decode()
        assert (f"corral-keeper: supervisor pid {sup.proc.pid} died; killed the processes of "
                f"{root.path} and removed it\n") in report
        print(f"{mode}: every task process gone {took * 1e3:.1f} ms after the SIGKILL")
    finally:
        for fd in [*tasks, keeper]:
            os.close(fd)
    root.close()


def test_released_tasks_outlive_their_supervisor(
        test_cgroup: Cgroup, start_supervisor: Callable[[Cgroup, str], Sup]) -> None:
    root = test_cgroup.make_child("root")
    sup = start_supervisor(root, "release")
    assert not alive(sup.keeper_pid)  # release() returned after the keeper exited
    wait_until(lambda: len(tree_pids(root)) == TASK_PROCESSES, "all task processes started")
    pids = tree_pids(root)
    sup.kill()
    assert all(alive(pid) for pid in pids)
    assert os.path.isdir(root.path)
    # the keeper's share of the root's lock went with it: nobody holds it any more
    fcntl.flock(root.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    root.close()  # the test cgroup's teardown kills and removes what was handed over


# -- the keeper itself ------------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [False, True], ids=["cgroup.kill", "freeze+signal"])
def test_keeper_kills_thaws_and_removes_the_whole_subtree(
        test_cgroup: Cgroup, devnull: int, capfd: pytest.CaptureFixture[str],
        fallback: bool) -> None:
    root = test_cgroup.make_child("root")
    deep = root.make_child("a").make_child("b").make_child("c")
    root.make_child("empty").close()
    tasks = [spawn(["sh", "-c", "setsid sleep 600 & exec sleep 600"], cgroup_fd=cg.fd,
                   stdin=devnull, stdout=devnull, stderr=devnull) for cg in (root, deep)]
    wait_until(lambda: len(tree_pids(root)) == 4, "4 processes started")
    escapees = pidfds_of(tree_pids(root))
    root.child("a").freeze()
    watched = watched_sleep(devnull)
    keeper = Keeper.start(root, supervisor_pid=watched.pid, force_fallback=fallback)
    try:
        end(watched)
        wait_until(lambda: not keeper.alive(), "the keeper done")
        keeper.close()
        assert keeper.returncode == 0
        assert all_exited(escapees) and not os.path.exists(root.path)
        assert (f"corral-keeper: supervisor pid {watched.pid} died; killed the processes of "
                f"{root.path} and removed it\n") in capfd.readouterr().err
    finally:
        for p in tasks:
            os.waitid(os.P_PIDFD, p.pidfd, os.WEXITED)
            os.close(p.pidfd)
        for fd in escapees:
            os.close(fd)
        deep.close()
        root.close()


def test_keeper_removes_an_empty_root_and_says_it_held_nothing(
        test_cgroup: Cgroup, devnull: int, capfd: pytest.CaptureFixture[str]) -> None:
    root = test_cgroup.make_child("root")
    root.make_child("tasks").close()
    watched = watched_sleep(devnull)
    keeper = Keeper.start(root, supervisor_pid=watched.pid)
    end(watched)
    wait_until(lambda: not keeper.alive(), "the keeper done")
    keeper.close()
    assert keeper.returncode == 0 and not os.path.exists(root.path)
    assert f"{root.path} held no processes; removed it\n" in capfd.readouterr().err
    root.close()


def test_keeper_finds_the_root_already_removed(
        test_cgroup: Cgroup, devnull: int, capfd: pytest.CaptureFixture[str]) -> None:
    root = test_cgroup.make_child("root")
    watched = watched_sleep(devnull)
    keeper = Keeper.start(root, supervisor_pid=watched.pid)
    os.rmdir(root.path)
    end(watched)
    wait_until(lambda: not keeper.alive(), "the keeper done")
    keeper.close()
    assert keeper.returncode == 0
    assert f"{root.path} was already removed\n" in capfd.readouterr().err
    root.close()


def test_root_stays_locked_until_the_keeper_has_cleaned_up(test_cgroup: Cgroup,
                                                           devnull: int) -> None:
    root = test_cgroup.make_child("root")
    fcntl.flock(root.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as placement does
    watched = watched_sleep(devnull)
    keeper = Keeper.start(root, supervisor_pid=watched.pid)
    path = root.path
    root.close()  # the supervisor's own fd is gone (as when it dies): the keeper's dup holds
    with Cgroup.open(path) as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        keeper.release()
        fcntl.flock(other.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: the lock is free
    end(watched)
    assert keeper.returncode == 0 and os.path.isdir(path)


def test_close_leaves_everything_as_it_is(test_cgroup: Cgroup, devnull: int) -> None:
    root = test_cgroup.make_child("root")
    task = spawn(["sleep", "600"], cgroup_fd=root.fd, stdin=devnull, stdout=devnull,
                 stderr=devnull)
    keeper = Keeper.start(root)
    assert keeper.alive()
    keeper.close()
    keeper.close()  # idempotent
    assert keeper.returncode == 0 and not keeper.alive()
    assert alive(task.pid) and os.path.isdir(root.path)
    end(task)
    root.close()


def test_keeper_lives_in_our_cgroup_in_its_own_session(test_cgroup: Cgroup) -> None:
    root = test_cgroup.make_child("root")
    with Keeper.start(root) as keeper:
        assert os.getsid(keeper.pid) == keeper.pid
        assert own_cgroup(keeper.pid) == own_cgroup()
    assert keeper.returncode == 0
    root.close()


def test_keeper_ignores_terminal_and_stop_signals(test_cgroup: Cgroup) -> None:
    root = test_cgroup.make_child("root")
    keeper = Keeper.start(root)
    pidfd = os.pidfd_open(keeper.pid)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE):
            signal.pidfd_send_signal(pidfd, sig)
        # killed by one, it would not exit 0; stopped by one, it would not answer close()
        # and end SIGKILLed (-9)
        keeper.close()
        assert keeper.returncode == 0
    finally:
        os.close(pidfd)
    root.close()


def test_a_dead_keeper_is_noticed_and_does_not_hurt_the_supervisor(
        test_cgroup: Cgroup, caplog: pytest.LogCaptureFixture) -> None:
    root = test_cgroup.make_child("root")
    keeper = Keeper.start(root)
    pidfd = os.pidfd_open(keeper.pid)
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    os.close(pidfd)
    wait_until(lambda: not keeper.alive(), "the keeper seen dead")
    with caplog.at_level(logging.WARNING, logger="supervisor._keeper"):
        keeper.release()  # nothing to tell, nothing raised
    assert keeper.returncode == -signal.SIGKILL
    assert "had exited (status -9) before it was told to" in caplog.text
    assert os.path.isdir(root.path)
    root.close()


def test_start_refuses_a_directory_outside_cgroup2() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        not_a_cgroup = Cgroup(tmp, fd)  # adopts any directory fd, unchecked
        with pytest.raises(KeeperError, match=r"refused to start: .*is not a directory on a "
                                              r"cgroup2 filesystem"):
            Keeper.start(not_a_cgroup)
        not_a_cgroup.close()


def test_start_refuses_to_guard_the_cgroup_we_live_in() -> None:
    with Cgroup.open(own_cgroup()) as here, pytest.raises(KeeperError, match="kill itself"):
        Keeper.start(here)


def test_keeper_executable_refuses_bad_arguments_on_the_ready_pipe() -> None:
    from supervisor._keeper import KEEPER_PATH

    r = subprocess.run([str(KEEPER_PATH), "--pid", "x"], capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 2
    assert r.stdout.startswith("error: --pid must be a non-negative number")


# In a private mount namespace (nothing of the host's is touched), a sub-cgroup with a tmpfs
# mounted on it cannot be removed (EBUSY while the mount lives): the keeper must say so.
BUSY_PROGRAM = r"""
import os, signal, subprocess, sys
from cgroupfs import Cgroup
from supervisor._keeper import Keeper
from supervisor._spawn import spawn

root = Cgroup.open(sys.argv[1])
busy = root.make_child("busy")
subprocess.run(["mount", "-t", "tmpfs", "corral-test", busy.path], check=True)
null = os.open(os.devnull, os.O_RDWR)
watched = spawn(["sleep", "600"], stdin=null, stdout=null, stderr=null)
keeper = Keeper.start(root, supervisor_pid=watched.pid)
signal.pidfd_send_signal(watched.pidfd, signal.SIGKILL)
os.waitid(os.P_PIDFD, watched.pidfd, os.WEXITED)
while keeper.alive():
    os.sched_yield()
keeper.close()
subprocess.run(["umount", busy.path], check=True)
print(keeper.returncode, flush=True)
"""


def test_keeper_says_what_it_could_not_remove_and_exits_1(test_cgroup: Cgroup) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) (util-linux) for a private mount namespace")
    root = test_cgroup.make_child("root")
    r = subprocess.run([unshare, "--mount", "--propagation", "private", sys.executable, "-P",
                        "-c", BUSY_PROGRAM, root.path],
                       cwd="/", capture_output=True, text=True, timeout=HANG)
    assert r.stdout.strip() == "1", r.stderr
    # the keeper does not walk into the tmpfs (nothing there is a cgroup of ours)
    assert (f"corral-keeper: cannot walk into {root.path}/busy: Invalid cross-device link\n"
            in r.stderr)
    assert (f"corral-keeper: cannot remove {root.path}: Device or resource busy\n"
            in r.stderr)  # it still holds busy/
    assert (f"the cleanup of {root.path} is incomplete: cannot walk into {root.path}/busy: "
            f"Invalid cross-device link\n") in r.stderr
    assert os.path.isdir(os.path.join(root.path, "busy"))  # the test cgroup's teardown ends it
    root.close()


async def test_a_keeper_that_dies_is_replaced_and_the_records_say_so(
        test_cgroup: Cgroup) -> None:
    import trio

    import supervisor

    def keepers() -> list[int]:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            kids = [int(c) for c in f.read().split()]
        found = []
        for pid in kids:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "corral-keeper":
                        found.append(pid)
            except OSError:
                pass
        return found

    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as sup, \
            trio.open_nursery() as n:
        task = await n.start(sup.start, ["sleep", "30"])
        (first,) = keepers()
        os.kill(first, signal.SIGKILL)  # an operator's kill, the OOM killer
        with trio.fail_after(HANG):
            while keepers() in ([], [first]):
                await trio.sleep(0.01)
        (second,) = keepers()
        task.stop()
        r = await task.wait()
    assert second != first
    assert any(f"keeper (pid {first}" in note and f"new one (pid {second})" in note
               for note in r.notes), r.notes
