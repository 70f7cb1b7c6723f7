"""One HTTP/1.1 connection over h11: read requests within limits, send JSON or NDJSON.

Limits, each ending in a clear 4xx or a closed connection, never in unbounded memory:
- the request head must fit ``max_header_bytes`` and :data:`MAX_HEADERS` fields (431), and
  the whole request (head and body)
  arrive within ``header_timeout`` of its first byte (408, then close);
- a body above ``max_body`` is refused on its Content-Length, or as soon as a chunked body
  passes it (413);
- an idle keep-alive connection is closed after ``idle_timeout``;
- a response that cannot be sent within ``send_timeout`` (a client that stopped reading a
  followed stream) ends the connection.
Long responses (long polls, followed streams) watch the connection for EOF and stop as soon as
the client is gone; what a client sends meanwhile is held up to one request's worth, and a
client that sends more is disconnected.

A large answer (a task of a MiB of argv shown in full, a session's environment) is encoded in
pieces (:func:`json_pieces`: no one C call walks more than :data:`PIECE` items), a few at a
time at its uid's turn (``Shares.heavy``), so that one tenant asking for it over and over on
many connections takes one slice of the event loop in turn with the others, not the loop.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import operator
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

import h11
import trio

from .peers import Peer
from .protocol import ApiError
from .quiet import Quiet
from .shares import Held, Shares

__all__ = ["HEAVY_ANSWER", "HttpLimits", "Later", "Request", "Response", "Streaming",
           "encode_in_turns",
           "json_pieces", "json_response", "serve_connection"]

log = logging.getLogger(__name__)


# header fields a request head may have (Apache's LimitRequestFields; a client sends a
# handful): h11 checks each one's name and value apart, and 3,200 tiny ones within the 16 KiB
# of a head were ~3 ms of one step of the loop a request (another tenant's p99 6.3x, an
# independent attack).  Counted as its lines come, before h11 reads a field of them.
MAX_HEADERS = 100


def _head_lines(head: bytes | bytearray) -> int:
    """The header fields of a request head that begins ``head`` (all its lines but the
    request line, up to the blank one: body bytes after it are not counted)."""
    ends = [i for i in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if i >= 0]
    if ends:  # (the last field's line end is the blank line's start)
        return head.count(b"\n", 0, min(ends))
    return head.count(b"\n") - 1  # (its complete lines but the request line)


def _first_twice(pairs: list[tuple[str, str]]) -> str:
    """The first name of ``pairs`` that an earlier pair has too."""
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            return name
        seen.add(name)
    return ""


class HttpLimits(NamedTuple):
    max_body: int = 1 << 20
    max_header_bytes: int = 16 * 1024
    header_timeout: float = 10.0
    idle_timeout: float = 300.0
    send_timeout: float = 30.0


class Request(NamedTuple):
    method: str
    path: str
    query: dict[str, str]
    body: bytes
    peer: Peer
    received: float = 0.0  # (trio's clock) when its first byte came: a wait bound counts from it


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = "application/json"
    obj: Any = None  # a large JSON answer, encoded in pieces as it is sent (``body``: empty)


Send = Callable[[bytes], Awaitable[None]]


class Streaming(NamedTuple):
    """An NDJSON (or other) body sent as it is produced, chunked: ``produce(send)`` calls
    ``await send(chunk)`` for each piece (a coroutine, so it may open nurseries)."""

    status: int
    produce: Callable[[Send], Awaitable[None]]
    content_type: str = "application/x-ndjson"
    release: Callable[[], None] | None = None  # called once the stream ends, however


class Later(NamedTuple):
    """An answer that waits (a submission's ``wait`` bound): the request's work is done at its
    uid's turn, the waiting is not: ``produce()`` runs as a long poll does, holding none of
    its uid's turns (four submissions waiting an hour held them all: the uid could not stop
    its own tasks meanwhile, an independent review), and ends once its client closes its
    end (watching it costs ~0.15 ms a submission: 5.57 against 5.41 ms, four runs each)."""

    produce: Callable[[], Awaitable[Response]]


Handler = Callable[[Request], Awaitable[Response | Streaming | Later]]
Router = Callable[[Request], tuple[Handler, bool, str]]  # handler, long, verb name


HEAVY_ANSWER = 64 << 10  # an answer weighing more is encoded in pieces, in turns
PIECE = 2048  # items of a list or object one C call of the encoder walks at most
PIECES_PER_TURN = 4  # pieces encoded at a time (about a millisecond)


def json_response(status: int, obj: Any, weight: int = 0) -> Response:
    """``obj`` as compact JSON.  ``weight``: about how many bytes it holds, if it grows with
    what a tenant sent (a task's request, a session's environment): above
    :data:`HEAVY_ANSWER`, it is encoded as it is sent, in pieces, at its uid's turn."""
    if weight > HEAVY_ANSWER:
        return Response(status, b"", obj=obj)
    return Response(status, json.dumps(obj, separators=_COMPACT).encode() + b"\n")


