"""A task's stdio: the plumbing between the spawn and the reactor.

:func:`plumb` opens what the child gets as fds 0, 1 and 2 (pipes, /dev/null, our own fds
for ``inherit``, or a new pseudo-terminal) and our ends of them, without a checkpoint, before
the spawn; :func:`register` hands our ends to the supervisor's :class:`IoReactor` once the
child runs; :func:`end` lets go of them once the leaf is empty.  Who owns an fd is never
tracked by hand: until the spawn succeeded, ours sit on an ExitStack that closes them if it did
not, and the child's on one that closes them right after the spawn either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import termios
from collections.abc import Callable
from typing import Any

import trio

from ._capture import StreamCapture, open_log
from ._output import IoReactor, StdinFeed, Stream, enlarge_pipe
from ._spec import TaskSpec

__all__ = ["DRAIN_DEADLINE", "TaskIo", "end", "plumb", "register", "set_window_size"]

DRAIN_DEADLINE = 0.25  # after the leaf is empty: how long a pipe held outside it may delay us


class TaskIo:
    """A running task's stdio on our side: its streams, its stdin feed, its terminal.

    Between the plumbing and the spawn, ``readers`` and ``feed_fd`` hold our ends; once the
    child runs they are handed to the reactor, which owns them from then on (``streams``,
    ``feed_stream``)."""

    __slots__ = ("feed", "feed_fd", "feed_stream", "master", "readers", "streams")

    def __init__(self) -> None:
        self.readers: list[tuple[int, StreamCapture]] = []
        self.feed_fd = -1
        self.streams: list[Stream] = []
        self.feed: StdinFeed | None = None
        self.feed_stream: Stream | None = None
        self.master: int | None = None  # the pseudo-terminal (tty=True), for resize()


def plumb(spec: TaskSpec, stdout: StreamCapture, stderr: StreamCapture,
          undo: contextlib.ExitStack, child_ends: contextlib.ExitStack,
          null_input: int) -> tuple[list[int], TaskIo]:
    """The child's fds 0, 1, 2, and our ends of them (registered once the spawn succeeded).
    Fds opened for the child go on ``child_ends`` (closed right after the spawn, whatever
    happens: EOF never comes while we hold a writer); ours on ``undo``.  ``null_input`` is
    the supervisor's /dev/null, the stdin of a task given none (shared, never closed here)."""
    def ours(fd: int) -> int:
        undo.callback(os.close, fd)
        return fd

    def theirs(fd: int) -> int:
        child_ends.callback(os.close, fd)
        return fd

    if spec.tty:
        return _plumb_tty(spec, stdout, stderr, ours, theirs, undo)
    io = TaskIo()
    stdin = null_input if spec.stdin is None else _plumb_stdin(spec, io, ours, theirs)
    outs = []
    for name, inherited, cap in (("stdout", 1, stdout), ("stderr", 2, stderr)):
        if getattr(spec, name) == "inherit":
            cap.mode = "inherit"
            cap.close()
            outs.append(inherited)
            continue
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(ours(r), False)
        enlarge_pipe(r)
        outs.append(theirs(w))
        _capture(cap, spec, name, undo)
        io.readers.append((r, cap))
    return [stdin, *outs], io


def _plumb_stdin(spec: TaskSpec, io: TaskIo, ours: Callable[[int], int],
                 theirs: Callable[[int], int]) -> int:
    if spec.stdin == "inherit":
        return 0
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    os.set_blocking(r, True)  # the child's end: blocking, as any program expects
    data = spec.stdin if isinstance(spec.stdin, bytes) else b""
    io.feed = StdinFeed(data, eof=spec.stdin != "pipe")
    io.feed_fd = ours(w)
    return theirs(r)


def _plumb_tty(spec: TaskSpec, stdout: StreamCapture, stderr: StreamCapture,
               ours: Callable[[int], int], theirs: Callable[[int], int],
               undo: contextlib.ExitStack) -> tuple[list[int], TaskIo]:
    """A new pseudo-terminal: the slave is the child's 0, 1 and 2 (and its controlling
    terminal); we read and write the master."""
    io = TaskIo()
    master, slave = os.openpty()
    ours(master)
    theirs(slave)
    if spec.tty_size is not None:
        set_window_size(master, *spec.tty_size)
    if spec.tty_modes is not None:
        termios.tcsetattr(slave, termios.TCSANOW, spec.tty_modes)
    os.set_blocking(master, False)
    io.master = master
    _capture(stdout, spec, "stdout", undo, mode="tty")
    stderr.mode = "tty"
    stderr.close()
    io.readers.append((master, stdout))
    io.feed = StdinFeed(spec.stdin if isinstance(spec.stdin, bytes) else b"")
    io.feed_fd = ours(os.dup(master))
    return [slave, slave, slave], io


def _capture(cap: StreamCapture, spec: TaskSpec, name: str, undo: contextlib.ExitStack,
             mode: str = "capture") -> None:
    cap.mode = mode
    if spec.log_file is not None:
        cap.log_path = spec.log_file if name == "stdout" else f"{spec.log_file}.stderr"
        if spec.log_lazy:
            cap.log_pending = True  # (made at the stream's first byte)
        else:
            cap.log_fd = open_log(cap.log_path)
        cap.log_limit = spec.log_max_bytes


def register(io: TaskIo, reactor: IoReactor, *, tty: bool) -> None:
    """Hand our ends to the reactor (it owns and closes them from now on; a terminal's
    master is held open until :func:`end` removes it)."""
    io.streams = [reactor.add_reader(fd, cap, hold=tty) for fd, cap in io.readers]
    io.readers = []
    if io.feed is not None:
        io.feed_stream = reactor.add_writer(io.feed_fd, io.feed, hold=tty)


def set_window_size(fd: int, rows: int, columns: int) -> None:
    """The terminal at ``fd`` is ``rows`` x ``columns`` (its foreground group gets SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


async def end(io: TaskIo, reactor: IoReactor) -> tuple[list[str], list[tuple[Any, str]]]:
    """The leaf is empty: whoever still holds a pipe is outside it and EOF may never come.
    Wait a little for EOF (shielded: the caller's cancellation is the driver's business),
    then take what is buffered and let go.  Returns notes for the record, and the pipes
    still held open then (their capture, and ``pipe:[inode]`` as /proc/PID/fd names them):
    proof that something of the task lives outside its leaf."""
    for stream in io.streams:
        if not stream.done.is_set():
            reactor.serve_now(stream)  # at EOF already, usually: no round to wait for it
    held: list[tuple[Any, str]] = []
    if not all(stream.done.is_set() for stream in io.streams):
        with trio.move_on_after(DRAIN_DEADLINE, shield=True):
            for stream in io.streams:
                await stream.done.wait()
        held = [(s.capture, link) for s in io.streams if not s.done.is_set()
                and (link := _pipe_link(s.fd)) is not None]
    for stream in io.streams:
        reactor.remove(stream)
    if io.feed_stream is not None:
        reactor.remove(io.feed_stream)
    io.master = None
    if io.feed is not None and io.feed.error is not None:
        return [f"writing the task's stdin failed: {io.feed.error}"], held
    return [], held


def _pipe_link(fd: int) -> str | None:
    """``pipe:[inode]`` for a pipe ``fd`` (None for a terminal, or a closed fd)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return f"pipe:[{st.st_ino}]" if stat.S_ISFIFO(st.st_mode) else None
