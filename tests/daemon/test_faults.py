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

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_util import (
    CORRAL,
    RunningDaemon,
    SmallDisk,
    fill,
    fill_past_the_reserve,
    log_grows_at_the_next_write,
    on_tmpfs,
    read_rows,
    rows_on,
    wait_for,
)

from supervisor.client import ApiError, Call
from supervisor.serve.records import RecordsError

Start = Callable[..., RunningDaemon]


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
                           wrap=on_tmpfs(state, "1m", read_only=True))
    assert "Read-only file system" in line and f"{state} is read-only" in line, line


def test_a_full_disk_is_refused_at_start(start_daemon: Start, tmp_path: Path) -> None:
    state = tmp_path / "full-state"
    wrap = on_tmpfs(state, "256k")
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
    d = start_daemon("--state-dir", str(state), wrap=on_tmpfs(state, "2m"))
    inside = Path(f"/proc/{d.proc.pid}/root{state}")
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    with d.client() as c:
        assert c.wait(c.submit(["true"]).id).outcome == "succeeded"
        running = c.submit(["sh", "-c", f"read x < {gate}; echo done"])
        wait_for(lambda: c.show(running.id).state == "running", "the task to run")
        fill_past_the_reserve(inside)  # (no room held for the records either: see below)
        with pytest.raises(ApiError) as caught:
            c.submit(["echo", "never"])
        e = caught.value
        assert e.status == 503 and e.code == "records_unavailable", e
        assert "nothing was accepted" in e.message and "full" in e.message, e.message
        threading.Thread(target=lambda: gate.write_text("go\n"), daemon=True).start()
        done = c.wait(running.id)  # the result, from memory: its record cannot be written
        assert done.outcome == "succeeded"
        shown = c.show(running.id)._asdict()
        pending = c._do(Call("GET", f"/v1/tasks/{running.id}"))
        assert pending.get("record") == "pending", pending
        assert shown["state"] == "finished"
        (inside / "filler").unlink()
        wait_for(lambda: "record" not in c._do(Call("GET", f"/v1/tasks/{running.id}")),
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


def test_the_records_reserve_lets_an_end_record_be_written_on_a_full_disk(
        start_daemon: Start, tmp_path: Path) -> None:
    """Room is held for the records (a file of zeros, ``reserve``): once the disk is full, a
    new task is refused (nothing accepted), but an end record (what already happened) takes
    the reserve and is written at once; the reserve comes back once there is room."""
    state = tmp_path / "small-state"
    d = start_daemon("--state-dir", str(state), wrap=on_tmpfs(state, "4m"))
    inside = Path(f"/proc/{d.proc.pid}/root{state}")
    assert (inside / "reserve").stat().st_size > 0
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    with d.client() as c:
        running = c.submit(["sh", "-c", f"read x < {gate}; echo done"])
        wait_for(lambda: c.show(running.id).state == "running", "the task to run")
        fill(inside / "filler")
        with pytest.raises(ApiError) as caught:
            c.submit(["echo", "never"])
        assert caught.value.status == 503 and "full" in caught.value.message
        threading.Thread(target=lambda: gate.write_text("go\n"), daemon=True).start()
        assert c.wait(running.id).outcome == "succeeded"
        assert "record" not in c._do(Call("GET", f"/v1/tasks/{running.id}"))  # written
        assert not (inside / "reserve").exists()
        (inside / "filler").unlink()
        assert c.wait(c.submit(["true"]).id).outcome == "succeeded"
        assert (inside / "reserve").exists()  # made again, now that there is room
    assert "the records' reserve" in d.log_text()


def test_a_start_on_a_full_disk_takes_the_reserve_or_says_the_disk_is_full(
        start_daemon: Start, small_disk: Callable[..., SmallDisk], tmp_path: Path) -> None:
    """A daemon stopped cleanly leaves no -shm file; started again on a disk that filled
    meanwhile, SQLite cannot make it and says only "disk I/O error".  With the records'
    reserve it starts (the reserve makes the room); without it (nor the start's), the
    message says the filesystem is full and how to fix it."""
    state = tmp_path / "small-state"
    disk = small_disk(state, "3m")
    d = start_daemon(state_dir=str(state), wrap=disk.wrap)
    with d.client() as c:
        done = c.wait(c.submit(["echo", "before"]).id)
    assert d.stop() == 0
    fill(disk.inside / "filler")
    again = start_daemon(like=d, wrap=disk.wrap)  # (the reserve is released for it)
    with again.client() as c:
        assert c.show(done.id).outcome == "succeeded"
    assert again.stop() == 0
    assert "the records' reserve" in again.log_text()
    for reserve in ("reserve", "reserve.start"):
        (disk.inside / reserve).unlink(missing_ok=True)
    fill(disk.inside / "filler2")
    line = _fails_at_start(start_daemon, like=d, wrap=disk.wrap)
    assert "filesystem is full" in line or "disk is full" in line, line
    assert "free space on the filesystem" in line, line


_WRITES_ON_A_FULL_DISK = r"""
import json, os, sys, time
import trio
from supervisor.serve.records import Records, RecordsError

state = sys.argv[1]
row = {"uid": 0, "gid": 0, "peer_pid": 1, "spec": {"argv": ["true"]}, "state": "queued",
       "created_at": time.time()}
session_row = {SESSION}

def fill(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    for size in (1 << 20, 4096, 1):
        try:
            while True:
                os.write(fd, b"\0" * size)
        except OSError:
            pass
    os.close(fd)

async def main():
    r = await Records.open(state)
    done = []
    run = await r.begin_run(os.getpid(), time.time())
    task = await r.accept(dict(row))
    session = await r.open_session(session_row)
    fill(os.path.join(state, "filler"))
    for new in (lambda: r.accept(dict(row)), lambda: r.open_session(dict(session_row))):
        try:
            await new()
        except RecordsError as e:
            done.append(["refused", str(e)])
    await r.set_run_root(run, "/sys/fs/cgroup/x", 1 << 30)
    await r.starting(task, run)
    r.started(task, time.time(), 4242, "/sys/fs/cgroup/x/1")
    await r.flush_lazy()
    await r.ended(task, {"outcome": "succeeded", "exit_status": 0, "ended_at": time.time(),
                         "bytes": 0, "result": "{}"})
    await r.notified(task)
    await r.close_session(session, time.time(), 100)
    await r.end_run(run, time.time(), "stopped")
    done.append(["reserve", os.path.exists(os.path.join(state, "reserve"))])
    done.append(["row", (await r.get(task))["state"]])
    await r.close()
    print(json.dumps(done))

trio.run(main)
"""


SESSION_ROW = {"uid": 0, "gid": 0, "groups": [], "created_at": 1.0, "closed_at": None,
               "shell": "/bin/sh", "cwd": "/", "env": None, "defaults": {}}


def test_on_a_full_disk_everything_that_happened_is_written_and_nothing_new(
        tmp_path: Path) -> None:
    """Found by CI: a daemon started on a disk filled meanwhile wrote its run's start from
    the reserve, then failed to write the next line of that run (its cgroup root) and exited,
    whenever the start fell where the log file had to grow.  Only the ends of tasks could use
    the reserve; now every write that records what already happened can (a run's start, root
    and end, a task's start, its end, its notification, a session's close), and only a new
    task or session is refused."""
    state = tmp_path / "small-state"
    script = _WRITES_ON_A_FULL_DISK.replace("{SESSION}", repr(SESSION_ROW))
    r = subprocess.run([*on_tmpfs(state, "3m"), sys.executable, "-c", script,
                        str(state)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    *refused, reserve, row = json.loads(r.stdout.splitlines()[-1])
    assert len(refused) == 2, refused  # (the task and the session)
    for what, message in refused:
        assert what == "refused" and "full" in message and "free space there" in message
    assert reserve == ["reserve", False]  # (given up for the writes)
    assert row == ["row", "finished"]


class _FailingRecords:
    """Records whose every write fails, as on a full disk with the reserve spent."""

    def __init__(self) -> None:
        from supervisor.serve.pendingends import PendingEnds

        self.writes = 0
        self.pending = PendingEnds("/nonexistent", 0)  # (never opened: nothing fits)

    async def starting(self, task_id: str, run: int) -> None:
        self.writes += 1
        raise RecordsError("database or disk is full")

    async def ended(self, *args: object) -> None:
        self.writes += 1
        raise RecordsError("database or disk is full")


def _failing_daemon(**state: object) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(**{"records": _FailingRecords(), "run": 1, "retrying": set(),
                              "unrecorded": set(), "gave_up": False, "draining": False,
                              **state})


def _finished_task() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(id="7", uid=1, recorded=False, started_at=None, output="/nonexistent",
                           result_json={"id": "7", "outcome": "cancelled", "argv": ["true"]},
                           request=SimpleNamespace(argv=["true"]))


async def test_a_start_that_cannot_be_marked_during_a_drain_is_not_queued_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """Found by CI: on a full disk, a task's "starting" row failed and the task went back to
    its queue; once the drain had emptied the queues, a task put back after it was never
    ended, and the drain waited for it for ever (the daemon never exited).  While draining, a
    start that cannot be marked goes on to end unstarted, which the drain waits for."""
    from supervisor.serve import dispatch

    requeued: list[object] = []
    d = _failing_daemon(draining=True, scheduler=type("S", (), {"requeue": requeued.append})())
    assert await dispatch._mark_starting(d, _finished_task()) is True
    assert requeued == [] and d.records.writes == 1
    assert "the daemon drains: it ends unstarted" in caplog.text


async def test_an_end_record_failing_once_the_daemon_gave_up_is_kept_or_logged_not_retried(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """An end record that first fails after the drain's last chance for the rest (and so
    after their retries were cancelled) used to be retried for ever, doubling to 30 s: the
    daemon never exited.  Once the daemon has given up, the end is kept at once for the next
    start (``pending-ends``, read back whole by the next open); if it does not fit there, the
    result is logged whole."""
    import trio

    from supervisor.serve import dispatch
    from supervisor.serve.pendingends import PendingEnds

    values = {"outcome": "cancelled", "exit_status": None, "result": "{}", "bytes": 9,
              "not_a_column": 1}
    for size in (64 << 10, 100):
        d = _failing_daemon(gave_up=True)
        d.records.pending = PendingEnds(str(tmp_path), size)
        d.records.pending.open()
        with trio.fail_after(5):
            await dispatch._retry_end(d, _finished_task(), values, ("s1", {"cwd": "/"}))
        d.records.pending.close()
        assert d.records.writes == 0 and d.retrying == set()
    said = caplog.text
    assert said.count("task 7: its end record could not be written before the daemon exited: "
                      "kept in ") == 1, said
    assert "task 7: its end record could not be written before the daemon exited (the next " \
           "start queues it again if its start was never marked, else records it lost); its " \
           "result: {" in said
    again = PendingEnds(str(tmp_path), 64 << 10)
    again.open()
    del values["not_a_column"]
    assert again.found == {"7": (values, ("s1", {"cwd": "/"}))}
    again.clear()
    again.close()
    assert (tmp_path / "pending-ends").read_bytes() == bytes(64 << 10)


def test_a_queue_a_shutdown_cannot_end_on_a_full_disk_is_never_said_to_end_and_runs_next(
        start_daemon: Start, small_disk: Callable[..., SmallDisk], tmp_path: Path) -> None:
    """Found by an independent attack: on a full state disk, the drain ended the queue
    unstarted in memory (waiters and event streams told "cancelled"), its ends could not be
    written, and the next start queued those tasks again and ran them: a command said to be
    cancelled ran.  A queued task whose end cannot be written at the drain is said nothing
    of; the next start runs it, and it has one final record, its own."""
    import socket
    import time

    state = tmp_path / "small-state"
    disk = small_disk(state, "3m")
    d = start_daemon("--max-running", "1", state_dir=str(state), wrap=disk.wrap)
    with d.client() as c:
        gate = c.submit(["sleep", "600"])
        wait_for(lambda: c.show(gate.id).state == "running", "the gate to run")
        queued = [c.submit(["echo", f"queued-{i}"]).id for i in range(5)]
        wait_for(lambda: any(r["seq"] == int(gate.id) and r["state"] == "running"
                             for r in rows_on(disk, tmp_path)),
                 "the gate's running row (written lazily)")
        while not log_grows_at_the_next_write(disk.inside):  # (else the ends fit its blocks)
            queued.append(c.submit(["true"]).id)
    waiter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiter.connect(d.socket)
    waiter.sendall(f"GET /v1/tasks/{queued[0]}/wait HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    fill_past_the_reserve(disk.inside)
    began = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - began < 20
    waiter.settimeout(10)
    told = b"".join(iter(lambda: waiter.recv(65536), b""))
    waiter.close()
    assert b"cancelled" not in told and b"outcome" not in told, told
    assert d.log_text().count("it stays queued, and the next start runs it") == len(queued), \
        d.log_text()[-3000:]
    (disk.inside / "filler").unlink()
    again = start_daemon(like=d, wrap=disk.wrap)
    with again.client() as c:
        for task_id in queued:
            done = c.wait(task_id)
            assert done.outcome == "succeeded", done
    assert again.stop() == 0
    rows = {str(r["seq"]): r for r in rows_on(disk, tmp_path)}
    assert all(rows[i]["state"] == "finished" and rows[i]["outcome"] == "succeeded"
               for i in queued), again.log_text()


def test_a_stop_on_a_filling_disk_writes_the_running_tasks_ends_before_the_queues(
        start_daemon: Start, small_disk: Callable[..., SmallDisk], tmp_path: Path) -> None:
    """Found by an independent attack: on a disk another program filled, a stop wrote the
    queue's ends first (226 tasks of one tenant), they spent the records' reserve, and the
    other tenant's running tasks were recorded lost by the next start.  The running tasks'
    ends go first now; the queue's that do not fit leave their tasks queued for the next
    start (said nothing of)."""
    state = tmp_path / "small-state"
    disk = small_disk(state, "3m")
    d = start_daemon("--max-running", "2", state_dir=str(state), wrap=disk.wrap)
    with d.client() as c:
        running = [c.submit(["sleep", "600"]).id]  # (a uid runs one at a time here)
        wait_for(lambda: c.show(running[0]).state == "running", "the sleep to run")
        queued = []
        for i in range(400):
            try:
                # (short commands, many of them: an end no longer repeats a long argv, so a
                # few long ones all fit the reserve, and nothing was left queued to check)
                queued.append(c.submit(["echo", f"q{i}", "x" * 100], name="n" * 200).id)
            except ApiError as e:
                assert e.code == "queue_full", e
                break
    assert len(queued) > 20, len(queued)
    fill(disk.inside / "filler")  # (the reserve stays: the stop's first failure releases it)
    assert d.stop() == 0
    said = d.log_text()
    (disk.inside / "filler").unlink()
    rows = {str(r["seq"]): r for r in rows_on(disk, tmp_path)}
    assert [rows[i]["outcome"] for i in running] == ["cancelled"], said[-3000:]
    left = [i for i in queued if rows[i]["state"] == "queued"]
    assert left and said.count("it stays queued, and the next start runs it") == len(left)


def test_ends_a_stop_cannot_write_on_a_disk_full_to_the_byte_are_kept_for_the_next_start(
        start_daemon: Start, small_disk: Callable[..., SmallDisk], tmp_path: Path) -> None:
    """Found by an independent attack: on a state disk full to the byte with the records'
    reserve already spent, a stop could not write the running tasks' ends, and the next start
    recorded them lost (their results known, logged only); a queued task its user had
    stopped (answered "cancelled" from memory) was queued again and ran.  Both ends are kept
    in room of the daemon's own (``pending-ends``).  A start on the still full disk used to
    be refused, and a tenant that could write the filesystem kept the daemon down for
    everyone (a later attack): it now opens the records and writes the ends from a reserve
    kept for starts (``reserve.start``), answers, and refuses new work saying the disk is
    full; once there is room, the reserves are made again and new work is accepted.  With
    that reserve gone too, a start is refused, saying so, and keeps the ends."""
    state = tmp_path / "small-state"
    disk = small_disk(state, "3m")
    d = start_daemon("--max-running", "2", state_dir=str(state), wrap=disk.wrap)
    with d.client() as c:
        running = c.submit(["sleep", "600"]).id
        wait_for(lambda: c.show(running).state == "running", "the sleep to run")
        queued = c.submit(["sh", "-c", f"echo ran > {disk.inside}/ran"]).id  # (one a uid)
        assert c.show(queued).state == "queued"
        fill_past_the_reserve(disk.inside)
        assert c.stop(queued)
        assert c.show(queued).outcome == "cancelled"
    assert d.stop() == 0
    said = d.log_text()
    for task_id in (running, queued):
        assert f"task {task_id}: its end record could not be written before the daemon " \
               f"exited: kept in " in said, said[-3000:]
    assert (disk.inside / "reserve.start").exists()
    start_reserve = (disk.inside / "reserve.start").read_bytes()
    (disk.inside / "reserve.start").unlink()  # (gone too: the start is refused, keeps them)
    fill(disk.inside / "filler2")
    line = _fails_at_start(start_daemon, like=d, wrap=disk.wrap)
    assert "full" in line, line
    (disk.inside / "filler2").unlink()
    (disk.inside / "reserve.start").write_bytes(start_reserve)  # (as the daemon had it)
    fill(disk.inside / "filler2")
    again = start_daemon(like=d, wrap=disk.wrap)
    with again.client() as c:
        assert c.show(running).outcome == "cancelled"
        assert c.show(queued).outcome == "cancelled"
        with pytest.raises(ApiError) as refused:
            c.submit(["true"])
        assert refused.value.status == 503 and "full" in refused.value.message
        rows = {str(r["seq"]): r for r in rows_on(disk, tmp_path)}
        assert [rows[i]["outcome"] for i in (running, queued)] == ["cancelled", "cancelled"]
        # (room again: on this tiny disk the new task's room is made by expiring those)
        for filler in ("filler", "filler2"):
            (disk.inside / filler).unlink()
        assert c.wait(c.submit(["true"]).id).outcome == "succeeded"
    assert again.stop() == 0
    said = again.log_text()
    assert "2 end(s) kept at the last stop" in said and "start's reserve" in said, said[-3000:]
    assert (disk.inside / "reserve").exists() and (disk.inside / "reserve.start").exists()
    assert not (disk.inside / "ran").exists()
    assert (disk.inside / "pending-ends").read_bytes().strip(b"\0") == b""


def test_kept_ends_a_crash_cut_short_or_that_are_not_ends_are_skipped(tmp_path: Path) -> None:
    """What the next start reads of ``pending-ends``: whole lines that are ends, the end's
    own columns of each; a line a crash cut short, or anything else, is skipped, never an
    error (the start goes on, and those tasks are recorded lost as before)."""
    from supervisor.serve.pendingends import PendingEnds

    good = b'{"id":"3","values":{"outcome":"succeeded","state":"queued"},"session":null}\n'
    lines = [b'{"id":"1","values":{"outcome":', b"[]", b'{"id":2,"values":{},"session":null}',
             b'{"id":"4","values":[],"session":null}', b'{"id":"5","values":{},"session":[1]}',
             b"\xff\xfe", b'{"id":"6","values":{}}']
    (tmp_path / "pending-ends").write_bytes(b"\n".join(lines) + b"\n" + good + bytes(100))
    kept = PendingEnds(str(tmp_path), 4096)
    kept.open()
    assert kept.found == {"3": ({"outcome": "succeeded"}, None)}
    kept.add(0, "8", {"outcome": "failed"}, None, str)  # (after what is there, not over it)
    kept.close()
    again = PendingEnds(str(tmp_path), 4096)
    again.open()
    assert set(again.found) == {"3", "8"}
    again.close()


async def test_a_users_stop_of_a_queued_task_written_once_the_drain_began_is_not_requeued(
        caplog: pytest.LogCaptureFixture) -> None:
    """Found while writing the test above: a user's stop of a queued task is answered
    "cancelled" at once; if its end then failed to be written after the daemon's stop began,
    it was taken for one the drain ended (said nothing of, left queued), and the next start
    ran a command its user had been told was cancelled.  Only the drain's own ends (reason
    ``shutdown``) stay queued; the user's is retried, then kept for the next start."""
    from types import SimpleNamespace

    import trio

    from supervisor.serve import dispatch

    told: list[str] = []
    async with trio.open_nursery() as nursery:
        d = _failing_daemon(
            draining=True, nursery=nursery, ending=0,
            hooks=SimpleNamespace(enabled=False, finished=told.append),
            room=SimpleNamespace(settle=lambda *a: None, wanted=None),
            task_finished=lambda t: told.append(f"finished {t.id}"),
            task_left=lambda: told.append("left"))
        for reason in ("cancel", "shutdown"):
            t = SimpleNamespace(
                id=reason, uid=1, holds=0, state="queued", outcome="cancelled",
                exit_status=None, started_at=None, ended_at=1.0, pid=None, output="/nonexistent",
                size=10, limits_bytes=0, listed="", carried=None, recorded=False, handle=None,
                spec=None, kept={},
                done=trio.Event(), request=SimpleNamespace(idempotency_key=None, name=None,
                                                           argv=["true"]),
                result_json={"outcome": "cancelled", "stop": {"reason": reason}})
            await dispatch.write_end(d, t)
        d.gave_up = True
        for scope in d.retrying:
            scope.cancel()
    d.records.pending.flush()  # (as the records' close does)
    assert told == ["finished cancel", "left"], told
    assert "task shutdown: its end (never started, the daemon stopping) cannot be written" \
        in caplog.text
    assert "task cancel: its end record could not be written before the daemon exited" \
        in caplog.text


def test_kept_ends_are_shared_fairly_between_uids_and_without_their_command_lines(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by an independent attack: ``pending-ends`` was filled first come, first served,
    and an end kept its command line, as long as a tenant made it (a 326 KB end took a whole
    20 MiB disk's file).  The command lines are left out (the row's request has them), and
    each uid's smallest ends go first, one of each uid's at a time: one tenant's large ends
    (a long name) never take the room of another's."""
    from supervisor.serve.pendingends import PendingEnds

    def end(size: int, argv: list[str]) -> dict[str, Any]:
        return {"outcome": "succeeded", "result": json.dumps(
            {"argv": argv, "name": "n" * size, "outcome": "succeeded"})}

    kept = PendingEnds(str(tmp_path), 10 << 10)
    kept.open()
    kept.add(1000, "1", end(0, ["x" * 300_000]), None, lambda: "(one)")  # (argv: left out)
    for i in range(2, 6):
        kept.add(1000, str(i), end(3000 + i, []), None, lambda: "(theirs)")
    kept.add(2000, "6", end(100, ["true"]), None, lambda: "(mine)")
    kept.add(2000, "7", end(2000, ["true"]), None, lambda: "(mine)")
    kept.close()
    again = PendingEnds(str(tmp_path), 10 << 10)
    again.open()
    assert set(again.found) == {"1", "6", "7", "2", "3"}, sorted(again.found)
    assert json.loads(again.found["1"][0]["result"])["argv"] is None
    assert json.loads(again.found["6"][0]["result"])["argv"] is None
    again.close()
    assert caplog.text.count("could not be written before the daemon exited: kept in") == 5
    assert caplog.text.count("records it lost); its result: (theirs)") == 2


def test_the_records_reserve_is_made_again_once_there_is_room_for_it(
        small_disk: Callable[..., SmallDisk], tmp_path: Path) -> None:
    """Found by an independent attack: a start on a nearly full disk did not make the
    records' reserve again (it wanted four times its size free) yet accepted new tasks
    against the free room, which a tenant then filled: their ends stayed pending and a task
    queued.  The reserves are made as soon as there is room for them (and a little more),
    and new work is accepted only while the reserve is there."""
    from supervisor.serve.records import Reserve

    disk = small_disk(tmp_path / "state", "4m")
    reserve = Reserve(str(disk.inside))
    hold = disk.inside / "hold"
    hold.write_bytes(bytes(2 * reserve.size))  # (twice the reserve: under four times)
    fill(disk.inside / "filler")
    assert not reserve.kept() and not (disk.inside / "reserve").exists()
    hold.unlink()
    assert reserve.kept()
    assert (disk.inside / "reserve").stat().st_blocks * 512 >= reserve.size
    assert (disk.inside / "reserve.start").stat().st_blocks * 512 >= reserve.start_size
    assert reserve.release() and not (disk.inside / "reserve").exists()
    fill(disk.inside / "filler2")  # (a tenant takes the room given back)
    assert not reserve.kept()  # (new work refused: nothing holds room for its end)
