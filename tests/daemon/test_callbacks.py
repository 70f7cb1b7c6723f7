"""Completion callbacks: ``--on-finish-exec`` (a program, run as a task of the daemon's own) and
``--on-finish-url`` over ``--on-finish-socket`` (an HTTP POST on a Unix socket); at least once,
across a crash of the daemon too."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_util import RunningDaemon, User, as_user, wait_for

from supervisor.client import Client

Start = Callable[..., RunningDaemon]


class Receiver:
    """A tiny HTTP server on a Unix socket: records each request; answers ``statuses`` in
    turn (then 200)."""

    def __init__(self, path: str, statuses: list[int] | None = None,
                 delay: float = 0.0) -> None:
        self.path = path
        self.statuses = list(statuses or [])
        self.delay = delay  # (seconds before each answer: a slow target)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self._answer(conn)

    @staticmethod
    def _head(conn: socket.socket) -> tuple[bytes, bytes, int]:
        """A request's head, the body's bytes read with it, and its content-length."""
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        return head, body, length

    def _answer(self, conn: socket.socket) -> None:
        head, body, length = self._head(conn)
        while len(body) < length:
            body += conn.recv(65536)
        request_line = head.split(b"\r\n")[0].decode()
        status = self.statuses.pop(0) if self.statuses else 200
        time.sleep(self.delay)
        self.requests.append((request_line, json.loads(body)))
        conn.sendall(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n".encode())

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


@pytest.fixture
def receiver_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "hook.sock")


def test_an_exec_hook_gets_each_finished_task(start_daemon: Start, tmp_path: Path) -> None:
    out = tmp_path / "events"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\n{{ cat; echo; echo \"$CORRAL_TASK_ID $CORRAL_OUTCOME "
                    f"$CORRAL_EXIT_STATUS $CORRAL_TASK_UID\"; }} >> {out}\n")
    hook.chmod(0o755)
    d = start_daemon("--on-finish-exec", str(hook))
    with d.client() as c:
        t = c.submit(["sh", "-c", "exit 7"], name="seven")
        c.wait(t.id)
    wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 2, "the hook")
    event_line, env_line = out.read_text().splitlines()
    event = json.loads(event_line)
    assert event["id"] == t.id and event["outcome"] == "failed" and event["exit_status"] == 7
    assert event["name"] == "seven" and event["state"] == "finished"
    assert event["result"]["exit"]["code"] == 7
    assert env_line == f"{t.id} failed 7 0"
    wait_for(lambda: [r["notified"] for r in d.rows()] == [1], "the delivery to be marked")


def test_a_url_on_a_unix_socket_is_posted_and_retried(start_daemon: Start,
                                                      receiver_path: str) -> None:
    receiver = Receiver(receiver_path, statuses=[500, 503])
    try:
        d = start_daemon("--on-finish-url", "http://agent-host/corral/done?x=1",
                         "--on-finish-socket", receiver_path)
        with d.client() as c:
            t = c.submit(["echo", "hi"])
            c.wait(t.id)
        wait_for(lambda: len(receiver.requests) == 3, "two failures, then the delivery",
                 timeout=30)
        lines = {line for line, _ in receiver.requests}
        assert lines == {"POST /corral/done?x=1 HTTP/1.1"}
        assert all(e["id"] == t.id and e["outcome"] == "succeeded"
                   for _, e in receiver.requests)
        wait_for(lambda: [r["notified"] for r in d.rows()] == [1], "the delivery marked")
    finally:
        receiver.close()


def test_a_callback_due_at_a_crash_is_delivered_by_the_next_start(
        start_daemon: Start, receiver_path: str) -> None:
    args = ("--on-finish-url", "http://localhost/done", "--on-finish-socket", receiver_path)
    d = start_daemon(*args)  # nobody listens on the receiver's socket yet
    with d.client() as c:
        t = c.submit(["true"])
        c.wait(t.id)
    assert [r["notified"] for r in d.rows()] == [0]  # due
    d.kill()
    receiver = Receiver(receiver_path)
    try:
        d2 = start_daemon(*args, like=d)
        wait_for(lambda: [e["id"] for _, e in receiver.requests] == [t.id], "the delivery")
        wait_for(lambda: [r["notified"] for r in d2.rows()] == [1], "the delivery marked")
    finally:
        receiver.close()


def test_one_tenants_many_events_do_not_hold_another_tenants_behind_them(
        start_daemon: Start, users: list[User], receiver_path: str) -> None:
    """Found by an independent attack: completion events were one queue for every uid, in
    end order: one tenant's 8,166 finished tasks delayed another's event 30.6 s.  The uids
    take turns: an event waits for at most one of each other uid's (and the one in flight)."""
    receiver = Receiver(receiver_path, delay=0.05)  # (a slow target: 20 events a second)
    try:
        d = start_daemon("--on-finish-url", "http://localhost/done", "--on-finish-socket",
                         receiver_path)
        os.chmod(receiver_path, 0o600)  # (the daemon's alone)

        def flood() -> Any:
            with Client(d.socket) as c:
                return [c.wait(c.submit(["true"]).id).id for _ in range(40)]

        def mine() -> Any:
            with Client(d.socket) as c:
                return c.wait(c.submit(["true"]).id).id

        flooded = as_user(users[0], flood)
        told_before = len(receiver.requests)
        victim = as_user(users[1], mine)
        # (counted once the victim's task has ended: its event was due from then on; the
        # flood's go on meanwhile, 20 a second, however long its submission took)
        told_after = len(receiver.requests)
        wait_for(lambda: len(receiver.requests) == len(flooded) + 1, "every event", timeout=30)
        order = [e["id"] for _, e in receiver.requests]
        assert told_after < len(flooded) - 5, told_after  # (the flood's were still due)
        assert order.index(victim) <= told_after + 2, (told_before, told_after,
                                                       order.index(victim))
    finally:
        receiver.close()


