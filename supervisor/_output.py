"""A task's pipes: drain its output continuously into head/tail rings, feed its stdin.

Why not trio's streams: they cost ~30% throughput at GB scale, and we never need their
buffering.  One :class:`IoReactor` per supervisor holds every task's pipes in one epoll set, read
and written by one trio task: a chatty task never blocks on a full pipe (no deadlock at any
size), memory stays bounded (the head is filled once, the tail is a ring, the rest is counted),
and a held task costs no trio task of its own for its I/O.

End of output does not wait on EOF alone: a setsid'd grandchild may hold the pipe forever.  The
task's life gives each stream a short deadline once the leaf is empty (everything in it is gone,
so any writer left is outside it), then removes it: what is buffered is read, the rest dropped.

Streams are registered and removed by identity (a :class:`Stream`), never by fd number: by the
time a task's cleanup removes its stream, the reactor may have closed the fd at EOF and the
kernel handed the same number to a newer task's pipe.

A program that shares the reactor between owners (the daemon: a uid per task) tags streams
with one (:meth:`IoReactor.own`) and gives the reactor ``pace`` and ``charge`` hooks: an
owner's pipes then rest unread while ``pace`` says so (out of the epoll set for
:attr:`IoReactor.REST` at a time: their writers block on full pipes, nothing is lost), and
each read of them is charged to it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterable

import trio

from ._capture import StreamCapture, Tap

__all__ = ["IoReactor", "Latch", "StdinFeed", "Stream", "Tap", "enlarge_pipe"]

log = logging.getLogger(__name__)

_READ_SIZE = 1 << 20
_SMALL_READ = 1 << 16  # a read past the head when the pipe held no more than the tail
_PIPE_SIZE = 1 << 20
_FOUR_ZEROS = bytes(4)  # FIONREAD's int
STDIN_BUFFER = 1 << 20  # bytes write_stdin() may queue before it waits for the task to read

# The one write into a task's stdin (a module-level name: the tests' seam for a failing write).
_write_stdin = os.write


def enlarge_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer: fewer wake-ups at high throughput.  Best effort."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size for an unprivileged user: keep the default


class StdinFeed:
    """Bytes on their way to a task's stdin: a bounded buffer the reactor drains into the pipe.

    ``error`` is set (and the pipe closed) if writing failed for a reason other than the task
    closing its end: the task's record says so; it is never mistaken for a stop request.
    """

    __slots__ = ("broken", "buffer", "eof", "error", "space")

    def __init__(self, data: bytes = b"", *, eof: bool = False) -> None:
        self.buffer = bytearray(data)
        self.eof = eof  # no more bytes will come: close the pipe once the buffer is written
        self.broken = False  # the task's end is closed (or the task ended)
        self.error: OSError | None = None
        self.space: trio.Event | None = None  # set when the buffer drains below its cap

    def wake(self) -> None:
        if self.space is not None:
            self.space.set()
            self.space = None


class _ReadBuffer(threading.local):
    """One read buffer per thread, shared by every read of that thread's trio run: a read and
    the copy out of it happen with no checkpoint between them, so reads never interleave on
    it, and a thousand tasks do not cost a thousand buffers (nor an mmap per read)."""

    def __init__(self) -> None:
        self.buf = bytearray(_READ_SIZE)
        self.view = memoryview(self.buf)


_buffer = _ReadBuffer()


def _read_into(fd: int, capture: StreamCapture, sink: int, pass_by: bool = True) -> bool:
    """One read into the shared buffer, fed to ``capture``; past its head, the bytes its tail
    will never hold are passed on unread instead (:func:`_pass_by`; not with ``pass_by``
    False: the last read of a stream, which must leave its tail filled).  False at EOF (EIO
    counts: it is what a pseudo-terminal's master reads once every slave fd is closed);
    raises BlockingIOError when there is nothing to read now."""
    buf = _buffer.view
    if pass_by and capture.passable():
        passed = _pass_by(fd, capture, sink)
        if passed:
            return True
        if passed is not None:
            # at most a tail's worth waited: what came since is the next call's to pass by
            buf = buf[:max(capture.tail_limit, _SMALL_READ)]
    try:
        n = os.readv(fd, [buf])
    except OSError as e:
        if e.errno == errno.EIO:
            return False
        raise
    if n == 0:
        return False
    capture.feed(_buffer.view[:n])
    return True


def _pass_by(fd: int, capture: StreamCapture, sink: int) -> bool | None:
    """What the pipe holds beyond its last ``tail_limit`` bytes, spliced to the log file or to
    ``sink`` (/dev/null), never copied to us: the tail keeps only the newest.  True if some
    was; False if the pipe held no more than the tail; None if it cannot splice (a terminal,
    a log file opened to append)."""
    if capture.mode != "capture":
        return None
    excess = _unread(fd) - capture.tail_limit
    if excess <= 0:
        return False
    return capture.pass_by(fd, excess, sink) > 0 or None


def _unread(fd: int) -> int:
    """How many bytes wait in pipe ``fd``."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, _FOUR_ZEROS), sys.byteorder)


class Latch:
    """A one-shot trio Event made only when someone waits (a supervisor may hold thousands of
    tasks that nobody waits on: an Event costs ~200 bytes, this ~50)."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: trio.Event | None = None

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            await trio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        await self._event.wait()


class Stream:
    """One pipe end registered with the reactor: read into ``capture``, or written from
    ``feed``.  ``done`` is set once the reactor has let go of it (EOF, error, or removal).

    ``hold`` (a pseudo-terminal's master): at the end of the stream the fd is kept open until
    :meth:`IoReactor.remove`, as a terminal emulator keeps it until its child has exited.
    Closing the last master fd hangs the terminal up, which sends SIGHUP to the session: a
    program that closes its stdio before it exits (cat does) would die of it."""

    __slots__ = ("capture", "done", "fd", "feed", "hold", "owner", "rests_until", "served_at")

    def __init__(self, fd: int, capture: StreamCapture | None, feed: StdinFeed | None,
                 hold: bool = False) -> None:
        self.fd = fd
        self.capture = capture
        self.feed = feed
        self.hold = hold
        self.done = Latch()
        self.owner: int | None = None  # whose output it is, for the reactor's ``pace``
        self.rests_until = 0.0  # (trio's clock) a resting terminal is read again no sooner
        self.served_at = 0.0  # (trio's clock) a terminal's last read or write: woken in turn


class IoReactor:
    """One epoll set for the pipes of every task of a supervisor, served by one trio task.

    Level-triggered: each round reads every ready pipe (a few MiB at most per pipe per round, so
    one chatty task cannot starve the others) into the shared buffer, each read copied out
    (head, tail, log, subscribers) before the next, and writes what stdin feeds hold.  Run
    :meth:`run` in a nursery; :meth:`stop` ends it (it is shielded, like the watcher: tasks
    still draining below a cancelled supervisor need it).
    """

    _ROUND = 4  # reads per pipe per round
    REST = 0.02  # seconds a paced owner's pipes go unread before they are asked about again
    # bytes of an owned terminal's output (a pseudo-terminal's master: ``hold``) read in one
    # round past which it rests as a paced pipe does, its writer blocked meanwhile: a
    # terminal's every byte is the kernel's work (its line discipline, and the flushes of its
    # buffers in kernel threads no task's cgroup holds), and one tenant's terminal printing
    # `yes`, read as fast as it came, took 97% of this box's CPUs in the kernel and another
    # tenant's p99 10x (eight of them: 80-140x; an independent attack).  The bytes are counted
    # per owner, across all its terminals (four of them were four times one: 5x), in windows
    # of a rest: once an owner's terminals gave ``TERMINAL_ROUND`` in one, every one of them
    # rests until it ends.  Read so, an owner's terminals give at most ~24 KiB a rest
    # (~1.2 MB/s) together, more than a screen shows.  The keys written into them count in
    # the same window, and stop at it (the line discipline's work per key, its echo among
    # it, is the kernel's too: a tenant's eight terminals taking 1 MB writes as fast as they
    # could put 96% of the CPUs in kernel threads, another tenant's p99 20-70x; an
    # independent attack): a paste of a MiB takes a second or two.
    TERMINAL_ROUND = 8192

    #: ``pace(owner)``: whether a stream with an ``owner`` (:meth:`own`) rests this round,
    #: its pipe unread (its writers block once it is full: they wait, and cost nothing); and
    #: ``charge(owner, seconds)``: the time each read of its pipes held the loop's thread, by
    #: the clock (its CPU time said nothing of a write of the output into its file that the
    #: kernel held back, the disk behind its dirty pages: a tenant's output flood onto the
    #: state disk slept the loop there, charged to no one, and another tenant's p99 was 9x).
    #: (The daemon's share of the event loop per uid: a tenant's output flood was read in
    #: steps that were no one's, and another tenant's requests waited behind them.)
    pace: Callable[[int], bool] | None = None
    charge: Callable[[int, float], None] | None = None

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sink = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)  # what no capture keeps
        # every task's stdin when given none: one read-only open file description (a task can
        # change only its flags, which no read of /dev/null heeds), not an open per task
        self.null_input = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._streams: dict[int, Stream] = {}
        self._held: dict[int, Stream] = {}  # ended, fd kept open until remove()
        self._resting: dict[int, Stream] = {}  # paced: unread until the next rest is over
        # owner -> [when its terminals' window ends, bytes they gave in it] (TERMINAL_ROUND)
        self._terminals: dict[int, list[float]] = {}
        self._scope = trio.CancelScope(shield=True)

    def add_reader(self, fd: int, capture: StreamCapture, *, hold: bool = False) -> Stream:
        """Read non-blocking ``fd`` into ``capture`` from now on, until EOF or :meth:`remove`;
        the reactor owns ``fd`` from now on and closes it (with ``hold``: only at remove)."""
        stream = Stream(fd, capture, None, hold)
        self._streams[fd] = stream
        self._epoll.register(fd, select.EPOLLIN)
        return stream

    def watch_tap(self, stream: Stream) -> None:
        """``stream``'s capture has a tap: read it again whenever the tap was drained."""
        capture, tap = stream.capture, stream.capture.tap if stream.capture else None
        assert capture is not None and tap is not None

        def drained() -> None:
            if capture.tap_full and self._streams.get(stream.fd) is stream:
                capture.tap_full = False
                if self._resting.get(stream.fd) is not stream:  # (else: when the rest ends)
                    self._epoll.modify(stream.fd, select.EPOLLIN)

        tap.on_drained = drained

    def add_writer(self, fd: int, feed: StdinFeed, *, hold: bool = False) -> Stream:
        """Write ``feed``'s bytes to non-blocking ``fd`` as the task reads them; closes ``fd``
        after ``feed.eof`` once all is written, or when the task's end closes (with ``hold``:
        only at remove)."""
        stream = Stream(fd, None, feed, hold)
        self._streams[fd] = stream
        self._epoll.register(fd, select.EPOLLOUT if feed.buffer or feed.eof else 0)
        return stream

    def poke(self, stream: Stream) -> None:
        """``stream``'s feed has new bytes (or EOF): write it when the pipe has room (a
        terminal resting for its owner's window: when the rest is over)."""
        if self._streams.get(stream.fd) is stream and self._resting.get(stream.fd) is not stream:
            self._epoll.modify(stream.fd, select.EPOLLOUT)

    def detach(self, stream: Stream) -> int | None:
        """Stop serving ``stream`` without reading or closing it, and give its fd back (for a
        hand-over); None if the reactor had already closed it (its end came first)."""
        if self._held.get(stream.fd) is stream:
            del self._held[stream.fd]
            return stream.fd
        if self._streams.get(stream.fd) is not stream:
            return None
        del self._streams[stream.fd]
        self._unwatch(stream)
        return stream.fd

    def _unwatch(self, stream: Stream) -> None:
        """Out of the epoll set (a resting stream is out of it already)."""
        if self._resting.get(stream.fd) is stream:
            del self._resting[stream.fd]
        else:
            self._epoll.unregister(stream.fd)

    def remove(self, stream: Stream) -> None:
        """Stop serving ``stream`` now: read what is already buffered (bounded: a writer outside
        the leaf may still be writing), close its fd, end its capture.  A stream the reactor
        already let go of is left alone, whatever now has its fd number."""
        if self._held.get(stream.fd) is stream:
            del self._held[stream.fd]
            os.close(stream.fd)
            return
        if self._streams.get(stream.fd) is not stream:
            return
        if stream.capture is not None:
            # a terminal's or a tapped stream's last bytes are all read (nobody writes any
            # more once the task is gone); a pipe held outside the leaf gets a few reads
            rounds = 64 if stream.hold or stream.capture.tap is not None else self._ROUND
            for i in range(rounds, 0, -1):
                try:
                    # (the last round reads: a pass-by there, with a writer outside the leaf
                    # still writing, would leave the tail empty for good)
                    if not _read_into(stream.fd, stream.capture, self._sink, i > 1):
                        break
                except OSError:  # BlockingIOError: nothing more now
                    break
        self._close(stream)

    def serve_now(self, stream: Stream) -> None:
        """Serve a reader now, as the next round would: a pipe at EOF ends here (its task is
        waiting for that, and the reactor's own round may come only after it).  Nothing
        happens to a stream already let go of, a terminal's or a tapped one."""
        if (self._streams.get(stream.fd) is stream and not stream.hold
                and stream.capture is not None and stream.capture.tap is None):
            self._serve_reader(stream)

    def _close(self, stream: Stream, *, ended: bool = False) -> None:
        """Let go of ``stream``; ``ended``: at its end (EOF, hang-up, error), when a held
        stream keeps its fd open for :meth:`remove`."""
        del self._streams[stream.fd]
        self._unwatch(stream)
        if ended and stream.hold:
            self._held[stream.fd] = stream
        else:
            os.close(stream.fd)
        if stream.capture is not None:
            stream.capture.close()
        if stream.feed is not None:
            stream.feed.broken = True
            stream.feed.wake()
        stream.done.set()

    def _serve_reader(self, stream: Stream) -> None:
        assert stream.capture is not None
        try:
            for _ in range(self._ROUND):
                if not _read_into(stream.fd, stream.capture, self._sink):
                    self._close(stream, ended=True)  # EOF
                    return
                if stream.capture.tap_full:
                    self._epoll.modify(stream.fd, 0)  # until the tap is read (watch_tap)
                    return
        except BlockingIOError:
            pass
        except OSError as e:
            log.warning("reading a task's output (fd %d): %s", stream.fd, e)
            self._close(stream, ended=True)

    def _serve_writer(self, stream: Stream, events: int) -> None:
        feed = stream.feed
        assert feed is not None
        window = None
        if stream.hold and stream.owner is not None and self.pace is not None:
            window = self._terminal_window(stream, stream.owner)  # (a tenant's terminal)
            if window is None:
                return
        try:
            while feed.buffer:
                if window is None:
                    n = _write_stdin(stream.fd, feed.buffer)
                else:
                    left = int(self.TERMINAL_ROUND - window[1])
                    if left <= 0:
                        self._rest_until(stream, window[0])
                        break
                    n = _write_stdin(stream.fd, feed.buffer[:left])
                    window[1] += n
                del feed.buffer[:n]
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            self._close(stream, ended=True)  # the task closed its stdin: not a failure
            return
        except OSError as e:
            if e.errno != errno.EIO:  # EIO: a terminal whose every slave fd closed (its end)
                feed.error = e
            self._close(stream, ended=True)
            return
        if len(feed.buffer) < STDIN_BUFFER:
            feed.wake()
        if not feed.buffer:
            if feed.eof or events & (select.EPOLLERR | select.EPOLLHUP):
                self._close(stream, ended=True)
            elif self._resting.get(stream.fd) is not stream:
                self._epoll.modify(stream.fd, 0)  # nothing to write: wait for poke()

    @staticmethod
    def own(streams: Iterable[Stream], owner: int) -> None:
        """``streams`` are ``owner``'s output from now on (see :attr:`pace`)."""
        for stream in streams:
            stream.owner = owner

    def _serve_owned(self, stream: Stream, owner: int) -> None:
        """A stream with an owner: rested if its owner is paced, else read and charged."""
        assert self.pace is not None
        if self.pace(owner):
            # (out of the set, not a mask of 0: a pipe whose writers are gone reports a
            # hang-up whatever the mask, and the loop would spin on it for the whole rest)
            self._epoll.unregister(stream.fd)
            self._resting[stream.fd] = stream
            return
        window = None
        if stream.hold:  # a terminal: its owner's window (TERMINAL_ROUND)
            window = self._terminal_window(stream, owner)
            if window is None:
                return
        began = time.monotonic()  # (the clock's: see charge)
        capture = stream.capture
        before = 0 if capture is None else capture.total
        self._serve_reader(stream)
        if self.charge is not None:
            self.charge(owner, time.monotonic() - began)
        if window is not None and capture is not None:
            window[1] += capture.total - before
            if window[1] >= self.TERMINAL_ROUND and self._streams.get(stream.fd) is stream:
                self._rest_until(stream, window[0])

    def _terminal_window(self, stream: Stream, owner: int) -> list[float] | None:
        """``[when it ends, bytes so far]`` of ``owner``'s terminals' window (a new one if the
        last is over), ``stream`` served now; None, ``stream`` resting until it ends, if it is
        spent (``TERMINAL_ROUND``)."""
        now = trio.current_time()
        window = self._terminals.get(owner)
        if window is None or window[0] <= now:
            window = self._terminals[owner] = [now + self.REST, 0]
        elif window[1] >= self.TERMINAL_ROUND:
            self._rest_until(stream, window[0])
            return None
        stream.served_at = now
        return window

    def _rest_until(self, stream: Stream, until: float) -> None:
        """A terminal whose owner's window is spent: not read or written (its writer, or its
        feed's, waits) until it ends (out of the epoll set, as a paced stream; one held for
        its tap is so already)."""
        if self._resting.get(stream.fd) is not stream:
            self._epoll.unregister(stream.fd)
            self._resting[stream.fd] = stream
        stream.rests_until = until

    def _wake_resting(self) -> None:
        """The rested streams are back in the epoll set, read (or asked about) from the next
        round; one held for its tap waits for it there (one closed or removed meanwhile left
        ``_resting`` then: :meth:`_unwatch`); a terminal's rest lasts its whole time, and the
        terminals read longest ago are back first (the next round reads them in that order,
        and the first of an owner's may spend its window: the others would starve)."""
        now = trio.current_time()
        for owner in [o for o, (ends, _) in self._terminals.items() if ends <= now]:
            del self._terminals[owner]
        due = [s for s in self._resting.values() if s.rests_until <= now]
        due.sort(key=lambda s: s.served_at)
        for stream in due:
            fd = stream.fd
            if stream.feed is not None:  # (a terminal's keys: written when there is room)
                mask = select.EPOLLOUT if stream.feed.buffer or stream.feed.eof else 0
            else:
                held = stream.capture is not None and stream.capture.tap_full
                mask = 0 if held else select.EPOLLIN
            self._epoll.register(fd, mask)
            del self._resting[fd]

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the main task, not here
    async def run(self) -> None:
        try:
            with self._scope:
                while True:
                    if self._resting:
                        with trio.move_on_after(self.REST):
                            await trio.lowlevel.wait_readable(self._epoll.fileno())
                        self._wake_resting()
                    else:
                        await trio.lowlevel.wait_readable(self._epoll.fileno())
                    for fd, events in self._epoll.poll(0):
                        stream = self._streams.get(fd)
                        if stream is None:
                            continue
                        if stream.capture is None:
                            self._serve_writer(stream, events)
                        elif stream.owner is not None and self.pace is not None:
                            self._serve_owned(stream, stream.owner)
                        else:
                            self._serve_reader(stream)
        finally:
            for stream in list(self._streams.values()):
                self._close(stream)
            for stream in list(self._held.values()):
                self.remove(stream)
            self._epoll.close()
            os.close(self._sink)
            os.close(self.null_input)

    def stop(self) -> None:
        self._scope.cancel()
