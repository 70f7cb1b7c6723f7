"""``GET /v1/tasks/ID/output?stream=stdout&offset=N&follow=true``: NDJSON frames
(``tail=N`` instead of ``offset``: from the stream's last N bytes; past a capped file's end,
a gap and the kept tail, as from any offset there).

Every byte a task writes goes to its output file in the state directory (the core's
``log_file``, lossless up to ``--output-cap``), so any offset the file holds can be read again:
a client that reconnects with the offset after its last frame loses nothing.  Frames::

    {"stream": "stdout", "offset": N, "data": "<base64>"}   bytes N .. N+len
    {"stream": "stdout", "gap": [A, B]}                     bytes A .. B are no longer held
    {"end": true, "result": {...}}                          the task ended; nothing follows
    {"end": false, "offset": N, "state": "running"}         not following: resume at N

Past the cap, the file stops growing; at the end the result's kept tail (the last bytes) is
sent after a gap frame that says exactly which bytes are lost.  A follower is woken by the
task's output (``TaskHandle.on_output``: each chunk only wakes it, and the bytes come from the
file).  A reader, following or not, holds the one piece it is being sent, from its making until
it is sent, and a uid's readers hold at most ``Shares.output_piece``'s number of pieces at once
(250 readers of a tenant reading a byte at a time held ~260 KB each, counted in no share); a
reader of a task no longer in memory holds none of its request (its command: up to a MiB)
while it reads, and a finished task's large last frame (its result) is encoded once, at its
uid's turns, and shared by its readers (``Daemon.end_frame``).  Each chunk is
read and encoded at the caller's uid's turn (``Shares.heavy``): sixteen readers of one uid
take one slice of the event loop in turn with the others, not sixteen.  A follower reads at
most every :data:`REST` seconds while the output keeps coming (a task printing a line at a
time woke each follower for each line), and a uid follows at most :data:`FOLLOWERS` outputs
at once (root: any; 429 ``too_many_streams``): 64 followers of one tenant's task printing
`x` in a loop took another tenant's median from 8 to 79-138 ms, and its slowest to 0.5-0.8 s
(an independent attack); with the rest, 64 or 200 of them cost it about what one does
(benchmarks/bench_tenants.py trickle_followers, pinned: p99 22.6 and 23.2 ms against 14.5
alone).  The bound is of what a uid holds (a file and a connection each), wide enough for 32
`corral submit -f` of one uid at once (each follows two).
"""

from __future__ import annotations

import binascii
import functools
import json
import math
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from ..daemontask import served_result, stream_path
from ..http import HEAVY_ANSWER, Request, Send, Streaming
from ..protocol import ApiError, gap_frame, invalid, query_bool, query_int

if TYPE_CHECKING:
    from ..daemontask import DaemonTask
    from ..peers import Peer
    from ..state import Daemon

CHUNK = 64 * 1024
POLL = 1.0  # a safety net: the subscription wakes followers
REST = 0.01  # seconds a follower waits after a read before the next (the output coming on)
FOLLOWERS = 64  # followed outputs a uid may have open at once (root: any)


Turn = Callable[[], AbstractAsyncContextManager[None]]


class _Turns(NamedTuple):
    """A reader's uid's turns: ``heavy``, to make a piece (``Shares.heavy``); ``piece``, held
    from its making until it is sent (``Shares.output_piece``)."""

    heavy: Turn
    piece: Turn


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _data_line(stream: str, offset: int, data: bytes) -> bytes:
    """``_line({"stream": stream, "offset": offset, "data": <data in base64>})``, made
    without the JSON encoder (base64 needs no escaping): a quarter of the cost of a 64 KiB
    chunk."""
    return b'{"stream":"%s","offset":%d,"data":"%s"}\n' % (
        stream.encode(), offset, binascii.b2a_base64(data, newline=False))


