"""Attacks that would hurt a shared host, run in the user-mode Linux guest (tests/vm/run-in-vm:
a kernel of its own, every controller, its own sysctls).  Marked redteam_long: they boot a
guest (a few seconds each)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from rt_util import HERE

import supervisor

REPO = os.path.dirname(os.path.dirname(HERE))
RUN_IN_VM = os.path.join(REPO, "tests", "vm", "run-in-vm")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(supervisor.__file__)))

pytestmark = pytest.mark.redteam_long


def in_guest(program: str, timeout: float = 240) -> dict[str, object]:
    if os.environ.get("CORRAL_SKIP_VM") == "1":
        pytest.skip("CORRAL_SKIP_VM=1")
    if shutil.which("linux.uml") is None and not os.path.exists("/usr/bin/linux.uml"):
        pytest.skip("user-mode-linux is not installed (tests/vm/run-in-vm installs it)")
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([RUN_IN_VM, sys.executable, os.path.join(HERE, program)], cwd=HERE,
                       capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode == 125 or not lines:
        pytest.fail(f"the guest gave no answer (status {r.returncode}): {r.stdout[-2000:]}"
                    f"{r.stderr[-2000:]}")
    return json.loads(lines[-1])


def test_a_task_using_up_inotify_watches_does_not_break_other_tasks() -> None:
    """Held since 82157a5 (was: wait_empty's inotify_add_watch failing ENOSPC, another task
    recorded lost and InternalError out of run())."""
    got = in_guest("vm_rt_inotify.py")
    assert "raised" not in got, got["raised"]
    assert got["outcome"] == "succeeded" and got["cleanup"] == "clean", got
