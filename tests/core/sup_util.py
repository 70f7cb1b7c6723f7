"""Helpers for the supervisor tests: condition polling and process checks."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import trio

import supervisor

# Generous bound that only a hang crosses; no test asserts speed.
HANG = 30.0


async def wait_for(condition: Callable[[], bool], timeout: float = HANG,
                   what: str = "condition") -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` (a hang)."""
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.005)
        return
    pytest.fail(f"{what} not reached within {timeout}s")


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def leaf_pids(sup: supervisor.Supervisor, task_id: str) -> list[int]:
    path = os.path.join(sup.cgroup_root, task_id, "cgroup.procs")
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


IGNORE_TERM_READY = "trap '' TERM; echo ready; sleep 60"


async def wait_ready(task: supervisor.TaskHandle) -> None:
    """Wait until a task running IGNORE_TERM_READY has installed its trap (said "ready")."""
    await wait_for(lambda: b"ready" in task.output().head,
                   what="ready")
