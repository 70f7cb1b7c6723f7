"""``corral serve`` under a real systemd (the project's sandbox, tests/systemd_tier/): started by
socket activation through systemd/corral.socket, Type=notify with READY=1 and STATUS=, the
watchdog fed, a delegated cgroup for its tasks, and ``systemctl stop`` draining with
reason ``shutdown``.  Read the safety header of tests/systemd_tier/systemd_sandbox.py first."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_util import wait_for

from supervisor.client import Client

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "systemd_tier"))
from systemd_sandbox import INSIDE_DIR, SandboxUnavailable, SystemdSandbox  # noqa: E402

pytestmark = pytest.mark.systemd
CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
STATE = "/run/corral-test-state"  # on the sandbox's private /run, never the host's /var/lib


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SystemdSandbox]:
    if os.environ.get("CORRAL_SKIP_SYSTEMD") == "1":
        pytest.skip("CORRAL_SKIP_SYSTEMD=1")
    if not os.access(CORRAL, os.X_OK) or CORRAL.startswith(("/tmp/", "/run/", "/var/tmp/")):
        pytest.skip(f"needs the corral command where the sandbox sees it, not {CORRAL}")
    try:
        sb = SystemdSandbox.boot()
    except SandboxUnavailable as e:
        pytest.skip(f"cannot boot systemd in namespaces here: {e}")
    try:
        yield sb
    finally:
        sb.stop()
    assert not os.path.exists(sb.cgroup)


def _install_units(sb: SystemdSandbox) -> Path:
    inside_root = Path(f"/proc/{sb.pid}/root")
    service = (REPO / "systemd" / "corral.service").read_text()
    service = re.sub(r"^ExecStart=.*$", f"ExecStart={CORRAL} serve --state-dir {STATE} "
                     f"--log-level debug", service, count=1, flags=re.M)
    # StateDirectory= would make /var/lib/corral on the host's disk, which the sandbox shares
    service = re.sub(r"^StateDirectory=.*$", "", service, flags=re.M)
    service = service.replace("[Service]\n", "[Service]\nWatchdogSec=2s\n", 1)
    units = f"{INSIDE_DIR}/units"
    Path(f"{inside_root}{units}/corral.service").write_text(service)
    Path(f"{inside_root}{units}/corral.socket").write_text(
        (REPO / "systemd" / "corral.socket").read_text())
    for unit in ("corral.service", "corral.socket"):
        verify = sb.run(["systemd-analyze", "verify", f"{units}/{unit}"], check=False)
        assert "Unknown" not in verify.stderr and "nrecognized" not in verify.stderr, \
            verify.stderr
    sb.run(["systemctl", "daemon-reload"])
    return inside_root


def test_socket_activation_notify_watchdog_delegation_and_drain(
        sandbox: SystemdSandbox, tmp_path: Path) -> None:
    sb = sandbox
    inside_root = _install_units(sb)
    try:
        sb.run(["systemctl", "start", "corral.socket"])
        assert sb.show("corral.service", "ActiveState")["ActiveState"] == "inactive"
        sock = f"{inside_root}/run/corral/corral.sock"
        with Client(sock, timeout=30) as c:  # the first connection starts the daemon
            done = c.wait(c.submit(["cat", "/proc/self/cgroup"]).id)
            assert done.outcome == "succeeded"
            cgroup = b"".join(f.data for f in c.output(done.id)).decode()
            props = sb.show("corral.service", "ActiveState", "SubState", "Type",
                            "StatusText", "ControlGroup", "Delegate", "NRestarts")
            assert props["ActiveState"] == "active" and props["SubState"] == "running"
            assert props["Type"] == "notify" and props["Delegate"] == "yes"
            assert props["StatusText"].startswith("serving"), props
            leaf = next(line[3:] for line in cgroup.splitlines() if line.startswith("0::"))
            assert leaf.startswith(f"{props['ControlGroup']}/"), leaf  # its delegated tree
            # WatchdogSec=2s: still running well past it, so WATCHDOG=1 arrives
            time.sleep(5)
            assert sb.show("corral.service", "ActiveState", "NRestarts") == {
                "ActiveState": "active", "NRestarts": "0"}
            running = c.submit(["sleep", "600"], grace="1s")
            wait_for(lambda: c.show(running.id).state == "running", "the task to run")
        sb.run(["systemctl", "stop", "corral.service"], timeout=60)
        assert sb.show("corral.service", "ActiveState", "Result") == {
            "ActiveState": "inactive", "Result": "success"}
        # (SQLite resolves the /proc/PID/root symlink to "/": read a copy)
        copy = tmp_path / "state.db"
        for suffix in ("", "-wal"):
            if os.path.exists(f"{inside_root}{STATE}/state.db{suffix}"):
                shutil.copy(f"{inside_root}{STATE}/state.db{suffix}", f"{copy}{suffix}")
        db = sqlite3.connect(copy)
        try:
            rows = db.execute("SELECT seq, state, result FROM tasks ORDER BY seq").fetchall()
        finally:
            db.close()
        assert [r[1] for r in rows] == ["finished", "finished"]
        last = json.loads(rows[1][2])
        assert last["outcome"] == "cancelled" and last["stop"]["reason"] == "shutdown"
        # the socket is still systemd's: the next connection starts the daemon again
        with Client(sock, timeout=30) as c:
            assert [t.id for t in c.list()][:2] == [str(rows[1][0]), str(rows[0][0])]
    finally:
        sb.run(["systemctl", "stop", "corral.service", "corral.socket"], check=False)
