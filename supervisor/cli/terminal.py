"""``corral run`` at a terminal: whose key was that, and the terminal's modes afterwards.

corral and its task share the terminal's foreground process group, so a key the terminal turns
into a signal (Ctrl-C, Ctrl-\\, Ctrl-Z) reaches both at the same moment.  Python would raise
KeyboardInterrupt wherever corral happens to be; instead ``corral run`` blocks these signals in
every thread before anything else (before trio is imported: no handler of Python's or trio's
ever runs) and reads them from a signalfd, which says where each came from
(``signalfd_siginfo.ssi_code``, see signalfd(2) and sigaction(2)):

- ``SI_KERNEL``: the terminal's line discipline made it (a key, or a hangup).  The program got
  the same signal from the kernel; a Ctrl-C or Ctrl-\\ is the program's own, as without corral.
- anything else (``SI_USER``, ``SI_QUEUE``, ``SI_TKILL``): a process sent it, with its pid.  A
  stop request for corral, unless that process is one of the task's own (one that signals its
  process group, e.g. ``trap 'kill 0' EXIT``, reaches corral only because they share it).

The spawn empties the child's signal mask and resets its dispositions, so tasks never inherit
the blocked set.  Nothing here imports trio, or much at all: :func:`block_job_signals` must
run as early as it can.

``--pty`` (relay.py) gives the task a terminal of its own instead: the same signalfd also
carries SIGWINCH (the real terminal's size, passed on) and SIGCONT (after ``fg``: raw mode
again), and in raw mode Ctrl-C arrives as a byte, which :meth:`Keys.press` counts all the same.

A full-screen program killed while it holds the terminal leaves its modes (restored from the
saved ones) and its screen (the alternate screen, a hidden cursor: :func:`screen_reset`).
"""

from __future__ import annotations

import collections
import enum
import os
import re
import signal
import struct
import sys
import termios
from typing import Any, NamedTuple

__all__ = ["JOB_SIGNALS", "Act", "Delivery", "Keys", "Terminal", "block_job_signals",
           "die_by_signal", "may_suspend", "read_deliveries", "screen_reset", "sender_cgroup"]

# Blocked from the start of `corral run` and read from a signalfd.  SIGTTIN/SIGTTOU keep their
# default (stop): corral must be stopped, not wrongly allowed, when it touches the terminal
# from the background.  SIGWINCH and SIGCONT serve --pty (blocking SIGCONT never keeps it from
# continuing a stopped process: that happens when it is sent).
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
               signal.SIGWINCH, signal.SIGCONT)

SI_KERNEL = 0x80  # <asm-generic/siginfo.h>: sent by the kernel (a terminal's key, a hangup)
SIGINFO_SIZE = 128  # sizeof(struct signalfd_siginfo)
_SIGINFO_HEAD = struct.Struct("=IiiI")  # ssi_signo, ssi_errno, ssi_code, ssi_pid

WAY_OUT_PRESSES = 3  # Ctrl-C this many times ...
WAY_OUT_WINDOW = 2.0  # ... within this many seconds: corral stops the task


def block_job_signals() -> None:
    """Block :data:`JOB_SIGNALS` in this thread, and so in every thread started after it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)


class Delivery(NamedTuple):
    """One delivered signal: its number, ``si_code`` and sender pid (0 for the kernel)."""

    signo: int
    code: int
    pid: int

    @property
    def from_terminal(self) -> bool:
        return self.code == SI_KERNEL

    def describe(self) -> str:
        name = signal.Signals(self.signo).name
        return f"{name} from the terminal" if self.from_terminal else f"{name} from pid {self.pid}"


def read_deliveries(fd: int) -> list[Delivery]:
    """Every signal pending on the non-blocking signalfd ``fd`` (maybe none)."""
    out: list[Delivery] = []
    while True:
        try:
            buf = os.read(fd, SIGINFO_SIZE * 16)
        except BlockingIOError:
            return out
        for offset in range(0, len(buf) - SIGINFO_SIZE + 1, SIGINFO_SIZE):
            signo, _errno, code, pid = _SIGINFO_HEAD.unpack_from(buf, offset)
            out.append(Delivery(signo, code, pid))


def sender_cgroup(pid: int) -> str | None:
    """The cgroup v2 path of process ``pid`` as /proc shows it, or None (gone, no v2 line)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass  # the sender is gone already: nothing says it was one of the task's
    return None


