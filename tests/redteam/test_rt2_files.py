"""Second round on the files corral (root) writes for a task that runs as another user
(c2fa6b0: log_file, --json-file, --plot never opened through a symlink in their last
component).  The task owns the directory the operator pointed corral at; what else can it
plant there?"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from rt_util import CORRAL

import supervisor

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def layout() -> Iterator[tuple[str, str]]:
    """(a directory the task's user owns, a root-only directory with a root-only file
    ``task.log`` and ``result.json`` in it: the victims).  Not in pytest's tmp_path (0700
    parents the task's user could not pass)."""
    base = tempfile.mkdtemp(prefix="rt2-files-")
    os.chmod(base, 0o755)
    ws = os.path.join(base, "ws")
    os.mkdir(ws)
    os.chown(ws, NOBODY.pw_uid, NOBODY.pw_gid)
    private = os.path.join(base, "private")
    os.mkdir(private, 0o700)
    for name in ("task.log", "result.json"):
        with open(os.path.join(private, name), "w") as f:
            f.write("root's own\n")
        os.chmod(os.path.join(private, name), 0o600)
    try:
        yield ws, private
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


async def test_a_log_file_under_a_directory_the_task_swapped_for_a_symlink(
        scratch: str, layout: tuple[str, str]) -> None:
    ws, private = layout
    iso = supervisor.Isolation.from_properties([("User", "nobody")])
    os.mkdir(os.path.join(ws, "logs"))
    os.chown(os.path.join(ws, "logs"), NOBODY.pw_uid, NOBODY.pw_gid)
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup:
        # an agent's command, as nobody, in its own workspace
        await sup.run(["sh", "-c", f"rm -r logs && ln -s {private} logs"], isolation=iso,
                      cwd=ws)
        try:
            await sup.run(["echo", "written by the task"], isolation=iso,
                          log_file=os.path.join(ws, "logs", "task.log"))
        except supervisor.SpecError:
            pass  # refused: as it should be
    assert _read(os.path.join(private, "task.log")) == "root's own\n", (
        "a root-only file was overwritten with the task's output through ws/logs -> "
        f"{private}: it now reads {_read(os.path.join(private, 'task.log'))!r}")


def test_a_plot_path_swapped_for_a_fifo_does_not_hang_corral(
        scratch: str, layout: tuple[str, str]) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("--plot needs matplotlib")
    ws, _ = layout
    plot = os.path.join(ws, "usage.svg")
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", scratch, "-p", "User=nobody",
                          "--chdir", ws, "--plot", plot, "-q", "--", "sh", "-c",
                          f"rm -f {plot}; mkfifo {plot}; exit 0"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 6
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if p.poll() is None:
            p.send_signal(sig)
            time.sleep(0.5)
    hung = p.poll() is None
    if hung:
        p.kill()
    p.wait()
    assert not hung, ("corral run was still in open() of the task's FIFO 6 s after a task "
                      "that exits at once, and outlived SIGINT, SIGTERM and SIGHUP")
