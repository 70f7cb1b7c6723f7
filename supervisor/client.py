"""A small synchronous client for ``corral serve`` (no trio, no http.client: it starts fast).

Example::

    from supervisor.client import Client

    with Client() as c:                       # $CORRAL_SOCKET or /run/corral/corral.sock
        task = c.submit(["make", "test"], time_limit="10min")
        for frame in c.output(task.id, follow=True):
            if frame.kind == "data":
                sys.stdout.buffer.write(frame.data)
        info = c.wait(task.id)
        print(info.outcome, info.exit_status, info.result["usage"])

Every method raises :class:`supervisor.serve.protocol.ApiError` for an answer that is not a
success (``.status``, ``.code``, ``.field``), and :class:`DaemonUnavailable` when the daemon
cannot be reached.  Types (``TaskInfo``, ``Frame``) are the protocol module's, shared with the
daemon.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

from .serve.protocol import (
    DEFAULT_SOCKET,
    SOCKET_ENV,
    ApiError,
    Frame,
    SubmitRequest,
    TaskInfo,
    parse_frame,
)

__all__ = ["ApiError", "Client", "DaemonUnavailable", "Frame", "TaskInfo", "default_socket"]


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def quote(text: str, safe: str = "") -> str:
    """Percent-encode ``text`` for a URL path or query (urllib.parse costs a client ~3 ms of
    start-up)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode())


def urlencode(query: dict[str, Any]) -> str:
    return "&".join(f"{quote(k)}={quote(str(v))}" for k, v in query.items())


class DaemonUnavailable(ConnectionError):
    """The daemon's socket cannot be reached; the message names it and the fix."""


def default_socket() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class _Response:
    def __init__(self, status: int, headers: dict[str, str], reader: Any) -> None:
        self.status = status
        self.headers = headers
        self._reader = reader
        self.done = False

    def chunks(self) -> Iterator[bytes]:
        """The body, piece by piece (chunked, sized, or until EOF)."""
        r = self._reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(r.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while r.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                yield _read_exactly(r, size)
                r.readline()
        elif "content-length" in self.headers:
            yield _read_exactly(r, int(self.headers["content-length"]))
        else:
            while data := r.read1(65536):
                yield data
        self.done = True

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self) -> Iterator[bytes]:
        pending = b""
        for chunk in self.chunks():
            pending += chunk
            *whole, pending = pending.split(b"\n")
            yield from (line for line in whole if line.strip())
        if pending.strip():
            yield pending


def _read_exactly(reader: Any, n: int) -> bytes:
    data = reader.read(n)
    if len(data) != n:
        raise DaemonUnavailable(f"the daemon closed the connection after {len(data)} of {n} "
                                f"bytes")
    return bytes(data)


