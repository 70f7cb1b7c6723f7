"""Fixtures for the tests that run INSIDE the user-mode Linux guest.

Files here are named ``guest_*.py`` so that a plain ``pytest`` on the host never collects them;
``tests/test_vm_tier.py`` boots the guest (``tests/vm/run-in-vm``) and runs, inside it::

    python -m pytest -o python_files='guest_*.py' --confcutdir tests/guest tests/guest

In the guest ``/sys/fs/cgroup`` is pure cgroup v2 with cpu io memory pids, the tests run as
root, and whatever they do to cgroups, processes and memory dies with the guest. This conftest
is still loaded (never used) when the host collects ``tests/``: it imports nothing but the
standard library at module level, and its fixtures refuse to run outside the guest.

Each test gets its own uniquely named cgroup under the guest's root cgroup (``cgroup``), which
is killed and removed afterwards however the test ended.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from cgroupfs import Cgroup

CONTROLLERS = frozenset({"memory", "pids", "cpu", "io"})


def _not_in_guest_reason() -> str | None:
    if os.environ.get("CORRAL_IN_VM") != "1":
        return "CORRAL_IN_VM=1 is not set"
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError as exc:
        return f"cannot read /proc/cpuinfo: {exc}"
    if "User Mode Linux" not in cpuinfo:
        return "this kernel is not user-mode Linux"
    return None


@pytest.fixture(scope="session", autouse=True)
def _only_in_the_guest() -> None:
    """These tests create cgroups at the cgroup2 root and run memory hogs: never on a host."""
    reason = _not_in_guest_reason()
    if reason:
        pytest.exit(
            f"tests/guest runs only inside the user-mode Linux guest ({reason}); "
            "on the host run: pytest tests/test_vm_tier.py",
            returncode=4,
        )


@pytest.fixture(scope="session")
def cgroup_root() -> Iterator[Cgroup]:
    """The guest's root cgroup, with memory pids cpu io enabled for its children.

    The root cgroup is exempt from the no-internal-process rule, so this works with every
    process of the guest (pytest included) still in it.
    """
    from cgroupfs import Cgroup, find_cgroup2_mount

    mount = find_cgroup2_mount()
    assert mount.mount_point == "/sys/fs/cgroup", mount
    with Cgroup.open(mount.mount_point) as root:
        missing = CONTROLLERS - set(root.available_controllers())
        assert not missing, f"the guest kernel lacks controllers {sorted(missing)}"
        root.enable_controllers(CONTROLLERS)
        yield root


def _pids_in_tree(path: str) -> set[int]:
    pids: set[int] = set()
    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(FileNotFoundError):  # removed while we walked
            pids |= {int(p) for p in Path(dirpath, "cgroup.procs").read_text().split()}
    return pids


def destroy_tree(path: str, root_path: str) -> None:
    """Kill every process under ``path`` and remove it with its sub-cgroups (plain os calls,
    so that cleanup works even when the code under test does not). If this very process was
    left somewhere inside (a test that moved pytest), it is first moved back to the root."""
    if not os.path.isdir(path):
        return
    if os.getpid() in _pids_in_tree(path):
        fd = os.open(os.path.join(root_path, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    deadline = time.monotonic() + 10
    while "populated 1" in Path(path, "cgroup.events").read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} still populated 10 s after cgroup.kill")
        time.sleep(0.01)
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        for attempt in range(100):  # a just-killed cgroup can stay busy for a moment
            try:
                os.rmdir(dirpath)
                break
            except OSError:
                if attempt == 99:
                    raise
                time.sleep(0.01)


@pytest.fixture
def cgroup(cgroup_root: Cgroup, request: pytest.FixtureRequest) -> Iterator[Cgroup]:
    """A fresh, uniquely named child of the root cgroup (memory pids cpu io available in it,
    none enabled for its own children); killed and removed after the test."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:60]
    name = f"corral-test-{slug}-{uuid.uuid4().hex[:8]}"
    path = os.path.join(str(cgroup_root.path), name)
    try:
        with cgroup_root.make_child(name) as cg:
            yield cg
    finally:
        destroy_tree(path, str(cgroup_root.path))


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``spawn(cg, argv, **popen_kwargs)`` starts argv already inside cgroup ``cg`` (via
    ``cg.add_proc``); every process started is killed and reaped after the test."""
    from guestutil import spawn_in

    procs: list[subprocess.Popen[bytes]] = []

    def _spawn(cg: Cgroup, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = spawn_in(cg.add_proc, argv, **kwargs)
        procs.append(proc)
        return proc

    yield _spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
