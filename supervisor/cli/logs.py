"""``corral logs [-f] [--stderr] [--offset N] [--raw] ID``: a task's output, from the daemon's
files.

The bytes go to stdout as the task wrote them, unless stdout is a terminal: the task may be
another tenant's, and a control sequence in its output would act on the reader's terminal
(OSC 52 writes the clipboard, a report request types text back, cursor moves forge lines).
There newline, carriage return, tab, backspace and SGR colours go through, and every other
control character or escape sequence is shown escaped (``\\x1b]52;c;...``, see
printable.TerminalFilter); ``--raw`` writes the bytes as they are even there.

With ``-f`` it follows until the task ends, then exits with the task's status (as ``corral
run``), reconnecting (from the next byte) if the daemon restarts meanwhile; a Ctrl-C just
detaches (the task goes on), as from ``tail -f``.  Bytes past the daemon's output cap are
named on stderr (``bytes A..B are no longer held``), never silently skipped.
"""

from __future__ import annotations

import argparse
import sys

from .clientutil import add_socket, run_client, write_frames
from .wait import report

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("logs", help="a task's output", description="Print a task's output.")
    p.add_argument("id")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the task ends")
    p.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    p.add_argument("--offset", type=int, default=0, metavar="N",
                   help="start at byte N (resume where an earlier read stopped)")
    p.add_argument("--raw", action="store_true",
                   help="write the bytes as they are even to a terminal (there, by default, "
                        "control characters and escape sequences other than colours are "
                        "shown escaped, so that the task's output cannot act on the "
                        "terminal)")
    add_socket(p)


def main(args: argparse.Namespace) -> int:
    stream = "stderr" if args.stderr else "stdout"

    def body(client: Any) -> int:
        frames = client.follow(args.id, stream, args.offset) if args.follow else \
            client.output(args.id, stream, args.offset)
        terminal = None
        if sys.stdout.isatty() and not args.raw:
            from .printable import TerminalFilter  # (not at the top: a pipe never needs it)

            terminal = TerminalFilter()
        end = write_frames(frames, sys.stdout.buffer, stream, terminal)
        if args.follow and end is not None:
            return report(args.id, end.result, end.exit_status, quiet=True)
        return 0

    return run_client(args, body)
