"""What corral keeps of a task's output stream: head, tail ring, counts, a capped log file,
and the live readers: subscribers (bounded: they miss chunks rather than grow) and taps
(lossless: they hold the stream still until read).

A capture is fed by the I/O reactor (``_output.py``) one chunk at a time; every chunk is
copied out of the reactor's shared buffer here, before the next read.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ._outfile import open_output
from ._result import StreamOutput

__all__ = ["SUBSCRIBER_BUFFER", "TAP_BUFFER", "StreamCapture", "Subscriber", "Tap"]

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 64  # chunks a subscriber may lag behind before it misses some
TAP_BUFFER = 1 << 18  # bytes a tap may hold unread before the stream waits for it


def open_log(path: str, *, append: bool = False) -> int:
    """A log file's fd (created, or truncated unless ``append``).  A regular file only: a
    FIFO or a device may block the event loop in open() or in each write; OSError then,
    naming the file, the rule and the fix.  Never through a symbolic link (:func:`open_output`)."""
    flags = os.O_WRONLY | os.O_NONBLOCK
    flags |= os.O_APPEND if append else os.O_CREAT | os.O_TRUNC
    refusal = (f"log_file {path} is not a regular file (a FIFO or a device could block "
               f"corral's writes); give the path of a plain file")
    try:
        # (O_NONBLOCK: a FIFO without a reader says ENXIO)
        fd = open_output(path, flags, "log_file", 0o600)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OSError(errno.EINVAL, refusal) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, refusal)
    return fd


@dataclass(eq=False, slots=True)
class Subscriber:
    """A live reader of one stream.  Never grows memory: when it lags more than
    ``SUBSCRIBER_BUFFER`` chunks, chunks are dropped for it and counted in ``missed``."""

    send: trio.MemorySendChannel[bytes]
    missed: int = 0


class Tap:
    """A lossless reader of one stream: every byte, in order, with back-pressure.

    Where a :class:`Subscriber` misses chunks rather than grow, a tap holds the stream still:
    once ``TAP_BUFFER`` bytes wait for it, the reactor stops reading the pipe (so the task
    blocks on its own writes, as it would on a slow terminal) until the tap is read again.
    ``corral run --pty`` mirrors the task's terminal to the real one through a tap.
    """

    __slots__ = ("buffer", "closed", "on_drained", "ready")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.closed = False
        self.ready = trio.Event()  # set when bytes (or the end) wait
        self.on_drained: Callable[[], None] | None = None  # the reactor's: read again

    def put(self, data: bytes | memoryview) -> bool:
        """Take a chunk; False when the tap is full and the stream should wait."""
        self.buffer += data
        self.ready.set()
        return len(self.buffer) < TAP_BUFFER

    def end(self) -> None:
        self.closed = True
        self.ready.set()

    async def receive(self) -> bytes:
        """The next bytes; b"" once the stream has ended and everything was read."""
        while not self.buffer and not self.closed:
            self.ready = trio.Event()
            await self.ready.wait()
        data, self.buffer = bytes(self.buffer), bytearray()
        if self.on_drained is not None and data:
            self.on_drained()
        return data

    def __aiter__(self) -> Tap:
        return self

    async def __anext__(self) -> bytes:
        data = await self.receive()
        if not data:
            raise StopAsyncIteration
        return data


@dataclass(eq=False, slots=True)
class StreamCapture:
    """What we keep of one stream: head, tail ring, total, and optionally a capped log file."""

    head_limit: int
    tail_limit: int
    log_fd: int | None = None
    log_limit: int | None = None
    log_path: str | None = None
    log_pending: bool = False  # the log file is made at the first byte (TaskSpec.log_lazy)
    # made on the first byte (and subscribers on the first subscriber): a supervisor may hold
    # thousands of quiet tasks
    head: bytearray | None = None
    tail: bytearray | None = None
    total: int = 0
    last_at: float = 0.0  # trio time of the last chunk (the idle timeout reads it)
    log_written: int = 0
    log_truncated: bool = False
    subscribers: list[Subscriber] | None = None
    # told of each chunk and of the end, with no bytes: readers of the log file (the daemon's
    # followers), whom the capture never holds output for, nor reads every byte for
    watchers: list[Callable[[], None]] | None = None
    tap: Tap | None = None
    tap_full: bool = False  # the tap is full: the reactor stops reading this stream
    closed: bool = False
    mode: str = "capture"

    def feed(self, data: bytes | memoryview) -> None:
        """Take one chunk.  ``data`` may be a view of a reused buffer: it is copied here."""
        self.total += len(data)
        self.last_at = trio.current_time()
        view = memoryview(data)
        if self.head is None:
            self.head, self.tail = bytearray(), bytearray()
        assert self.tail is not None
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += view[:room]
            view = view[room:]
        if view and self.tail_limit:
            self.tail += view[-self.tail_limit:]
            # amortised: trim only when the ring has doubled
            excess = len(self.tail) - self.tail_limit
            if excess > self.tail_limit:
                del self.tail[:excess]
        if self.log_fd is not None or (self.log_pending and self._open_pending()):
            self._log(data)
        if self.tap is not None and not self.tap.put(data):
            self.tap_full = True
        if self.subscribers:
            chunk = bytes(data)
            for sub in self.subscribers:
                try:
                    sub.send.send_nowait(chunk)
                except trio.WouldBlock:
                    sub.missed += len(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        self._tell()

    def _tell(self) -> None:
        for watcher in self.watchers or ():
            watcher()

    def watch(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """``watcher()`` at each chunk from now on and at the end of the stream (at once if it
        has ended); what stops it."""
        if self.closed:
            watcher()
            return lambda: None
        if self.watchers is None:
            self.watchers = []
        self.watchers.append(watcher)

        def stop() -> None:
            if self.watchers is not None and watcher in self.watchers:
                self.watchers.remove(watcher)

        return stop

    def passable(self) -> bool:
        """Bytes may now pass by unread (:meth:`pass_by`): the head is full and no subscriber
        or tap wants every byte."""
        return (self.head is not None and len(self.head) >= self.head_limit
                and not self.subscribers and self.tap is None)

    def pass_by(self, fd: int, n: int, sink: int) -> int:
        """Take the next ``n`` bytes of pipe ``fd`` without copying them to us: spliced into
        the log file while it has room, else into ``sink`` (/dev/null).  The caller saw at
        least ``tail_limit`` more behind them, which will push everything the tail holds now
        out of it.  Returns how many were taken; 0 when they cannot be spliced (a terminal,
        a log file opened to append): read them then."""
        out = sink
        if self.log_pending:
            self._open_pending()
        if self.log_fd is not None:
            room = n if self.log_limit is None else self.log_limit - self.log_written
            if room > 0:
                out, n = self.log_fd, min(n, room)
            else:
                self.log_truncated = True
        try:
            moved = os.splice(fd, out, n, flags=os.SPLICE_F_NONBLOCK)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return 0
            if out == sink:
                raise
            self._log_failed(e)
            return 0
        if out != sink:
            self.log_written += moved
        self.total += moved
        self.last_at = trio.current_time()
        if self.tail:
            del self.tail[:]
        self._tell()
        return moved

    def _log(self, data: bytes | memoryview) -> None:
        assert self.log_fd is not None
        if self.log_limit is not None:
            room = self.log_limit - self.log_written
            if room < len(data):
                self.log_truncated = True
                data = data[:max(room, 0)]
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.log_fd, view)
            except OSError as e:
                self._log_failed(e)
                return
            self.log_written += n
            view = view[n:]

    def _open_pending(self) -> bool:
        """Make the lazy log file (its stream's first byte came); whether it is open."""
        assert self.log_path is not None
        self.log_pending = False
        try:
            self.log_fd = open_log(self.log_path)
        except OSError as e:
            log.warning("log file %s: %s; the output is kept in memory only", self.log_path, e)
            self.log_truncated = True
            return False
        return True

    def _log_failed(self, e: OSError) -> None:
        # a full disk must not stop the task or lose the in-memory capture
        assert self.log_fd is not None
        log.warning("log file %s: %s; writing stops here", self.log_path, e)
        self.log_truncated = True
        os.close(self.log_fd)
        self.log_fd = None

    def subscribe(self) -> trio.MemoryReceiveChannel[bytes]:
        """The stream from its start as far as it is kept, then live.

        First what is kept so far (the head, then the tail; bytes dropped between them are
        counted in the subscriber's ``missed``), then every new chunk; the channel closes at
        the end of the stream.  So a subscriber that comes late still sees the first line.
        """
        send, recv = trio.open_memory_channel[bytes](SUBSCRIBER_BUFFER)
        sub = Subscriber(send)
        kept = self.result()
        sub.missed = kept.dropped
        for part in (kept.head, kept.tail):
            if part:
                send.send_nowait(part)
        if self.closed:
            send.close()
        else:
            if self.subscribers is None:
                self.subscribers = []
            self.subscribers.append(sub)
        return recv

    def open_tap(self) -> Tap:
        """A lossless reader of the stream from now on (one per stream)."""
        if self.tap is not None:
            raise RuntimeError("this stream already has a tap")
        self.tap = Tap()
        if self.closed:
            self.tap.end()
        return self.tap

    def close(self) -> None:
        """End of stream: subscribers see the channel close; the log file is closed."""
        self.closed = True
        self.log_pending = False
        if self.tap is not None:
            self.tap.end()
        for sub in self.subscribers or ():
            sub.send.close()
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None
        self._tell()
        self.watchers = None

    def export(self) -> dict[str, Any]:
        """What a next process needs to carry this capture on (a hand-over).  A lazy log
        file not made yet is made now: the next process appends to it, as to any."""
        if self.log_pending:
            self._open_pending()
        return {"mode": self.mode, "head_limit": self.head_limit, "tail_limit": self.tail_limit,
                "head": base64.b64encode(self.head or b"").decode(),
                "tail": base64.b64encode(self.tail[-self.tail_limit:] if self.tail and
                                         self.tail_limit else b"").decode(),
                "total": self.total, "log_path": self.log_path, "log_limit": self.log_limit,
                "log_written": self.log_written, "log_truncated": self.log_truncated,
                "closed": self.closed}

    @classmethod
    def restore(cls, state: dict[str, Any]) -> StreamCapture:
        """The capture :meth:`export` described; its log file reopened to append."""
        cap = cls(state["head_limit"], state["tail_limit"], log_limit=state["log_limit"],
                  log_path=state["log_path"], head=bytearray(base64.b64decode(state["head"])),
                  tail=bytearray(base64.b64decode(state["tail"])), total=state["total"],
                  log_written=state["log_written"], log_truncated=state["log_truncated"],
                  mode=state["mode"])
        if cap.log_path is not None and not state["closed"]:
            cap.log_fd = open_log(cap.log_path, append=True)
        if state["closed"]:
            cap.close()
        return cap

    def result(self) -> StreamOutput:
        head = bytes(self.head or b"")
        tail = bytes(self.tail[-self.tail_limit:]) if self.tail and self.tail_limit else b""
        dropped = self.total - len(head) - len(tail)
        return StreamOutput(head, tail, self.total, dropped, self.log_path,
                            self.log_truncated, self.mode)
