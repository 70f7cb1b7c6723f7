"""docs/agents.md's worked example (mini-swe-agent's environment interface over a corral
session) runs as written against a real daemon."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_util import RunningDaemon

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_mini_swe_agent_example_runs_against_a_daemon(
        start_daemon: Callable[..., RunningDaemon], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (example,) = [b for b in python_blocks(DOC.read_text()) if "class CorralEnvironment" in b]
    d = start_daemon()
    monkeypatch.setenv("CORRAL_SOCKET", d.socket)
    exec(compile(example, str(DOC), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.endswith("ok\n")
    with d.client() as c:  # the example closed its session: nothing of it runs
        assert [s["state"] for s in c.sessions()] == ["closed"]
        assert c.list(state="running") == []