class Act(enum.Enum):
    """What corral does about one delivered signal."""

    NOTHING = "nothing"  # the program's own (a key it got from the terminal too)
    HINT = "hint"  # the program's own, and one more Ctrl-C would stop the task
    STOP = "stop"  # stop the task: the first graceful, the next one a kill
    SUSPEND = "suspend"  # Ctrl-Z: stop corral as well (the task got it from the terminal)
    RESIZE = "resize"  # SIGWINCH: the real terminal's size changed (--pty passes it on)
    RESUMED = "resumed"  # SIGCONT: corral runs again (--pty: raw mode again in the foreground)


class Keys:
    """What each signal means to ``corral run`` (pure: no I/O, no clock of its own).

    - SIGWINCH, SIGCONT: news about the terminal, never a stop (``--pty`` acts on them).
    - SIGTSTP, from anywhere: corral stops itself too (a full-screen program that reads
      Ctrl-Z as a byte sends SIGTSTP to its whole process group, corral included).
    - A process's SIGINT, SIGTERM, SIGHUP or SIGQUIT: stop the task (graceful, then kill),
      unless the process is one of the task's own.  A terminal's hangup: stop the task.
    - The terminal's Ctrl-C or Ctrl-\\ before the task runs: it never starts.  While it runs
      they are the program's; three Ctrl-C within two seconds stop it (a hint after the
      second), and once corral has asked it to stop, each further Ctrl-C escalates.
    """

    def __init__(self, presses: int = WAY_OUT_PRESSES, window: float = WAY_OUT_WINDOW) -> None:
        self.presses = presses
        self.window = window
        self.stopping = False  # corral has asked the task to stop
        self._times: collections.deque[float] = collections.deque()

    def decide(self, d: Delivery, now: float, *, started: bool, from_task: bool = False) -> Act:
        if d.signo == signal.SIGWINCH:
            return Act.RESIZE
        if d.signo == signal.SIGCONT:
            return Act.RESUMED
        if d.signo == signal.SIGTSTP:
            return Act.SUSPEND
        if not d.from_terminal or d.signo in (signal.SIGTERM, signal.SIGHUP):
            return Act.NOTHING if from_task else Act.STOP
        if not started:
            return Act.STOP  # no program yet: the key is corral's
        if d.signo != signal.SIGINT:
            return Act.NOTHING
        return self.press(now)

    def press(self, now: float) -> Act:
        """One Ctrl-C that the program received too (a signal from the terminal, or under
        ``--pty`` the byte typed into the task's terminal)."""
        if self.stopping:
            return Act.STOP
        times = self._times
        times.append(now)
        while times and times[0] < now - self.window:
            times.popleft()
        if len(times) >= self.presses:
            return Act.STOP
        return Act.HINT if len(times) == self.presses - 1 else Act.NOTHING

    def hint(self) -> str:
        return (f"corral: Ctrl-C went to the task and it is still running; Ctrl-C "
                f"{self.presses} times within {self.window:g}s stops it")


