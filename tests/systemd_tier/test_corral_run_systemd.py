"""`corral run` on a host where systemd runs: a delegated scope per corral process.

The command runs inside the sandbox under ``systemd-run --scope`` (a plain, undelegated scope,
as a login session would be), so corral has to ask systemd for its own delegated scope.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from systemd_sandbox import SystemdSandbox

pytestmark = pytest.mark.systemd

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory both the host and the sandbox see (its /tmp is private)."""
    d = Path(tempfile.mkdtemp(prefix=".systemd-test-", dir=REPO))
    yield d
    shutil.rmtree(d)


def corral_units(sb: SystemdSandbox) -> list[str]:
    out = sb.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "corral-*"])
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def test_corral_run_gets_a_delegated_scope_and_leaves_nothing(
        systemd_sandbox: SystemdSandbox, shared_dir: Path) -> None:
    sb = systemd_sandbox
    result_file = shared_dir / "result.json"
    script = "setsid sleep 600 & cat /proc/self/cgroup"
    proc = sb.run(["systemd-run", "--scope", "--quiet", "--", CORRAL, "run", "--summary",
                   "--grace", "0.5s", "--json-file", str(result_file), "--",
                   "sh", "-c", script])
    leaf = next(line[3:] for line in proc.stdout.splitlines() if line.startswith("0::"))
    # <scope>/corral-<pid>-<hex>/<task>: corral's own root inside its delegated scope
    scope_cgroup = os.path.dirname(os.path.dirname(leaf))
    scope = os.path.basename(scope_cgroup)
    assert scope.startswith("corral-") and scope.endswith(".scope"), leaf
    result = json.loads(result_file.read_text())
    assert result["outcome"] == "succeeded" and result["cleanup"]["state"] == "clean"
    # one process left behind (caught as sh, setsid or sleep, depending on how far it got)
    assert len(result["cleanup"]["leftovers"]) == 1
    assert result["containment"]["cgroup"].endswith(leaf)
    assert "Cleanup: clean; 1 process(es) left behind" in proc.stderr
    # the escapee is gone, and so is the scope once corral has exited
    deadline = time.monotonic() + 10
    while scope in corral_units(sb):
        assert time.monotonic() < deadline, f"{scope} is still loaded: {corral_units(sb)}"
        time.sleep(0.05)
    assert not os.path.exists(sb.host_path(scope_cgroup))


def test_scope_is_delegated_while_the_task_runs(systemd_sandbox: SystemdSandbox,
                                                shared_dir: Path) -> None:
    sb = systemd_sandbox
    ready = shared_dir / "ready"
    go = shared_dir / "go"
    script = (f"cat /proc/self/cgroup > {ready}.tmp && mv {ready}.tmp {ready}; "
              f"while [ ! -e {go} ]; do sleep 0.02; done")
    proc = subprocess.Popen(sb.command(["systemd-run", "--scope", "--quiet", "--", CORRAL,
                                        "run", "--", "sh", "-c", script]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.02)
        leaf = next(line[3:] for line in ready.read_text().splitlines()
                    if line.startswith("0::"))
        scope = os.path.basename(os.path.dirname(os.path.dirname(leaf)))
        props = sb.show(scope, "Delegate", "ActiveState", "ControlGroup")
        assert props["Delegate"] == "yes" and props["ActiveState"] == "active"
        assert leaf.startswith(props["ControlGroup"] + "/corral-")
    finally:
        go.touch()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_corral_check_reports_the_systemd_it_reaches(systemd_sandbox: SystemdSandbox) -> None:
    proc = systemd_sandbox.run(["systemd-run", "--scope", "--quiet", "--", CORRAL, "check",
                                "--json"])
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["systemd"]["running"] and report["systemd"]["reachable"]
    assert report["systemd"]["version"].startswith(("25", "26", "27"))
    assert report["root_kind"].startswith("systemd scope corral-")
