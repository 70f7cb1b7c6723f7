"""supervisor.placement.systemd and systemd/corral.service against a real systemd (252 here).

The sandbox (conftest.py, systemd_sandbox.py) boots systemd as PID 1 of new namespaces; the
code under test runs inside it as ``nsenter ... <this venv's python> sandbox_client.py``, the
repository being visible there (only /tmp, /var/tmp, /run and /var/log are private). The
error-path tests need no sandbox and run on the host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from systemd_sandbox import INSIDE_DIR, SystemdSandbox

from supervisor.placement.systemd import SystemdError, create_delegated_scope, probe

pytestmark = pytest.mark.systemd

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CLIENT = HERE / "sandbox_client.py"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def client(sb: SystemdSandbox, *args: str) -> dict[str, Any]:
    proc = sb.run([sys.executable, str(CLIENT), *args])
    return json.loads(proc.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@contextmanager
def held_scope(sb: SystemdSandbox, *args: str) -> Iterator[dict[str, Any]]:
    """A client process that made its scope and waits; it exits when the block ends."""
    proc = subprocess.Popen(
        sb.command([sys.executable, str(CLIENT), "create", "--hold", *args]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=10)
            raise AssertionError(f"client exited {proc.returncode}: {proc.stderr.read()}")
        yield json.loads(line)
    finally:
        proc.stdin.close()  # the client's cue to exit
        status = proc.wait(timeout=10)
    assert status == 0, f"client exited {status}: {proc.stderr.read()}"


def systemd_major(sb: SystemdSandbox) -> int:
    first = sb.run(["systemctl", "--version"]).stdout.split()
    return int(first[1])


@pytest.mark.parametrize("bus", ["private", "system"])
def test_scope_is_delegated_and_holds_the_caller(systemd_sandbox: SystemdSandbox,
                                                 bus: str) -> None:
    sb = systemd_sandbox
    with held_scope(sb, "--bus", bus) as info:
        unit = info["unit"]
        assert re.fullmatch(r"corral-\d+-[0-9a-f]{6}\.scope", unit)
        assert info["bus"] == bus
        assert info["socket"] == {"private": "/run/systemd/private",
                                  "system": "/run/dbus/system_bus_socket"}[bus]
        assert info["proc_cgroup"] == f"0::/system.slice/{unit}"
        assert info["cgroup"] == f"/sys/fs/cgroup/system.slice/{unit}"
        assert info["writable"]
        assert info["running"]
        props = sb.show(unit, "ActiveState", "Delegate", "ControlGroup", "CollectMode",
                        "Description")
        assert props == {"ActiveState": "active", "Delegate": "yes",
                         "ControlGroup": f"/system.slice/{unit}",
                         "CollectMode": "inactive-or-failed", "Description": "corral supervisor"}
        major = systemd_major(sb)
        assert info["version"].startswith(str(major))
        # PIDFDs arrived in systemd 255; before, the PIDs fallback must have been taken.
        assert info["pids_property"] == ("PIDFDs" if major >= 255 else "PIDs")


def test_scope_and_its_subcgroups_go_when_the_process_exits(
        systemd_sandbox: SystemdSandbox) -> None:
    sb = systemd_sandbox
    with held_scope(sb, "--layout") as info:
        unit = info["unit"]
        assert info["proc_cgroup_after_move"] == f"0::/system.slice/{unit}/supervisor"
        host = sb.host_path(f"/system.slice/{unit}")
        assert os.path.isdir(os.path.join(host, "tasks", "t1"))
    wait_for(lambda: sb.show(unit, "LoadState")["LoadState"] == "not-found",
             f"{unit} to be unloaded")
    # systemd removed the scope's cgroup with the empty sub-cgroups we made below it.
    wait_for(lambda: not os.path.exists(host), f"{host} to be removed")


def test_a_process_left_in_a_subcgroup_keeps_the_scope(systemd_sandbox: SystemdSandbox) -> None:
    sb = systemd_sandbox
    with held_scope(sb, "--stray") as info:
        unit = info["unit"]
        leaf = sb.host_path(f"/system.slice/{unit}/tasks/t1")
    # The client is gone; its stray in tasks/t1 keeps the whole scope active.
    assert sb.show(unit, "ActiveState")["ActiveState"] == "active"
    assert Path(leaf, "cgroup.procs").read_text().split()
    Path(leaf, "cgroup.kill").write_text("1")
    wait_for(lambda: sb.show(unit, "LoadState")["LoadState"] == "not-found",
             f"{unit} to be unloaded after its last process was killed")
    wait_for(lambda: not os.path.exists(sb.host_path(f"/system.slice/{unit}")),
             "the scope's cgroup to be removed")


def test_refused_scope_names_unit_bus_and_dbus_error(systemd_sandbox: SystemdSandbox) -> None:
    out = client(systemd_sandbox, "twice")
    assert out["dbus_name"] == "org.freedesktop.systemd1.UnitExists"
    assert out["error_unit"] == out["unit"]
    assert out["socket"] == "/run/systemd/private"
    for part in (out["unit"], "/run/systemd/private", "UnitExists", "fix:"):
        assert part in out["message"]


def test_measure_scope_cost_against_systemd_run(systemd_sandbox: SystemdSandbox,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = client(systemd_sandbox, "measure", "20")
    with capsys.disabled():
        print(f"\n[systemd {systemd_major(systemd_sandbox)}] median of {out['n']}: "
              f"create_delegated_scope {out['create_delegated_scope_ms']:.1f} ms, "
              f"systemd-run --scope true {out['systemd_run_scope_true_ms']:.1f} ms")


def test_corral_service_unit_delegates_and_stops_through_the_daemon(
        systemd_sandbox: SystemdSandbox) -> None:
    sb = systemd_sandbox
    status_file = "/run/corral-test-status"
    text = (REPO / "systemd" / "corral.service").read_text()
    text = re.sub(r"^ExecStart=.*$", f"ExecStart={sys.executable} {HERE / 'fake_daemon.py'} "
                  f"{status_file}", text, count=1, flags=re.M)
    # StateDirectory= would make /var/lib/corral on the host's disk, which the sandbox shares.
    text = re.sub(r"^StateDirectory=.*$", "", text, flags=re.M)
    inside_root = Path(f"/proc/{sb.pid}/root")  # the sandbox's mount namespace, from here
    unit_path = f"{INSIDE_DIR}/units/corral.service"
    Path(f"{inside_root}{unit_path}").write_text(text)
    verify = sb.run(["systemd-analyze", "verify", unit_path], check=False)
    assert "Unknown" not in verify.stderr and "nrecognized" not in verify.stderr, verify.stderr
    sb.run(["systemctl", "daemon-reload"])
    try:
        sb.run(["systemctl", "start", "corral.service"], timeout=20)  # Type=notify: READY=1
        props = sb.show("corral.service", "ActiveState", "SubState", "Delegate", "KillMode",
                        "OOMPolicy", "NotifyAccess", "ControlGroup", "Type")
        assert props == {"ActiveState": "active", "SubState": "running", "Delegate": "yes",
                         "KillMode": "process", "OOMPolicy": "continue", "NotifyAccess": "main",
                         "ControlGroup": "/system.slice/corral.service", "Type": "notify"}
        root = sb.host_path(props["ControlGroup"])
        for sub in ("supervisor", "tasks/t1", "tasks/t2"):
            assert Path(root, sub, "cgroup.procs").read_text().split(), f"{sub} is empty"
        assert Path(f"{inside_root}/run/corral").is_dir()  # RuntimeDirectory=
        started = time.monotonic()
        sb.run(["systemctl", "stop", "corral.service"], timeout=60)
        took = time.monotonic() - started
    finally:
        sb.run(["systemctl", "stop", "corral.service"], check=False)
    status = json.loads(Path(f"{inside_root}{status_file}").read_text())
    # KillMode=process: the daemon alone got SIGTERM; its tasks were still there for it to stop
    # (a restarting daemon hands them over instead; one that dies has its keeper kill them).
    assert status == {"tasks_alive_at_sigterm": True,
                      "root": f"/sys/fs/cgroup{props['ControlGroup']}"}
    assert sb.show("corral.service", "ActiveState", "Result") == {
        "ActiveState": "inactive", "Result": "success"}
    assert took < 30, f"stop took {took:.1f}s"
    wait_for(lambda: not os.path.exists(root), f"{root} to be removed")


# -- errors, no sandbox needed --------------------------------------------------------------------

async def test_unreachable_socket_names_it_and_the_fix(tmp_path: Path) -> None:
    path = str(tmp_path / "no-such-dir" / "private")
    with pytest.raises(SystemdError) as caught:
        await create_delegated_scope(os.getpid(), bus=path)
    message = str(caught.value)
    assert path in message and "No such file or directory" in message and "fix:" in message
    assert "--cgroup-root" in message
    assert caught.value.socket == path
    assert await probe(path) is None


async def test_missing_system_bus_names_its_address(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "system_bus_socket")
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={path}")
    with pytest.raises(SystemdError, match=r"systemctl start dbus") as caught:
        await create_delegated_scope(os.getpid(), bus="system")
    assert path in str(caught.value)


async def test_silent_peer_times_out_naming_the_step(tmp_path: Path) -> None:
    path = str(tmp_path / "silent")
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    with listener:
        await listener.bind(path)
        listener.listen(1)  # accepted by the kernel's backlog, never answered
        with pytest.raises(SystemdError, match=r"within 0.3s while authenticating") as caught:
            await create_delegated_scope(os.getpid(), bus=path, timeout=0.3)
    assert path in str(caught.value)


async def test_bad_arguments_are_value_errors_before_any_io(tmp_path: Path) -> None:
    nowhere = str(tmp_path / "nowhere")  # connecting would fail: a ValueError proves no I/O
    with pytest.raises(ValueError, match=r"must be .* ending in '\.scope'.*got 'corral'"):
        await create_delegated_scope(os.getpid(), name="corral", bus=nowhere)
    with pytest.raises(ValueError, match=r"bus must be"):
        await create_delegated_scope(os.getpid(), bus="session-bus-please")
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(ValueError, match=rf"pid {gone.pid} names no running process"):
        await create_delegated_scope(gone.pid, bus=nowhere)
