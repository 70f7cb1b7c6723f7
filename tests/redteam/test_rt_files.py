"""Files corral (root) writes for a task that runs as another user: a log file, the JSON
result, the plot.  Where the task may write the directory, it may plant a symlink there; corral
must never follow it into a file the task could not write itself."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from rt_util import CORRAL

import supervisor

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def workspace() -> Iterator[tuple[str, str]]:
    """(a directory the task's user owns, a root-only file outside it: the victim).  Not in
    pytest's tmp_path: its parents are 0700, which the task's user could not pass."""
    base = tempfile.mkdtemp(prefix="rt-files-")
    os.chmod(base, 0o755)
    ws = os.path.join(base, "ws")
    os.mkdir(ws)
    os.chown(ws, NOBODY.pw_uid, NOBODY.pw_gid)
    victim = os.path.join(base, "victim")
    with open(victim, "w") as f:
        f.write("root's own\n")
    os.chmod(victim, 0o600)
    try:
        yield ws, victim
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _victim(victim: str) -> str:
    with open(victim) as f:
        return f.read()


async def test_a_log_file_symlink_planted_by_a_task_is_not_followed(
        scratch: str, workspace: tuple[str, str]) -> None:
    ws, victim = workspace
    iso = supervisor.Isolation.from_properties([("User", "nobody")])
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup:
        # an agent's command, as nobody, in its workspace: a link where the next log goes
        await sup.run(["ln", "-s", victim, os.path.join(ws, "task-2.log")], isolation=iso,
                      cwd=ws)
        with pytest.raises(supervisor.SpecError, match="symbolic link"):
            await sup.run(["echo", "root::0:0:owned:/root:/bin/sh"], isolation=iso,
                          log_file=os.path.join(ws, "task-2.log"))
        # planted after the spec was checked: refused at the spawn, all the same
        spec = supervisor.TaskSpec(["echo", "root::0:0:owned:/root:/bin/sh"], isolation=iso,
                                   log_file=os.path.join(ws, "task-3.log"))
        await sup.run(["ln", "-s", victim, os.path.join(ws, "task-3.log")], isolation=iso,
                      cwd=ws)
        r = await sup.run(spec)
    assert r.outcome == "spawn_failed" and "symbolic link" in (r.error or ""), r.error
    assert _victim(victim) == "root's own\n", f"root's file now reads {_victim(victim)!r}"


def test_a_plot_path_swapped_for_a_symlink_during_the_run_is_not_followed(
        scratch: str, workspace: tuple[str, str]) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("--plot needs matplotlib")
    ws, victim = workspace
    plot = os.path.join(ws, "usage.svg")
    subprocess.run([CORRAL, "run", "--cgroup-root", scratch, "-p", "User=nobody", "--chdir",
                    ws, "--plot", plot, "-q", "--", "sh", "-c",
                    f"ln -sf {victim} {plot}; sleep 1.2"], stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=60, start_new_session=True)
    assert _victim(victim) == "root's own\n", "root's file was overwritten with the plot"


def test_a_json_file_symlink_planted_by_an_earlier_task_is_not_followed(
        scratch: str, workspace: tuple[str, str]) -> None:
    ws, victim = workspace
    result = os.path.join(ws, "result.json")
    for script in (f"ln -sf {victim} {result}", "true"):  # the same agent, two commands
        subprocess.run([CORRAL, "run", "--cgroup-root", scratch, "-p", "User=nobody",
                        "--chdir", ws, "--json-file", result, "-q", "--", "sh", "-c", script],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                       start_new_session=True)
    assert _victim(victim) == "root's own\n", "root's file was overwritten with a JSON result"
