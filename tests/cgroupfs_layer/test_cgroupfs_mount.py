"""Finding cgroup v2: mountinfo and /proc/PID/cgroup parsers, and own_cgroup here."""

# The mountinfo samples are real lines, kept whole.
# ruff: noqa: E501

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import cgroupfs
from cgroupfs import MountInfo, NoCgroup2Error

# A pure cgroup v2 host booted by systemd (Debian 12 / Fedora style).
PURE_V2 = textwrap.dedent("""\
    22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro
    23 22 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
    26 23 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
    27 23 0:25 / /sys/fs/pstore rw,nosuid,nodev,noexec,relatime shared:5 - pstore pstore rw
    """)

# This machine: v1 hierarchies on a tmpfs, cgroup2 at /sys/fs/cgroup/unified.
HYBRID = textwrap.dedent("""\
    22 27 0:21 / /proc rw,relatime - proc proc rw
    23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
    31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
    32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
    33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
    35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
    39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
    40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
    """)

# systemd's legacy mode: v1 only, several controllers co-mounted.
LEGACY = textwrap.dedent("""\
    25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
    26 25 0:23 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,release_agent=/lib/systemd/systemd-cgroups-agent,name=systemd
    29 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
    30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
    """)

# A container with its own cgroup namespace (docker --cgroupns=private): the
# mount's root is the namespace root "/", and it is read-only.
CONTAINER = textwrap.dedent("""\
    1071 1036 0:95 / / rw,relatime master:486 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
    1074 1071 0:99 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
    1075 1074 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate,memory_recursiveprot
    """)

# After `unshare --cgroup` in /corral-test-x/sub without remounting: the
# inherited mount's root lies two levels above our namespace root.
INHERITED = "41 31 0:38 /../.. /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"


def test_parse_mountinfo_reads_every_field_of_a_pure_v2_host() -> None:
    mounts = cgroupfs.parse_mountinfo(PURE_V2)
    assert [m.mount_point for m in mounts] == ["/", "/sys", "/sys/fs/cgroup", "/sys/fs/pstore"]
    cg = mounts[2]
    assert cg == MountInfo(
        mount_id=26,
        parent_id=23,
        major_minor="0:24",
        root="/",
        mount_point="/sys/fs/cgroup",
        options="rw,nosuid,nodev,noexec,relatime",
        optional_fields=("shared:4",),
        fstype="cgroup2",
        source="cgroup2",
        super_options="rw,nsdelegate,memory_recursiveprot",
    )
    assert cg.read_only is False


def test_parse_mountinfo_handles_several_optional_fields_and_none() -> None:
    text = "90 60 0:40 / /mnt rw shared:5 master:2 propagate_from:2 unbindable - tmpfs none rw\n"
    (mount,) = cgroupfs.parse_mountinfo(text)
    assert mount.optional_fields == ("shared:5", "master:2", "propagate_from:2", "unbindable")
    assert (mount.fstype, mount.source, mount.super_options) == ("tmpfs", "none", "rw")
    (bare,) = cgroupfs.parse_mountinfo(HYBRID.splitlines()[-1])
    assert bare.optional_fields == ()


def test_parse_mountinfo_decodes_octal_escapes_in_paths() -> None:
    text = r"50 22 0:44 /a\134b /mnt/my\040dir\011x\012y rw - tmpfs my\040src rw" + "\n"
    (mount,) = cgroupfs.parse_mountinfo(text)
    assert mount.root == "/a\\b"
    assert mount.mount_point == "/mnt/my dir\tx\ny"
    assert mount.source == "my src"


def test_parse_mountinfo_decodes_escaped_utf8_bytes() -> None:
    (mount,) = cgroupfs.parse_mountinfo(r"50 22 0:44 / /mnt/caf\303\251 rw - tmpfs t rw")
    assert mount.mount_point == "/mnt/café"


