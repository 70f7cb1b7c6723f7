"""`corral run` from scripts: closed stdio, odd output files, odd argv, signals from others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from rt_util import CORRAL


def corral_run(root: str, *args: str, timeout: float = 60,
               **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([CORRAL, "run", "--cgroup-root", root, *args], timeout=timeout,
                          start_new_session=True, **kw)  # type: ignore[call-overload]


def test_a_json_fifo_without_reader_does_not_make_corral_deaf(scratch: str,
                                                              tmp_path: object) -> None:
    fifo = os.path.join(str(tmp_path), "result.fifo")
    os.mkfifo(fifo)
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", scratch, "--json-file", fifo, "--",
                          "sleep", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(1.0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if p.poll() is None:
            p.send_signal(sig)
            time.sleep(0.5)
    alive = p.poll() is None
    if alive:
        p.kill()
    p.wait()
    assert not alive, "corral run outlived SIGINT, SIGTERM and SIGHUP, stuck opening the FIFO"


def test_closed_stdout_and_stderr_keep_the_exit_status(scratch: str) -> None:
    """Held: the task's own status comes back with corral's stdout and stderr closed."""
    r = subprocess.run(f"{CORRAL} run --cgroup-root {scratch} -- sh -c 'echo hi; echo e >&2; "
                       f"exit 4' >&- 2>&-", shell=True, timeout=60, start_new_session=True)
    assert r.returncode == 4


def test_an_unwritable_result_is_reported_and_the_status_kept(scratch: str) -> None:
    """Held: a --json-file that fails at the end (a full disk) is one line; the status stays."""
    r = corral_run(scratch, "--json-file", "/dev/full", "--", "sh", "-c", "exit 6",
                   capture_output=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 6 and b"No space left on device" in r.stderr


@pytest.mark.parametrize(("argv", "status"), [
    ([""], 125), ([], 125), (["a\nb"], 127), (["/"], 126), (["/etc/hostname"], 126),
    (["--", "-x"], 127)])
def test_odd_commands_are_refused_with_the_documented_status(scratch: str, argv: list[str],
                                                             status: int) -> None:
    """Held: 125 nothing started, 126 cannot be run, 127 not found."""
    r = corral_run(scratch, "--", *argv, capture_output=True, stdin=subprocess.DEVNULL)
    assert r.returncode == status, r.stderr
    assert os.listdir(scratch) == [] or all(
        not os.path.isdir(os.path.join(scratch, d)) for d in os.listdir(scratch))


def test_a_binary_name_and_output_make_a_valid_utf8_record(scratch: str,
                                                           tmp_path: object) -> None:
    """Held: invalid UTF-8 in argv and output becomes U+FFFD in the JSON record."""
    path = os.path.join(str(tmp_path), "r.json")
    r = corral_run(scratch, "--json-file", path, "--", "sh", "-c",
                   "printf '\\377\\376\\033[2J\\n'; exit 0", b"\xff\xfe",
                   capture_output=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    assert data["argv"][-1] == "\ufffd\ufffd"
