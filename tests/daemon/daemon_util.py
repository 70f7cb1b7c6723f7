"""Helpers and fixtures for ``corral serve``'s tests (conftest.py registers the fixtures; a
uniquely named module, since every test folder's conftest is a module named ``conftest``).

- ``start_daemon(*args)``: a ``corral serve`` process on a fresh socket (in a 0755 directory,
  so other uids can reach it) and state directory, with the test's own ``corral-test-*``
  cgroup as ``--cgroup-root``; ``like=d`` starts one on ``d``'s socket and state (a
  restart).  At teardown: SIGTERM, a clean exit is required (but of daemons the test
  SIGKILLed), and the cgroup must be empty and removable (tests/conftest.py checks that).
- ``users``: four throw-away users (``useradd``; unique names; removed at the session's end).
- ``as_user(user, fn)``: ``fn()`` in a forked child that dropped to the user's uid, gid and
  groups, so that the daemon sees that uid through SO_PEERCRED; returns what ``fn`` returned
  (JSON), or re-raises an ``ApiError`` it raised.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import settings

import cgroupfs
from supervisor.client import Client
from supervisor.serve.protocol import ApiError

# no example database in the checkout: the property tests stay reproducible by their seed
settings.register_profile("corral-daemon", database=None)
settings.load_profile("corral-daemon")

CORRAL = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]


def stop_reached(result: dict[str, Any]) -> str:
    """How far a result's stop escalated (the result format's two spellings so far)."""
    stop = result["stop"]
    return str(stop.get("reached", stop.get("level")))


def stream_total(result: dict[str, Any], stream: str = "stdout") -> tuple[int, bool]:
    """(total bytes, log truncated) of a result's stream."""
    if "output" in result:
        s = result["output"][stream]
        return s["total_bytes"], s["log_truncated"]
    s = result[f"output_{stream}"]
    return s["total"], s["log_truncated"]


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def connectable(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


class RunningDaemon:
    def __init__(self, proc: subprocess.Popen[bytes], sock: str, state: Path, log: Path,
                 cgroup: str) -> None:
        self.proc = proc
        self.socket = sock
        self.state = state
        self.log = log
        self.cgroup = cgroup
        self.killed = False  # SIGKILLed on purpose: its exit status is not checked

    def kill(self) -> None:
        """SIGKILL the daemon (a crash), and reap it."""
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def client(self, timeout: float | None = 60) -> Client:
        return Client(self.socket, timeout=timeout)

    def corral(self, *args: str, check: bool = False, timeout: float = 60,
               input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        env = dict(os.environ, CORRAL_SOCKET=self.socket)
        proc = subprocess.run([*CORRAL, *args], capture_output=True, env=env, timeout=timeout,
                              cwd=os.path.dirname(self.socket), input=input, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"corral {' '.join(args)} exited {proc.returncode}: "
                                 f"{proc.stderr.decode()}")
        return proc

    def curl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["curl", "-sS", "--unix-socket", self.socket, *args],
                              capture_output=True, text=True, timeout=60, check=False)

    def rows(self, table: str = "task_rows") -> list[dict[str, Any]]:
        return read_rows(self.state, table)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"the daemon did not exit within {timeout}s of SIGTERM; "
                                     f"log: {self.log.read_text()[-2000:]}") from None
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def read_rows(state: Path, table: str = "task_rows") -> list[dict[str, Any]]:
    """Every row of ``table`` in the records at ``state`` (read-only; the daemon may run)."""
    db = sqlite3.connect(f"file:{state}/state.db?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        by_seq = ("tasks", "task_rows", "requests", "expired", "sessions")
        order = "seq" if table in by_seq else "id"
        return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY {order}")]
    finally:
        db.close()


def answering(sock: str) -> bool:
    """Whether a daemon answers on ``sock`` (start-up recovery done: it answers only then)."""
    try:
        with Client(sock, timeout=5) as c:
            c.limits()
        return True
    except (OSError, ApiError):
        return False


@pytest.fixture
def start_daemon(test_cgroup: cgroupfs.Cgroup, tmp_path: Path,
                 ) -> Iterator[Callable[..., RunningDaemon]]:
    """``start(*args, env=, wrap=, like=, expect_exit=, socket=, state_dir=)``: a daemon;
    ``like``: another daemon's socket and state directory (a restart); ``wrap``: a command
    prefix (e.g. a private mount namespace); ``expect_exit``: it is expected to fail at start
    (returned with its exit status, not waited for); ``socket``, ``state_dir``: paths of the
    test's own instead of fresh ones."""
    started: list[RunningDaemon] = []
    sockdirs: list[str] = []

    def start(*extra: str, env: dict[str, str] | None = None, wrap: list[str] | None = None,
              like: RunningDaemon | None = None, expect_exit: bool = False,
              socket: str | None = None, state_dir: str | None = None) -> RunningDaemon:
        if like is None:
            sockdir = tempfile.mkdtemp(prefix="corral-test-sock-")
            os.chmod(sockdir, 0o755)
            sockdirs.append(sockdir)
            sock, state = os.path.join(sockdir, "corral.sock"), tmp_path / f"state{len(started)}"
        else:
            sock, state = like.socket, like.state
        sock = socket or sock
        state = Path(state_dir) if state_dir is not None else state
        log = tmp_path / f"daemon{len(started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*(wrap or []), *CORRAL, "serve", "--socket", sock, "--state-dir", str(state),
                 "--cgroup-root", test_cgroup.path, *extra],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=os.path.dirname(sock), env=env)
        d = RunningDaemon(proc, sock, state, log, test_cgroup.path)
        started.append(d)
        if expect_exit:
            proc.wait(60)
            d.killed = True  # (its status is the test's to check)
            return d
        wait_for(lambda: proc.poll() is not None or answering(sock), "the daemon to answer")
        assert proc.poll() is None, f"the daemon exited {proc.returncode}: {log.read_text()}"
        return d

    try:
        yield start
    finally:
        problems = []
        for d in started:
            status = d.stop()
            if d.killed:
                continue
            if status != 0:
                problems.append(f"the daemon exited {status}: {d.log_text()[-3000:]}")
            elif "Traceback" in d.log_text():
                problems.append(f"the daemon logged a traceback: {d.log_text()[-3000:]}")
        for sockdir in sockdirs:
            shutil.rmtree(sockdir, ignore_errors=True)
        assert not problems, "\n".join(problems)