def test_read_only_comes_from_mount_or_superblock_options() -> None:
    (container,) = [m for m in cgroupfs.parse_mountinfo(CONTAINER) if m.fstype == "cgroup2"]
    assert container.read_only is True
    (sb_ro,) = cgroupfs.parse_mountinfo("5 1 0:9 / /x rw - cgroup2 cgroup2 ro,nsdelegate")
    assert sb_ro.read_only is True


@pytest.mark.parametrize(
    "line", ["garbage", "1 2 0:3 / /x rw tmpfs t rw", "a b 0:3 / /x rw - t s rw"]
)
def test_parse_mountinfo_refuses_a_malformed_line_naming_it(line: str) -> None:
    with pytest.raises(ValueError, match="malformed mountinfo line 1"):
        cgroupfs.parse_mountinfo(line)


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        (PURE_V2, "unified"),
        (HYBRID, "hybrid"),
        (LEGACY, "legacy"),
        (CONTAINER, "unified"),
        ("", "none"),
    ],
)
def test_hierarchy_mode(text: str, mode: str) -> None:
    assert cgroupfs.hierarchy_mode(cgroupfs.parse_mountinfo(text)) == mode


def test_find_cgroup2_mount_on_pure_v2_and_hybrid_hosts_and_in_a_container() -> None:
    assert cgroupfs.find_cgroup2_mount(PURE_V2).mount_point == "/sys/fs/cgroup"
    assert cgroupfs.find_cgroup2_mount(HYBRID).mount_point == "/sys/fs/cgroup/unified"
    assert cgroupfs.find_cgroup2_mount(CONTAINER, cgroup_path="/").mount_point == "/sys/fs/cgroup"


def test_find_cgroup2_mount_on_a_v1_only_host_names_the_v1_hierarchies() -> None:
    with pytest.raises(NoCgroup2Error) as info:
        cgroupfs.find_cgroup2_mount(LEGACY)
    message = str(info.value)
    assert "only cgroup v1 hierarchies are mounted (cpu, cpuacct, memory, name=systemd)" in message
    assert "systemd.unified_cgroup_hierarchy=1" in message


def test_find_cgroup2_mount_without_any_cgroup_says_so() -> None:
    with pytest.raises(NoCgroup2Error, match="no cgroup filesystem is mounted"):
        cgroupfs.find_cgroup2_mount(PURE_V2.splitlines()[0])


def test_find_cgroup2_mount_prefers_one_containing_our_cgroup_then_root_then_writable() -> None:
    bind_mounts = textwrap.dedent("""\
        60 22 0:30 /a /mnt/a rw - cgroup2 cgroup2 rw
        61 22 0:30 /b /mnt/b rw - cgroup2 cgroup2 rw
        """)
    assert cgroupfs.find_cgroup2_mount(bind_mounts, cgroup_path="/b/job").mount_point == "/mnt/b"
    whole = bind_mounts + textwrap.dedent("""\
        62 22 0:30 / /mnt/all ro - cgroup2 cgroup2 rw
        63 22 0:30 / /mnt/all-rw rw - cgroup2 cgroup2 rw
        """)
    assert cgroupfs.find_cgroup2_mount(whole, cgroup_path="/b/job").mount_point == "/mnt/all-rw"


def test_find_cgroup2_mount_skips_a_mount_hidden_under_another_on_the_same_point() -> None:
    text = textwrap.dedent("""\
        70 22 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw
        71 70 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
        """)
    assert cgroupfs.find_cgroup2_mount(text, cgroup_path="/").mount_id == 71


def test_parse_proc_cgroup_on_pure_v2_and_hybrid() -> None:
    assert cgroupfs.parse_proc_cgroup("0::/user.slice/session-2.scope\n") == (
        "/user.slice/session-2.scope"
    )
    hybrid = "9:name=systemd:/\n4:memory:/process_api/c7\n1:cpu:/\n0::/\n"
    assert cgroupfs.parse_proc_cgroup(hybrid) == "/"
    assert cgroupfs.parse_proc_cgroup("0::/odd:name\n") == "/odd:name"


