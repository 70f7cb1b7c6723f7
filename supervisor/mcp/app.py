"""The MCP server on stdio: the SDK's low-level ``Server`` with our tools, over a backend.

:func:`serve` is the server's life: open the backend, serve MCP on stdin/stdout until the
host closes stdin, then close the backend (in-process: every task it started is stopped and
recorded; the daemon's: the sessions opened here with nothing running are closed, the
tasks still running go on).  Runs under trio (the SDK's anyio runs on it).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from . import tools
from .backend import Backend
from .daemon import open_daemon_backend
from .local import open_local_backend

__all__ = ["build_server", "serve"]


def _version() -> str:
    try:
        return importlib.metadata.version("corral")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def build_server(backend: Backend) -> Server[Any]:
    """The low-level Server: tools/list and tools/call, answered from ``backend``."""
    limits = backend.limits()
    listed = tools.tool_list(limits)

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        return await tools.call(backend, ctx, params.name, params.arguments)

    return Server("corral", version=_version(), title="corral",
                  instructions=tools.instructions(limits),
                  on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(*, socket: str | None, cgroup_root: str | None, time_limit: str | None,
                max_time_limit: str | None, properties: list[str]) -> None:
    """Serve until stdin ends, on the daemon at ``socket`` (None: in-process); then stop
    what was started in-process (the daemon's tasks go on) and return."""
    backend_cm: contextlib.AbstractAsyncContextManager[Backend]
    if socket is not None:
        backend_cm = open_daemon_backend(socket, time_limit=time_limit,
                                         max_time_limit=max_time_limit, properties=properties)
    else:
        backend_cm = open_local_backend(cgroup_root=cgroup_root, time_limit=time_limit,
                                        max_time_limit=max_time_limit, properties=properties)
    async with backend_cm as backend:
        server = build_server(backend)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
