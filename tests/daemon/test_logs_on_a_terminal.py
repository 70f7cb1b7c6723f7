"""``corral logs`` of a task that prints terminal escape sequences, to a real pseudo-terminal
(what reaches it is read on the master side) and to a pipe.  (Not test_logs_terminal.py: that
is the filter's unit tests in tests/cli, and two test modules may not share a name.)"""

from __future__ import annotations

import errno
import os
import re
import select
import shutil
import subprocess
import time
import tty
from collections.abc import Callable
from typing import Any

from daemon_util import CORRAL, RunningDaemon, User, as_user

from supervisor.client import Client

Start = Callable[..., RunningDaemon]

HOSTILE = (b"title\x1b]0;pwned\x07 clip\x1b]52;c;ZWNobyBoaQ==\x07 report\x1b[21t "
           b"dcs\x1bP$q\"p\x1b\\ up\x1b[2A\x1b[2Kforged\r\n\x1b[31mred\x1b[0m caf\xc3\xa9 "
           b"\xc2\x9b\x9b[2J\xff \xe2\x80\xaeevil\n")
SGR = re.compile(rb"\x1b\[[0-9;]*m")


def hostile_task(d: RunningDaemon) -> str:
    """The id of a finished task that printed HOSTILE (every byte spelled in octal for
    printf(1), so the command line itself holds none of them)."""
    spelled = "".join(f"\\{b:03o}" for b in HOSTILE)
    task_id = d.corral("submit", "--", "printf", spelled, check=True).stdout.decode().strip()
    assert d.corral("wait", task_id).returncode == 0
    return task_id


def on_a_terminal(d: RunningDaemon, *args: str, timeout: float = 60) -> bytes:
    """What ``corral ARGS`` writes to its stdout, a pseudo-terminal in raw mode (so the line
    discipline passes the bytes as written: no newline made CR LF)."""
    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        proc = subprocess.Popen([*CORRAL, *args], stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=subprocess.PIPE, cwd=os.path.dirname(d.socket),
                                env=dict(os.environ, CORRAL_SOCKET=d.socket))
    finally:
        os.close(slave)
    got = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"corral {' '.join(args)} still writing after {timeout}s: {got!r}"
            if not select.select([master], [], [], left)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError as e:
                if e.errno != errno.EIO:  # EIO: no slave side is open any more (it exited)
                    raise
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(master)
    _, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"corral {' '.join(args)} exited {proc.returncode}: {stderr!r}"
    return got


def test_logs_at_a_terminal_shows_escape_sequences_instead_of_sending_them(
        start_daemon: Start) -> None:
    d = start_daemon()
    task_id = hostile_task(d)
    got = on_a_terminal(d, "logs", task_id)
    acting = SGR.sub(b"", got)
    for raw in (b"\x1b", b"\x07", b"\x9b", "\u202e".encode(), "\x9b".encode()):
        assert raw not in acting, (raw, got)
    for escaped in (rb"\x1b]52;c;ZWNobyBoaQ==\x07", rb"\x1b]0;pwned\x07", rb"\x1b[21t",
                    rb"\x1bP$q", rb"\x1b[2A\x1b[2Kforged", rb"\x9b\x9b[2J\xff", rb"\u202eevil"):
        assert escaped in got, (escaped, got)
    assert b"\x1b[31mred\x1b[0m" in got and "café".encode() in got and b"\r\n" in got


def test_logs_to_a_pipe_or_with_raw_gives_the_exact_bytes(start_daemon: Start) -> None:
    d = start_daemon()
    task_id = hostile_task(d)
    assert d.corral("logs", task_id, check=True).stdout == HOSTILE
    assert on_a_terminal(d, "logs", "--raw", task_id) == HOSTILE


def test_session_ls_shows_a_tenants_working_directory_escaped(start_daemon: Start,
                                                              users: list[User]) -> None:
    """Found by an independent attack: ``corral session ls`` printed each session's cwd raw,
    and a tenant names its directories as it likes, so root's terminal ran a tenant's title,
    clipboard (OSC 52) and screen-clearing sequences.  It escapes them, as ``ps`` and
    ``show`` do."""
    d = start_daemon()
    name = "/tmp/corral-test-cwd \x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J end"

    def wander() -> Any:
        with Client(d.socket) as c:
            sid = c.open_session(cwd="/tmp")["id"]
            # (the name spelled for printf(1): the command line holds none of its bytes)
            spelled = "".join(f"\\{ord(ch):03o}" for ch in name)
            done = c.exec(sid, f'd="$(printf \'{spelled}\')"; mkdir -p "$d" && cd "$d"',
                          wait=30)
            return sid, done["result"]["outcome"]

    try:
        sid, outcome = as_user(users[0], wander)
        assert outcome == "succeeded"
        listed = d.corral("session", "ls", check=True).stdout
        shown = on_a_terminal(d, "session", "ls")
    finally:
        shutil.rmtree(name, ignore_errors=True)
    for out in (listed, shown):
        assert sid.encode() in out and b"\x1b" not in out and b"\x07" not in out, out
        assert rb"\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J end" in out, out