async def handle(d: Daemon, req: Request, id: str) -> Streaming:
    stream = req.query.get("stream", "stdout")
    if stream not in ("stdout", "stderr"):
        raise invalid("stream", f"?stream= must be stdout or stderr, got {stream!r}")
    offset = query_int(req.query, "offset", 0)
    tail = query_int(req.query, "tail", 0) if "tail" in req.query else None
    if tail is not None and "offset" in req.query:
        raise invalid("tail", f"?tail={tail} and ?offset={offset} both given: tail=N reads "
                              f"from the stream's last N bytes, offset=N from byte N; give "
                              f"one of them")
    follow = query_bool(req.query, "follow")
    t = await d.find(req.peer, id)
    uid = req.peer.uid

    turns = _Turns(lambda: d.shares.heavy(uid), lambda: d.shares.output_piece(uid))
    if t is None:
        row = await d.find_row(req.peer, id, ending=True)
        path = os.path.join(d.output_dir, row["id"])
        if tail is not None:
            offset = max(0, (_total(row.get("result"), stream)
                             or _file_size(stream_path(path, stream))) - tail)
        peer = req.peer

        async def last(state: str, pos: int) -> bytes:
            return await _recorded_end(d, peer, id, path, state, pos)

        return Streaming(200, _Recorded(row, stream, offset, path, turns, last).produce)
    if tail is not None:  # (the last ``tail`` bytes: a reattaching terminal's screen)
        offset = max(0, _stream_total(t, stream) - tail)
    task = t

    async def end() -> bytes:
        return await _end(d, uid, task)

    if not follow:
        return Streaming(200, _Follower(t, stream, offset, follow, turns, end).produce)
    if d.following[uid] >= FOLLOWERS and not req.peer.is_root:
        raise ApiError(429, "too_many_streams", f"uid {uid} follows {d.following[uid]} "
                       f"outputs (?follow=true), the most one uid may at once; close one "
                       f"first, or read without follow and ask again from the offset after")
    d.following[uid] += 1  # (no checkpoint from here until the stream's release is armed)

    def unfollow() -> None:
        d.following[uid] -= 1
        if d.following[uid] <= 0:
            del d.following[uid]

    return Streaming(200, _Follower(t, stream, offset, follow, turns, end).produce,
                     release=unfollow)


def _stream_total(t: DaemonTask, stream: str) -> int:
    """Bytes ``stream`` of ``t`` has had so far: past the cap of its file too (a capped
    file's size counted from the file's end: ``tail=0`` of a finished task sent the 48 KiB
    of its kept tail)."""
    kept = t.kept.get(stream)
    if kept is not None:  # (finished)
        return kept[0]
    if t.handle is not None:
        return t.handle.output(stream).total
    return _file_size(stream_path(t.output, stream))


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class _Wake:
    """Set on every chunk of the task's output, and when its output ends."""

    def __init__(self) -> None:
        self.event = trio.Event()

    async def drain(self, t: DaemonTask, stream: str) -> None:
        """Woken by the task's output once it runs, until cancelled.  (No subscription to
        its bytes: each follower had one, up to 64 chunks of 1 MiB copied for it whatever it
        read, and 16 followers of one tenant's flooding tasks took the daemon to 1 GB.)"""
        await t.started.wait()
        handle = t.handle
        if handle is None:
            self.event.set()
            return
        stop = handle.on_output(stream, self.set)
        try:
            await trio.sleep_forever()
        finally:
            stop()

    def set(self) -> None:
        self.event.set()

    async def wait(self) -> None:
        with trio.move_on_after(POLL):
            await self.event.wait()
        self.event = trio.Event()


class _Follower:
    def __init__(self, t: DaemonTask, stream: str, offset: int, follow: bool,
                 turns: _Turns, end: Callable[[], Awaitable[bytes]]) -> None:
        self.t = t
        self.end = end
        self.turn = turns.heavy
        self.piece = turns.piece
        self.stream = stream
        self.pos = offset
        self.follow = follow
        self.path = t.output if stream == "stdout" else t.output + ".stderr"
        self.fd: int | None = None

    def _read(self) -> bytes:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return b""
        return os.pread(self.fd, CHUNK, self.pos)

    async def produce(self, send: Send) -> None:
        try:
            async with trio.open_nursery() as nursery:
                wake = _Wake()
                if self.follow:
                    nursery.start_soon(wake.drain, self.t, self.stream)
                await self._loop(send, wake)
                nursery.cancel_scope.cancel()
        finally:
            if self.fd is not None:
                os.close(self.fd)

    async def _loop(self, send: Send, wake: _Wake) -> None:
        t = self.t
        caught_up = -math.inf  # when a read last took less than a chunk (the file's end)
        while True:
            if self.follow and not t.done.is_set() and (
                    rest := caught_up + REST - trio.current_time()) > 0:
                await trio.sleep(rest)  # (what comes meanwhile is read in one go)
            done = t.done.is_set()  # before reading: then the file is complete
            async with self.piece():
                async with self.turn():
                    data = self._read()
                    line = _data_line(self.stream, self.pos, data) if data else b""
                read = len(data)
                del data  # (what a reader that does not read holds is its line alone)
                if read:
                    await send(line)
                del line  # (nor is that held while it waits for its next piece)
            if read < CHUNK:
                caught_up = trio.current_time()
            if read:
                self.pos += read
                continue
            if done:
                total = t.kept.get(self.stream, (self.pos, b""))[0]
                await _after_file(send, self, total, functools.partial(_kept_tail, t,
                                                                       self.stream))
                async with self.piece():
                    await send(await self.end())
                return
            if not self.follow:
                await send(_line({"end": False, "offset": self.pos, "state": t.live_state}))
                return
            await wake.wait()


