"""``corral serve`` under a real systemd (the project's sandbox, tests/systemd_tier/): started by
socket activation through systemd/corral.socket, Type=notify with READY=1 and STATUS=, the
watchdog fed, a delegated cgroup for its tasks, ``systemctl stop`` draining with reason
``shutdown``; ``systemctl restart`` handing running tasks to the next daemon process through
the fd store (output read across it complete and in order, the tasks' real results, their
limits and stops going on); a SIGKILLed daemon's tasks killed at once and recorded lost by the
restart systemd makes.  Read the safety header of tests/systemd_tier/systemd_sandbox.py first."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_util import answering, wait_for

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


def _install_units(sb: SystemdSandbox, *extra: str, store_max: int | None = None) -> Path:
    inside_root = Path(f"/proc/{sb.pid}/root")
    service = (REPO / "systemd" / "corral.service").read_text()
    if store_max is not None:
        service = re.sub(r"^FileDescriptorStoreMax=.*$", f"FileDescriptorStoreMax={store_max}",
                         service, flags=re.M)
    service = re.sub(r"^ExecStart=.*$", f"ExecStart={CORRAL} serve --state-dir {STATE} "
                     f"--log-level debug {' '.join(extra)}", service, count=1, flags=re.M)
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


def _read_db(inside_root: Path, tmp_path: Path) -> list[dict[str, object]]:
    # (SQLite resolves the /proc/PID/root symlink to "/": read a copy)
    copy = tmp_path / "copy"
    copy.mkdir(exist_ok=True)
    for suffix in ("", "-wal"):
        if os.path.exists(f"{inside_root}{STATE}/state.db{suffix}"):
            shutil.copy(f"{inside_root}{STATE}/state.db{suffix}", copy / f"state.db{suffix}")
    db = sqlite3.connect(copy / "state.db")
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM task_rows ORDER BY seq")]
    finally:
        db.close()


def _lines(n: int, tag: str) -> str:
    """A shell loop printing ``n`` numbered lines, a few a tick, for a few seconds."""
    return (f'i=0; while [ $i -lt {n} ]; do echo "{tag} line $i of {n}"; i=$((i+1)); '
            f'[ $((i % 5)) = 0 ] && sleep 0.02; done')


class _Follower(threading.Thread):
    """Follows one stream with the client's reconnecting ``follow``, keeping every byte."""

    def __init__(self, sock: str, task_id: str, stream: str = "stdout") -> None:
        super().__init__(daemon=True)
        self.sock, self.task_id, self.stream = sock, task_id, stream
        self.data = b""
        self.offsets_ok = True
        self.end: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.sock, timeout=60) as c:
                for frame in c.follow(self.task_id, self.stream, reconnect=60):
                    if frame.kind == "data":
                        self.offsets_ok &= frame.offset == len(self.data)
                        self.data += frame.data
                    elif frame.kind == "end":
                        self.end = frame
        except BaseException as e:  # reported by the test
            self.error = e


def _check_outputs(followers: list[_Follower], results: dict[str, Any],
                   streams: list[Any]) -> None:
    """Every byte followed across the restart, in order, and the tasks' real exits."""
    for f in followers:
        f.join(60)
        assert f.error is None and f.end is not None and f.offsets_ok, f.error
    for k, t in enumerate(streams):
        assert results[t.id].exit_status == k + 3  # the real exit status, after adoption
        expected = "".join(f"t{k} line {i} of 800\n" for i in range(800)).encode()
        assert followers[k].data == expected  # complete and in order: 0 bytes lost
    out = followers[2].data.decode().splitlines()
    err = followers[3].data.decode().splitlines()
    assert out == [f"out line {i} of 300" for i in range(300)]
    assert err == [f"err line {i} of 300" for i in range(300)]


