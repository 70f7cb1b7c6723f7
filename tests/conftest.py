"""Fixtures shared by every test tier: a real, uniquely named cgroup per test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import pytest

import cgroupfs

# Python programs the tests start (``sys.executable -c ...``) must import corral as installed,
# never the checkout they run in: a non-editable install (CI) has no compiled module there.
# PYTHONSAFEPATH keeps the working directory (and a script's) off their sys.path.
os.environ["PYTHONSAFEPATH"] = "1"

# Started in the background by a non-interactive shell (`pytest ... &`, nohup), we inherit
# SIGINT and SIGQUIT ignored, and so would every program the tests start (an ignored signal
# stays ignored across exec): the Ctrl-C tests would test nothing.  Back to the defaults.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def cgroup2_mount() -> str:
    """Mount point of the cgroup2 filesystem; skips the test if there is none we can write."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the tests create cgroups directly under the cgroup2 mount")
    try:
        mount = cgroupfs.find_cgroup2_mount()
    except cgroupfs.NoCgroup2Error as exc:
        pytest.skip(f"needs a cgroup2 mount: {exc}")
    if not cgroupfs.is_writable(mount.mount_point):
        pytest.skip(f"needs a writable cgroup2 mount; {mount.mount_point} is not writable")
    return mount.mount_point


@pytest.fixture
def test_cgroup(cgroup2_mount: str) -> Iterator[cgroupfs.Cgroup]:
    """A fresh ``corral-test-<hex>`` cgroup under the cgroup2 mount, open.

    At teardown whatever is left in it or below is killed (cgroup.kill), and
    the test fails if it does not empty within 5 s or cannot be removed.
    """
    with cgroupfs.Cgroup.open(cgroup2_mount) as root:
        cg = root.make_child(f"corral-test-{uuid.uuid4().hex[:8]}")
    path = cg.path
    try:
        yield cg
    finally:
        cg.close()
        if os.path.isdir(path):
            with cgroupfs.Cgroup.open(path) as leftover:
                if leftover.is_populated():
                    leftover.kill()
                assert leftover.wait_unpopulated(5.0), f"{path} still populated after kill"
                leftover.remove(recursive=True, busy_timeout=2.0)
        assert not os.path.exists(path), f"{path} was not removed"


STOPPER_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <time.h>
/* stopper SECONDS: kill(-1, SIGSTOP) for that long (every process this uid may signal, but
 * this one), then SIGCONT them all, and exit. */
int main(int argc, char **argv)
{
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 10);
    while (time(NULL) < end)
        kill(-1, SIGSTOP);
    kill(-1, SIGCONT);
    return 0;
}
"""


@pytest.fixture(scope="session")
def stopper() -> Iterator[str]:
    """A program, ``stopper SECONDS``, that any uid may run: ``kill(-1, SIGSTOP)`` in a tight
    loop for that long, then SIGCONT to the same processes.  What a tenant runs to stop its
    own processes the moment they take its uid.  In C: a Python loop is too slow to hit the
    few microseconds between a child's uid change and its exec often enough."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the SIGSTOP loop (a Python loop rarely hits the few "
                    "microseconds before a task's exec)")
    where = tempfile.mkdtemp(prefix="corral-test-stopper-")
    os.chmod(where, 0o755)
    src = os.path.join(where, "stopper.c")
    with open(src, "w") as f:
        f.write(STOPPER_C)
    subprocess.run(["gcc", "-O2", "-o", os.path.join(where, "stopper"), src], check=True)
    try:
        yield os.path.join(where, "stopper")
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def slow_path() -> Iterator[str]:
    """A PATH whose first 8 entries each take the kernel milliseconds to refuse (a chain of
    40 symbolic links, each walking ~1600 path components), then /usr/bin:/bin: a child's
    search along it holds it a few tens of milliseconds between its uid change and its exec,
    the window a tenant's SIGSTOP lands in.  (What an attacker builds to widen that window;
    corral caps PATH at 256 entries, so this is about as wide as it gets.)"""
    where = tempfile.mkdtemp(prefix="corral-test-chain-")
    os.chmod(where, 0o755)
    os.mkdir(os.path.join(where, "d"))
    pad = "d/../" * 818
    for i in range(39):
        os.symlink(f"{pad}l{i + 1}", os.path.join(where, f"l{i}"))
    os.symlink(f"{pad}d", os.path.join(where, "l39"))
    os.symlink("l0", os.path.join(where, "a"))
    try:
        yield ":".join([os.path.join(where, "a")] * 8 + ["/usr/bin", "/bin"])
    finally:
        shutil.rmtree(where, ignore_errors=True)
