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
daemon.  :class:`AsyncClient` has the same methods for trio (``await c.submit(...)``,
``async for frame in c.output(...)``); trio is imported only when it is used.
"""

from __future__ import annotations

import _socket
import builtins
import errno
import io
import os
import sys

from .serve import fastjson
from .serve.protocol import (
    DEFAULT_SOCKET,
    OWN_SUFFIX,
    SOCKET_ENV,
    ApiError,
    Frame,
    SubmitRequest,
    TaskInfo,
    parse_frame,
)

TYPE_CHECKING = False  # not typing's: importing typing costs every client's start-up
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from typing import Any

    import trio

__all__ = ["Api", "ApiError", "AsyncClient", "AsyncSession", "Call", "Client",
           "DaemonUnavailable", "Frame", "Session", "TaskInfo", "default_socket",
           "own_socket_of"]


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def quote(text: str) -> str:
    """Percent-encode ``text`` for a URL path or query (urllib.parse costs a client ~3 ms of
    start-up)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode())


def urlencode(query: dict[str, Any]) -> str:
    return "&".join(f"{quote(k)}={quote(str(v))}" for k, v in query.items())


RECONNECT = 60.0  # seconds a waiting or following client tries to reach a restarting daemon
# what a socket that is not there yet, or not listening yet, answers a connect(2): a daemon
# that is starting (``corral serve &`` binds its socket a few hundred ms after it starts)
_NOT_YET = (errno.ENOENT, errno.ECONNREFUSED)


class DaemonUnavailable(ConnectionError):
    """The daemon's socket cannot be reached; the message names it and the fix."""


def default_socket() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def own_socket_of(path: str) -> str | None:
    """Our uid's own socket beside the daemon's shared one at ``path``, which the daemon
    makes for root and ``--allow-group``'s members at its start, for any other uid once it
    has connected (serve/ownsockets.py: another uid's flood of connections fills the shared
    socket's backlog, never this one's), if only the daemon could have made it: in a
    directory of root's or of the shared socket's directory's owner, writable by its owner
    alone.  None if it is not there."""
    if not path.startswith("/"):
        return None
    uid = os.getuid()
    directory = path + OWN_SUFFIX
    try:
        st = os.lstat(directory)
        if st.st_mode & 0o170022 != 0o040000 or (
                st.st_uid != 0 and st.st_uid != os.stat(os.path.dirname(path)).st_uid):
            return None  # (not a directory, writable by others, or someone else's)
    except OSError:
        return None
    return f"{directory}/{uid}"


def _served_by_the_daemon(sock: Any, path: str) -> Any:
    """``sock``, connected to ``path``, if root or our own uid listens there (the kernel's
    ``SO_PEERCRED``); else closed, and DaemonUnavailable before anything is sent.  (A socket
    in a directory others may write, /tmp, was taken by another user when the daemon was
    not there, and clients sent it their requests, environments and all, and took its forged
    answers: an independent attack.)"""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    if uid in (0, os.getuid()):
        return sock
    sock.close()
    raise DaemonUnavailable(
        f"the socket {path} is served by uid {uid}, neither root nor you: not the corral "
        f"daemon's (another user's listener?); nothing was sent.  See who made it (ls -l "
        f"{path}), and point {SOCKET_ENV} / --socket at the daemon's socket, in a directory "
        f"only root may write")


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
                line = r.readline()
                if not line:  # (a chunked body always ends with a 0 chunk)
                    raise DaemonUnavailable("the daemon closed the connection in the middle "
                                            "of its answer")
                size = int(line.split(b";")[0].strip() or b"0", 16)
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


class Call:
    """One request of the API as both clients send it: the method, path and body, the
    statuses that are answers, whether it may be sent again on a new connection if the
    first was lost before its answer (``resend``: a read, or a submission with its
    idempotency key), whether it is asked again while the daemon restarts (``again``:
    ``"restarting"``, its 503 only; ``"gone"``, also once a daemon that had answered cannot
    be reached), and what the answer's body becomes (``decode(status, body)``)."""

    __slots__ = ("again", "body", "content_type", "decode", "method", "ok", "path", "resend")

    def __init__(self, method: str, path: str, body: Any = None, *,
                 ok: tuple[int, ...] = (200, 201), resend: bool | None = None,
                 again: str | None = None, decode: Any = None,
                 content_type: str = "application/json") -> None:
        self.method = method
        self.path = path
        self.body = body if body is None or isinstance(body, bytes) else \
            fastjson.dumps(body).encode()
        self.content_type = content_type
        self.ok = ok
        self.resend = method == "GET" if resend is None else resend
        self.again = again
        self.decode = decode or _json_value


