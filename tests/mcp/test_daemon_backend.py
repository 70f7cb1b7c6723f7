"""What only the daemon backend does: tasks outlive the MCP host, a session runs one
foreground command at a time, the limits come from the daemon's /v1/limits, and with no
option ``corral mcp`` takes the daemon when its socket answers (else in-process)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from daemon_util import RunningDaemon
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_util import HANG, open_host

import cgroupfs
from supervisor.client import Client
from supervisor.mcp import choose_socket

Start = Callable[..., RunningDaemon]


async def test_a_task_outlives_the_host_and_idle_sessions_are_closed(
        start_daemon: Start, test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    d = start_daemon()
    async with open_host(test_cgroup, tmp_path / "err", socket=d.socket) as h:
        idle = await h.call("new_session", {"cwd": str(tmp_path)})
        await h.run("true", session=idle["session"])
        long = await h.run("echo going; sleep 600", wait=0.5)
        assert long["state"] == "running"
    with Client(d.socket, timeout=30) as c:
        assert c.show(long["task_id"]).state == "running"  # the host is gone; it is not
        sessions = {s["id"]: s for s in c.sessions()}
        assert sessions[idle["session"]]["state"] == "closed"
        (still,) = [s for s in sessions.values() if s["state"] == "open"]
        assert still["running"] == [long["task_id"]]
        assert c.stop(long["task_id"])
        assert c.wait(long["task_id"]).outcome == "cancelled"
        c.close_session(still["id"])


async def test_a_command_past_its_bound_becomes_background_work_when_the_next_runs(
        start_daemon: Start, test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    # (as in-process: the daemon's sessions take the next command once an exec was answered)
    d = start_daemon()
    async with open_host(test_cgroup, tmp_path / "err", socket=d.socket) as h:
        first = await h.run("sleep 600; cd /", wait=0.2)
        assert first["state"] == "running"
        after = await h.run("echo next")
        assert after["stdout"]["head"] == "next\n"
        beside = await h.run("echo beside", background=True)
        done = await h.call("output", {"task_id": beside["task_id"], "wait": HANG})
        assert done["text"] == "beside\n" and done["eof"] is True
        stopped = await h.call("stop", {"task_id": first["task_id"], "force": True})
        assert stopped["state"] == "finished"
        assert "background work" in stopped["carried"]["nothing"]


async def test_the_descriptions_carry_the_daemons_ceiling(start_daemon: Start,
                                                          test_cgroup: cgroupfs.Cgroup,
                                                          tmp_path: Path) -> None:
    d = start_daemon("--max-time-limit", "5min")
    async with open_host(test_cgroup, tmp_path / "err", socket=d.socket) as h:
        run = h.tools["run"].description or ""
        assert "Time limit: 5min" in run and "ceiling 5min" in run, run  # ours was 10min
        assert "tasks outlive this server" in h.instructions


async def _instructions(env: dict[str, str], tmp_path: Path, *args: str) -> str:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "supervisor.mcp", *args], env=env, cwd="/")
    with open(tmp_path / "err", "a") as err:
        async with stdio_client(params, errlog=err) as (r, w), ClientSession(r, w) as s:
            return (await s.initialize()).instructions or ""


async def test_with_no_option_the_daemon_is_used_when_its_socket_answers(
        start_daemon: Start, tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_SOCKET": start_daemon().socket}
    with trio.fail_after(HANG):
        text = await _instructions(env, tmp_path)
    assert "the corral serve daemon" in text


def test_with_no_option_and_no_daemon_it_is_in_process(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_SOCKET", str(tmp_path / "nobody.sock"))
    assert choose_socket(None, False) is None
    assert choose_socket("/forced.sock", False) == "/forced.sock"
    assert choose_socket(None, True) is None
