"""The native spawn helper, on real processes in real cgroup leaves."""

from __future__ import annotations

import errno
import os
import pathlib
import signal
import time
from collections.abc import Iterator

import pytest

from cgroupfs import Cgroup, find_cgroup2_mount
from supervisor._spawn import Spawned, SpawnError, SpawnMethod, resolve_executable, spawn

SLEEP = "/bin/sleep"


@pytest.fixture
def devnull() -> Iterator[int]:
    fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    yield fd
    os.close(fd)


@pytest.fixture
def reap() -> Iterator[list[Spawned]]:
    """Children a test started: killed (by pidfd, never by pid) and reaped at teardown."""
    started: list[Spawned] = []
    yield started
    for sp in started:
        try:
            signal.pidfd_send_signal(sp.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
        os.close(sp.pidfd)


def run_capture(argv: list[str], **kw: object) -> tuple[Spawned, bytes, int]:
    """Spawn argv with stdout on a pipe; return its output and wait status."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        sp = spawn(argv, stdin=kw.pop("stdin", w), stdout=w, stderr=2, **kw)  # type: ignore[arg-type]
    finally:
        os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    res = os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
    os.close(sp.pidfd)
    assert res is not None
    return sp, b"".join(chunks), res.si_status


def cgroup_of(pid: int | str) -> str:
    text = pathlib.Path(f"/proc/{pid}/cgroup").read_text()
    return next(line[3:] for line in text.splitlines() if line.startswith("0::"))


def rel(cg: Cgroup) -> str:
    """The leaf's path as /proc/PID/cgroup shows it (relative to the v2 mount's root)."""
    return "/" + os.path.relpath(cg.path, find_cgroup2_mount().mount_point)


@pytest.mark.parametrize("fallback", [False, True], ids=["clone3", "fallback"])
def test_child_is_in_its_leaf_before_exec(test_cgroup: Cgroup, fallback: bool) -> None:
    # The exec'd program's very first look at /proc/self/cgroup already names the leaf:
    # clone3 made it there, or (fallback) it joined before execve.
    leaf = test_cgroup.make_child("leaf")
    sp, out, status = run_capture(["cat", "/proc/self/cgroup"], cgroup_fd=leaf.fd,
                                  force_fallback=fallback)
    assert status == 0
    assert f"0::{rel(leaf)}\n" in out.decode()
    if fallback:
        assert sp.method == SpawnMethod.VFORK_JOIN and sp.fallback_errno != 0
    else:
        assert sp.method == SpawnMethod.CLONE3_VFORK and sp.fallback_errno == 0
    leaf.remove()


@pytest.mark.parametrize("fallback", [False, True], ids=["clone3", "fallback"])
def test_running_child_and_its_children_stay_in_leaf(
    test_cgroup: Cgroup, devnull: int, reap: list[Spawned], fallback: bool
) -> None:
    leaf = test_cgroup.make_child("leaf")
    sp = spawn(["sh", "-c", "sleep 60 & exec sleep 60"], cgroup_fd=leaf.fd, stdin=devnull,
               stdout=devnull, stderr=devnull, force_fallback=fallback)
    reap.append(sp)
    assert cgroup_of(sp.pid) == rel(leaf)
    assert sp.pid in leaf.procs()
    leaf.kill()


def test_not_found_is_enoent_at_exec(devnull: int) -> None:
    with pytest.raises(SpawnError) as ei:
        spawn(["corral-no-such-command-xyz"], stdin=devnull, stdout=devnull, stderr=devnull)
    assert ei.value.errno == errno.ENOENT and ei.value.step == "exec"
    assert "corral-no-such-command-xyz" in str(ei.value)


def test_not_executable_is_eacces_at_exec(tmp_path: pathlib.Path, devnull: int) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    with pytest.raises(SpawnError) as ei:
        spawn([str(script)], stdin=devnull, stdout=devnull, stderr=devnull)
    assert (ei.value.errno, ei.value.step) == (errno.EACCES, "exec")


def test_path_search_reports_eacces_over_later_enoent(tmp_path: pathlib.Path,
                                                      devnull: int) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    env = {"PATH": f"{tmp_path}:/nonexistent-dir"}
    with pytest.raises(SpawnError) as ei:
        spawn(["tool"], env=env, stdin=devnull, stdout=devnull, stderr=devnull)
    assert ei.value.errno == errno.EACCES


def test_path_search_finds_later_entry(tmp_path: pathlib.Path) -> None:
    env = {"PATH": f"/nonexistent-dir:{tmp_path}:/bin:/usr/bin"}
    _, out, status = run_capture(["echo", "found"], env=env)
    assert (out, status) == (b"found\n", 0)


def test_bad_cwd_is_reported_at_chdir(tmp_path: pathlib.Path, devnull: int) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SpawnError) as ei:
        spawn(["true"], cwd=str(missing), stdin=devnull, stdout=devnull, stderr=devnull)
    assert (ei.value.errno, ei.value.step) == (errno.ENOENT, "chdir")
    assert str(missing) in str(ei.value)
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(SpawnError) as ei:
        spawn(["true"], cwd=str(afile), stdin=devnull, stdout=devnull, stderr=devnull)
    assert (ei.value.errno, ei.value.step) == (errno.ENOTDIR, "chdir")


def test_failed_spawn_leaves_no_zombie(devnull: int) -> None:
    for _ in range(20):
        with pytest.raises(SpawnError):
            spawn(["corral-no-such-command-xyz"], stdin=devnull, stdout=devnull, stderr=devnull)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def fds_after_exec(pid: int, expected: list[int], timeout: float = 5.0) -> list[int]:
    """The child's fds once exec has closed the CLOEXEC ones: a CLONE_VFORK parent resumes
    at the exec's point of no return, before the kernel closes them."""
    deadline = time.monotonic() + timeout
    while True:
        fds = sorted(int(f) for f in os.listdir(f"/proc/{pid}/fd"))
        if fds == expected or time.monotonic() > deadline:
            return fds
        time.sleep(0.001)


