"""Cgroup on the real cgroup2 mount: the handle, the tree, processes, controllers."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import cgroupfs
from cgroupfs import (
    Cgroup,
    CgroupBusy,
    CgroupNotFound,
    CgroupOSError,
    ControllerUnavailable,
    InvalidName,
    Limits,
    NoCgroup2Error,
)


def _pid_max() -> int:
    fd = os.open("/proc/sys/kernel/pid_max", os.O_RDONLY)
    try:
        return int(os.read(fd, 64))
    finally:
        os.close(fd)


# -- the handle ------------------------------------------------------------------


def test_open_holds_a_directory_fd_and_closes_it(test_cgroup: Cgroup) -> None:
    with Cgroup.open(test_cgroup.path) as cg:
        fd = cg.fd
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
        assert cg.fileno() == fd
        assert os.get_inheritable(fd) is False
        assert cg.path == test_cgroup.path and cg.name == os.path.basename(cg.path)
        assert repr(cg) == f"<Cgroup {cg.path!r} fd={fd}>"
        assert cg.events_path == os.path.join(cg.path, "cgroup.events")
    assert cg.closed and repr(cg).endswith("closed>")
    with pytest.raises(ValueError, match="closed"):
        cg.procs()
    cg.close()  # idempotent


def test_open_refuses_a_directory_that_is_not_a_cgroup(tmp_path: Path) -> None:
    with pytest.raises(NoCgroup2Error, match="is not a cgroup v2 directory"):
        Cgroup.open(tmp_path)


def test_open_of_a_missing_cgroup_names_the_path(test_cgroup: Cgroup) -> None:
    missing = os.path.join(test_cgroup.path, "nope")
    with pytest.raises(CgroupNotFound) as info:
        Cgroup.open(missing)
    assert info.value.filename == missing and info.value.errno == errno.ENOENT


# -- the tree --------------------------------------------------------------------


def test_make_child_child_children_and_remove(test_cgroup: Cgroup) -> None:
    with test_cgroup.make_child("b"), test_cgroup.make_child("a") as a:
        assert a.path == os.path.join(test_cgroup.path, "a") and os.path.isdir(a.path)
        assert test_cgroup.children() == ["a", "b"]
        with test_cgroup.child("a") as again:
            assert os.path.samestat(os.fstat(again.fd), os.fstat(a.fd))
        a.remove()
        assert a.closed and not os.path.exists(a.path)
        assert test_cgroup.children() == ["b"]
        a.remove()  # already gone: fine by default
    with pytest.raises(CgroupNotFound) as info:
        Cgroup(os.path.join(test_cgroup.path, "a"), -1).remove(missing_ok=False)
    assert info.value.filename == os.path.join(test_cgroup.path, "a")


def test_make_child_of_an_existing_name(test_cgroup: Cgroup) -> None:
    test_cgroup.make_child("x").close()
    with pytest.raises(CgroupOSError) as info:
        test_cgroup.make_child("x")
    assert info.value.errno == errno.EEXIST
    assert info.value.filename == os.path.join(test_cgroup.path, "x")
    test_cgroup.make_child("x", exist_ok=True).close()


@pytest.mark.parametrize(
    "name",
    ["", "a/b", ".", "..", "cgroup.procs", "memory.max", "cpu.x", "x\ny", "a\0b", "n" * 256, 5],
)
def test_make_child_refuses_bad_names_before_creating_anything(
    test_cgroup: Cgroup, name: object
) -> None:
    with pytest.raises(InvalidName) as info:
        test_cgroup.make_child(name)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("cgroup name must be ")
    assert "use a plain name" in str(info.value)
    assert test_cgroup.children() == []


def test_dotted_names_that_are_not_controller_prefixes_are_fine(test_cgroup: Cgroup) -> None:
    test_cgroup.make_child("job.1").close()
    test_cgroup.make_child("init.scope").close()
    assert test_cgroup.children() == ["init.scope", "job.1"]


def test_child_of_a_missing_name_is_not_found(test_cgroup: Cgroup) -> None:
    with pytest.raises(CgroupNotFound, match="nope"):
        test_cgroup.child("nope")
    with pytest.raises(InvalidName):
        test_cgroup.child("../escape")


def test_remove_recursive_removes_descendants_deepest_first(test_cgroup: Cgroup) -> None:
    with test_cgroup.make_child("a") as a:
        a.make_child("x").close()
        with a.make_child("y") as y:
            y.make_child("z").close()
    test_cgroup.make_child("b").close()
    assert test_cgroup.descendants() == ["a", "a/x", "a/y", "a/y/z", "b"]
    path = test_cgroup.path
    with Cgroup.open(path) as cg:
        cg.remove(recursive=True)
    assert not os.path.exists(path)


def test_a_tree_deeper_than_path_max_is_walked_thawed_and_removed(test_cgroup: Cgroup) -> None:
    # 18 levels of 250-byte names: the deepest path is over 4500 bytes (PATH_MAX is 4096), as
    # a task below its leaf may make them; every walk goes by fd, one name at a time
    name = "x" * 250
    opened = [test_cgroup.make_child(name)]
    for _ in range(17):
        opened.append(opened[-1].make_child(name))
    opened[-1].write_file("cgroup.freeze", "1")
    for cg in opened:
        cg.close()
    rels = test_cgroup.descendants()
    assert len(rels) == 18 and len(rels[-1]) > 4096
    assert test_cgroup.procs_tree() == {rel: [] for rel in [".", *rels]}
    assert test_cgroup.thaw_tree() == [rels[-1]]
    path = test_cgroup.path
    with Cgroup.open(path) as cg:
        done = cg.destroy()
    assert done.error is None and not os.path.exists(path)


def test_remove_with_a_child_cgroup_is_busy_at_once_and_says_why(test_cgroup: Cgroup) -> None:
    test_cgroup.make_child("kid").close()
    with pytest.raises(CgroupBusy) as info:
        test_cgroup.remove(busy_timeout=30)  # no retrying: a child never goes away by itself
    assert info.value.errno == errno.EBUSY and info.value.filename == test_cgroup.path
    assert "child cgroups ['kid']" in str(info.value)
    assert not test_cgroup.closed


def test_remove_of_a_populated_cgroup_is_busy_and_names_the_process(
    test_cgroup: Cgroup, processes: Any
) -> None:
    sleeper = processes.sleep()
    with pytest.raises(CgroupBusy) as info:
        test_cgroup.remove(busy_timeout=0.05)
    exc = info.value
    assert isinstance(exc, OSError) and exc.errno == errno.EBUSY
    assert exc.filename == test_cgroup.path
    assert str(exc).startswith(f"removing directory {test_cgroup.path}: [Errno 16] ")
    assert f"processes [{sleeper.pid}]" in str(exc)
    assert not test_cgroup.closed and os.path.isdir(test_cgroup.path)
    # Kill, wait for populated 0, and the same cgroup can go.
    test_cgroup.kill()
    assert test_cgroup.wait_unpopulated(5.0)
    sleeper.wait(timeout=5)
    test_cgroup.remove()
    assert not os.path.exists(exc.filename)


# -- processes -------------------------------------------------------------------


def test_add_proc_moves_a_process(test_cgroup: Cgroup, processes: Any) -> None:
    assert test_cgroup.procs() == [] and not test_cgroup.is_populated()
    sleeper = processes.sleep()
    assert test_cgroup.procs() == [sleeper.pid]
    assert cgroupfs.own_cgroup(sleeper.pid) == test_cgroup.path
    assert test_cgroup.read_events() == cgroupfs.CgroupEvents(populated=True, frozen=False)


def test_add_proc_of_a_missing_pid_is_esrch_with_the_path(test_cgroup: Cgroup) -> None:
    missing = _pid_max() + 1
    with pytest.raises(CgroupOSError) as info:
        test_cgroup.add_proc(missing)
    assert info.value.errno == errno.ESRCH
    assert info.value.filename == os.path.join(test_cgroup.path, "cgroup.procs")
    assert str(info.value) == (
        f"writing '{missing}' to {info.value.filename}: [Errno 3] No such process"
    )


@pytest.mark.parametrize("pid", [-1, True, "12", 1.0])
def test_add_proc_refuses_non_pids(test_cgroup: Cgroup, pid: object) -> None:
    with pytest.raises(ValueError, match="pid must be an int >= 0"):
        test_cgroup.add_proc(pid)  # type: ignore[arg-type]


def test_move_procs_into_empties_the_cgroup_even_while_it_forks(
    test_cgroup: Cgroup, processes: Any
) -> None:
    sleeper = processes.sleep()
    forker = processes.shell("while :; do /bin/true; done")
    with test_cgroup.move_procs_into("supervisor") as leaf:
        assert test_cgroup.procs() == []
        assert {sleeper.pid, forker.pid} <= set(leaf.procs())
        assert leaf.path == os.path.join(test_cgroup.path, "supervisor")
        # exist_ok: a second call reuses the leaf and has nothing to move.
        test_cgroup.move_procs_into("supervisor").close()


def test_write_file_of_an_invalid_value_is_einval_with_the_path(test_cgroup: Cgroup) -> None:
    with pytest.raises(CgroupOSError) as info:
        test_cgroup.write_file("cgroup.freeze", "abc")
    assert info.value.errno == errno.EINVAL
    assert info.value.filename == os.path.join(test_cgroup.path, "cgroup.freeze")
    assert str(info.value).startswith(f"writing 'abc' to {info.value.filename}: [Errno 22]")
    assert test_cgroup.read_file("cgroup.freeze") == "0\n"
    with pytest.raises(CgroupNotFound):
        test_cgroup.read_file("memory.nonexistent")


# -- controllers and limits ------------------------------------------------------------


def _missing_controller(cg: Cgroup) -> str:
    for name in ("memory", "pids", "cpu", "io"):
        if name not in cg.available_controllers():
            return name
    pytest.skip("every controller is available here; the VM tier covers enabling them")


def test_enable_controllers_names_what_is_missing_and_writes_nothing(test_cgroup: Cgroup) -> None:
    name = _missing_controller(test_cgroup)
    available = test_cgroup.available_controllers()
    with pytest.raises(ControllerUnavailable) as info:
        test_cgroup.enable_controllers([name])
    exc = info.value
    offered = " ".join(sorted(available)) or "empty"
    assert str(exc).startswith(
        f"controller '{name}' is not available under {test_cgroup.path} "
        f"(cgroup.controllers: {offered}); "
    )
    assert (exc.controller, exc.path, exc.available) == (name, test_cgroup.path, available)
    assert "Delegate=yes" in str(exc) or "cgroup.subtree_control" in str(exc)
    assert test_cgroup.enabled_controllers() == frozenset()
    assert test_cgroup.children() == []


def test_enable_controllers_argument_checks(test_cgroup: Cgroup) -> None:
    test_cgroup.enable_controllers([])  # nothing to do
    with pytest.raises(TypeError, match=r"\['memory'\]"):
        test_cgroup.enable_controllers("memory")
    with pytest.raises(ValueError, match="controller names"):
        test_cgroup.enable_controllers(["+memory"])


def test_set_limits_names_the_controller_and_the_limit_that_needs_it(test_cgroup: Cgroup) -> None:
    if "memory" in test_cgroup.available_controllers():
        pytest.skip("memory is available here; the VM tier covers writing limits")
    with pytest.raises(ControllerUnavailable) as info:
        test_cgroup.set_limits(Limits(memory_max=64 * 1024**2, memory_high=32 * 1024**2))
    message = str(info.value)
    assert message.startswith(f"controller 'memory' is not enabled for {test_cgroup.path} ")
    assert "needed by memory_max, memory_high" in message
    assert info.value.needed_by == ("memory_max", "memory_high")
    assert not os.path.exists(os.path.join(test_cgroup.path, "memory.max"))
    test_cgroup.set_limits(Limits())  # nothing set: nothing needed
