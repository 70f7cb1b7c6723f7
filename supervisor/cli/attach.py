"""``corral attach [--detach-keys ctrl-],q] ID``: this terminal, raw, on a terminal task of the
daemon's: its screen here, the keys there, the window size kept in step (SIGWINCH).

The last :data:`SCREEN` bytes of its output are shown first (the recent screen: the daemon
keeps every byte), then what comes.  The detach keys (as ``docker attach --detach-keys``;
default Ctrl-] then q) leave it running; a Ctrl-C is a key like any other and goes to the
task.  When the task ends: its status, as ``corral run``'s.  A task of another uid's (root
attaching to a tenant's) is shown with its control sequences escaped, as ``corral logs``
does: only your own task's bytes reach your terminal raw.
"""

from __future__ import annotations

import argparse
import os
import sys

from .clientutil import add_socket, run_client

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "attach", "main"]

SCREEN = 16 << 10  # bytes of recent output shown on attaching


def add_parser(sub: Any) -> None:
    p = sub.add_parser("attach", help="this terminal on a terminal task (detach: Ctrl-], q)",
                       description="Attach this terminal to a task submitted with a terminal "
                                   "(corral submit -t): raw mode, its screen here, the keys "
                                   "there.  The detach keys leave it running.")
    p.add_argument("id")
    p.add_argument("--detach-keys", default="ctrl-],q", metavar="KEYS",
                   help="comma-separated keys that detach: a letter or ctrl-X (default "
                        "ctrl-],q)")
    add_socket(p)


def detach_sequence(text: str) -> bytes:
    """``"ctrl-],q"`` -> ``b"\\x1dq"`` (ValueError naming the key it cannot read)."""
    out = bytearray()
    for key in text.split(","):
        if key.lower().startswith("ctrl-") and len(key) == 6:
            code = ord(key[5].upper()) ^ 0x40
            if not 0 <= code < 32:
                raise ValueError(f"--detach-keys: {key!r} is no control key")
            out.append(code)
        elif len(key) == 1 and key.isprintable():
            out += key.encode()
        else:
            raise ValueError(f"--detach-keys: {key!r} is not a key (a letter, or ctrl-X)")
    if not out:
        raise ValueError("--detach-keys: no keys given")
    return bytes(out)


def main(args: argparse.Namespace) -> int:
    from . import die

    try:
        keys = detach_sequence(args.detach_keys)
    except ValueError as e:
        die(str(e))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        die("corral attach needs a terminal on stdin and stdout; read a task's output with "
            "corral logs -f ID")
    return run_client(args, lambda client: attach(client, args.id, keys))


def attach(client: Any, task_id: str, keys: bytes) -> int:
    """Attach the terminal on fds 0 and 1 to ``task_id``; the exit status (0 when
    detached)."""
    import signal
    import termios
    import threading
    import tty

    from ..client import Client
    from .wait import report

    ended: dict[str, Any] = {}
    info = client.show(task_id)
    if not (info.spec or {}).get("tty"):
        from . import die

        die(f"task {task_id} has no terminal (submit it with corral submit -t, or \"tty\")")
    terminal = None
    if info.uid != os.getuid():
        from .printable import TerminalFilter

        terminal = TerminalFilter()
    # (a connection each: the screen's stream is read in a thread of its own, left to end
    # with the process when we detach)
    keyboard, viewer = Client(client.socket_path), Client(client.socket_path)

    def resize(*_: Any) -> None:
        if "frame" in ended:
            raise _Ended  # (out of the key loop's read: the task has ended)
        size = os.get_terminal_size(1)
        if not (size.lines and size.columns):
            return  # (a terminal never sized: the task keeps its own)
        try:
            keyboard.resize(task_id, size.lines, size.columns)
        except Exception:
            pass  # (ended meanwhile)

    def screen() -> None:
        out = sys.stdout.buffer
        try:
            for frame in viewer.output(task_id, follow=True, tail=SCREEN):
                if frame.kind == "data":
                    out.write(terminal.feed(frame.data) if terminal else frame.data)
                    out.flush()
                elif frame.kind == "end":
                    ended["frame"] = frame
        finally:
            ended.setdefault("frame", None)
            os.kill(os.getpid(), signal.SIGWINCH)  # (wakes the key loop's read)

    saved = termios.tcgetattr(0)
    old_winch = signal.signal(signal.SIGWINCH, resize)
    tty.setraw(0)
    try:
        resize()
        threading.Thread(target=screen, daemon=True).start()
        detached = _keys(keyboard, task_id, keys, ended)
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_winch)
        keyboard.close()
    if detached:
        print(f"\r\ncorral: detached from task {task_id} (it goes on: corral attach "
              f"{task_id})", file=sys.stderr)
        return 0
    end = ended.get("frame")
    if end is None:
        return 0
    return report(task_id, end.result, end.exit_status, quiet=True)


class _Ended(Exception):
    """The task ended while the key loop waited for a key."""


def _keys(keyboard: Any, task_id: str, keys: bytes, ended: dict[str, Any]) -> bool:
    """Keys from fd 0 to the task until the detach keys (True) or its end (False)."""
    pending = b""
    while "frame" not in ended:
        try:
            data = os.read(0, 1024)
        except _Ended:
            return False
        if not data:
            return True  # (our terminal went away: the task goes on)
        data = pending + data
        pending = b""
        if keys in data:
            before = data[:data.index(keys)]
            if before:
                keyboard.write_stdin(task_id, before)
            return True
        for n in range(len(keys) - 1, 0, -1):  # a detach sequence begun, not finished
            if data.endswith(keys[:n]):
                data, pending = data[:-n], keys[:n]
                break
        if data:
            try:
                keyboard.write_stdin(task_id, data)
            except Exception:  # (it ended as we typed: its end frame is on its way)
                import time

                deadline = time.monotonic() + 5
                while "frame" not in ended and time.monotonic() < deadline:
                    time.sleep(0.01)
                if "frame" not in ended:
                    raise
                return False
    return False