def test_parse_proc_cgroup_on_v1_only_raises_naming_the_hierarchies() -> None:
    with pytest.raises(NoCgroup2Error) as info:
        cgroupfs.parse_proc_cgroup("2:cpu,cpuacct:/\n1:name=systemd:/init.scope\n")
    assert "only cgroup v1 hierarchies (cpu,cpuacct, name=systemd)" in str(info.value)


def test_parse_proc_cgroup_refuses_a_deleted_cgroup() -> None:
    with pytest.raises(NoCgroup2Error, match="/gone has been removed"):
        cgroupfs.parse_proc_cgroup("0::/gone (deleted)\n")


def test_cgroup_fs_path_is_the_path_below_the_mount_root() -> None:
    (whole,) = cgroupfs.parse_mountinfo("1 0 0:1 / /cg rw - cgroup2 cgroup2 rw")
    (sub,) = cgroupfs.parse_mountinfo("1 0 0:1 /a /cg rw - cgroup2 cgroup2 rw")
    assert cgroupfs.cgroup_fs_path(whole, "/") == "/cg"
    assert cgroupfs.cgroup_fs_path(whole, "/a/b") == "/cg/a/b"
    assert cgroupfs.cgroup_fs_path(sub, "/a/b") == "/cg/b"
    with pytest.raises(NoCgroup2Error, match="not below the root /a"):
        cgroupfs.cgroup_fs_path(sub, "/ab")
    (inherited,) = cgroupfs.parse_mountinfo(INHERITED)
    with pytest.raises(NoCgroup2Error):
        cgroupfs.cgroup_fs_path(inherited, "/")


def _proc_text(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 20).decode()
    finally:
        os.close(fd)


def test_own_cgroup_here_agrees_with_proc_self_cgroup() -> None:
    mount = cgroupfs.find_cgroup2_mount()
    v2_path = cgroupfs.parse_proc_cgroup(_proc_text("/proc/self/cgroup"))
    expected = os.path.normpath(mount.mount_point + "/" + v2_path)
    assert cgroupfs.own_cgroup() == expected
    assert cgroupfs.own_cgroup(os.getpid()) == expected
    assert os.path.isfile(os.path.join(expected, "cgroup.procs"))


def test_own_cgroup_of_a_process_in_the_test_cgroup(
    processes: Any, test_cgroup: cgroupfs.Cgroup
) -> None:
    sleeper = processes.sleep()
    assert cgroupfs.own_cgroup(sleeper.pid) == test_cgroup.path
    assert cgroupfs.own_cgroup(str(sleeper.pid)) == test_cgroup.path


def test_own_cgroup_of_a_missing_pid_is_a_process_lookup_error() -> None:
    pid_max = int(_proc_text("/proc/sys/kernel/pid_max"))
    with pytest.raises(ProcessLookupError):
        cgroupfs.own_cgroup(pid_max + 1)


def test_own_cgroup_inside_a_new_cgroup_namespace_finds_the_real_directory(
    processes: Any, test_cgroup: cgroupfs.Cgroup
) -> None:
    # unshare --cgroup without remounting: /proc/self/cgroup says "/" and the
    # inherited mount's root shows as "/../..", so own_cgroup has to search.
    sub = test_cgroup.make_child("sub")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(cgroupfs.__file__)))
    code = (
        "import cgroupfs; print(open('/proc/self/cgroup').read().splitlines()[-1]); "
        "print(cgroupfs.own_cgroup())"
    )
    shell = processes.shell(
        f'exec unshare --cgroup "{sys.executable}" -c "{code}"',
        sub,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": repo},
    )
    out, _ = shell.communicate(timeout=10)
    assert shell.returncode == 0
    assert out.decode().splitlines() == ["0::/", sub.path]
    sub.close()