_COMPACT = (",", ":")
_CONTAINERS = frozenset((dict, list, tuple))
_VALUE = operator.itemgetter(1)


def _flat(values: Iterable[Any]) -> bool:
    """Whether none of ``values`` is a dict, list or tuple (by exact type, in C: a subclass
    is then encoded in its parent's piece, which is still exactly right)."""
    return _CONTAINERS.isdisjoint(map(type, values))


async def encode_in_turns(obj: Any,
                          turn: Callable[[], AbstractAsyncContextManager[None]]) -> bytes:
    """A large answer's JSON and its newline, a few pieces at a time, each at ``turn()``
    (its uid's: see the module docstring)."""
    parts: list[str] = []
    pieces = json_pieces(obj)
    while True:
        async with turn():
            taken = list(itertools.islice(pieces, PIECES_PER_TURN))
        parts += taken
        if len(taken) < PIECES_PER_TURN:
            break
    parts.append("\n")
    return "".join(parts).encode()


def json_pieces(obj: Any, piece: int = PIECE) -> Iterator[str]:
    """``json.dumps(obj, separators=(",", ":"))`` in pieces whose concatenation is exactly
    that; making one walks at most ``piece`` items of one container in C (a list of 65,000
    arguments is 32 calls of a fifth of a millisecond, not one of 7 ms holding the GIL)."""
    if isinstance(obj, dict):
        items = list(obj.items())
        yield "{"
        for start in range(0, len(items), piece):
            chunk = items[start:start + piece]
            lead = "," if start else ""
            if _flat(map(_VALUE, chunk)):
                yield lead + json.dumps(dict(chunk), separators=_COMPACT)[1:-1]
                continue
            for i, (k, v) in enumerate(chunk):
                # ({k: None} encodes the key as json.dumps would: '{"k":null}' less its ends)
                yield (lead if i == 0 else ",") + json.dumps({k: None},
                                                             separators=_COMPACT)[1:-5]
                yield from json_pieces(v, piece)
        yield "}"
    elif isinstance(obj, (list, tuple)):
        yield "["
        for start in range(0, len(obj), piece):
            values = obj[start:start + piece]
            if _flat(values):
                yield ("," if start else "") + json.dumps(list(values),
                                                          separators=_COMPACT)[1:-1]
                continue
            for i, v in enumerate(values):
                if start or i:
                    yield ","
                yield from json_pieces(v, piece)
        yield "]"
    else:
        yield json.dumps(obj, separators=_COMPACT)


def error_response(e: ApiError) -> Response:
    return json_response(e.status, e.to_json())


class _Closed(Exception):
    """The connection is over (EOF, timeout, a send that would not finish)."""


