"""The host fixture, once per backend: an MCP server (in-process, rooted in the test's own
cgroup; or on a real ``corral serve`` from the daemon tests' ``start_daemon``, itself rooted
there), the SDK's client on it over stdio."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "daemon"))

from daemon_util import RunningDaemon, start_daemon
from mcp_util import Host, assert_nothing_left, assert_nothing_running, open_host

import cgroupfs

__all__ = ["backend", "host", "start_daemon"]


@pytest.fixture(params=["in-process", "daemon"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def host(backend: str, test_cgroup: cgroupfs.Cgroup, tmp_path: Path,
               request: pytest.FixtureRequest) -> AsyncIterator[Host]:
    if backend == "daemon":
        start: Callable[..., RunningDaemon] = request.getfixturevalue("start_daemon")
        d = start()
        async with open_host(test_cgroup, tmp_path / "server.err", socket=d.socket) as h:
            yield h
        assert_nothing_running(d)
    else:
        async with open_host(test_cgroup, tmp_path / "server.err") as h:
            yield h
        assert_nothing_left(test_cgroup)