def test_only_std_fds_reach_the_child(devnull: int, reap: list[Spawned]) -> None:
    leaky = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]  # inheritable on purpose
    for fd in leaky:
        os.set_inheritable(fd, True)
    try:
        sp = spawn([SLEEP, "60"], stdin=devnull, stdout=devnull, stderr=devnull)
        reap.append(sp)
        assert fds_after_exec(sp.pid, [0, 1, 2]) == [0, 1, 2]
    finally:
        for fd in leaky:
            os.close(fd)


def test_pass_fds_are_kept_at_their_numbers(devnull: int, reap: list[Spawned]) -> None:
    extra = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        sp = spawn([SLEEP, "60"], stdin=devnull, stdout=devnull, stderr=devnull,
                   pass_fds=[extra])
        reap.append(sp)
        assert fds_after_exec(sp.pid, [0, 1, 2, extra]) == [0, 1, 2, extra]
    finally:
        os.close(extra)


def test_std_fds_given_in_crossed_order() -> None:
    # stdout arrives as fd 0 and stdin as fd 1: installing one must not clobber the other.
    r, w = os.pipe()
    saved0, saved1 = os.dup(0), os.dup(1)
    try:
        os.dup2(w, 0)
        os.dup2(r, 1)
        os.close(w)
        os.close(r)
        sp = spawn(["echo", "crossed"], stdin=1, stdout=0, stderr=2)
        os.close(0)  # our copy of the write end; the child keeps its own
        out = os.read(1, 100)
    finally:
        os.dup2(saved0, 0)
        os.dup2(saved1, 1)
        os.close(saved0)
        os.close(saved1)
    os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
    os.close(sp.pidfd)
    assert out == b"crossed\n"


def proc_status(pid: int) -> dict[str, str]:
    lines = pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines)}


