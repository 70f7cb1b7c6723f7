"""`corral check`: it reports what it really found, and its exit status says if run works."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cgroupfs

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CORRAL, "check", *args], capture_output=True, text=True, timeout=60)


def test_json_report_matches_this_machine(test_cgroup: cgroupfs.Cgroup) -> None:
    r = check("--json", "--cgroup-root", test_cgroup.path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    mount = cgroupfs.find_cgroup2_mount()
    assert report["ok"] is True and report["problems"] == []
    assert report["cgroup2_mount"] == mount.mount_point
    assert report["own_cgroup"] == cgroupfs.own_cgroup()
    assert report["root"] == test_cgroup.path
    assert report["pidfd"] is True
    # this kernel (>= 5.14) has both: the probe spawned into a real leaf and found cgroup.kill
    assert report["clone_into_cgroup"] is True and report["spawn_method"] == "clone3"
    assert report["cgroup_kill"] is True
    available = test_cgroup.available_controllers() & {"cpu", "io", "memory", "pids"}
    assert set(report["controllers"]) == available
    assert ("MemoryMax" in report["properties"]) == ("memory" in available)
    assert "RuntimeMaxSec" in report["properties"]
    assert test_cgroup.children() == []  # the probe's root and leaf are gone


def test_text_report_says_it_works_and_cleans_up() -> None:
    r = check()
    assert r.returncode == 0 and "corral run works here" in r.stdout
    assert "CLONE_INTO_CGROUP:  yes" in r.stdout and "cgroup.kill:        yes" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("probe root:"))
    root = line.split()[2]
    assert "/corral-" in root and not os.path.exists(root)


def test_unusable_root_exits_1_and_says_why() -> None:
    r = check("--cgroup-root", "/proc")
    assert r.returncode == 1
    assert "not a cgroup v2 directory" in r.stdout and "cannot work here" in r.stdout


def test_every_property_it_lists_runs_and_every_one_it_refuses_is_refused(
        test_cgroup: cgroupfs.Cgroup) -> None:
    # the list is what `corral run -p` takes here: each listed isolation property runs a task
    # with a value that needs what it needs (another uid, a namespace, a capability), each
    # refused one is refused by corral run too (exit 125, nothing started)
    from supervisor.cli.check import ISOLATION_PROBES

    r = check("--json", "--cgroup-root", test_cgroup.path)
    report = json.loads(r.stdout)
    listed, refused = report["properties"], report["properties_refused"]
    if os.geteuid() == 0:  # root here: another uid, namespaces and capabilities are ours
        assert {"User", "Group", "PrivateNetwork", "PrivateTmp", "ProtectControlGroups",
                "CapabilityBoundingSet", "LimitNOFILE"} <= set(listed), refused
    samples = {"MemoryMax": "512M", "MemoryHigh": "512M", "MemorySwapMax": "0",
               "TasksMax": "64", "CPUQuota": "50%", "CPUWeight": "100", "IOWeight": "100"}
    for name in [*listed, *refused]:
        if name in ISOLATION_PROBES:
            props = [f"{n}={v}" for n, v in ISOLATION_PROBES[name]]
        elif name in samples:
            props = [f"{name}={samples[name]}"]
        else:
            continue  # (a time, a signal, a directory: nothing of the host's)
        argv = [CORRAL, "run", "--cgroup-root", test_cgroup.path, "-q",
                *(w for p in props for w in ("-p", p)), "--", "true"]
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert ran.returncode == (0 if name in listed else 125), (name, ran.stderr)
    assert test_cgroup.children() == []


def test_a_missing_root_is_said_to_be_missing_with_the_fix(test_cgroup: cgroupfs.Cgroup) -> None:
    missing = os.path.join(test_cgroup.path, "demo")
    r = check("--cgroup-root", missing)
    assert r.returncode == 1
    assert f"--cgroup-root {missing} does not exist; make it first (mkdir -p {missing})" \
        in r.stdout, r.stdout
    assert "not a cgroup v2 directory" not in r.stdout
