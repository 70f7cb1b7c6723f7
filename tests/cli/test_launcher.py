"""The ``corral`` command is a launcher (native/corral_launch.c) that execs Python with the job
signals blocked: a signal that comes while Python starts waits for corral instead of being a
KeyboardInterrupt with a traceback.  ``corral run`` reads it; every other verb gets the signals
back at once; no task inherits the mask or the launcher's marker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cgroupfs

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
               signal.SIGWINCH, signal.SIGCONT)


def blocked(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line.split()[1] for line in f if line.startswith("SigBlk:")), 16)
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


def test_the_command_is_the_launcher() -> None:
    with open(CORRAL, "rb") as f:
        assert f.read(4) == b"\x7fELF", "corral is not the launcher executable"


def test_a_signal_while_python_starts_is_corrals_not_a_traceback(
        test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", test_cgroup.path, "--json-file",
                          str(record), "--", "sleep", "30"], stdin=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    # Once the launcher has blocked them (a signal sent before its first instruction finds a
    # program that does not exist yet: the default action), Python has not even started
    deadline = time.monotonic() + 60
    while signal.SIGINT not in blocked(p.pid) and time.monotonic() < deadline:
        pass
    os.kill(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert "Traceback" not in err, err
    r = json.loads(record.read_text())
    assert r["outcome"] == "cancelled" and r["started"] is False, r
    assert p.returncode == r["exit_status"], (p.returncode, r["exit_status"])


def test_tasks_inherit_neither_the_mask_nor_the_marker(test_cgroup: cgroupfs.Cgroup) -> None:
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "-q", "--", "sh", "-c",
                        "grep SigBlk /proc/self/status; echo marker=${CORRAL_LAUNCHER:-none}"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SigBlk:", "0000000000000000", "marker=none"], r.stdout


def test_other_verbs_get_the_signals_back(test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    p = subprocess.Popen([CORRAL, "serve", "--socket", str(sock), "--state-dir",
                          str(tmp_path / "state"), "--cgroup-root", test_cgroup.path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None and sock.exists(), p.stderr.read() if p.stderr else ""
        while blocked(p.pid) & set(JOB_SIGNALS) and time.monotonic() < deadline:
            time.sleep(0.01)  # the daemon's stop signals: once its receiver is open
        assert not blocked(p.pid) & set(JOB_SIGNALS)
    finally:
        p.terminate()
        p.wait(timeout=60)
    assert p.returncode == 0


def test_serve_drains_on_a_sigterm_sent_while_it_starts(test_cgroup: cgroupfs.Cgroup,
                                                        tmp_path: Path) -> None:
    """The socket is bound before the daemon's receiver is open: a SIGTERM sent the moment it
    appears (a service manager, a test) waits for it and is a drain, not a death."""
    sock = tmp_path / "s.sock"
    p = subprocess.Popen([CORRAL, "serve", "--socket", str(sock), "--state-dir",
                          str(tmp_path / "state"), "--cgroup-root", test_cgroup.path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not sock.exists() and p.poll() is None and time.monotonic() < deadline:
        pass
    p.terminate()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "draining" in err, (p.returncode, err)


def test_the_running_command_is_named_corral(test_cgroup: cgroupfs.Cgroup) -> None:
    """ps, top and pgrep see ``corral`` (the name) and the command's path (the command line),
    as they did when the command was a Python script, not a bare python3."""
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "-q", "--", "sh", "-c",
                        "cat /proc/$PPID/comm; tr '\\0' '\\n' </proc/$PPID/cmdline"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    comm, *argv = r.stdout.splitlines()
    assert comm == "corral", r.stdout
    assert CORRAL in argv and argv[argv.index(CORRAL) + 1] == "run", argv
