"""``corral signal ID SIGNAL``: a signal to a running task of the daemon's, not a stop."""

from __future__ import annotations

import argparse
import sys

from .clientutil import add_socket, run_client

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "main"]

SIGNALS = ("INT", "QUIT", "HUP", "TERM", "USR1", "USR2", "WINCH", "CONT")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("signal", help="send a signal to a running task (not a stop)",
                       description="Send SIGNAL to every process of a running task (a "
                                   "terminal task: to its foreground process group, as the key "
                                   "would).  The task is not stopped; its record lists the "
                                   "signal.  KILL and STOP are not sent this way: corral stop "
                                   "--force kills the task's tree.")
    p.add_argument("id")
    p.add_argument("signal", type=lambda s: s.upper().removeprefix("SIG"),
                   choices=SIGNALS, metavar="SIGNAL", help=" ".join(SIGNALS))
    add_socket(p)


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        sent = client.signal(args.id, args.signal)
        print(f"task {args.id}: {sent['signal']} sent to its {sent['to']}", file=sys.stderr)
        return 0

    return run_client(args, body)
