"""``corral wait ID``: wait for a task of the daemon's; exit with its status (as corral run)."""

from __future__ import annotations

import argparse
import sys

from .clientutil import add_socket, run_client

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("wait", help="wait for a task; exit with its status",
                       description="Wait for a task of the daemon's to end; exit with its "
                                   "status, as `corral run` would.")
    p.add_argument("id")
    p.add_argument("-q", "--quiet", action="store_true", help="no line when it did not succeed")
    add_socket(p)


def report(outcome: str | None, status: int | None, quiet: bool) -> int:
    """Print a line unless it succeeded (or ``quiet``); the exit status to give."""
    status = 125 if status is None else status
    if not quiet and outcome != "succeeded":
        print(f"corral: task {outcome}: exit status {status}", file=sys.stderr)
    return status


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        t = client.wait(args.id)
        return report(t.outcome, t.exit_status, args.quiet)

    return run_client(args, body)
