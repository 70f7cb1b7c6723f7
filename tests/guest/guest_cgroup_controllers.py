"""cgroupfs against a kernel with every controller (memory pids cpu io): real processes, real
limits. Runs only inside the user-mode Linux guest (see tests/vm/README.md). Memory figures stay
at tens of MiB: page faults are slow in UML (64 MiB touched: ~4 s).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
from guestutil import CONTROLLERS, MiB, own_cgroup_path, read, wait_until

from cgroupfs import (
    Cgroup,
    CgroupBusy,
    CgroupNotFound,
    ControllerUnavailable,
    CpuMax,
    Limits,
    find_cgroup2_mount,
)

Spawn = Callable[..., subprocess.Popen[bytes]]

# Allocates 64 MiB and touches every page; under memory.max=32M the OOM killer takes it.
HOG_64M = "b = bytearray(64 << 20)\nb[::4096] = b'x' * (len(b) // 4096)\nprint('survived')"


def rel(cg: Cgroup) -> str:
    """The cgroup's path as /proc/PID/cgroup shows it (the guest's cgroup2 root is /)."""
    return "/" + os.path.relpath(cg.path, find_cgroup2_mount().mount_point)


# -- the no-internal-process rule ------------------------------------------------------------


# The kernel refuses domain controllers (memory, io) in a cgroup with processes (EBUSY), but
# accepts threaded ones (cpu, pids) and silently makes the cgroup a thread root (cgroup.type
# "domain threaded", new children "domain invalid": no process can join them; seen on this
# 6.1 kernel). cgroupfs refuses both the same way, before writing anything.
@pytest.mark.parametrize(
    "controllers", [CONTROLLERS, {"memory"}, {"cpu", "pids"}], ids=["all", "domain", "threaded"]
)
def test_enable_controllers_refused_while_the_cgroup_holds_a_process(
    cgroup: Cgroup, spawn: Spawn, controllers: set[str]
) -> None:
    proc = spawn(cgroup, ["sleep", "600"])
    assert cgroup.procs() == [proc.pid]

    with pytest.raises(CgroupBusy) as info:
        cgroup.enable_controllers(controllers)

    err = info.value
    assert err.errno == errno.EBUSY
    assert err.filename == os.path.join(cgroup.path, "cgroup.subtree_control")
    message = str(err)
    assert "no-internal-process" in message
    assert str(proc.pid) in message  # names the process in the way
    assert "move_procs_into" in message  # and the fix
    assert cgroup.enabled_controllers() == frozenset()
    assert read(cgroup.path, "cgroup.subtree_control") == ""
    assert read(cgroup.path, "cgroup.type") == "domain"


def test_move_a_child_process_into_a_leaf_then_enable_controllers(
    cgroup: Cgroup, spawn: Spawn
) -> None:
    proc = spawn(cgroup, ["sleep", "600"])

    with cgroup.move_procs_into("supervisor") as leaf:
        assert leaf.path == os.path.join(cgroup.path, "supervisor")
        assert cgroup.procs() == []
        assert leaf.procs() == [proc.pid]
        assert read(f"/proc/{proc.pid}", "cgroup") == f"0::{rel(leaf)}"

        cgroup.enable_controllers(CONTROLLERS)

        assert cgroup.enabled_controllers() == CONTROLLERS
        assert set(read(cgroup.path, "cgroup.subtree_control").split()) == CONTROLLERS
        assert leaf.available_controllers() == CONTROLLERS
        # Once enabled, the parent may hold no process again: add_proc says why.
        with pytest.raises(CgroupBusy, match="no-internal-process"):
            cgroup.add_proc(proc.pid)
        # ...while a sibling leaf can take limits and processes.
        with cgroup.make_child("job") as job:
            job.set_limits(Limits(memory_max=32 * MiB, pids_max=8))
            job.add_proc(proc.pid)
            assert job.procs() == [proc.pid]
            assert read(job.path, "memory.max") == str(32 * MiB)


def test_move_our_own_process_into_a_leaf_then_enable_controllers(
    cgroup_root: Cgroup, cgroup: Cgroup
) -> None:
    """What the supervisor does at start: move itself out of the way, then delegate."""
    me = os.getpid()
    before = own_cgroup_path()
    try:
        cgroup.add_proc(0)
        assert own_cgroup_path() == rel(cgroup)
        with pytest.raises(CgroupBusy, match="no-internal-process"):
            cgroup.enable_controllers(CONTROLLERS)

        with cgroup.move_procs_into("supervisor") as leaf:
            assert own_cgroup_path() == rel(leaf)
            assert leaf.procs() == [me]
            cgroup.enable_controllers(CONTROLLERS)
            assert cgroup.enabled_controllers() == CONTROLLERS
            with cgroup.make_child("job") as job:
                job.set_limits(Limits(pids_max=4))
                assert read(job.path, "pids.max") == "4"
    finally:
        cgroup_root.add_proc(me)  # back where we were, before the fixture kills the tree
    assert own_cgroup_path() == before == "/"


# -- limits that bite ------------------------------------------------------------------------


def test_memory_max_gets_a_hog_oom_killed(cgroup: Cgroup, spawn: Spawn) -> None:
    cgroup.set_limits(Limits(memory_max=32 * MiB, memory_swap_max=0))
    proc = spawn(cgroup, [sys.executable, "-c", HOG_64M], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=120)

    assert proc.returncode == -signal.SIGKILL, (proc.returncode, out)
    assert b"survived" not in out
    stats = cgroup.read_stats()
    assert stats.memory_events is not None
    assert stats.memory_events.oom_kill is not None and stats.memory_events.oom_kill >= 1
    assert stats.memory_events.max is not None and stats.memory_events.max >= 1
    if stats.memory_peak is not None:
        assert 16 * MiB < stats.memory_peak <= 32 * MiB
    wait_until(lambda: not cgroup.is_populated(), what="the OOM-killed cgroup to empty")


def test_pids_max_stops_a_fork_loop_and_kill_empties_the_cgroup(
    cgroup: Cgroup, spawn: Spawn
) -> None:
    cgroup.set_limits(Limits(pids_max=16))
    loop = (  # the sleepers must not hold our pipe open
        "i=0; while [ $i -lt 40 ]; do sleep 600 >/dev/null 2>&1 & i=$((i+1)); done; "
        'echo "forked all 40"'
    )
    proc = spawn(cgroup, ["/bin/sh", "-c", loop], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=60)

    assert proc.returncode != 0, out
    assert b"forked all 40" not in out
    assert b"fork" in out.lower(), out  # dash: "Cannot fork"
    stats = cgroup.read_stats()
    assert stats.pids_events is not None and stats.pids_events.max is not None
    assert stats.pids_events.max >= 1
    assert stats.pids_current is not None and 1 <= stats.pids_current <= 16
    if stats.pids_peak is not None:
        assert stats.pids_peak == 16
    sleepers = cgroup.procs()
    assert 1 <= len(sleepers) <= 16

    assert cgroup.kill() == "cgroup.kill"
    assert cgroup.wait_unpopulated(10.0)
    assert cgroup.procs() == []
    # The orphaned sleepers are reaped by the guest's init; then they are uncharged.
    wait_until(lambda: cgroup.read_stats().pids_current == 0, what="pids.current to drop to 0")


# -- limits written exactly ------------------------------------------------------------------


def test_limits_are_written_and_read_back_exactly(cgroup: Cgroup) -> None:
    cgroup.set_limits(
        Limits(
            memory_max=64 * MiB,
            memory_high=48 * MiB,
            memory_swap_max=16 * MiB,
            pids_max=100,
            cpu_max=CpuMax(50_000, 200_000),
            cpu_weight=250,
        )
    )
    assert read(cgroup.path, "memory.max") == str(64 * MiB)
    assert read(cgroup.path, "memory.high") == str(48 * MiB)
    assert read(cgroup.path, "memory.swap.max") == str(16 * MiB)
    assert read(cgroup.path, "pids.max") == "100"
    assert read(cgroup.path, "cpu.max") == "50000 200000"
    assert read(cgroup.path, "cpu.weight") == "250"

    # "max" and CpuMax(None) lift limits again; fields left None are untouched.
    cgroup.set_limits(Limits(memory_high="max", pids_max="max", cpu_max=CpuMax(None)))
    assert read(cgroup.path, "memory.high") == "max"
    assert read(cgroup.path, "pids.max") == "max"
    assert read(cgroup.path, "cpu.max") == "max 100000"
    assert read(cgroup.path, "memory.max") == str(64 * MiB)
    assert read(cgroup.path, "cpu.weight") == "250"


def test_io_weight_is_written_exactly_or_reported_missing(cgroup: Cgroup) -> None:
    """io.weight needs the iocost (or BFQ) scheduler; Debian's UML 6.1 kernel has neither,
    so there the io controller is enabled but the file is absent, and set_limits must say so."""
    if os.path.exists(os.path.join(cgroup.path, "io.weight")):
        cgroup.set_limits(Limits(io_weight=300))
        assert read(cgroup.path, "io.weight").splitlines()[0] == "default 300"
    else:
        assert "io" in cgroup.available_controllers()
        with pytest.raises(CgroupNotFound) as info:
            cgroup.set_limits(Limits(pids_max=7, io_weight=300))
        assert info.value.filename == os.path.join(cgroup.path, "io.weight")
        assert "io.weight" in str(info.value)
        assert "io controller is enabled" in str(info.value)  # not "no such cgroup"
        assert read(cgroup.path, "pids.max") == "max"  # checked before anything was written


def test_set_limits_needing_a_controller_the_parent_did_not_enable(cgroup: Cgroup) -> None:
    with cgroup.make_child("job") as job:
        assert job.available_controllers() == frozenset()
        with pytest.raises(ControllerUnavailable) as info:
            job.set_limits(Limits(memory_max=32 * MiB))
        err = info.value
        assert err.controller == "memory"
        assert err.path == job.path
        assert err.needed_by == ("memory_max",)
        assert "cgroup.subtree_control" in str(err)  # the fix: enable it in the parent
        assert not os.path.exists(os.path.join(job.path, "memory.max"))

        cgroup.enable_controllers({"pids"})
        job.set_limits(Limits(pids_max=10))
        assert read(job.path, "pids.max") == "10"
        # A mix: refused as a whole before anything is written.
        with pytest.raises(ControllerUnavailable) as info:
            job.set_limits(Limits(pids_max=20, cpu_weight=50))
        assert info.value.controller == "cpu"
        assert read(job.path, "pids.max") == "10"


# -- stats -----------------------------------------------------------------------------------


def test_read_stats_reports_real_numbers(cgroup: Cgroup, spawn: Spawn) -> None:
    busy = (
        "import time\n"
        "b = bytearray(24 << 20)\n"
        "b[::4096] = b'x' * (len(b) // 4096)\n"  # every page touched, whatever the allocator
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = spawn(cgroup, [sys.executable, "-c", busy], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"

    stats = cgroup.read_stats()
    assert stats.memory_current is not None and stats.memory_current >= 24 * MiB
    has_peak = os.path.exists(os.path.join(cgroup.path, "memory.peak"))
    if has_peak:
        assert stats.memory_peak is not None and stats.memory_peak >= 24 * MiB
    else:
        assert stats.memory_peak is None
    assert stats.memory_events is not None and stats.memory_events.oom_kill == 0
    assert stats.pids_current == 1
    if os.path.exists(os.path.join(cgroup.path, "pids.peak")):
        assert stats.pids_peak is not None and stats.pids_peak >= 1
    else:
        assert stats.pids_peak is None
    assert stats.pids_events is not None and stats.pids_events.max == 0
    assert stats.cpu is not None
    assert stats.cpu.usage_usec is not None and stats.cpu.usage_usec >= 200_000
    assert stats.cpu.user_usec is not None and stats.cpu.user_usec > 0
    assert stats.cgroup is not None and stats.cgroup.nr_descendants == 0


def test_read_stats_gives_none_for_files_of_controllers_not_enabled(cgroup: Cgroup) -> None:
    """memory.peak exists on this kernel; in a cgroup without the memory controller it is
    absent, and so None (never 0), like every other controller file."""
    with cgroup.make_child("plain") as plain:
        stats = plain.read_stats()
        assert stats.memory_current is None
        assert stats.memory_peak is None
        assert stats.memory_events is None
        assert stats.pids_current is None
        assert stats.pids_peak is None
        assert stats.pids_events is None
        assert stats.cpu is not None and stats.cpu.usage_usec == 0  # cpu.stat is core