def _json_value(status: int, data: bytes) -> Any:
    return fastjson.loads(data)


def _as_dict(status: int, data: bytes) -> dict[str, Any]:
    return dict(fastjson.loads(data))


def _task_info(status: int, data: bytes) -> TaskInfo:
    return TaskInfo.from_json(fastjson.loads(data))


class Api:
    """Each verb of the API as a :class:`Call` (docs/api.md): the one description of it that
    :class:`Client` and :class:`AsyncClient`, two transports, both send."""

    @staticmethod
    def submit(argv: list[str], options: dict[str, Any]) -> Call:
        """``wait`` among ``options``: answered when the task ends (its result) or when the
        bound passes (still running, ``output`` so far), whichever comes first."""
        options = dict(options)
        wait = options.pop("wait", None)
        body = submission(argv, options)
        if wait is not None:
            body["wait"] = _wait_text(wait)

        def created(status: int, data: bytes) -> TaskInfo:
            obj = fastjson.loads(data)
            if status == 201:  # (accepted: the id and state only)
                return TaskInfo(obj["id"], obj["state"], list(argv), -1, -1)
            return TaskInfo.from_json(obj)

        return Call("POST", "/v1/tasks", body, ok=(200, 201, 202), resend=True,
                    again="gone", decode=created)

    @staticmethod
    def list(state: str | None, limit: int, session: str | None, before: str | None) -> Call:
        query = urlencode({k: v for k, v in (("state", state), ("limit", limit),
                                             ("session", session), ("before", before)) if v})
        return Call("GET", f"/v1/tasks?{query}", decode=lambda status, data: [
            TaskInfo.from_json(t) for t in fastjson.loads(data)["tasks"]])

    @staticmethod
    def show(task_id: str) -> Call:
        return Call("GET", f"/v1/tasks/{quote(task_id)}", decode=_task_info)

    @staticmethod
    def wait(task_id: str, seconds: float) -> Call:
        """One long poll: (finished?, the task as it is)."""
        return Call("GET", f"/v1/tasks/{quote(task_id)}/wait?timeout={seconds:.3f}s",
                    ok=(200, 202), again="gone", decode=lambda status, data: (
                        status == 200, TaskInfo.from_json(fastjson.loads(data))))

    @staticmethod
    def output(task_id: str, stream: str, offset: int, follow: bool,
               tail: int | None) -> Call:
        if tail is not None and offset:
            raise ValueError(f"output: offset={offset} and tail={tail} both given; give one")
        query = urlencode({"stream": stream, "follow": "true" if follow else "false",
                           **({"offset": offset} if tail is None else {"tail": tail})})
        return Call("GET", f"/v1/tasks/{quote(task_id)}/output?{query}",
                    decode=lambda status, line: parse_frame(line))

    @staticmethod
    def events() -> Call:
        return Call("GET", "/v1/events", decode=_json_value)

    @staticmethod
    def stop(task_id: str, force: bool) -> Call:
        return Call("POST", f"/v1/tasks/{quote(task_id)}/stop", {"force": force},
                    again="restarting", decode=lambda status, data: bool(
                        fastjson.loads(data)["changed"]))

    @staticmethod
    def signal(task_id: str, sig: str) -> Call:
        return Call("POST", f"/v1/tasks/{quote(task_id)}/signal", {"signal": sig},
                    decode=_as_dict)

    @staticmethod
    def resize(task_id: str, rows: int, cols: int) -> Call:
        return Call("POST", f"/v1/tasks/{quote(task_id)}/resize", {"rows": rows, "cols": cols},
                    decode=lambda status, data: None)

    @staticmethod
    def write_stdin(task_id: str, data: bytes, eof: bool) -> Call:
        return Call("POST", f"/v1/tasks/{quote(task_id)}/stdin?eof={'true' if eof else 'false'}",
                    bytes(data), ok=(200,), resend=False, again="restarting",
                    decode=lambda status, body: None, content_type="application/octet-stream")

    @staticmethod
    def open_session(options: dict[str, Any]) -> Call:
        return Call("POST", "/v1/sessions", options, decode=_as_dict)

    @staticmethod
    def exec(session_id: str, command: str, options: dict[str, Any]) -> Call:
        return Call("POST", f"/v1/sessions/{quote(session_id)}/exec",
                    _exec_body(command, options), ok=(200, 201, 202), decode=_as_dict)

    @staticmethod
    def close_session(session_id: str) -> Call:
        return Call("DELETE", f"/v1/sessions/{quote(session_id)}", decode=_as_dict)

    @staticmethod
    def sessions(limit: int) -> Call:
        return Call("GET", f"/v1/sessions?limit={int(limit)}", decode=lambda status, data: [
            dict(x) for x in fastjson.loads(data)["sessions"]])

    @staticmethod
    def show_session(session_id: str) -> Call:
        return Call("GET", f"/v1/sessions/{quote(session_id)}", decode=_as_dict)

    @staticmethod
    def limits() -> Call:
        return Call("GET", "/v1/limits", decode=_as_dict)

    @staticmethod
    def metrics() -> Call:
        return Call("GET", "/metrics", ok=(200,), decode=lambda status, data: data.decode())


