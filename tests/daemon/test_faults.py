"""Faults of the records' storage: a full disk (a small tmpfs), a read-only state directory, a
damaged database, a locked one.  At start: a clear error (exit 125, the file, the reason and
the fix) and nothing served.  While running: a submission that cannot be recorded is refused
(503, nothing runs), an end record that cannot be written is retried until it is, and the
task is answered from memory meanwhile (``"record": "pending"``); no record is ever half
written.

Each tmpfs is mounted in a private mount namespace of the daemon's own (``unshare -m``), on a
directory of the test's: nothing of the host's is covered, and it goes with the daemon.  The
test reaches it through ``/proc/PID/root``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_util import CORRAL, RunningDaemon, read_rows, wait_for

from supervisor.client import ApiError

Start = Callable[..., RunningDaemon]


def _on_tmpfs(state: Path, size: str, *, read_only: bool = False) -> list[str]:
    """A command prefix: a private mount namespace with a tmpfs of ``size`` on ``state``."""
    state.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o {options} corral-test-state "$0" && exec "$@"', str(state)]


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem is full (unbuffered: every byte that
    fits is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                continue
    finally:
        os.close(fd)


def _fails_at_start(start_daemon: Start, *args: str, wrap: list[str] | None = None,
                    like: RunningDaemon | None = None) -> str:
    d = start_daemon(*args, wrap=wrap, like=like, expect_exit=True)
    assert d.proc.returncode == 125, d.log_text()
    assert not os.path.exists(d.socket) or like is not None
    lines = d.log_text().strip().splitlines()
    assert "Traceback" not in d.log_text(), d.log_text()
    return lines[-1]


def test_a_damaged_database_is_refused_at_start(start_daemon: Start, tmp_path: Path) -> None:
    d = start_daemon()
    d.stop()
    (d.state / "state.db").write_bytes(b"this is not an SQLite database, just bytes" * 100)
    for name in ("state.db-wal", "state.db-shm"):
        (d.state / name).unlink(missing_ok=True)
    line = _fails_at_start(start_daemon, like=d)
    assert line.startswith(f"corral: opening the task records at {d.state}/state.db: ") and \
        "file is not a database" in line and "move it aside" in line, line


def test_a_truncated_database_is_refused_at_start(start_daemon: Start) -> None:
    d = start_daemon()
    with d.client() as c:
        for i in range(30):
            c.wait(c.submit(["echo", "x" * 2000, str(i)]).id)
    d.stop()
    db = d.state / "state.db"
    os.truncate(db, os.path.getsize(db) // 2)
    line = _fails_at_start(start_daemon, like=d)
    assert "malformed" in line and "move it aside" in line, line


def test_a_read_only_state_directory_is_refused_at_start(start_daemon: Start,
                                                          tmp_path: Path) -> None:
    state = tmp_path / "ro-state"
    line = _fails_at_start(start_daemon, "--state-dir", str(state),
                           wrap=_on_tmpfs(state, "1m", read_only=True))
    assert "Read-only file system" in line and f"{state} is read-only" in line, line


def test_a_full_disk_is_refused_at_start(start_daemon: Start, tmp_path: Path) -> None:
    state = tmp_path / "full-state"
    wrap = _on_tmpfs(state, "256k")
    # fill the tmpfs first, from inside the same namespace, then start the daemon there
    wrap[-2] = wrap[-2].replace('&& exec "$@"', '&& (cat /dev/zero > "$0/filler" 2>/dev/null; '
                                'true) && exec "$@"')
    line = _fails_at_start(start_daemon, "--state-dir", str(state), wrap=wrap)
    assert "full" in line and "free space" in line, line


def test_a_locked_database_is_refused_at_start(start_daemon: Start) -> None:
    d = start_daemon()
    d.stop()
    holder = sqlite3.connect(d.state / "state.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        line = _fails_at_start(start_daemon, like=d)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "database is locked" in line and "another process holds a lock" in line, line


def test_a_full_disk_mid_run_refuses_new_tasks_and_retries_end_records(
        start_daemon: Start, tmp_path: Path) -> None:
    state = tmp_path / "small-state"
    d = start_daemon("--state-dir", str(state), wrap=_on_tmpfs(state, "2m"))
    inside = Path(f"/proc/{d.proc.pid}/root{state}")
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    with d.client() as c:
        assert c.wait(c.submit(["true"]).id).outcome == "succeeded"
        running = c.submit(["sh", "-c", f"read x < {gate}; echo done"])
        wait_for(lambda: c.show(running.id).state == "running", "the task to run")
        _fill(inside / "filler")
        with pytest.raises(ApiError) as caught:
            c.submit(["echo", "never"])
        e = caught.value
        assert e.status == 503 and e.code == "records_unavailable", e
        assert "nothing was accepted" in e.message and "full" in e.message, e.message
        threading.Thread(target=lambda: gate.write_text("go\n"), daemon=True).start()
        done = c.wait(running.id)  # the result, from memory: its record cannot be written
        assert done.outcome == "succeeded"
        shown = c.show(running.id)._asdict()
        pending = c._call("GET", f"/v1/tasks/{running.id}")[1]
        assert pending.get("record") == "pending", pending
        assert shown["state"] == "finished"
        (inside / "filler").unlink()
        wait_for(lambda: "record" not in c._call("GET", f"/v1/tasks/{running.id}")[1],
                 "the end record to be written once there is space", timeout=60)
        assert [t.argv for t in c.list()] and all(t.argv != ["echo", "never"]
                                                  for t in c.list())
    copy = tmp_path / "copy"  # (SQLite resolves /proc/PID/root to "/": read a copy)
    copy.mkdir()
    for name in ("state.db", "state.db-wal"):
        if (inside / name).exists():
            shutil.copy(inside / name, copy / name)
    rows = read_rows(copy)
    assert [r["state"] for r in rows] == ["finished", "finished"]
    assert rows[1]["outcome"] == "succeeded" and rows[1]["result"]
    assert "could not be written" in d.log_text()


def test_corral_serve_names_a_state_directory_it_cannot_make(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = subprocess.run([*CORRAL, "serve", "--socket", str(tmp_path / "s"), "--state-dir",
                        str(blocker / "state")], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 125 and str(blocker) in r.stderr and "Not a directory" in r.stderr
