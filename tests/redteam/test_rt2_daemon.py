"""corral serve's records under a hostile submitter: one local user (the default socket is
0666) sends a string the records cannot hold, while others submit as usual."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

import pytest
from rt_util import CORRAL, poll


def request(sock: str, method: str, path: str, body: str | None = None,
            timeout: float = 15) -> tuple[int, str] | None:
    """One HTTP/1.1 request on the daemon's socket: (status, body), or None if no answer came
    within ``timeout``."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    data = b"" if body is None else body.encode()
    try:
        s.connect(sock)
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                  + data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        return None
    finally:
        s.close()
    head, _, rest = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest.decode(errors="replace")


# Sent as nobody: JSON's "\udcff" is a lone surrogate once decoded, which SQLite cannot encode
POISON = r"""
import socket, sys, threading
def send():
    s = socket.socket(socket.AF_UNIX); s.settimeout(15); s.connect(sys.argv[1])
    body = b'{"argv": ["true"], "name": "x\\udcff"}'
    s.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass
threads = [threading.Thread(target=send) for _ in range(12)]
for t in threads: t.start()
for t in threads: t.join()
"""


@pytest.fixture
def daemon(scratch: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    yield from _daemon(scratch)


@pytest.fixture
def capped_daemon(scratch: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    yield from _daemon(scratch, "--max-time-limit", "1s")


def _daemon(scratch: str, *options: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    home = tempfile.mkdtemp(prefix="rt2-serve-")
    os.chmod(home, 0o755)
    sock = os.path.join(home, "s.sock")
    p = subprocess.Popen([CORRAL, "serve", "--socket", sock, "--state-dir",
                          os.path.join(home, "state"), "--cgroup-root", scratch,
                          "--log-level", "error", *options], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert poll(lambda: os.path.exists(sock), 20), "the daemon did not start"
        yield sock, p
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()  # (its keeper then clears its root)
            p.wait()
        shutil.rmtree(home, ignore_errors=True)


def test_one_users_unencodable_name_does_not_wedge_other_users_tasks(
        daemon: tuple[str, subprocess.Popen[bytes]]) -> None:
    sock, proc = daemon
    answers: dict[int, tuple[int, str] | None] = {}

    def submit(i: int) -> None:
        answers[i] = request(sock, "POST", "/v1/tasks", json.dumps({"argv": ["true"]}))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(40)]
    poison = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               "--", sys.executable, "-c", POISON, sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    poison.wait(timeout=30)
    refused = {i: a for i, a in answers.items() if a is None or a[0] >= 300}
    accepted = [json.loads(a[1])["id"] for a in answers.values() if a and a[0] < 300]

    def states() -> dict[str, str] | None:
        got = request(sock, "GET", "/v1/tasks?limit=500", timeout=5)
        if got is None or got[0] != 200:
            return None  # the daemon does not answer a listing
        return {t["id"]: t["state"] for t in json.loads(got[1])["tasks"]}

    def finished() -> bool:
        now = states()
        return now is not None and all(now.get(i) == "finished" for i in accepted)

    all_finished = poll(finished, 15)
    now = states()
    stuck = "the daemon no longer answers GET /v1/tasks" if now is None else {
        i: s for i, s in now.items() if i in accepted and s != "finished"}
    assert not refused, (f"{len(refused)} of 40 ordinary submissions failed or got no answer "
                         f"while another user sent an unencodable name: "
                         f"{list(refused.values())[:2]}")
    assert all_finished, f"accepted tasks never finished (no final record): {stuck}"
    assert proc.poll() is None


def test_the_hosts_max_time_limit_bounds_a_tasks_life(
        capped_daemon: tuple[str, subprocess.Popen[bytes]]) -> None:
    sock, _ = capped_daemon
    sent = request(sock, "POST", "/v1/tasks", json.dumps({
        "argv": ["sh", "-c", "trap '' TERM; sleep 60"], "time_limit": "1s",
        "properties": {"TimeoutStopSec": "36000d"}}))
    assert sent is not None and sent[0] < 300, sent
    task_id = json.loads(sent[1])["id"]

    def finished() -> bool:
        got = request(sock, "GET", f"/v1/tasks/{task_id}", timeout=5)
        return got is not None and '"state":"finished"' in got[1].replace(" ", "")

    assert poll(finished, 8), "the task still runs 8 s past the host's 1 s ceiling"