class User(NamedTuple):
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def users() -> Iterator[list[User]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create test users")
    tag = secrets.token_hex(3)
    made: list[User] = []
    try:
        for i in range(4):
            name = f"corral-t{tag}-{i}"
            subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                            "/usr/sbin/nologin", name], check=True, capture_output=True)
            pw = pwd.getpwnam(name)
            made.append(User(name, pw.pw_uid, pw.pw_gid))
        yield made
    finally:
        for u in made:
            subprocess.run(["userdel", u.name], check=False, capture_output=True)


def as_user(user: User | None, fn: Callable[[], Any], timeout: float = 120) -> Any:
    """``fn()`` as ``user`` (None: as root) in a forked child; its JSON-able return value."""
    return as_users([(user, fn)], timeout)[0]


def as_users(calls: list[tuple[User | None, Callable[[], Any]]], timeout: float = 120,
             ) -> list[Any]:
    """Each ``fn()`` as its user, all at once (one forked child each); their return values."""
    children = [_fork_as(user, fn) for user, fn in calls]
    return [_collect(pid, r, user, timeout) for (pid, r), (user, _) in
            zip(children, calls, strict=True)]


def _fork_as(user: User | None, fn: Callable[[], Any]) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            if user is not None:
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
            out: dict[str, Any] = {"ok": fn()}
        except ApiError as e:
            out = {"api_error": [e.status, e.code, e.message, e.field]}
        except BaseException as e:
            out = {"error": repr(e)}
        try:
            data = json.dumps(out, default=str).encode()
            while data:
                data = data[os.write(w, data):]
        except BaseException:
            code = 1
        os._exit(code)
    os.close(w)
    return pid, r


def _collect(pid: int, r: int, user: User | None, timeout: float) -> Any:
    chunks = []
    deadline = time.monotonic() + timeout
    with os.fdopen(r, "rb", buffering=0) as f:
        while True:
            if not select.select([f], [], [], max(0.0, deadline - time.monotonic()))[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"as {user}: no answer in {timeout:g}s")
            if not (chunk := f.read(65536)):
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    out = json.loads(b"".join(chunks) or b'{"error": "no answer from the child"}')
    if "api_error" in out:
        raise ApiError(*out["api_error"])
    if "error" in out:
        raise AssertionError(f"as {user}: {out['error']}")
    return out["ok"]