class Client:
    """One keep-alive connection to the daemon at ``socket_path``."""

    def __init__(self, socket_path: str | None = None, *, timeout: float | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._reader: Any = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._reader.close()
            self._sock.close()
            self._sock = self._reader = None

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise DaemonUnavailable(
                f"cannot reach the corral daemon at {self.socket_path}: {e.strerror or e}; "
                f"start it (corral serve, or systemctl start corral) or point "
                f"{SOCKET_ENV} / --socket at its socket") from None
        self._sock = sock
        self._reader = sock.makefile("rb")

    def _request(self, method: str, path: str, body: bytes | None = None,
                 content_type: str = "application/json") -> _Response:
        for attempt in (0, 1):
            if self._sock is None:
                self._connect()
            assert self._sock is not None
            head = f"{method} {path} HTTP/1.1\r\nhost: corral\r\n"
            if body is not None:
                head += f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            try:
                self._sock.sendall(head.encode() + b"\r\n" + (body or b""))
                return self._read_head()
            except (ConnectionError, _Stale):
                self.close()  # a kept-alive connection the daemon had closed: once more
                if attempt:
                    raise DaemonUnavailable(f"the corral daemon at {self.socket_path} "
                                            f"closed the connection") from None
        raise AssertionError("unreachable")

    def _read_head(self) -> _Response:
        line = self._reader.readline()
        if not line:
            raise _Stale()
        parts = line.split(None, 2)
        status = int(parts[1])
        headers = {}
        while (line := self._reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        resp = _Response(status, headers, self._reader)
        if headers.get("connection", "").lower() == "close":
            self._sock = None  # not reused (the reader still holds the socket for the body)
        return resp

    def _call(self, method: str, path: str, obj: Any = None, *,
              ok: tuple[int, ...] = (200, 201)) -> tuple[int, Any]:
        body = None if obj is None else json.dumps(obj).encode()
        resp = self._request(method, path, body)
        data = resp.read()
        if resp.status not in ok:
            raise ApiError.from_response(resp.status, data)
        return resp.status, json.loads(data)

    def _stream(self, path: str) -> Iterator[bytes]:
        resp = self._request("GET", path)
        if resp.status != 200:
            raise ApiError.from_response(resp.status, resp.read())
        try:
            yield from resp.lines()
        finally:
            if not resp.done:
                self.close()  # abandoned mid-stream: the connection cannot be reused

    # ---- the verbs ------------------------------------------------------------------------

    def submit(self, argv: list[str], **options: Any) -> TaskInfo:
        """Submit a task; options are the fields of ``POST /v1/tasks`` (``time_limit``,
        ``properties={"MemoryMax": "1G"}``, ``stdin=b"..."`` or ``"pipe"``, ...)."""
        stdin = options.pop("stdin", None)
        if isinstance(stdin, bytes):
            options["stdin_data"] = stdin
        elif stdin is not None:
            options["stdin"] = stdin
        request = SubmitRequest(list(argv), **options)
        _, obj = self._call("POST", "/v1/tasks", request.to_json())
        return TaskInfo(obj["id"], obj["state"], list(argv), -1, -1)

    def list(self, state: str | None = None, limit: int = 100) -> list[TaskInfo]:
        query = urlencode({k: v for k, v in (("state", state), ("limit", limit)) if v})
        _, obj = self._call("GET", f"/v1/tasks?{query}")
        return [TaskInfo.from_json(t) for t in obj["tasks"]]

    def show(self, task_id: str) -> TaskInfo:
        _, obj = self._call("GET", f"/v1/tasks/{quote(task_id, safe='')}")
        return TaskInfo.from_json(obj)

    def wait(self, task_id: str, timeout: float | None = None) -> TaskInfo:
        """Until the task has finished (long polls of at most 60 s each); with ``timeout``,
        the task as it is then."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            status, obj = self._call("GET", f"/v1/tasks/{quote(task_id, safe='')}/wait?"
                                     f"timeout={left:.3f}s", ok=(200, 202))
            if status == 200 or (deadline is not None and time.monotonic() >= deadline):
                return TaskInfo.from_json(obj)

    def output(self, task_id: str, stream: str = "stdout", offset: int = 0,
               follow: bool = False) -> Iterator[Frame]:
        """NDJSON frames (see :class:`Frame`): data with its offset, gaps, and the end."""
        query = urlencode({"stream": stream, "offset": offset,
                           "follow": "true" if follow else "false"})
        for line in self._stream(f"/v1/tasks/{quote(task_id, safe='')}/output?{query}"):
            yield parse_frame(line)

    def stop(self, task_id: str, force: bool = False) -> bool:
        """Whether the request changed anything (False: the task had already ended)."""
        _, obj = self._call("POST", f"/v1/tasks/{quote(task_id, safe='')}/stop",
                            {"force": force})
        return bool(obj["changed"])

    def write_stdin(self, task_id: str, data: bytes, eof: bool = False) -> None:
        path = f"/v1/tasks/{quote(task_id, safe='')}/stdin?eof={'true' if eof else 'false'}"
        resp = self._request("POST", path, data, "application/octet-stream")
        body = resp.read()
        if resp.status != 200:
            raise ApiError.from_response(resp.status, body)

    def events(self) -> Iterator[dict[str, Any]]:
        for line in self._stream("/v1/events"):
            yield json.loads(line)

    def limits(self) -> dict[str, Any]:
        return self._call("GET", "/v1/limits")[1]  # type: ignore[no-any-return]

    def metrics(self) -> str:
        resp = self._request("GET", "/metrics")
        return resp.read().decode()


class _Stale(Exception):
    """A kept-alive connection was closed by the daemon before our request."""