@pytest.mark.parametrize("activation", ["socket", "service"])
def test_restart_keeps_running_tasks_and_their_output(
        sandbox: SystemdSandbox, tmp_path: Path, activation: str) -> None:
    sb = sandbox
    inside_root = _install_units(sb, "--max-running", "5", "--max-running-per-uid", "5")
    sb.run(["rm", "-rf", STATE])
    try:
        sb.run(["systemctl", "start", f"corral.{activation}"], timeout=30)
        sock = f"{inside_root}/run/corral/corral.sock"
        with Client(sock, timeout=30) as c:
            streams = [c.submit(["sh", "-c", f"{_lines(800, f't{k}')}; exit {k + 3}"])
                       for k in range(2)]
            both = c.submit(["sh", "-c", f"{_lines(300, 'out')} & {_lines(300, 'err')} >&2; "
                                         f"wait"])
            limited = c.submit(["sleep", "600"], time_limit="4s", grace="1s")
            to_stop = c.submit(["sh", "-c", "trap 'echo got TERM; exit 9' TERM; "
                                            "sleep 600 & wait"])
            queued = c.submit(["sh", "-c", "echo queued ran"])  # (--max-running 5: it waits)
            followers = [_Follower(sock, t.id) for t in (*streams, both)] + \
                [_Follower(sock, both.id, "stderr")]
            for f in followers:
                f.start()
            running = (*streams, both, limited, to_stop)
            wait_for(lambda: all(c.show(t.id).state == "running" for t in running),
                     "the tasks to run")
            assert c.show(queued.id).state == "queued"
            before = sb.show("corral.service", "MainPID")["MainPID"]
        started = time.monotonic()
        sb.run(["systemctl", "restart", "corral.service"], timeout=60)
        took = time.monotonic() - started
        props = sb.show("corral.service", "MainPID", "ActiveState", "NFileDescriptorStore")
        assert props["MainPID"] != before and props["ActiveState"] == "active", props
        assert props.get("NFileDescriptorStore", "0") == "0"  # taken back out of the store
        with Client(sock, timeout=60) as c:
            assert c.show(to_stop.id).state == "running"  # adopted
            assert c.stop(to_stop.id)  # stops reach adopted tasks
            results = {t.id: c.wait(t.id) for t in (*running, queued)}
        _check_outputs(followers, results, streams)
        assert results[both.id].outcome == "succeeded"
        assert results[limited.id].outcome == "timed_out"  # its limit held across the restart
        assert results[queued.id].outcome == "succeeded"
        assert (results[to_stop.id].outcome, results[to_stop.id].exit_status) == \
            ("cancelled", 143)  # a stop request: as SIGTERM
        assert [r["state"] for r in _read_db(inside_root, tmp_path)] == ["finished"] * 6
        print(f"\nadoption ({activation}): {len(running)} tasks running (3 of them writing "
              f"4 followed streams) and 1 queued across `systemctl restart` ({took:.2f}s): "
              f"all kept; {sum(len(f.data) for f in followers)} bytes followed, 0 lost")
    finally:
        sb.run(["systemctl", "stop", "corral.service", "corral.socket"], check=False)
    _assert_nothing_left(sb)


def _assert_nothing_left(sb: SystemdSandbox) -> None:
    cgroup = sb.host_path("/system.slice/corral.service")
    assert not os.path.exists(cgroup) or not any(
        Path(dp, "cgroup.procs").read_text().split() for dp, _, fs in os.walk(cgroup)
        if "cgroup.procs" in fs), "a process outlived systemctl stop"


def test_a_sigkilled_daemon_under_systemd_is_restarted_and_records_its_tasks_lost(
        sandbox: SystemdSandbox, tmp_path: Path) -> None:
    sb = sandbox
    inside_root = _install_units(sb)
    sb.run(["rm", "-rf", STATE])
    try:
        sb.run(["systemctl", "start", "corral.service"], timeout=30)
        sock = f"{inside_root}/run/corral/corral.sock"
        with Client(sock, timeout=30) as c:
            ids = [c.submit(["sleep", "600"]).id for _ in range(3)]
            wait_for(lambda: all(c.show(i).state == "running" for i in ids), "tasks to run")
            time.sleep(0.5)  # (the "running" rows are written lazily)
        pid = sb.show("corral.service", "MainPID")["MainPID"]
        sb.run(["sh", "-c", f"kill -KILL {pid}"])  # (the shell's kill: no procps needed)
        wait_for(lambda: sb.show("corral.service", "NRestarts")["NRestarts"] == "1",
                 "systemd to restart the daemon", timeout=30)
        wait_for(lambda: answering(sock), "the restarted daemon to answer", timeout=30)
        with Client(sock, timeout=60) as c:
            for i in ids:
                t = c.show(i)
                assert t.outcome == "lost" and t.result is not None
                assert t.result["cleanup"]["state"] == "clean", t.result["cleanup"]
    finally:
        sb.run(["systemctl", "stop", "corral.service"], check=False)


def test_restart_stops_tasks_that_would_not_fit_the_fd_store(sandbox: SystemdSandbox) -> None:
    sb = sandbox
    inside_root = _install_units(sb, store_max=3)
    sb.run(["rm", "-rf", STATE])
    try:
        sb.run(["systemctl", "start", "corral.service"], timeout=30)
        sock = f"{inside_root}/run/corral/corral.sock"
        with Client(sock, timeout=30) as c:
            t = c.submit(["sleep", "600"], grace="1s")
            wait_for(lambda: c.show(t.id).state == "running", "the task to run")
        sb.run(["systemctl", "restart", "corral.service"], timeout=60)
        wait_for(lambda: answering(sock), "the restarted daemon")
        with Client(sock, timeout=30) as c:
            done = c.wait(t.id)
        assert done.outcome == "cancelled" and done.result is not None
        assert done.result["stop"]["reason"] == "shutdown"  # drained, as for a stop
    finally:
        sb.run(["systemctl", "stop", "corral.service"], check=False)
