"""``corral mcp`` as the CLI verb: its --help, and an MCP host starting it with --local."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_util import HANG, assert_nothing_left

import cgroupfs

CORRAL = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]


def test_corral_mcp_help_names_the_backends_and_the_options() -> None:
    done = subprocess.run([*CORRAL, "mcp", "--help"], capture_output=True, text=True,
                          timeout=HANG, check=False)
    assert done.returncode == 0, done.stderr
    for words in ("usage: corral mcp", "--socket PATH", "--local", "--time-limit",
                  "--max-time-limit", "--property", "mcpServers"):
        assert words in done.stdout, words
    listed = subprocess.run([*CORRAL, "--help"], capture_output=True, text=True,
                            timeout=HANG, check=False)
    assert "mcp" in listed.stdout


async def test_a_host_starts_corral_mcp_local_and_runs_a_command(
        test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    params = StdioServerParameters(command=CORRAL[0], args=[
        *CORRAL[1:], "mcp", "--local", "--cgroup-root", test_cgroup.path], cwd="/")
    with open(tmp_path / "err", "w") as err, trio.fail_after(HANG):
        async with stdio_client(params, errlog=err) as (r, w), ClientSession(r, w) as s:
            init = await s.initialize()
            assert init.server_info.name == "corral" and "in-process" in (
                init.instructions or "")
            res = await s.call_tool("run", {"command": f"cd {tmp_path} && echo $PWD"})
            assert not res.is_error and res.structured_content is not None
            assert res.structured_content["stdout"]["head"] == f"{tmp_path}\n"
    assert_nothing_left(test_cgroup)