def test_on_finish_url_needs_its_socket(start_daemon: Start) -> None:
    d = start_daemon("--on-finish-url", "http://x/y", expect_exit=True)
    assert d.proc.returncode == 125
    assert "--on-finish-url and --on-finish-socket go together" in d.log_text()


class Picky(Receiver):
    """A receiver that answers 413 to a request whose body is above ``most`` bytes as soon as
    it has read its head, and closes without reading the body (as an HTTP server's body limit
    does); 503 to the events of the task ids in ``failing``; 200 to the rest."""

    def __init__(self, path: str, most: int, failing: set[str]) -> None:
        self.most, self.failing, self.refused = most, failing, 0
        super().__init__(path)

    def _answer(self, conn: socket.socket) -> None:
        _, body, length = self._head(conn)
        if length > self.most:
            self.refused += 1
            conn.sendall(b"HTTP/1.1 413 Too Large\r\ncontent-length: 0\r\n\r\n")
            return
        while len(body) < length:
            body += conn.recv(65536)
        event = json.loads(body)
        status = 503 if event["id"] in self.failing else 200
        self.requests.append((str(status), event))
        conn.sendall(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n".encode())


def test_a_tenants_event_a_target_refuses_neither_ends_the_daemon_nor_holds_the_others(
        start_daemon: Start, receiver_path: str) -> None:
    """Found by an independent attack: a target that closed its end as a tenant's large
    event was sent (a body limit's 413) raised an error nothing handled, and the daemon died,
    again at every start (the event still due); and an event a target refused was retried at
    the head of the one queue, holding every other uid's events for good.  Now a refusal for
    good (4xx) is logged and not sent again, an event that fails is retried behind the
    others, and the daemon goes on."""
    receiver = Picky(receiver_path, most=256 << 10, failing=set())
    try:
        d = start_daemon("--on-finish-url", "http://agent-host/done",
                         "--on-finish-socket", receiver_path)
        with d.client() as c:
            large = c.submit(["true", "\u00e9" * 150_000])  # (a body of 900 KB, an event of MBs)
            c.wait(large.id)
            failing = c.submit(["true"])
            receiver.failing.add(failing.id)
            c.wait(failing.id)
            later = c.submit(["echo", "later"])
            c.wait(later.id)
            wait_for(lambda: any(e["id"] == later.id and status == "200"
                                 for status, e in receiver.requests),
                     "the later task's event, past the failing one", timeout=30)
            wait_for(lambda: sum(e["id"] == failing.id for _, e in receiver.requests) >= 2,
                     "the failing event retried", timeout=30)
            assert c.show(later.id).outcome == "succeeded"  # (the daemon goes on)
        assert receiver.refused >= 1
        wait_for(lambda: {str(r["seq"]): r["notified"] for r in d.rows()}.get(large.id) == 1,
                 "the refused event marked, not due again")
        assert "refused the event of task" in d.log_text()
        assert "Traceback" not in d.log_text(), d.log_text()[-3000:]
        # (its failures within the minute: one line, not one a try: a later attack)
        assert d.log_text().count("; retrying") == 1, d.log_text()[-3000:]
    finally:
        receiver.close()


def test_an_event_is_utf8_not_three_times_its_command() -> None:
    """Found by an independent attack: an event repeats its command's arguments, ASCII-escaped
    (``\\u00e9``, six bytes for two): a command of 960 KB of ``é`` made an event of 2.9 MB.
    In UTF-8 it is the command's size; a lone surrogate (JSON may carry one) keeps its
    escape."""
    from supervisor.serve.hooks import event_bytes

    body = event_bytes({"argv": ["é" * 1000]})
    assert len(body) < 2100 and json.loads(body) == {"argv": ["é" * 1000]}
    odd = {"argv": ["\udc80é"]}
    assert json.loads(event_bytes(odd)) == odd