def test_signal_mask_and_dispositions_are_reset(devnull: int, reap: list[Spawned]) -> None:
    # Python itself ignores SIGPIPE; a task must not inherit that (nor a blocked mask).
    old = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        sp = spawn([SLEEP, "60"], stdin=devnull, stdout=devnull, stderr=devnull)
        reap.append(sp)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGUSR2, old)
    st = proc_status(sp.pid)
    assert int(st["SigIgn"], 16) == 0
    assert int(st["SigBlk"], 16) == 0
    # ...and the parent got its own mask back
    assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_session_umask_and_rlimits(devnull: int, reap: list[Spawned]) -> None:
    import resource

    sp = spawn([SLEEP, "60"], stdin=devnull, stdout=devnull, stderr=devnull,
               new_session=True, umask=0o027,
               rlimits=[(resource.RLIMIT_NOFILE, 64, 128)])
    reap.append(sp)
    stat_fields = pathlib.Path(f"/proc/{sp.pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat_fields[3]) == sp.pid  # session id
    assert proc_status(sp.pid)["Umask"] == "0027"
    limits = pathlib.Path(f"/proc/{sp.pid}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    assert line.split()[3:5] == ["64", "128"]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing uid/gid needs root")
def test_credentials_are_dropped(devnull: int, reap: list[Spawned]) -> None:
    sp = spawn([SLEEP, "60"], stdin=devnull, stdout=devnull, stderr=devnull,
               uid=65534, gid=65534, groups=[65534])
    reap.append(sp)
    st = proc_status(sp.pid)
    assert st["Uid"].split() == ["65534"] * 4
    assert st["Gid"].split() == ["65534"] * 4
    assert st["Groups"].split() == ["65534"]


def test_cwd_is_checked_as_the_target_user(tmp_path: pathlib.Path, devnull: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing uid needs root")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(SpawnError) as ei:
        spawn(["true"], cwd=str(private), uid=65534, gid=65534, groups=[],
              stdin=devnull, stdout=devnull, stderr=devnull)
    assert (ei.value.errno, ei.value.step) == (errno.EACCES, "chdir")


@pytest.mark.skipif(os.geteuid() != 0, reason="a new network namespace needs CAP_SYS_ADMIN")
def test_new_network_namespace(devnull: int, reap: list[Spawned]) -> None:
    sp = spawn([SLEEP, "60"], stdin=devnull, stdout=devnull, stderr=devnull, new_netns=True)
    reap.append(sp)
    assert os.readlink(f"/proc/{sp.pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_environment_is_exactly_the_given_one() -> None:
    _, out, _ = run_capture(["/usr/bin/env"], env={"ONLY": "this", "PATH": "/bin"})
    assert sorted(out.decode().splitlines()) == ["ONLY=this", "PATH=/bin"]


def test_a_large_argv_and_environment_reach_the_child_whole() -> None:
    # 65,000 arguments (empty ones and non-UTF-8 ones among them) and 3,000 variables, each
    # array pointed into one buffer
    argv = ["/bin/sh", "-c", 'printf "%s\\n" "$#" "$1" "${64996}"; env | grep -c "^V[0-9]*="', "sh",
            "", *(f"a{n}" for n in range(64994)), "\udcffz"]
    env = {f"V{n}": "x" * (n % 50) for n in range(3000)}
    _, out, status = run_capture(argv, env=env)
    assert status == 0 and out.split(b"\n") == [b"64996", b"", b"\xffz", b"3000", b""]


def test_spawn_into_a_removed_cgroup_fails_cleanly(test_cgroup: Cgroup, devnull: int) -> None:
    leaf = test_cgroup.make_child("gone")
    fd = os.dup(leaf.fd)
    leaf.remove()
    try:
        for fallback in (False, True):
            with pytest.raises(SpawnError) as ei:
                spawn(["true"], cgroup_fd=fd, stdin=devnull, stdout=devnull, stderr=devnull,
                      force_fallback=fallback)
            assert ei.value.errno == errno.ENODEV or ei.value.errno == errno.ENOENT
    finally:
        os.close(fd)


def test_resolve_executable_follows_execvp() -> None:
    assert resolve_executable("/bin/true", "/x") == ["/bin/true"]
    assert resolve_executable("tool", "/a::/b") == ["/a/tool", "./tool", "/b/tool"]
    assert resolve_executable("tool", None) == [os.path.join(d or ".", "tool")
                                                for d in os.defpath.split(":")]