class Connection:
    def __init__(self, stream: trio.SocketStream, peer: Peer, limits: HttpLimits,
                 on_answer: Callable[[str, int], None], held: Held | None = None,
                 shares: Shares | None = None) -> None:
        self.stream = stream
        self.peer = peer
        self.limits = limits
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.on_answer = on_answer
        self.shed_reason: str | None = None  # why the daemon gave up on this client
        self.held = held or Held(peer.uid)  # (its uid's share: idle or not)
        self.shares = shares
        self.body_limit: Callable[[str, str, int], int] = lambda method, path, cap: cap
        self.body_taken = 0  # bytes of the current request's body counted in its uid's share

    async def _receive(self, deadline: float) -> bytes:
        """One read into h11 (b"" marks EOF) before ``deadline``; what came."""
        with trio.move_on_at(deadline):
            data = await self.stream.receive_some(65536)
            self.h11.receive_data(data)
            return data
        raise _Closed("timeout")

    async def _next_event(self, deadline: float) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            await self._receive(deadline)

    async def read_request(self) -> Request | None:
        """The next request, or None when the client closed; raises ApiError (4xx).

        Idle (nothing of a request yet) for up to ``idle_timeout``; from its first byte on,
        the whole request (head and body) has ``header_timeout``.  The head may be at most
        ``max_header_bytes``, however it arrives (h11's own bound only holds a head that
        comes in pieces)."""
        here = self.h11.trailing_data[0]  # what of it is here already (pipelined)
        held = len(here)
        first: float | None = trio.current_time() if held else None
        self.held.idle = first is None
        came = 0
        cap = self.limits.max_header_bytes + 4
        coming = bytearray(here[:cap])  # (its head as it comes: its lines are counted first)
        lines = coming.count(b"\n")
        while True:
            if lines > MAX_HEADERS and _head_lines(coming) > MAX_HEADERS:
                raise ApiError(431, "too_many_headers", f"the request head has more than "
                               f"{MAX_HEADERS} header fields; send fewer (a client sends a "
                               f"handful)")
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                break
            deadline = (first + self.limits.header_timeout if first is not None
                        else trio.current_time() + self.limits.idle_timeout)
            try:
                data = await self._receive(deadline)
            except _Closed:
                if first is None:
                    self.shed_reason = "idle_timeout"
                    return None
                self.shed_reason = "header_timeout"
                raise ApiError(408, "timeout", f"the request head did not arrive within "
                               f"{self.limits.header_timeout:g}s of its first byte") from None
            came += len(data)
            if len(coming) < cap:
                coming += data[:cap - len(coming)]
                lines += data.count(b"\n")
            if first is None and data:
                first = trio.current_time()
                self.held.idle = False
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise ApiError(400, "bad_request", f"expected a request, got {type(event).__name__}")
        head = held + came - len(self.h11.trailing_data[0])
        if head > self.limits.max_header_bytes:
            raise ApiError(431, "headers_too_large", f"the request head is {head} bytes, above "
                           f"the daemon's limit of {self.limits.max_header_bytes} bytes; send "
                           f"fewer or shorter headers")
        start = trio.current_time() if first is None else first
        body = await self._read_body(event, start + self.limits.header_timeout)
        url = urlsplit(event.target.decode("ascii", "replace"))
        pairs = parse_qsl(url.query, keep_blank_values=True)
        query = dict(pairs)
        if len(query) < len(pairs):  # (the last one was taken, silently: which counts?)
            twice = _first_twice(pairs)
            raise ApiError(400, "bad_request", f"the query parameter {twice!r} is given twice; "
                           f"give it once", twice)
        # (the path as sent, never percent-decoded: every path and id of the API is plain
        # ASCII, so each is written one way, and "/v1/tasks/%31" is no task)
        return Request(event.method.decode("ascii", "replace"), url.path, query, body,
                       self.peer, start)

    async def _read_body(self, request: h11.Request, deadline: float) -> bytes:
        cap = self.body_limit(request.method.decode("ascii", "replace"),
                              urlsplit(request.target.decode("ascii", "replace")).path,
                              self.limits.max_body)
        for name, value in request.headers:
            if name == b"content-length":
                if int(value) > cap:
                    raise _too_large(int(value), cap, self.limits.max_body)
                self._take_body(int(value))  # (the whole body, before a byte of it is read)
            elif name == b"transfer-encoding":
                # a chunked body is read one h11 event per chunk: a byte a chunk costs the
                # event loop a million rounds a MiB.  Clients send the length (curl does).
                raise ApiError(411, "length_required", "send the request body with a "
                               "Content-Length, not chunked (Transfer-Encoding)")
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                event = await self._next_event(deadline)
            except _Closed:
                raise ApiError(408, "timeout", "the request body did not arrive within "
                               f"{self.limits.header_timeout:g}s") from None
            if isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            if isinstance(event, h11.ConnectionClosed):
                raise _Closed("eof in body")
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > cap:
                    raise _too_large(size, cap, self.limits.max_body)
                if size > self.body_taken:  # (chunked: counted as it comes)
                    self._take_body(size - self.body_taken)
                parts.append(bytes(event.data))

    def _take_body(self, size: int) -> None:
        """Count ``size`` more bytes of this request's body in its uid's share; ApiError 429
        past it (see ``shares.py``)."""
        if self.shares is None or not size:
            return
        if not self.shares.take_body(self.peer.uid, size):
            raise ApiError(429, "busy", f"the requests your uid's connections are sending "
                           f"hold {self.shares.bodies[self.peer.uid]} bytes, and this one "
                           f"{size} more: above your share "
                           f"({self.shares.body_bytes} bytes); send them one after another")
        self.body_taken += size

    def give_back_body(self) -> None:
        """The request is answered: its body leaves its uid's share."""
        if self.shares is not None and self.body_taken:
            self.shares.give_body(self.peer.uid, self.body_taken)
        self.body_taken = 0

    async def send_bytes(self, data: bytes) -> None:
        with trio.move_on_after(self.limits.send_timeout):
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                raise _Closed("peer gone") from e
            return
        self.shed_reason = "send_timeout"
        raise _Closed("send timeout")

    def heavy_turn(self) -> AbstractAsyncContextManager[None]:
        """Held while making a piece of a large answer or of a stream: one of each uid's at
        a time (``Shares.heavy``)."""
        if self.shares is None:
            return contextlib.nullcontext()
        return self.shares.heavy(self.peer.uid)

    async def send_response(self, resp: Response) -> None:
        if resp.obj is not None:
            resp = resp._replace(body=await encode_in_turns(resp.obj, self.heavy_turn),
                                 obj=None)
        headers = [("content-type", resp.content_type), ("content-length", str(len(resp.body)))]
        if self.h11.their_state is not h11.DONE:
            headers.append(("connection", "close"))  # its body was not read: no next request
        head = self.h11.send(h11.Response(status_code=resp.status, headers=headers))
        body = self.h11.send_with_data_passthrough(h11.Data(data=resp.body)) or []
        end = self.h11.send(h11.EndOfMessage())
        if len(resp.body) <= HEAVY_ANSWER:
            # one write for the whole answer: each send is a syscall and a trio checkpoint
            await self.send_bytes(b"".join([head, *body, end]))
            return
        # (a large body is sent as it is: copying MiBs to put a head before them took more
        # of the event loop than sending them)
        for piece in [head, *body, end]:
            if piece:
                await self.send_bytes(piece)

    async def send_streaming(self, resp: Streaming) -> None:
        try:
            await self.send_bytes(self.h11.send(h11.Response(
                status_code=resp.status, headers=[("content-type", resp.content_type)])))

            async def send(chunk: bytes) -> None:
                if len(chunk) <= HEAVY_ANSWER:
                    await self.send_bytes(self.h11.send(h11.Data(data=chunk)))
                    return
                # (a large chunk, a task's last frame with a MiB of command, kept for every
                # reader of it: sent as it is, not joined into a copy for each)
                for piece in self.h11.send_with_data_passthrough(h11.Data(data=chunk)) or []:
                    await self.send_bytes(piece)

            await resp.produce(send)
            await self.send_bytes(self.h11.send(h11.EndOfMessage()))
        finally:
            if resp.release is not None:
                resp.release()

    async def watch_eof(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when the client closes its end (while a long answer is made).
        What the client sends meanwhile is kept for later (a pipelined request), up to a
        request head's worth: a client that sends more while it waits is disconnected,
        never buffered without bound."""
        room = self.limits.max_header_bytes
        while True:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                scope.cancel()
                return
            self.h11.receive_data(data)
            if len(self.h11.trailing_data[0]) > room:
                self.shed_reason = "flood"
                scope.cancel()
                return


def _too_large(size: int, cap: int, max_body: int) -> ApiError:
    if cap < max_body:  # (a verb whose body is small: routes.body_limit)
        return ApiError(413, "body_too_large", f"the request body is {size} bytes, above "
                        f"{cap} bytes, the most this request takes (only a task's submission, "
                        f"its stdin and a session's command may be up to --max-body); send "
                        f"less")
    return ApiError(413, "body_too_large", f"the request body is {size} bytes, above the "
                    f"daemon's limit of {cap} bytes (--max-body); send less (write large stdin "
                    f"in several POST /v1/tasks/ID/stdin requests)")


# (a tenant's request answered 500, repeated: one traceback a minute per uid)
_INTERNAL = Quiet(whose=" of this uid's")


async def _handle(handler: Handler, req: Request) -> Response | Streaming | Later:
    try:
        return await handler(req)
    except ApiError as e:
        return error_response(e)
    except Exception as e:
        # a bug of ours: this request fails, the daemon and everyone else's go on
        _INTERNAL.say(req.peer.uid, log.exception, "answering %s %s (uid %d)", req.method,
                      req.path, req.peer.uid)
        return json_response(500, {"error": {
            "code": "internal", "field": None,
            "message": f"corral hit an internal error answering this request (a bug; please "
                       f"report it with the daemon's log): {e!r}"}})


async def _answer_long(conn: Connection, req: Request, handler: Handler, verb: str) -> bool:
    """A long poll or a stream, abandoned as soon as the client closes its end."""
    resp: Response | Streaming | Later | None = None
    gone = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.watch_eof, nursery.cancel_scope)
            resp = await _handle(handler, req)
            assert not isinstance(resp, Later)  # (a long poll waits in its handler)
            await _send(conn, resp, verb)
            nursery.cancel_scope.cancel()
    except* (_Closed, trio.BrokenResourceError, trio.ClosedResourceError):
        gone = True
    return not gone and resp is not None and conn.h11.our_state is h11.DONE


async def _answer(conn: Connection, req: Request, router: Router) -> bool:
    """Route, run and send one request's answer; False when the connection must end.  A
    request no route takes (404, 405) is paced and takes its turns as any other: answered at
    once, a tenant's 4 connections asking for a path that is none got 5,500 answers a second
    past the uid's rate, and another tenant's p99 went 4 -> 70 ms (an independent attack)."""
    try:
        handler, long, verb = router(req)
    except ApiError as e:
        refusal = error_response(e)

        async def refuse(_: Request) -> Response:
            return refusal

        handler, long, verb = refuse, False, "unknown"
    if conn.shares is not None:
        if wait := conn.shares.pace(req.peer.uid):
            await trio.sleep(wait)
        await conn.shares.loop.wait(req.peer.uid)  # (over its share of the loop: shares.py)
    if long:
        return await _answer_long(conn, req, handler, verb)
    if conn.shares is None:
        later = await _answer_now(conn, req, handler, verb)
    else:
        # (the sending too: a client that does not read its answers holds its own turns)
        async with conn.shares.turn(req.peer.uid):
            later = await _answer_now(conn, req, handler, verb)
    if later is not None:  # (its waiting holds no turn: Later)
        return await _answer_long(conn, req, lambda _: later.produce(), verb)
    return True


async def _answer_now(conn: Connection, req: Request, handler: Handler, verb: str
                      ) -> Later | None:
    resp = await _handle(handler, req)
    if isinstance(resp, Later):
        return resp
    await _send(conn, resp, verb)
    return None


async def _send(conn: Connection, resp: Response | Streaming, verb: str) -> None:
    conn.on_answer(verb, resp.status)
    if isinstance(resp, Streaming):
        await conn.send_streaming(resp)
    else:
        await conn.send_response(resp)


async def serve_connection(stream: trio.SocketStream, peer: Peer, limits: HttpLimits,
                           router: Router, on_answer: Callable[[str, int], None],
                           held: Held | None = None, shares: Shares | None = None,
                           body_limit: Callable[[str, str, int], int] | None = None,
                           ) -> str | None:
    """Answer requests on one connection until it closes or breaks a limit; why the daemon
    ended it (``send_timeout``, ``idle_timeout``, ...), or None if the client did.
    ``held``/``shares``: its place in its uid's share of the daemon (``shares.py``)."""
    conn = Connection(stream, peer, limits, on_answer, held, shares)
    if body_limit is not None:
        conn.body_limit = body_limit
    try:
        await _serve(conn, stream, router)
    finally:
        conn.give_back_body()
    return conn.shed_reason


async def _serve(conn: Connection, stream: trio.SocketStream, router: Router) -> None:
    try:
        async with stream:
            while True:
                try:
                    req = await conn.read_request()
                except ApiError as e:
                    await _refuse(conn, e)
                    return
                except h11.RemoteProtocolError as e:
                    # (h11 hints 501 for a transfer-encoding it lacks: still the client's fault)
                    status = e.error_status_hint if e.error_status_hint < 500 else 400
                    code = "headers_too_large" if status == 431 else "bad_request"
                    await _refuse(conn, ApiError(status, code, f"not a valid HTTP/1.1 "
                                                 f"request: {e}"))
                    return
                if req is None:
                    return
                try:
                    if not await _answer(conn, req, router):
                        return
                finally:
                    conn.give_back_body()
                if conn.h11.our_state is not h11.DONE or conn.h11.their_state is not h11.DONE:
                    return
                conn.h11.start_next_cycle()
    except _Closed:
        return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def _refuse(conn: Connection, e: ApiError) -> None:
    conn.on_answer("invalid", e.status)
    if conn.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
        try:
            await conn.send_response(error_response(e))
        except (_Closed, h11.LocalProtocolError):
            pass
