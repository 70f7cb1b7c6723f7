"""The native helper's isolation steps, on real namespaces and real mounts.

Every mount here is made by the child inside its own mount namespace: the tests check that
ours (the host's) is the same before and after.  Every failure is reported as its own step.
"""

from __future__ import annotations

import errno
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

from supervisor._spawn import (
    CAPABILITIES,
    SpawnError,
    cap_last_cap,
    setns,
    spawn,
    unshare,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and mounts need root")

CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV = 0x2, 0x4


def cap(name: str) -> int:
    return 1 << CAPABILITIES.index(name)


@pytest.fixture
def host_mounts() -> Iterator[None]:
    """Fails the test if our mount table changed: every mount must stay in the child's ns."""
    before = pathlib.Path("/proc/self/mountinfo").read_text()
    yield
    assert pathlib.Path("/proc/self/mountinfo").read_text() == before


def run(argv: list[str], **kw: object) -> tuple[int, str]:
    """Spawn argv with stdout+stderr on a pipe; (exit status, output)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        sp = spawn(argv, stdin=w, stdout=w, stderr=w, **kw)  # type: ignore[arg-type]
    finally:
        os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    res = os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
    os.close(sp.pidfd)
    assert res is not None
    return res.si_status, b"".join(chunks).decode()


def refused(**kw: object) -> SpawnError:
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        with pytest.raises(SpawnError) as info:
            spawn(["true"], stdin=devnull, stdout=devnull, stderr=devnull, **kw)  # type: ignore[arg-type]
    finally:
        os.close(devnull)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no zombie left behind
    return info.value


def status_field(text: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines()
                if line.startswith(f"{name}:"))


def test_tmpfs_is_mounted_in_the_childs_namespace_only(tmp_path: pathlib.Path,
                                                       host_mounts: None) -> None:
    (tmp_path / "host-file").write_text("host")
    status, out = run(["sh", "-c", f"ls -A {tmp_path}; touch {tmp_path}/child-file; "
                                   f"stat -c %a {tmp_path}"],
                      mount_namespace=True, tmpfs=[str(tmp_path)])
    assert (status, out) == (0, "1777\n")  # empty, world-writable with the sticky bit
    assert sorted(os.listdir(tmp_path)) == ["host-file"]


def test_read_only_remount_keeps_the_mount_flags(tmp_path: pathlib.Path,
                                                 host_mounts: None) -> None:
    # the child's own tmpfs, then remounted read-only: writes fail, nosuid/nodev stay
    status, out = run(["sh", "-c", f"grep ' {tmp_path} ' /proc/self/mountinfo; "
                                   f"touch {tmp_path}/x || echo refused"],
                      mount_namespace=True, tmpfs=[str(tmp_path)],
                      read_only=[(str(tmp_path), MS_NOSUID | MS_NODEV)])
    assert status == 0, out
    options = out.split()[5].split(",")
    assert {"ro", "nosuid", "nodev"} <= set(options)
    assert out.rstrip().endswith("refused")


def test_cgroupfs_read_only_for_the_child_writable_for_us(host_mounts: None) -> None:
    from cgroupfs import find_cgroup2_mount

    mount = find_cgroup2_mount().mount_point
    status, out = run(["sh", "-c", f"mkdir {mount}/corral-should-not-exist-$$ || echo refused"],
                      mount_namespace=True, read_only=[(mount, 0)])
    assert status == 0 and "Read-only file system" in out and "refused" in out
    assert os.access(mount, os.W_OK)


def test_mounts_need_a_mount_namespace(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="mount_namespace=True"):
        spawn(["true"], stdin=0, stdout=1, stderr=2, tmpfs=[str(tmp_path)])


# Run inside a task: its interfaces (name, up) and whether it holds 127.0.0.1 and ::1.
LINKS = """
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _, name in socket.if_nameindex():
    raw = fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", name.encode(), 0))  # SIOCGIFFLAGS
    print(name, "UP" if struct.unpack("16sH14x", raw)[1] & 1 else "DOWN")
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    socket.socket(family).bind((host, 0))  # EADDRNOTAVAIL where the address is missing
    print(host)
"""


def test_new_network_namespace_has_loopback_up() -> None:
    status, out = run([sys.executable, "-c", LINKS], new_netns=True)
    assert (status, out.split("\n")) == (0, ["lo UP", "127.0.0.1", "::1", ""]), out


def test_joins_a_given_network_namespace() -> None:
    made: dict[str, int] = {}

    def make() -> None:  # a thread's unshare moves only that thread
        unshare(CLONE_NEWNET)
        made["fd"] = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    try:
        status, out = run(["readlink", "/proc/self/ns/net"], netns_fd=made["fd"])
        assert status == 0
        assert out.strip() == f"net:[{os.fstat(made['fd']).st_ino}]"
        assert out.strip() != os.readlink("/proc/self/ns/net")
    finally:
        os.close(made["fd"])


def test_joining_something_that_is_not_a_namespace_is_the_netns_step() -> None:
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        err = refused(netns_fd=fd)
    finally:
        os.close(fd)
    assert (err.step, err.errno) == ("netns", errno.EINVAL)
    assert "network namespace" in str(err)


def test_setns_from_a_thread_sees_the_childs_namespace() -> None:
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    sp = spawn(["sleep", "30"], stdin=devnull, stdout=devnull, stderr=devnull, new_netns=True)
    os.close(devnull)
    seen: list[str] = []

    def look() -> None:
        fd = os.open(f"/proc/{sp.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        setns(fd, CLONE_NEWNET)
        os.close(fd)
        seen.append(os.readlink("/proc/thread-self/ns/net"))

    try:
        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        assert seen == [os.readlink(f"/proc/{sp.pid}/ns/net")]
        assert os.readlink("/proc/self/ns/net") != seen[0]
    finally:
        signal.pidfd_send_signal(sp.pidfd, signal.SIGKILL)
        os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
        os.close(sp.pidfd)


def test_bounding_set_drop_and_no_new_privs() -> None:
    drop = cap("CAP_SYS_ADMIN") | cap("CAP_SYS_PTRACE")
    status, out = run(["cat", "/proc/self/status"], drop_bounding_caps=drop, no_new_privs=True)
    assert status == 0
    bounding = int(status_field(out, "CapBnd"), 16)
    assert bounding & drop == 0 and bounding & cap("CAP_CHOWN")
    assert int(status_field(out, "CapEff"), 16) & drop == 0  # root's caps come from the set
    assert status_field(out, "NoNewPrivs") == "1"


def test_ambient_capability_survives_the_uid_change() -> None:
    status, out = run(["cat", "/proc/self/status"], uid=65534, gid=65534, groups=[65534],
                      ambient_caps=cap("CAP_NET_BIND_SERVICE"))
    assert status == 0
    assert status_field(out, "Uid").split() == ["65534"] * 4
    for name in ("CapAmb", "CapEff", "CapPrm"):
        assert int(status_field(out, name), 16) == cap("CAP_NET_BIND_SERVICE"), name


def test_without_ambient_capabilities_a_user_has_none() -> None:
    status, out = run(["cat", "/proc/self/status"], uid=65534, gid=65534, groups=[65534])
    assert status == 0
    for name in ("CapAmb", "CapEff", "CapPrm", "CapInh"):
        assert int(status_field(out, name), 16) == 0, name


def test_ambient_capability_outside_the_bounding_set_is_the_caps_step() -> None:
    err = refused(uid=65534, gid=65534, groups=[], drop_bounding_caps=cap("CAP_NET_RAW"),
                  ambient_caps=cap("CAP_NET_RAW"))
    assert (err.step, err.errno) == ("caps", errno.EPERM)


@pytest.mark.parametrize("step", ["tmpfs", "readonly"])
def test_a_missing_mount_point_names_the_step_and_the_path(tmp_path: pathlib.Path,
                                                           step: str) -> None:
    missing = str(tmp_path / "missing")
    kw: dict[str, object] = {"tmpfs": [missing]} if step == "tmpfs" else {
        "read_only": [(missing, 0)]}
    err = refused(mount_namespace=True, **kw)
    assert (err.step, err.errno, err.filename) == (step, errno.ENOENT, missing)
    assert missing in str(err)


def test_a_refused_rlimit_names_the_resource() -> None:
    import resource

    nr_open = int(pathlib.Path("/proc/sys/fs/nr_open").read_text())
    err = refused(rlimits=[(resource.RLIMIT_CORE, 0, 0),
                           (resource.RLIMIT_NOFILE, nr_open + 1, nr_open + 1)])
    assert (err.step, err.filename) == ("rlimit", "RLIMIT_NOFILE")
    assert err.errno == errno.EPERM


def test_capability_numbers_match_the_kernel() -> None:
    assert cap_last_cap() == int(pathlib.Path("/proc/sys/kernel/cap_last_cap").read_text())
    assert cap_last_cap() < len(CAPABILITIES)
    assert CAPABILITIES.index("CAP_SYS_ADMIN") == 21 and CAPABILITIES.index("CAP_BPF") == 39


def test_isolated_spawns_leave_no_process_and_no_mount(tmp_path: pathlib.Path,
                                                       host_mounts: None) -> None:
    for _ in range(20):
        assert run(["true"], new_netns=True, mount_namespace=True, tmpfs=[str(tmp_path)],
                   uid=65534, gid=65534, groups=[])[0] == 0
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)



def test_isolation_on_the_vfork_fallback_path(host_mounts: None) -> None:
    status, out = run(["sh", "-c", "id -u; ls -A /tmp | wc -l; ls /proc/self/net/dev_snmp6"],
                      force_fallback=True, new_netns=True, mount_namespace=True,
                      tmpfs=["/tmp"], uid=65534, gid=65534, groups=[])
    assert (status, out.split()) == (0, ["65534", "0", "lo"])


def test_a_uid_change_in_the_child_leaves_us_dumpable() -> None:
    # the child shares our memory until exec; its setresuid() must not leave our mm
    # marked non-dumpable (prctl(2) PR_GET_DUMPABLE)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_get_dumpable = 3
    assert libc.prctl(pr_get_dumpable, 0, 0, 0, 0) == 1
    for fallback in (False, True):
        status, _ = run(["true"], uid=65534, gid=65534, groups=[], force_fallback=fallback)
        assert status == 0
        assert libc.prctl(pr_get_dumpable, 0, 0, 0, 0) == 1
