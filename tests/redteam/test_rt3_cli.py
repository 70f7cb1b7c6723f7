"""Red team 3: ``corral run``'s last words (the record on --json-fd, the summary) against a
task that set O_NONBLOCK on the stdout it shares with corral (node does that to a pipe) and
left it full for a slow reader.  corral's writes then met EAGAIN: the JSON record was
"writing the result failed: Resource temporarily unavailable" and the summary vanished."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time

from rt_util import CORRAL

# The task: O_NONBLOCK on its stdout (the description it shares with corral), fill the pipe,
# say so in a file, exit.
FILL = """
import fcntl, os, sys
fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)
try:
    while True:
        os.write(1, b"x" * 4096)
except BlockingIOError:
    pass
open(sys.argv[1], "w").close()
"""


def _slow_reader(argv: list[str], marker: str, *, merged: bool) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with stdout a pipe nobody reads until the task has filled it and exited
    and corral has had a moment (or said something on stderr); then read everything."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(marker), "the task never filled the pipe"
        if p.stderr is not None:
            select.select([p.stderr], [], [], 1.5)  # corral's complaint, if it has one
        else:
            time.sleep(1.0)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.kill(p.pid, 9)
            p.wait()
    return p.returncode, out, err or b""


def test_json_fd_record_waits_for_a_slow_reader(scratch: str, tmp_path) -> None:
    marker = str(tmp_path / "filled")
    rc, out, err = _slow_reader(
        [CORRAL, "run", "--cgroup-root", scratch, "--json-fd", "1", "--",
         "python3", "-c", FILL, marker], marker, merged=False)
    assert rc == 0, err
    assert b"writing the result failed" not in err, err
    text = out.lstrip(b"x")
    assert text, f"no record after the task's output; stderr: {err!r}"
    record = json.loads(text)
    assert record["outcome"] == "succeeded" and record["exit_status"] == 0


def test_summary_waits_for_a_slow_reader(scratch: str, tmp_path) -> None:
    marker = str(tmp_path / "filled")
    rc, out, _ = _slow_reader(
        [CORRAL, "run", "--cgroup-root", scratch, "--summary", "--",
         "python3", "-c", FILL, marker], marker, merged=True)
    assert rc == 0
    assert b"finished with result: succeeded" in out, out.lstrip(b"x")[:500]
