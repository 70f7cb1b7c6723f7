"""Driving ``python -m supervisor.mcp`` with the SDK's own client over stdio, as a host does:
``--local`` rooted in the test's own cgroup, or ``--socket`` on a test's daemon."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import trio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import cgroupfs
from supervisor.client import Client

if TYPE_CHECKING:
    from daemon_util import RunningDaemon

HANG = 30.0  # seconds after which a wait is a failure, not slowness


class Host:
    """One server and the client session to it; every answer checked against the schemas
    the server declared."""

    def __init__(self, session: ClientSession, instructions: str | None,
                 tools: dict[str, Any], socket: str | None) -> None:
        self.session = session
        self.socket = socket  # the daemon's, or None: in-process
        self.backend = "in-process" if socket is None else "daemon"
        self.instructions = instructions or ""
        self.tools = tools  # name -> Tool

    async def call(self, name: str, arguments: dict[str, Any] | None = None, *,
                   error: bool = False, **kwargs: Any) -> dict[str, Any]:
        """The structured content of a call that is (not) an error; for an error, its text
        as {"text": ...}."""
        res = await self.session.call_tool(name, arguments or {}, **kwargs)
        assert res.is_error == error, res.content
        if error:
            return {"text": res.content[0].text}  # type: ignore[union-attr]
        content = res.structured_content
        jsonschema.validate(content, self.tools[name].output_schema)
        # the text copy is the same content
        assert json.loads(res.content[0].text) == content  # type: ignore[union-attr]
        return content  # type: ignore[no-any-return]

    async def run(self, command: str, **arguments: Any) -> dict[str, Any]:
        return await self.call("run", {"command": command, **arguments})

    async def wait_finished(self, task_id: str, timeout: float = HANG) -> dict[str, Any]:
        """Poll list until the task has finished; its row."""
        with trio.fail_after(timeout):
            while True:
                rows = (await self.call("list"))["tasks"]
                row = next(r for r in rows if r["task_id"] == task_id)
                if row["state"] == "finished":
                    return row  # type: ignore[no-any-return]
                await trio.sleep(0.05)


@asynccontextmanager
async def open_host(cgroup: cgroupfs.Cgroup, errlog: Path, *options: str,
                    socket: str | None = None) -> AsyncIterator[Host]:
    """A server on the daemon at ``socket``, else in-process rooted in ``cgroup``."""
    where = ["--socket", socket] if socket is not None else ["--local", "--cgroup-root",
                                                               cgroup.path]
    # (cwd /: the installed corral, never a checkout's source tree, which has no native part
    # in CI's clean clone)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "supervisor.mcp", *where, *options], cwd="/")
    with open(errlog, "a") as err:
        async with stdio_client(params, errlog=err) as (r, w), ClientSession(r, w) as session:
            init = await session.initialize()
            listed = await session.list_tools()
            yield Host(session, init.instructions, {t.name: t for t in listed.tools}, socket)


def assert_nothing_left(cgroup: cgroupfs.Cgroup) -> None:
    """The server removed its root: no process, no cgroup of it is left."""
    assert not cgroup.is_populated()
    assert cgroup.children() == []


def assert_nothing_running(d: RunningDaemon) -> None:
    """No task of the daemon's is still running (the test stopped what it left)."""
    with Client(d.socket, timeout=30) as c:
        assert [t.id for t in c.list(state="running")] == []