class Terminal:
    """The controlling terminal's modes, saved before the task runs and restored after it.

    A full-screen program (less, vi, top) puts the terminal in raw mode and restores it when
    it exits; killed, it cannot, and the shell would then keep the broken modes (bash adopts
    the modes a job leaves when the job exits normally, and corral does).
    """

    def __init__(self, fd: int, modes: list[Any], pgrp: int, foreground: bool) -> None:
        self.fd = fd
        self.modes = modes
        self.pgrp = pgrp
        self.was_foreground = foreground

    @classmethod
    def open(cls) -> Terminal | None:
        """Our controlling terminal, or None when there is none (or it cannot be read)."""
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return None  # ENXIO: no controlling terminal
        try:
            modes = termios.tcgetattr(fd)
            pgrp = os.getpgrp()
            return cls(fd, modes, pgrp, os.tcgetpgrp(fd) == pgrp)
        except (OSError, termios.error):
            os.close(fd)
            return None

    def restore(self) -> bool:
        """Put the saved modes back if they changed and the terminal is ours to change; True
        if they had changed (a program left them: it held the terminal when it ended).

        Never raises: a terminal that hung up has nothing to restore.
        """
        try:
            if self._reclaim() and termios.tcgetattr(self.fd) != self.modes:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.modes)
                return True
        except (OSError, termios.error):
            pass  # EIO after a hangup: nobody is there to see the modes
        return False

    def _reclaim(self) -> bool:
        """Are we the terminal's foreground group (again)?  A task that took the terminal for
        a group of its own (an interactive shell does) and died cannot give it back: when
        nobody is left in that group, we take it, as a shell does for its jobs."""
        foreground = os.tcgetpgrp(self.fd)
        if foreground == self.pgrp:
            return True
        if not self.was_foreground:
            return False
        try:
            os.killpg(foreground, 0)
            return False  # someone lives there: we are in the background (`bg`); hands off
        except ProcessLookupError:
            pass
        except PermissionError:
            return False
        # from a background group, tcsetpgrp raises SIGTTOU unless it is blocked
        old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTTOU])
        try:
            os.tcsetpgrp(self.fd, self.pgrp)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return True

    def close(self) -> None:
        os.close(self.fd)


# xterm's, for a terminal whose terminfo entry cannot be read
_RESET_FALLBACK = {"rmcup": b"\x1b[?1049l", "cnorm": b"\x1b[?25h"}
_PADDING = re.compile(rb"\$<[0-9.*/]+>")  # terminfo delays, for tputs(3) only
# DEC private mode 1047 off: the normal screen if the alternate one is shown, the cursor where
# it is; outside the alternate screen nothing at all (xterm, VTE, tmux)
_LEAVE_ALTERNATE_IN_PLACE = b"\x1b[?1047l"


def screen_reset(fd: int, *, alternate: bool, cursor: bool, known: bool = True) -> bytes:
    """What a full-screen program sends its terminal when it exits, and one that was killed
    could not, for the terminal at ``fd`` ($TERM): leave the alternate screen, and show the
    cursor (terminfo ``cnorm``); b"" for what is not asked.  ``known``: the alternate screen
    is known to be shown, so terminfo's ``rmcup`` also brings the cursor back to where the
    program found it; otherwise (a guess) mode 1047 is turned off, which does nothing outside
    the alternate screen (``rmcup`` there would move the cursor to an old saved place)."""
    caps = [cap for cap, wanted in (("rmcup", alternate and known), ("cnorm", cursor))
            if wanted]
    found = _terminfo(fd, caps) if caps else []
    out = b"".join(_PADDING.sub(b"", seq) if seq else _RESET_FALLBACK[cap]
                   for cap, seq in zip(caps, found, strict=True))
    return (_LEAVE_ALTERNATE_IN_PLACE if alternate and not known else b"") + out


def _terminfo(fd: int, caps: list[str]) -> list[bytes | None]:
    """The terminfo strings ``caps`` of $TERM (None each: no curses, no $TERM, unknown)."""
    try:
        import curses
    except ImportError:
        return [None] * len(caps)
    try:
        curses.setupterm(None, fd)
    except curses.error:
        return [None] * len(caps)
    return [curses.tigetstr(cap) for cap in caps]


def may_suspend() -> bool:
    """May corral stop itself for a SIGTSTP?  Not when its process group is orphaned (no
    member's parent is in the session but outside the group: nobody there would ever resume
    it), as the kernel decides for a SIGTSTP left to its default action (signal(7))."""
    try:
        parent = os.getppid()
        return os.getsid(parent) == os.getsid(0) and os.getpgid(parent) != os.getpgrp()
    except OSError:
        return False  # the parent is gone: we were reparented, nobody's job any more


def die_by_signal(signo: int) -> None:
    """End this process by ``signo`` (its default action), after flushing stdout/stderr.

    A shell running ``corral run`` in a loop stops the loop only when its child died of
    SIGINT, not when it exited 130 (bash's "wait and cooperative exit"): after a Ctrl-C
    ended the task, corral ends the same way.  Returns only if the signal did not end us.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or hung-up stream: nothing more to say there
    signal.signal(signo, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signo])
    signal.raise_signal(signo)