class Client:
    """One keep-alive connection to the daemon at ``socket_path``.

    ``start_wait``: for up to that many seconds, a socket that is not there yet or refuses
    the connection is tried again, as a daemon that is starting has it (``corral serve &``
    then ``corral submit``); once a daemon has answered, losing it is a restart's doing
    (below).  0, the default: an error at once."""

    def __init__(self, socket_path: str | None = None, *, timeout: float | None = None,
                 start_wait: float = 0.0) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout
        self.start_wait = start_wait
        self._sock: _socket.socket | None = None
        self._reader: Any = None
        self._reached = False  # a daemon answered once: losing it now is a restart's doing

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
        """Connect, waiting up to ``start_wait`` for a daemon that is starting (never once
        one has answered); DaemonUnavailable naming the socket and the fix."""
        import time

        own = own_socket_of(self.socket_path)
        if own is not None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(own)
            except OSError:
                sock.close()  # (not made yet, or gone: the shared socket)
            else:
                self._sock = _served_by_the_daemon(sock, own)
                self._reader = io.BufferedReader(_SocketReader(sock))
                return
        give_up = time.monotonic() + (0.0 if self._reached else self.start_wait)
        pause = 0.02
        while True:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.socket_path)
                break
            except OSError as e:
                sock.close()
                left = give_up - time.monotonic()
                if e.errno in _NOT_YET and left > 0:
                    time.sleep(min(pause, left))  # (the last try: at the end of the wait)
                    pause = min(pause * 2, 0.25)
                    continue
                waited = f" (waited {self.start_wait:g}s for it to start)" if (
                    e.errno in _NOT_YET and self.start_wait and not self._reached) else ""
                raise DaemonUnavailable(
                    f"cannot reach the corral daemon at {self.socket_path}: "
                    f"{e.strerror or e}{waited}; start it (corral serve, or systemctl start "
                    f"corral) or point {SOCKET_ENV} / --socket at its socket") from None
        self._sock = _served_by_the_daemon(sock, self.socket_path)
        self._reader = io.BufferedReader(_SocketReader(sock))

    def _request(self, method: str, path: str, body: bytes | None = None,
                 content_type: str = "application/json", *,
                 resend: bool = False) -> _Response:
        """Send one request and read its answer's head.  A kept-alive connection the daemon
        has closed meanwhile is found before anything is sent (a peek) and replaced.  Once
        sent, a request is sent again on a new connection only if that is safe (``resend``:
        a read, or a submission with its idempotency key): a connection lost after a stop or
        a stdin write may have carried it, and doing it twice is not the same."""
        for attempt in (0, 1):
            if self._sock is not None and _hung_up(self._sock.fileno()):
                self.close()
            if self._sock is None:
                self._connect()
            assert self._sock is not None
            try:
                self._sock.sendall(_request_bytes(method, path, body, content_type))
                return self._read_head()
            except (ConnectionError, _Stale):
                self.close()
                if attempt or not resend:
                    raise _unanswered(self.socket_path, method, path, resend) from None
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
        self._reached = True
        if headers.get("connection", "").lower() == "close":
            self._sock = None  # not reused (the reader still holds the socket for the body)
        return resp

    def _send(self, call: Call) -> Any:
        """``call`` sent once (and again on a new connection if it says so): its decoded
        answer, or ApiError."""
        resp = self._request(call.method, call.path, call.body, call.content_type,
                             resend=call.resend)
        data = resp.read()
        if resp.status not in call.ok:
            raise ApiError.from_response(resp.status, data)
        return call.decode(resp.status, data)

    def _do(self, call: Call, reconnect: float = RECONNECT) -> Any:
        """``call``, asked again across a restart of the daemon if it says so
        (:meth:`_again`)."""
        if call.again is None:
            return self._send(call)
        return self._again(reconnect, self._send, call, unreachable=call.again == "gone")

    def _lines(self, call: Call) -> Iterator[Any]:
        """A streamed answer (NDJSON), each line decoded by ``call``."""
        resp = self._request(call.method, call.path, call.body, resend=True)
        if resp.status != 200:
            raise ApiError.from_response(resp.status, resp.read())
        try:
            for line in resp.lines():
                yield call.decode(200, line)
        finally:
            if not resp.done:
                self.close()  # abandoned mid-stream: the connection cannot be reused

    def _again(self, reconnect: float, call: Any, *args: Any, unreachable: bool = True,
               **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, again while the daemon is restarting (503
        ``restarting``) or (with ``unreachable``), once it had answered, unreachable: for up
        to ``reconnect`` seconds.  A daemon never reached is an error at once."""
        import time

        give_up = time.monotonic() + reconnect
        pause = 0.05
        while True:
            try:
                return call(*args, **kwargs)
            except (DaemonUnavailable, ApiError) as e:
                if not _passing(e, unreachable and self._reached):
                    raise
                self.close()
                if time.monotonic() + pause > give_up:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    # ---- the verbs (each request described once: Api) ------------------------------------

    def submit(self, argv: list[str], **options: Any) -> TaskInfo:
        """Submit a task; options are the fields of ``POST /v1/tasks`` (``time_limit``,
        ``properties={"MemoryMax": "1G"}``, ``stdin=b"..."`` or ``"pipe"``, ...).  With
        ``wait="30s"`` (or seconds), the answer comes when the task ends (``result``) or when
        the bound passes: then it is still running, with its ``output`` so far.

        Every submission carries an idempotency key (one of the caller's, or one made here),
        so that asking again after a lost answer (a connection dropped, a daemon restarting)
        gives the same task back and never runs the command twice."""
        return self._do(Api.submit(argv, options))  # type: ignore[no-any-return]

    def list(self, state: str | None = None, limit: int = 100,
             session: str | None = None, before: str | None = None) -> list[TaskInfo]:
        """Your tasks, newest first (``session``: that session's commands only; ``before``:
        older than that id, for the next page of at most ``limit`` (1000 at most))."""
        return self._do(Api.list(state, limit, session, before))  # type: ignore[no-any-return]

    def show(self, task_id: str) -> TaskInfo:
        return self._do(Api.show(task_id))  # type: ignore[no-any-return]

    def wait(self, task_id: str, timeout: float | None = None, *,
             reconnect: float = RECONNECT) -> TaskInfo:
        """Until the task has finished (long polls of at most 60 s each); with ``timeout``,
        the task as it is then.  A daemon that goes away (a restart) is reconnected to for up
        to ``reconnect`` seconds."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            finished, info = self._do(Api.wait(task_id, left), reconnect)
            if finished or (deadline is not None and time.monotonic() >= deadline):
                return info  # type: ignore[no-any-return]

    def follow(self, task_id: str, stream: str = "stdout", offset: int = 0, *,
               reconnect: float = RECONNECT) -> Iterator[Frame]:
        """Like ``output(follow=True)``, across restarts of the daemon: when the connection
        drops before the end frame, reconnect (for up to ``reconnect`` seconds) and go on
        from the next byte.  Every byte comes once, in order; the end frame comes last."""
        import time

        follower = _Follower(offset)
        give_up = time.monotonic() + reconnect
        while True:
            try:
                for frame in self.output(task_id, stream, follower.pos, follow=True):
                    give_up = time.monotonic() + reconnect
                    yield frame
                    if follower.took(frame):
                        return
            except (DaemonUnavailable, ApiError) as e:
                if not _passing(e, self._reached):
                    raise
            self.close()  # the stream ended early (or broke): the daemon went away
            if time.monotonic() > give_up:
                raise follower.gone(self.socket_path, task_id, reconnect)
            time.sleep(0.1)

    def output(self, task_id: str, stream: str = "stdout", offset: int = 0,
               follow: bool = False, tail: int | None = None) -> Iterator[Frame]:
        """NDJSON frames (see :class:`Frame`): data with its offset, gaps, and the end;
        ``tail``: from the stream's last ``tail`` bytes instead of ``offset``."""
        return self._lines(Api.output(task_id, stream, offset, follow, tail))

    def stop(self, task_id: str, force: bool = False) -> bool:
        """Whether the request changed anything (False: the task had already ended)."""
        return self._do(Api.stop(task_id, force))  # type: ignore[no-any-return]

    def signal(self, task_id: str, sig: str) -> dict[str, Any]:
        """Send ``sig`` (``"INT"``, ``"TERM"``, ``"HUP"``, ``"QUIT"``, ``"USR1"``, ``"USR2"``,
        ``"WINCH"``, ``"CONT"``) to a running task's whole tree (a terminal task: its
        foreground process group): not a stop.  ApiError 409 if it is not running."""
        return self._do(Api.signal(task_id, sig))  # type: ignore[no-any-return]

    def resize(self, task_id: str, rows: int, cols: int) -> None:
        """Set a terminal task's window size (submitted with ``tty={"rows", "cols"}``)."""
        self._do(Api.resize(task_id, rows, cols))

    def write_stdin(self, task_id: str, data: bytes, eof: bool = False) -> None:
        """Write ``data`` to the task's stdin (``eof``: then close it); asked again while the
        daemon is restarting (503 ``restarting``: nothing was written)."""
        self._do(Api.write_stdin(task_id, data, eof))

    def events(self) -> Iterator[dict[str, Any]]:
        """State changes of your tasks as they happen (``GET /v1/events``)."""
        return self._lines(Api.events())

    def limits(self) -> dict[str, Any]:
        return self._do(Api.limits())  # type: ignore[no-any-return]

    def metrics(self) -> str:
        return self._do(Api.metrics())  # type: ignore[no-any-return]

    # ---- sessions ----------------------------------------------------------------------------

    def open_session(self, **options: Any) -> dict[str, Any]:
        """A new session (``cwd``, ``env``, ``shell``, ``time_limit``, ``grace``,
        ``properties``: each command's defaults); its JSON (``id``, ``cwd``, ...)."""
        return self._do(Api.open_session(options))  # type: ignore[no-any-return]

    def session(self, **options: Any) -> Session:
        """``with c.session(cwd="/src") as s: s.run("cd lib && make")``: a session, closed
        (everything of it stopped) when the block ends."""
        return Session(self, self.open_session(**options)["id"])

    def exec(self, session_id: str, command: str, **options: Any) -> dict[str, Any]:
        """Run ``command`` in the session (``wait``, ``background``, ``time_limit``, ``grace``,
        ``stdin=b"..."``, ``name``, ``idempotency_key``, ``cwd``: its directory instead of the
        session's): the task as the daemon answers it
        (with ``wait``: finished, with its result, or still running with the output so far)."""
        return self._do(Api.exec(session_id, command, options))  # type: ignore[no-any-return]

    def close_session(self, session_id: str) -> dict[str, Any]:
        """Close the session: what of it still runs is stopped (``stopped``: their ids)."""
        return self._do(Api.close_session(session_id))  # type: ignore[no-any-return]

    def sessions(self, limit: int = 100) -> builtins.list[dict[str, Any]]:
        return self._do(Api.sessions(limit))  # type: ignore[no-any-return]

    def show_session(self, session_id: str) -> dict[str, Any]:
        return self._do(Api.show_session(session_id))  # type: ignore[no-any-return]


def _passing(e: Exception, reached: bool) -> bool:
    """Whether ``e`` is a restart's doing, or a submission still being accepted (worth
    another try); ``reached``: a daemon answered before, and an unreachable one counts."""
    if isinstance(e, ApiError):
        return e.code in ("restarting", "in_progress")
    return reached


class _Follower:
    """Where a followed stream is (its next byte), across reconnections."""

    __slots__ = ("pos",)

    def __init__(self, offset: int) -> None:
        self.pos = offset

    def took(self, frame: Frame) -> bool:
        """Note ``frame``; whether it is the end."""
        if frame.kind == "data":
            self.pos = frame.offset + len(frame.data)
        elif frame.kind == "gap":
            self.pos = frame.end
        return frame.kind == "end"

    def gone(self, socket_path: str, task_id: str, reconnect: float) -> DaemonUnavailable:
        return DaemonUnavailable(f"the corral daemon at {socket_path} went away while "
                                 f"following task {task_id}, and did not come back within "
                                 f"{reconnect:g}s")


class _SocketReader(io.RawIOBase):
    """The reading half of ``socket.makefile("rb")`` over the C socket: the ``socket``
    module's enums and ``selectors`` cost a client ~2 ms of start-up, and only ``recv_into``
    is needed.  Closing it leaves the socket open (the client closes that)."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._sock.recv_into(b)


class _Stale(Exception):
    """A kept-alive connection was closed by the daemon before our request."""


def _unanswered(socket_path: str, method: str, path: str, resend: bool) -> DaemonUnavailable:
    return DaemonUnavailable(f"the corral daemon at {socket_path} closed the connection "
                             f"before it answered {method} {path}" + ("" if resend else
                             "; it may or may not have been done (corral show tells)"))


def _hung_up(fd: int) -> bool:
    """Whether the daemon has closed this kept-alive connection (its idle timeout, a
    restart): seen at once (poll, no wait), without reading anything of an answer."""
    import select

    poll = select.poll()
    poll.register(fd, select.POLLIN | select.POLLRDHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
               for _, ev in poll.poll(0))


def new_key() -> str:
    """An idempotency key for a submission that came without one: 128 random bits."""
    return "corral-" + os.urandom(16).hex()


def submission(argv: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/tasks``'s body for ``argv`` and the client's keyword options, with an
    idempotency key (:func:`new_key` unless the caller gave one)."""
    options = dict(options)
    stdin = options.pop("stdin", None)
    if isinstance(stdin, bytes):
        options["stdin_data"] = stdin
    elif stdin is not None:
        options["stdin"] = stdin
    if options.get("idempotency_key") is None:
        options["idempotency_key"] = new_key()
    return SubmitRequest(list(argv), **options).to_json()


def _head(line: bytes, header_lines: list[bytes]) -> tuple[int, dict[str, str]]:
    status = int(line.split(None, 2)[1])
    headers = {}
    for raw in header_lines:
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _request_bytes(method: str, path: str, body: bytes | None, content_type: str) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: corral\r\n"
    if body is not None:
        head += f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


def _exec_body(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """A session command's request body (stdin bytes as base64, a number ``wait`` as
    seconds)."""
    body = {"command": command, **options}
    if isinstance(body.get("stdin"), bytes | bytearray):
        import base64

        body["stdin"] = {"base64": base64.b64encode(body["stdin"]).decode("ascii")}
    return body


def _wait_text(wait: float | str) -> str:
    return f"{wait}s" if isinstance(wait, int | float) else wait


class Session:
    """A session of the daemon's, held by a :class:`Client` (see ``Client.session``)."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, command: str, *, wait: float | str = 3600, **options: Any) -> dict[str, Any]:
        """Run ``command`` and wait for it (at most ``wait``: then the answer says it is still
        running, with its id and output so far); the task as the daemon answers it."""
        return self.client.exec(self.id, command, wait=_wait_text(wait), **options)

    def start(self, command: str, **options: Any) -> dict[str, Any]:
        """Run ``command`` without waiting (``background=True``: beside the foreground one)."""
        return self.client.exec(self.id, command, **options)

    def show(self) -> dict[str, Any]:
        return self.client.show_session(self.id)

    def close(self) -> dict[str, Any]:
        return self.client.close_session(self.id)


class AsyncClient:
    """:class:`Client` for trio: one keep-alive connection; the same methods, awaited.

    ``async with AsyncClient() as c: task = await c.submit(["make"])``; ``output`` and
    ``events`` are async iterators.  Cancelling a call closes the connection (the next call
    opens a new one).
    """

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self._stream: trio.SocketStream | None = None
        self._buf = bytearray()
        self._streaming: object | None = None  # the output/events iterator holding it
        self._reached = False  # a daemon answered once: losing it now is a restart's doing

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        self._buf.clear()
        if stream is not None:
            await stream.aclose()

    def _drop(self) -> None:
        """Close now, without waiting (a call abandoned half way)."""
        if self._stream is not None:
            self._stream.socket.close()
            self._stream = None
        self._buf.clear()

    async def _connect(self) -> trio.SocketStream:
        import trio

        own = own_socket_of(self.socket_path)
        if own is not None:
            try:
                stream = await trio.open_unix_socket(own)
            except OSError:
                pass  # (not made yet, or gone: the shared socket)
            else:
                _served_by_the_daemon(stream.socket, own)
                self._stream = stream
                return stream
        try:
            stream = await trio.open_unix_socket(self.socket_path)
        except OSError as e:
            raise DaemonUnavailable(
                f"cannot reach the corral daemon at {self.socket_path}: {e.strerror or e}; "
                f"start it (corral serve, or systemctl start corral) or point "
                f"{SOCKET_ENV} at its socket") from None
        _served_by_the_daemon(stream.socket, self.socket_path)
        self._stream = stream
        return stream

    async def _fill(self) -> None:
        import trio

        assert self._stream is not None
        try:
            data = await self._stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            raise _Stale()
        self._buf += data

    async def _readline(self) -> bytes:
        while (i := self._buf.find(b"\n")) < 0:
            await self._fill()
        line = bytes(self._buf[:i + 1])
        del self._buf[:i + 1]
        return line

    async def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    async def _request(self, method: str, path: str, body: bytes | None = None,
                       content_type: str = "application/json", *,
                       resend: bool = False) -> tuple[int, dict[str, str]]:
        """:meth:`Client._request` for trio (the same rule for sending again)."""
        import trio

        if self._streaming is not None:
            # an iterator was left behind mid-stream (async generators are closed late):
            # its connection cannot carry another request
            self._drop()
            self._streaming = None
        for attempt in (0, 1):
            if self._stream is not None and _hung_up(self._stream.socket.fileno()):
                self._drop()
            stream = self._stream or await self._connect()
            try:
                await stream.send_all(_request_bytes(method, path, body, content_type))
                first = await self._readline()
                lines = []
                while (line := await self._readline()) not in (b"\r\n", b"\n"):
                    lines.append(line)
                self._reached = True
                return _head(first, lines)
            except (_Stale, trio.BrokenResourceError, trio.ClosedResourceError):
                self._drop()
                if attempt or not resend:
                    raise _unanswered(self.socket_path, method, path, resend) from None
            except BaseException:
                self._drop()
                raise
        raise AssertionError("unreachable")

    async def _chunks(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await self._readline()).split(b";")[0].strip() or b"0", 16):
                yield await self._read(size)
                await self._readline()
            while await self._readline() not in (b"\r\n", b"\n"):
                pass
        else:
            yield await self._read(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self._drop()

    async def _body(self, headers: dict[str, str]) -> bytes:
        return b"".join([c async for c in self._chunks(headers)])

    async def _send(self, call: Call) -> Any:
        """:meth:`Client._send` for trio."""
        status, headers = await self._request(call.method, call.path, call.body,
                                              call.content_type, resend=call.resend)
        try:
            data = await self._body(headers)
        except BaseException:
            self._drop()
            raise
        if status not in call.ok:
            raise ApiError.from_response(status, data)
        return call.decode(status, data)

    async def _do(self, call: Call, reconnect: float = RECONNECT) -> Any:
        """:meth:`Client._do` for trio: ``call``, asked again across a restart of the daemon
        (503 ``restarting``; with ``again="gone"``, a daemon gone after it had answered) for
        up to ``reconnect`` seconds, if it says so."""
        import trio

        if call.again is None:
            return await self._send(call)
        give_up = trio.current_time() + reconnect
        pause = 0.05
        while True:
            try:
                return await self._send(call)
            except (DaemonUnavailable, ApiError) as e:
                if not _passing(e, call.again == "gone" and self._reached) or \
                        trio.current_time() + pause > give_up:
                    raise
            self._drop()
            await trio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _lines(self, call: Call) -> AsyncIterator[Any]:
        """:meth:`Client._lines` for trio."""
        status, headers = await self._request(call.method, call.path, call.body, resend=True)
        if status != 200:
            raise ApiError.from_response(status, await self._body(headers))
        pending = b""
        done = False
        token = self._streaming = object()
        try:
            async for chunk in self._chunks(headers):
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    if line.strip():
                        yield call.decode(200, line)
            done = True
        except _Stale:
            raise DaemonUnavailable(f"the corral daemon at {self.socket_path} closed the "
                                    f"connection in the middle of its answer") from None
        finally:
            if self._streaming is token:  # (else a later request already dropped it)
                if not done:
                    self._drop()  # abandoned mid-stream: the connection cannot be reused
                self._streaming = None

    # ---- the verbs: as Client's, awaited (each request described once: Api) --------------

    async def submit(self, argv: list[str], **options: Any) -> TaskInfo:
        """:meth:`Client.submit`: with an idempotency key, asked again safely."""
        return await self._do(Api.submit(argv, options))  # type: ignore[no-any-return]

    async def list(self, state: str | None = None, limit: int = 100,
                   session: str | None = None, before: str | None = None) -> list[TaskInfo]:
        return await self._do(  # type: ignore[no-any-return]
            Api.list(state, limit, session, before))

    async def show(self, task_id: str) -> TaskInfo:
        return await self._do(Api.show(task_id))  # type: ignore[no-any-return]

    async def wait(self, task_id: str, timeout: float | None = None, *,
                   reconnect: float = RECONNECT) -> TaskInfo:
        """:meth:`Client.wait`: until the task has finished (long polls of 60 s), across a
        restart of the daemon; with ``timeout``, the task as it is then."""
        import trio

        deadline = None if timeout is None else trio.current_time() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline -
                                                                trio.current_time()))
            finished, info = await self._do(Api.wait(task_id, left), reconnect)
            if finished or (deadline is not None and trio.current_time() >= deadline):
                return info  # type: ignore[no-any-return]

    def output(self, task_id: str, stream: str = "stdout", offset: int = 0,
               follow: bool = False, tail: int | None = None) -> AsyncIterator[Frame]:
        """:meth:`Client.output`: ``async for frame in c.output(...)``."""
        return self._lines(Api.output(task_id, stream, offset, follow, tail))

    async def follow(self, task_id: str, stream: str = "stdout", offset: int = 0, *,
                     reconnect: float = RECONNECT) -> AsyncIterator[Frame]:
        """:meth:`Client.follow` for trio: ``output(follow=True)`` across restarts of the
        daemon (reconnecting for up to ``reconnect`` seconds, from the next byte)."""
        import trio

        follower = _Follower(offset)
        give_up = trio.current_time() + reconnect
        while True:
            try:
                async for frame in self.output(task_id, stream, follower.pos, follow=True):
                    give_up = trio.current_time() + reconnect
                    yield frame
                    if follower.took(frame):
                        return
            except (DaemonUnavailable, ApiError) as e:
                if not _passing(e, self._reached):
                    raise
            self._drop()
            if trio.current_time() > give_up:
                raise follower.gone(self.socket_path, task_id, reconnect)
            await trio.sleep(0.1)

    async def stop(self, task_id: str, force: bool = False) -> bool:
        return await self._do(Api.stop(task_id, force))  # type: ignore[no-any-return]

    async def signal(self, task_id: str, sig: str) -> dict[str, Any]:
        return await self._do(Api.signal(task_id, sig))  # type: ignore[no-any-return]

    async def resize(self, task_id: str, rows: int, cols: int) -> None:
        await self._do(Api.resize(task_id, rows, cols))

    async def write_stdin(self, task_id: str, data: bytes, eof: bool = False) -> None:
        await self._do(Api.write_stdin(task_id, data, eof))

    def events(self) -> AsyncIterator[dict[str, Any]]:
        return self._lines(Api.events())

    async def limits(self) -> dict[str, Any]:
        return await self._do(Api.limits())  # type: ignore[no-any-return]

    async def metrics(self) -> str:
        return await self._do(Api.metrics())  # type: ignore[no-any-return]

    async def open_session(self, **options: Any) -> dict[str, Any]:
        return await self._do(Api.open_session(options))  # type: ignore[no-any-return]

    async def session(self, **options: Any) -> AsyncSession:
        """``async with await c.session(cwd="/src") as s: await s.run("make")``: a session,
        closed (everything of it stopped) when the block ends."""
        return AsyncSession(self, (await self.open_session(**options))["id"])

    async def exec(self, session_id: str, command: str, **options: Any) -> dict[str, Any]:
        return await self._do(  # type: ignore[no-any-return]
            Api.exec(session_id, command, options))

    async def close_session(self, session_id: str) -> dict[str, Any]:
        return await self._do(Api.close_session(session_id))  # type: ignore[no-any-return]

    async def sessions(self, limit: int = 100) -> builtins.list[dict[str, Any]]:
        return await self._do(Api.sessions(limit))  # type: ignore[no-any-return]

    async def show_session(self, session_id: str) -> dict[str, Any]:
        return await self._do(Api.show_session(session_id))  # type: ignore[no-any-return]


class AsyncSession:
    """A session of the daemon's, held by an :class:`AsyncClient` (``AsyncClient.session``):
    :class:`Session`'s methods, awaited."""

    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self.client = client
        self.id = session_id

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        import trio

        with trio.move_on_after(30, shield=True):  # (closed however the block ends)
            await self.close()

    async def run(self, command: str, *, wait: float | str = 3600,
                  **options: Any) -> dict[str, Any]:
        return await self.client.exec(self.id, command, wait=_wait_text(wait), **options)

    async def start(self, command: str, **options: Any) -> dict[str, Any]:
        return await self.client.exec(self.id, command, **options)

    async def show(self) -> dict[str, Any]:
        return await self.client.show_session(self.id)

    async def close(self) -> dict[str, Any]:
        return await self.client.close_session(self.id)
