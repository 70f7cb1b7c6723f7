"""`corral run` inside a container: a cgroup namespace over a sub-cgroup, cgroup2 mounted inside.

This is what a CI runner's container sees (no container engine needed: a container is
namespaces plus mounts).  With the mount read-write, corral uses the namespace's root; with it
read-only, corral refuses before starting anything and says what to change.
"""

from __future__ import annotations

import os
import subprocess
import sys

import cgroupfs

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")


def in_container(cg: cgroupfs.Cgroup, mount_options: str, command: str) -> (
        subprocess.CompletedProcess[str]):
    inner = (f"mount -t cgroup2 -o {mount_options} cgroup2 /sys/fs/cgroup && {command}")
    return subprocess.run(
        ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec unshare --cgroup --mount --pid '
                     '--fork --mount-proc --propagation private sh -c "$2"',
         "sh", cg.path, inner],
        capture_output=True, text=True, timeout=60)


def test_writable_namespace_root_is_used(test_cgroup: cgroupfs.Cgroup) -> None:
    r = in_container(test_cgroup, "rw",
                     f"{CORRAL} run --summary -- sh -c 'setsid sleep 600 & cat /proc/self/cgroup'")
    assert r.returncode == 0, r.stderr
    leaf = next(line[3:] for line in r.stdout.splitlines() if line.startswith("0::"))
    # inside the namespace the container's cgroup is "/": corral made its root right below it
    assert leaf.startswith("/corral-") and leaf.count("/") == 2
    assert "1 process(es) left behind" in r.stderr
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()


def test_corral_check_in_the_container(test_cgroup: cgroupfs.Cgroup) -> None:
    r = in_container(test_cgroup, "rw", f"{CORRAL} check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cgroup namespace root" in r.stdout and "cgroup2 mount:      /sys/fs/cgroup\n" \
        in r.stdout


def test_read_only_cgroup_mount_is_refused_with_the_fix(test_cgroup: cgroupfs.Cgroup) -> None:
    r = in_container(test_cgroup, "ro", f"{CORRAL} run -- touch /corral-must-not-run")
    assert r.returncode == 125
    assert "read-only" in r.stderr and "mount it read-write" in r.stderr
    assert r.stderr.count("\n") == 1
    assert test_cgroup.children() == []
