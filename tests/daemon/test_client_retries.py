"""The project's clients never do a thing twice: each submission has an idempotency key of
the client's own making (a retry gives the same task back), and a stop or a stdin write whose
answer was lost is reported, not sent again.

A real daemon behind a real relay (a Unix socket in between that can lose an answer: the
request reaches the daemon, which acts on it, and the connection drops before the answer
reaches the client), as a restart under socket activation does."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_util import RunningDaemon, wait_for

from supervisor.client import AsyncClient, Client, DaemonUnavailable

Start = Callable[..., RunningDaemon]


class Relay:
    """Accepts on ``path`` and relays each connection to the daemon; while ``lose`` is set,
    the next answer is read from the daemon and thrown away, and the client's connection is
    closed (``lost`` counts them)."""

    def __init__(self, path: str, daemon: str) -> None:
        self.path, self.daemon = path, daemon
        self.lose = 0
        self.lost = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(self.daemon)
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        while True:
            data = upstream.recv(65536)
            if not data:
                break
            if self.lose:
                self.lose -= 1
                self.lost += 1
                break  # the answer goes nowhere, and the connection with it
            client.sendall(data)
        for s in (client, upstream):  # (shutdown: the pump's recv holds the socket open)
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    @staticmethod
    def _pump(client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relay(start_daemon: Start) -> Iterator[tuple[RunningDaemon, Relay]]:
    d = start_daemon()
    r = Relay(os.path.join(os.path.dirname(d.socket), "relay.sock"), d.socket)
    try:
        yield d, r
    finally:
        r.close()


def test_a_submission_whose_answer_was_lost_is_asked_again_and_runs_once(
        relay: tuple[RunningDaemon, Relay]) -> None:
    d, r = relay
    with Client(r.path, timeout=30) as c:
        c.limits()  # (a daemon answered once: losing it later is worth another try)
        r.lose = 1
        t = c.submit(["sh", "-c", "echo ran"])
        assert r.lost == 1
        assert c.wait(t.id).outcome == "succeeded"
    with d.client() as c:
        tasks = c.list()
    assert [x.id for x in tasks] == [t.id]  # one task, though the request was sent twice
    assert d.rows()[0]["idempotency_key"].startswith("corral-")


async def test_the_async_client_asks_again_with_the_same_key(
        relay: tuple[RunningDaemon, Relay]) -> None:
    d, r = relay
    async with AsyncClient(r.path) as c:
        await c.limits()
        r.lose = 1
        t = await c.submit(["true"])
        assert (await c.wait(t.id)).outcome == "succeeded"
    assert r.lost == 1
    assert [x["seq"] for x in d.rows()] == [int(t.id)]


def test_a_stop_whose_answer_was_lost_is_reported_not_sent_again(
        relay: tuple[RunningDaemon, Relay]) -> None:
    """A second graceful stop is a kill: a stop sent again after a lost answer would turn the
    caller's one request into two."""
    _, r = relay
    with Client(r.path, timeout=30) as c:
        t = c.submit(["sh", "-c", "trap 'echo got TERM; sleep 1; exit 3' TERM; echo ready; "
                                  "sleep 60 & wait"], grace="20s")
        # (its trap set: a stop 2 ms after the spawn found none, and the task died at once)
        wait_for(lambda: b"ready" in b"".join(f.data for f in c.output(t.id)
                                              if f.kind == "data"), "the task's trap")
        r.lose = 1
        with pytest.raises(DaemonUnavailable, match="may or may not have been done"):
            c.stop(t.id)
        done = c.wait(t.id)
    assert done.result["stop"]["reached"] == "signalled", done.result["stop"]  # not killed
    assert done.result["exit"]["code"] == 3  # (its trap ran to the end)


def test_a_stdin_write_whose_answer_was_lost_is_not_written_twice(
        relay: tuple[RunningDaemon, Relay]) -> None:
    _, r = relay
    with Client(r.path, timeout=30) as c:
        t = c.submit(["wc", "-c"], stdin="pipe")
        r.lose = 1
        with pytest.raises(DaemonUnavailable):
            c.write_stdin(t.id, b"x" * 1000)
        c.write_stdin(t.id, b"", eof=True)
        c.wait(t.id)
        out = b"".join(f.data for f in c.output(t.id))
    assert out.strip() == b"1000"


def test_a_client_uses_its_own_socket_only_where_only_the_daemon_could_have_made_it(
        tmp_path: Path) -> None:
    """``own_socket_of``: the uid's own socket beside the shared one, if its directory is a
    real directory of root's (or of the shared socket's directory's owner) that nobody else
    may write; else None (the shared socket), so that another user cannot plant a listener a
    client would send its requests to."""
    import stat as stat_

    from supervisor.client import own_socket_of

    shared = tmp_path / "corral.sock"
    own_dir = tmp_path / "corral.sock.uid"
    assert own_socket_of(str(shared)) is None  # (not there)
    own_dir.mkdir(mode=0o755)
    assert own_socket_of(str(shared)) == f"{own_dir}/{os.getuid()}"
    assert own_socket_of("relative/corral.sock") is None
    for mode in (0o775, 0o757, 0o777):
        os.chmod(own_dir, mode)
        assert own_socket_of(str(shared)) is None, oct(mode)
    os.chmod(own_dir, 0o755)
    os.chown(own_dir, 4321, -1)  # (someone else's, in a directory of ours)
    assert own_socket_of(str(shared)) is None
    own_dir.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    own_dir.symlink_to(tmp_path / "elsewhere")  # (a link, even to a good directory)
    assert stat_.S_ISLNK(os.lstat(own_dir).st_mode)
    assert own_socket_of(str(shared)) is None
