"""``corral run --pty``: the task on a pseudo-terminal of its own, mirrored to corral's stdio.

The core runs the task on a new pseudo-terminal (``TaskSpec(tty=True)``) and reads it; this
module carries the bytes between that terminal and corral's own stdin and stdout, as
``systemd-run --pty``, ``docker run -t`` and script(1) do:

- Output: ``task.tap("stdout")`` (every byte in order; while it is unread the task waits on
  its own writes) is written to our stdout.  A terminal or a pipe is written through a
  description of our own opened with O_NONBLOCK from ``/proc/self/fd/1`` (as systemd's pty
  forwarder does: O_NONBLOCK on the description the shell shares would leak into the shell,
  also if corral were killed) whenever ``wait_writable`` says there is room, so a slow or
  stopped reader holds the task, never the event loop.  A regular file, which epoll refuses,
  is written directly.
- Input: our stdin, opened the same way, is typed into the task's terminal
  (``write_stdin``).  At a terminal, ours is in raw mode (cfmakeraw) while the task runs, so
  that the task's line discipline, not ours, makes keys into signals, echo and line editing;
  the saved modes come back before corral stops itself or prints anything, and raw mode again
  after ``fg``.  The end of our stdin types the end-of-file character (``close_stdin``).
- Keys corral still reads, now as bytes: a Ctrl-C counts towards the way out (three within
  two seconds) when the task's terminal makes it a signal.  A Ctrl-Z suspends corral and
  freezes the task when the task's foreground program is a lone one (its process group is
  the session's own, which has no parent in the session: the kernel would discard its
  terminal's SIGTSTP); with a job-control shell in the foreground it is that shell's key.
- SIGWINCH: the real terminal's size becomes the task's (``resize``).
- The screen: the output is watched for the alternate screen and a hidden cursor, so that a
  task that ends holding them (killed at its time limit) does not leave them to the shell.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import signal
import socket
import stat
import termios
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from .terminal import may_suspend, screen_reset

if TYPE_CHECKING:
    from .. import Tap, TaskHandle

__all__ = ["Port", "PtyRelay", "RawMode", "Screen", "task_terminal"]

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
DEFAULT_SIZE = (24, 80)  # rows, columns: when no terminal says (as systemd's ptyfwd)
_DISABLED = b"\0"  # _POSIX_VDISABLE: a control character turned off


class Port:
    """One of corral's own stdio fds, used without blocking and without changing the open file
    description others share: a terminal or a pipe is reopened with O_NONBLOCK, a socket gets
    MSG_DONTWAIT, anything else (a regular file, /dev/null) is used as it is: it never makes
    us wait long, and epoll refuses it.  A closed fd reads as end of file and writes as
    EPIPE.  Used on the trio thread; closed after ``trio.run`` has returned."""

    def __init__(self, fd: int, *, poll: bool, owned: bool = False,
                 sock: socket.socket | None = None, flags: int | None = None) -> None:
        self.fd = fd
        self.poll = poll  # wait with wait_readable/wait_writable
        self.owned = owned  # our own description: closed by close()
        self.sock = sock
        self.flags = flags  # the original's flags, when O_NONBLOCK had to be set on it

    @classmethod
    def open(cls, fd: int, *, write: bool) -> Port:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return cls(-1, poll=False)  # closed (corral run <&-): end of file, EPIPE
        if stat.S_ISSOCK(mode):
            return cls(fd, poll=True, sock=socket.socket(fileno=os.dup(fd)))
        if not (stat.S_ISFIFO(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))):
            return cls(fd, poll=False)
        access = os.O_WRONLY if write else os.O_RDONLY
        try:
            new = os.open(f"/proc/self/fd/{fd}",
                          access | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            return cls(new, poll=True, owned=True)
        except OSError:
            # no /proc, or a terminal we may not open again: the shared one, put back later
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
            return cls(fd, poll=True, flags=flags)

    @property
    def waits(self) -> int:
        return self.sock.fileno() if self.sock is not None else self.fd

    async def read(self) -> bytes:
        """The next bytes; b"" at end of file (EIO: a terminal that hung up)."""
        if self.fd < 0:
            return b""
        while True:
            try:
                if self.sock is not None:
                    return self.sock.recv(_CHUNK, socket.MSG_DONTWAIT)
                data = os.read(self.fd, _CHUNK)
                if not self.poll:
                    await trio.lowlevel.checkpoint()
                return data
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.waits)
            except OSError as e:
                if e.errno == errno.EIO:
                    return b""
                raise

    async def write_all(self, data: bytes) -> None:
        """Write all of ``data``, waiting while the reader is slow; BrokenPipeError when it
        is gone (EPIPE, or EIO: a terminal that hung up)."""
        if self.fd < 0:
            raise BrokenPipeError(errno.EPIPE, "stdout is closed")
        view = memoryview(data)
        while view:
            try:
                if self.sock is not None:
                    view = view[self.sock.send(view, socket.MSG_DONTWAIT):]
                else:
                    view = view[os.write(self.fd, view):]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.waits)
            except OSError as e:
                if e.errno == errno.EIO:
                    raise BrokenPipeError(errno.EPIPE, "the terminal hung up") from e
                raise
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        elif self.owned:
            os.close(self.fd)
        elif self.flags is not None:
            try:
                fcntl.fcntl(self.fd, fcntl.F_SETFL, self.flags)
            except OSError:
                pass  # closed meanwhile: nothing left to put back


def _foreground(fd: int) -> bool:
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


class RawMode:
    """The terminal at our stdin in raw mode while the task runs (cfmakeraw's flags, as
    systemd's ptyfwd and script(1)), the modes found when it was entered put back on every
    way out.  Only changed while corral is the terminal's foreground group (from the
    background, tcsetattr would stop it with SIGTTOU; and a background job finds the shell's
    line editor's modes there).  ``keep_output``: our stdout is elsewhere, so this terminal
    keeps its output processing for corral's own lines.  Never raises."""

    def __init__(self, fd: int, *, keep_output: bool) -> None:
        self.fd = fd
        self.keep_output = keep_output
        self.saved: list[Any] | None = None
        self.active = False

    def enter(self) -> None:
        if self.active or not _foreground(self.fd):
            return
        try:
            self.saved = termios.tcgetattr(self.fd)
            termios.tcsetattr(self.fd, termios.TCSADRAIN,
                              _raw(self.saved, keep_output=self.keep_output))
            self.active = True
        except (OSError, termios.error):
            pass  # hung up: nothing to type into the task any more

    def reenter(self) -> None:
        """After a stop: whoever had the terminal meanwhile (the shell) set its own modes."""
        self.active = False
        self.enter()

    def leave(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.saved is not None and _foreground(self.fd):
            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            except (OSError, termios.error):
                pass  # hung up: nobody there to see the modes


def _raw(modes: list[Any], *, keep_output: bool) -> list[Any]:
    """cfmakeraw(3) of ``modes`` (the flags glibc's clears), output processing kept if asked."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = modes
    iflag &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP
               | termios.INLCR | termios.IGNCR | termios.ICRNL | termios.IXON)
    if not keep_output:
        oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag = (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    cc = list(cc)
    cc[termios.VMIN], cc[termios.VTIME] = 1, 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


class Screen:
    """What the task's output left on at our terminal: the alternate screen (DEC private
    modes 1049, 1047, 47) and a hidden cursor (25).  Sequences cut between two chunks are
    seen whole: the last bytes of each chunk are read again with the next (setting a mode
    twice in order changes nothing)."""

    _MODES = re.compile(rb"\x1b\[\?([0-9;]+)([hl])")
    _CARRY = 32

    def __init__(self) -> None:
        self.alternate = False
        self.cursor_hidden = False
        self._carry = b""

    def feed(self, data: bytes) -> None:
        text = self._carry + data
        if b"\x1b[?" in text:
            for m in self._MODES.finditer(text):
                on = m.group(2) == b"h"
                for mode in m.group(1).split(b";"):
                    if mode in (b"1049", b"1047", b"47"):
                        self.alternate = on
                    elif mode == b"25":
                        self.cursor_hidden = not on
        self._carry = text[-self._CARRY:]


class TaskTerminal(NamedTuple):
    """The task's terminal as its main process sees it."""

    modes: list[Any]  # termios.tcgetattr()
    lone: bool  # its foreground group is the session's own: no job-control shell runs it


def task_terminal(pid: int) -> TaskTerminal | None:
    """The modes and foreground of the terminal of ``pid`` (a task's main process, leader of
    its session), or None: gone, or not that process any more.  (The core keeps the master
    to itself: the slave is opened by its device number, /proc/PID/stat's tty_nr.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        session, tty_nr, tpgid = int(fields[3]), int(fields[4]), int(fields[5])
        if session != pid or tty_nr == 0:
            return None
        fd = os.open(_pts_path(tty_nr), os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, IndexError, ValueError):
        return None
    try:
        return TaskTerminal(termios.tcgetattr(fd), tpgid == session)
    except termios.error:
        return None
    finally:
        os.close(fd)


def _pts_path(tty_nr: int) -> str:
    """/dev/pts/N of the device ``tty_nr``; FileNotFoundError if none has that number."""
    major, minor = os.major(tty_nr), os.minor(tty_nr)
    for n in dict.fromkeys((minor, (major - 136) * 256 + minor)):  # Unix98 ptys: majors 136+
        path = f"/dev/pts/{n}"
        try:
            if os.stat(path).st_rdev == os.makedev(major, minor):
                return path
        except OSError:
            continue
    raise FileNotFoundError(errno.ENOENT, "no /dev/pts entry for the device", str(tty_nr))


def _cc(modes: list[Any] | None, index: int, default: bytes) -> bytes:
    """Control character ``index`` of ``modes`` (``default`` without modes)."""
    if modes is None:
        return default
    value = modes[6][index]
    return value if isinstance(value, bytes) else bytes([value])


class PtyRelay:
    """Everything ``corral run --pty`` does besides what plain ``corral run`` does.

    Made before the run (:meth:`open`: the terminal's size and modes go into the spec), then
    :meth:`begin` right after the spawn, :meth:`run` until the task's output ended and was
    all written, and :meth:`finish` / :meth:`close` on every way out.  The signal watcher
    calls :meth:`resize`, :meth:`resumed`, :meth:`suspend`, :meth:`type_key` and
    :meth:`abandon`; :attr:`on_press` and :attr:`on_gone` are its callbacks (a Ctrl-C typed
    in raw mode; our stdout is gone).  All on the trio thread, except open/finish/close.
    """

    def __init__(self, stdin: Port, stdout: Port, raw: RawMode | None,
                 modes: list[Any] | None, stdout_tty: bool) -> None:
        self.stdin, self.stdout, self.raw, self.modes = stdin, stdout, raw, modes
        self.stdout_tty = stdout_tty
        self.screen = Screen()
        self.task: TaskHandle | None = None
        self.tap: Tap | None = None
        self.early = b""  # what the task printed before the tap opened
        self.gone = False  # our stdout is gone, or given up: output is read and dropped
        self.on_press: Callable[[], None] = lambda: None
        self.on_gone: Callable[[str], None] = lambda why: None
        self._nursery: trio.Nursery | None = None
        self._writing: trio.CancelScope | None = None
        self._reading: trio.CancelScope | None = None
        self._last_input = b"\n"

    @classmethod
    def open(cls) -> PtyRelay:
        """Our stdio, and the modes the task's terminal starts with: those of ours (stdin's,
        else stdout's) when corral is its foreground group, else the kernel's defaults (a
        background job would find the shell's line editor's modes there)."""
        stdin_tty, stdout_tty = os.isatty(0), os.isatty(1)
        modes = None
        for fd in (0, 1) if stdin_tty or stdout_tty else ():
            try:
                modes = termios.tcgetattr(fd) if _foreground(fd) else None
                break
            except termios.error:
                continue
        raw = None
        if stdin_tty:
            same = stdout_tty and os.path.samestat(os.fstat(0), os.fstat(1))
            raw = RawMode(0, keep_output=not same)
        return cls(Port.open(0, write=False), Port.open(1, write=True), raw, modes, stdout_tty)

    @property
    def raw_active(self) -> bool:
        return self.raw is not None and self.raw.active

    def spec_options(self) -> dict[str, Any]:
        """The TaskSpec fields of the task's terminal: the real one's size and modes."""
        return {"tty": True, "tty_size": self.size(), "tty_modes": self.modes}

    def size(self) -> tuple[int, int]:
        """(rows, columns) of the first of stdout, stdin, stderr that is a terminal; else
        $LINES and $COLUMNS, else 24 x 80."""
        for fd in (1, 0, 2):
            try:
                columns, rows = os.get_terminal_size(fd)
            except OSError:
                continue
            if rows and columns:
                return min(rows, 65535), min(columns, 65535)
        try:
            rows, columns = int(os.environ["LINES"]), int(os.environ["COLUMNS"])
            if 0 < rows <= 65535 and 0 < columns <= 65535:
                return rows, columns
        except (KeyError, ValueError):
            pass
        return DEFAULT_SIZE

    def begin(self, task: TaskHandle) -> None:
        """Tap the task's terminal; call right after ``start()`` returned, with no checkpoint
        between.  The reactor may have read a first chunk before the tap existed: it is in
        the head of the kept output, and written first."""
        from .. import SpecError

        kept = task.output("stdout")
        try:
            self.tap = task.tap("stdout")
        except SpecError:
            return  # it never started: nothing to mirror
        self.task = task
        if kept.total:
            self.early = kept.head + kept.tail  # whole: dropped only past the 64 KiB head

    async def run(self) -> None:
        """Mirror the task's terminal until its output has ended and all of it is written,
        our stdin typed into it meanwhile (raw mode while it runs)."""
        if self.task is None or self.tap is None:
            return
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.raw is not None:
                self.raw.enter()
            nursery.start_soon(self._pump, self.task)
            await self._mirror(self.tap)
            nursery.cancel_scope.cancel()  # the task is gone: keys typed now are the shell's
        self._nursery = None

    async def _mirror(self, tap: Tap) -> None:
        if self.early:
            await self._write(self.early)
        async for chunk in tap:
            await self._write(chunk)

    async def _write(self, data: bytes) -> None:
        self.screen.feed(data)
        if self.gone:
            return
        with trio.CancelScope() as scope:
            self._writing = scope
            try:
                await self.stdout.write_all(data)
            except OSError as e:
                self.gone = True
                self.on_gone(e.strerror or str(e))
        self._writing = None

    def abandon(self) -> None:
        """Drop the output not written yet (corral is asked to stop, after the task ended,
        while its stdout does not read)."""
        self.gone = True
        if self._writing is not None:
            self._writing.cancel()

    async def _pump(self, task: TaskHandle) -> None:
        """Our stdin into the task's terminal, until it ends (then the end-of-file key)."""
        try:
            while data := await self._read():
                if self.raw_active:
                    await self._typed(task, data)
                else:
                    await task.write_stdin(data)
                self._last_input = data[-1:]
            if self._last_input not in (b"\n", b"\r"):
                # Ctrl-D ends input only at the start of a line: end the last line first
                await task.write_stdin(_cc(self.modes, termios.VEOF, b"\x04"))
            task.close_stdin()
        except BrokenPipeError:
            pass  # the task's terminal is closed: nothing more to type
        except OSError as e:
            log.warning("reading corral's stdin failed: %s; the task's input ends here", e)
            task.close_stdin()

    async def _read(self) -> bytes:
        """The next bytes of our stdin.  A terminal is read only while corral is its
        foreground group: in the background (``&``, ``bg``) corral mirrors the output as any
        background job would, instead of being stopped by SIGTTIN; ``fg`` sends a running job
        no signal, so the foreground is looked for every 0.2 s, and brings raw mode back."""
        while True:
            if self.raw is not None and not _foreground(self.raw.fd):
                while not _foreground(self.raw.fd):
                    await trio.sleep(0.2)
                self.resumed()
            with trio.CancelScope() as self._reading:
                return await self.stdin.read()
            # cancelled by resumed(): sent to the background while waiting; look again

    async def _typed(self, task: TaskHandle, data: bytes) -> None:
        """Keys typed at our terminal (raw mode): to the task, but Ctrl-C is counted and a
        Ctrl-Z may suspend us (see the module docstring)."""
        keys = self._signal_keys(task, data)
        if keys is None:
            await task.write_stdin(data)
            return
        intr, susp, lone = keys
        start = 0
        for i in range(len(data)):
            key = data[i:i + 1]
            if key == susp and lone and may_suspend():
                await task.write_stdin(data[start:i])
                start = i + 1
                self.suspend()
            elif key == intr:
                self.on_press()
        await task.write_stdin(data[start:])

    def _signal_keys(self, task: TaskHandle, data: bytes) -> tuple[bytes, bytes, bool] | None:
        """When ``data`` holds an interrupt or suspend key and the task's terminal makes keys
        into signals: its interrupt and suspend characters (b"" if turned off) and whether its
        foreground program is a lone one; None otherwise (``vi`` reads them as keys)."""
        ours = (_cc(self.modes, termios.VINTR, b"\x03"), _cc(self.modes, termios.VSUSP, b"\x1a"))
        if not any(c != _DISABLED and c in data for c in ours):
            return None
        term = task_terminal(task.pid) if task.pid is not None else None
        modes = term.modes if term is not None else self.modes
        if modes is not None and not modes[3] & termios.ISIG:
            return None
        intr = _cc(modes, termios.VINTR, b"\x03")
        susp = _cc(modes, termios.VSUSP, b"\x1a")
        return (b"" if intr == _DISABLED else intr, b"" if susp == _DISABLED else susp,
                term is not None and term.lone)

    def type_key(self, signo: int) -> None:
        """The real terminal made a key into a signal for corral (its stdin is not in raw
        mode): the key is the task's, typed into its terminal as its character."""
        if self._nursery is None or self.task is None:
            return
        index = termios.VINTR if signo == signal.SIGINT else termios.VQUIT
        key = _cc(self.modes, index, b"\x03" if signo == signal.SIGINT else b"\x1c")
        if key != _DISABLED:
            self._nursery.start_soon(self._type, self.task, key)

    @staticmethod
    async def _type(task: TaskHandle, key: bytes) -> None:
        try:
            await task.write_stdin(key)
        except BrokenPipeError:
            pass  # ended meanwhile

    def suspend(self) -> None:
        """Ctrl-Z (or a SIGTSTP): our terminal's modes back, the task frozen, corral stopped;
        on ``fg`` / ``bg`` the task thawed, raw mode again if in the foreground."""
        if self.raw is not None:
            self.raw.leave()
        paused = self.task is not None and self.task.pause()
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once continued
        if paused and self.task is not None:
            self.task.resume()
        self.resumed()

    def resumed(self) -> None:
        """Continued (SIGCONT): raw mode again if the terminal is ours, and its size; in the
        background (``bg``), our stdin is left alone until ``fg``."""
        if self.raw is not None and self._nursery is not None:
            self.raw.reenter()
            if not self.raw.active and self._reading is not None:
                self._reading.cancel()
        self.resize()

    def resize(self) -> None:
        if self.task is None or self.task.result is not None:
            return
        try:
            self.task.resize(*self.size())
        except OSError:
            pass  # its terminal closed meanwhile

    def finish(self) -> None:
        """The task has ended: our terminal's modes back, and a screen it left in the
        alternate screen or with the cursor hidden restored.  Never raises."""
        if self.raw is not None:
            self.raw.leave()
        if self.stdout_tty and not self.gone:
            reset = screen_reset(1, alternate=self.screen.alternate,
                                 cursor=self.screen.cursor_hidden)
            try:
                if reset:
                    os.write(1, reset)
            except OSError:
                pass  # hung up: no screen to restore

    def close(self) -> None:
        """Let go of our descriptions (after ``trio.run``: trio no longer watches them)."""
        self.stdin.close()
        self.stdout.close()
