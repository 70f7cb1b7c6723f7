"""kill(), freeze() and thaw() on real process trees that try to escape."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

import cgroupfs
from cgroupfs import Cgroup, CgroupNotFound

# Five sleeps in $1 and one in $1/sub, started so that a process-group or
# session kill would miss most of them: two setsid escapees (one with a child
# of its own), an orphan whose parent exited (re-parented to the test process,
# a child subreaper), and one in a sub-cgroup.
ESCAPING_TREE = """\
setsid sleep 300 &
setsid sh -c 'sleep 300 & exec sleep 300' &
sh -c 'sleep 300 & exit 0'
sh -c 'echo $$ > "$1/sub/cgroup.procs" && exec sleep 300' sh "$1" &
exec sleep 300
"""


def _sleeps(processes: Any, cg: Cgroup) -> list[int]:
    return [pid for pid in cg.procs() if processes.comm(pid) == "sleep"]


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


@pytest.mark.parametrize(
    ("force_fallback", "method"), [(False, "cgroup.kill"), (True, "freeze+signal")]
)
def test_kill_takes_down_a_tree_that_setsids_and_double_forks(
    test_cgroup: Cgroup, processes: Any, force_fallback: bool, method: str
) -> None:
    sub = test_cgroup.make_child("sub")
    main = processes.shell(ESCAPING_TREE)
    processes.wait_for(
        lambda: len(_sleeps(processes, test_cgroup)) == 5 and len(_sleeps(processes, sub)) == 1,
        "the whole tree",
    )
    pids = test_cgroup.procs() + sub.procs()
    assert {os.getsid(pid) for pid in pids} != {os.getsid(main.pid)}, "no setsid escapee"
    assert os.getpid() in {_ppid(pid) for pid in pids}, "no re-parented orphan"

    assert test_cgroup.kill(force_fallback=force_fallback) == method

    processes.wait_for(lambda: not test_cgroup.is_populated(), "populated 0")
    assert test_cgroup.procs() == [] and sub.procs() == []
    assert main.wait(timeout=5) == -9
    assert test_cgroup.read_events().frozen is False
    assert test_cgroup.read_file("cgroup.freeze") == "0\n"
    sub.close()


@pytest.mark.parametrize("force_fallback", [False, True])
def test_kill_of_an_empty_cgroup_is_harmless(test_cgroup: Cgroup, force_fallback: bool) -> None:
    test_cgroup.kill(force_fallback=force_fallback)
    assert test_cgroup.read_events() == cgroupfs.CgroupEvents(populated=False, frozen=False)


@pytest.mark.parametrize("force_fallback", [False, True])
def test_kill_of_a_removed_cgroup_is_not_found(test_cgroup: Cgroup, force_fallback: bool) -> None:
    gone = test_cgroup.make_child("gone")
    os.rmdir(gone.path)
    with pytest.raises(CgroupNotFound) as info:
        gone.kill(force_fallback=force_fallback)
    assert info.value.filename.startswith(gone.path)
    gone.close()


def test_freeze_and_thaw_show_in_cgroup_events(test_cgroup: Cgroup, processes: Any) -> None:
    processes.sleep()
    test_cgroup.freeze()
    assert test_cgroup.wait_frozen(5.0)
    assert test_cgroup.read_events() == cgroupfs.CgroupEvents(populated=True, frozen=True)
    test_cgroup.thaw()
    processes.wait_for(lambda: not test_cgroup.read_events().frozen, "frozen 0")
    assert test_cgroup.is_populated()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_fallback_thaws_even_when_a_kill_is_refused(
    test_cgroup: Cgroup, processes: Any
) -> None:
    # A real refusal: the target runs as nobody and the killer is root without
    # CAP_KILL, so kill(2) answers EPERM half-way through the fallback.
    victim = processes.sleep(user=65534)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(cgroupfs.__file__)))
    code = (
        "import sys, cgroupfs\n"
        "cg = cgroupfs.Cgroup.open(sys.argv[1])\n"
        "try:\n"
        "    cg.kill(force_fallback=True)\n"
        "except cgroupfs.CgroupOSError as exc:\n"
        "    print(exc.errno, exc.filename)\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        ["setpriv", "--bounding-set=-kill", "--", sys.executable, "-c", code, test_cgroup.path],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "PYTHONPATH": repo},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    first, message = result.stdout.splitlines()
    assert first == f"{errno.EPERM} {os.path.join(test_cgroup.path, 'cgroup.procs')}"
    assert f"sending SIGKILL to pid {victim.pid} listed in" in message
    assert test_cgroup.read_events().frozen is False
    assert victim.poll() is None  # refused, so still running: teardown kills it