def raw(d: RunningDaemon, data: bytes, *, read_timeout: float = 10) -> tuple[int, dict]:
    """Send ``data`` on a fresh connection; the status and JSON body of the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(read_timeout)
        s.connect(d.socket)
        s.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(
                answer):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body.strip() else {}


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def post(body: bytes, path: bytes = b"/v1/tasks", extra: bytes = b"") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-length: " +
            str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def on_tmpfs(state: Path, size: str, *, read_only: bool = False) -> list[str]:
    """A command prefix: a private mount namespace with a tmpfs of ``size`` on ``state``."""
    state.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o {options} corral-test-state "$0" && exec "$@"', str(state)]


def fill(path: Path, *, append: bool = False) -> None:
    """Write zeros to ``path`` (after what it holds: ``append``) until the filesystem is full
    (unbuffered: every byte that fits is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC),
                 0o600)
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


def fill_past_the_reserve(inside: Path) -> None:
    """Fill the filesystem at ``inside`` (into ``filler``), the records' reserve given up and
    its room filled too.  Filled first: a write of the daemon's meanwhile would make the
    reserve again if its room were free (it needs its size and 64 KiB more)."""
    fill(inside / "filler")
    (inside / "reserve").unlink()
    fill(inside / "filler", append=True)


def log_grows_at_the_next_write(inside: Path) -> bool:
    """Whether the records' next write at ``inside`` takes new blocks of the filesystem.  A
    write-ahead log checkpointed in full starts again at its first frame, over blocks it has,
    so a test that fills the disk to the byte may still see its next write succeed (the
    format: sqlite.org/walformat.html; the index's header in the ``-shm`` file, native byte
    order: ``szPage`` at 14, ``mxFrame`` at 16, the checkpoint's ``nBackfill`` at 96)."""
    shm = (inside / "state.db-shm").read_bytes()[:100]
    page = struct.unpack_from("=H", shm, 14)[0]
    page = 65536 if page == 1 else page  # (the format's way of saying 65536)
    last, backfilled = struct.unpack_from("=I", shm, 16)[0], struct.unpack_from("=I", shm, 96)[0]
    nxt = 0 if last and backfilled == last else last
    return 32 + (nxt + 1) * (24 + page) > (inside / "state.db-wal").stat().st_size


class SmallDisk(NamedTuple):
    """A tmpfs of the test's in a mount namespace that a holder process keeps: daemons run
    in it (``wrap``) and may come and go (a restart finds the same files); the test reaches
    it through ``inside``."""

    holder: subprocess.Popen[bytes]
    wrap: list[str]
    inside: Path

    def size(self) -> int:
        """The filesystem's bytes."""
        st = os.statvfs(self.inside)
        return st.f_blocks * st.f_frsize


def rows_on(disk: SmallDisk, tmp_path: Path) -> list[dict[str, Any]]:
    """The task rows on a small disk, read from a copy (SQLite resolves /proc/PID/root to
    "/")."""
    copy = tmp_path / f"copy-{time.monotonic_ns()}"
    copy.mkdir()
    for name in ("state.db", "state.db-wal"):
        if (disk.inside / name).exists():
            shutil.copy(disk.inside / name, copy / name)
    return read_rows(copy)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[Path, str], SmallDisk]]:
    """``small_disk(path, size)``: a tmpfs of ``size`` on ``path``, in a private mount
    namespace held for the test (see :class:`SmallDisk`)."""
    held: list[subprocess.Popen[bytes]] = []

    def make(path: Path, size: str) -> SmallDisk:
        path.mkdir(parents=True, exist_ok=True)
        ready = tmp_path / f"disk-ready-{len(held)}"
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f'mount -t tmpfs -o size={size},mode=0700 corral-test-small "$0" && touch "$1" '
             f'&& exec sleep 3600', str(path), str(ready)])
        held.append(holder)
        wait_for(lambda: ready.exists() or holder.poll() is not None, "the small disk")
        assert holder.poll() is None, "mounting the small tmpfs failed"
        return SmallDisk(holder, ["nsenter", "-t", str(holder.pid), "-m", "--"],
                         Path(f"/proc/{holder.pid}/root{path}"))

    try:
        yield make
    finally:
        for holder in held:
            holder.kill()
            holder.wait()