async def _after_file(send: Send, reader: _Follower | _Recorded, total: int,
                      tail: Callable[[], bytes]) -> None:
    """What the file does not hold (past the cap): a gap, then the kept tail (``tail()``: the
    last bytes, ending at ``total``, at most 48 KiB), as one of the reader's pieces (a reader
    waiting for its turn holds no copy of it)."""
    if reader.pos >= total:
        return
    async with reader.piece():
        kept = tail()
        tail_start = total - len(kept)
        if reader.pos < tail_start:
            await send(_line(gap_frame(reader.stream, reader.pos, tail_start)))
            reader.pos = tail_start
        rest = kept[reader.pos - tail_start:]
        del kept
        for i in range(0, len(rest), CHUNK):
            piece = rest[i:i + CHUNK]
            async with reader.turn():
                line = _data_line(reader.stream, reader.pos, piece)
            await send(line)
            del line
            reader.pos += len(piece)


class _Recorded:
    """A task the daemon no longer holds in memory: the file, then a gap to the total.  Its
    row is read without its request (``rows.ending``) and its request only for the last frame
    (:func:`_recorded_end`), never held while the file is sent: a request holds the task's
    command, a MiB of it at most, and a tenant's 250 slow readers of such a task each held
    their copy for as long as they read."""

    def __init__(self, row: dict[str, Any], stream: str, offset: int, path: str,
                 turns: _Turns, last: Callable[[str, int], Awaitable[bytes]]) -> None:
        self.turn = turns.heavy
        self.piece = turns.piece
        self.last = last
        self.output = path
        self.path = stream_path(path, stream)
        self.stream = stream
        self.pos = offset
        self.state: str = row["state"]
        self.total = _total(row.get("result"), stream)

    async def produce(self, send: Send) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = None
        try:
            while fd is not None:
                async with self.piece():
                    async with self.turn():
                        data = os.pread(fd, CHUNK, self.pos)
                        line = _data_line(self.stream, self.pos, data) if data else b""
                    read = len(data)
                    del data
                    if read:
                        await send(line)
                    del line
                if not read:
                    break
                self.pos += read
        finally:
            if fd is not None:
                os.close(fd)
        await _after_file(send, self, self.total, lambda: _read_tail(self.path))
        async with self.piece():
            await send(await self.last(self.state, self.pos))


async def _end(d: Daemon, uid: int, t: DaemonTask) -> bytes:
    """A task in memory's last frame: its result (encoded in turns and kept, if large)."""

    def make() -> dict[str, Any]:
        return {"end": True, "exit_status": t.exit_status,
                "result": served_result(t.result_json, t.output, t.request.argv)}

    if t.weight <= HEAVY_ANSWER:
        return _line(make())
    return await d.end_frame(uid, t.id, t.recorded, make)


async def _recorded_end(d: Daemon, peer: Peer, task_id: str, output: str, state: str,
                        pos: int) -> bytes:
    """A task no longer in memory's last frame, from its row read again (its result kept, if
    large); ``state`` was the row's when the stream began: if retention removed the row
    since, a finished task's result is null."""
    try:
        body = await d.recorded_answer(peer, task_id, end=True)
        if body is not None:
            return body
        row: dict[str, Any] | None = await d.find_row(peer, task_id)
    except ApiError:
        row = None
    if row is None or row["state"] != "finished":
        if state == "finished":
            return _line({"end": True, "exit_status": None, "result": None})
        return _line({"end": False, "offset": pos, "state": state})
    return _line({"end": True, "exit_status": row["exit_status"],  # (small: above, if large)
                  "result": served_result(row.get("result"), output, row["spec"]["argv"])})


def _kept_tail(t: DaemonTask, stream: str) -> bytes:
    return t.kept.get(stream, (0, b""))[1]


def _read_tail(path: str) -> bytes:
    try:
        with open(path + ".tail", "rb") as f:
            return f.read()
    except OSError:
        return b""  # no tail kept (the file was not capped): the file has every byte


def _total(result: dict[str, Any] | None, stream: str) -> int:
    """Bytes the stream had, from a recorded result (either JSON shape the core has had)."""
    if not result:
        return 0
    nested = (result.get("output") or {}).get(stream) or {}
    flat = result.get(f"output_{stream}") or {}
    return int(nested.get("total_bytes", flat.get("total", 0)))
