"""``corral stop [--force] ID``: stop a task of the daemon's (again, or --force: kill now)."""

from __future__ import annotations

import sys

from .clientutil import add_socket, fast_client_args, run_client

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    import argparse
    from typing import Any

__all__ = ["add_parser", "fast_args", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("stop", help="stop a task (a second stop kills it now)",
                       description="Stop a task gracefully: its stop signal, then the kill "
                                   "at the end of its grace.  Again, or --force: kill now.  A "
                                   "queued task never starts.")
    p.add_argument("id")
    p.add_argument("--force", action="store_true", help="kill now")
    add_socket(p)


def fast_args(words: list[str]) -> Any:
    """:func:`add_parser`'s words in their plain forms, without argparse (``cli/__init__``)."""
    return fast_client_args(words, {"--force": "force"}, ("id",))


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        if client.stop(args.id, force=args.force):
            print(f"task {args.id}: {'killing' if args.force else 'stopping'}",
                  file=sys.stderr)
        else:
            print(f"task {args.id} had already ended", file=sys.stderr)
        return 0

    return run_client(args, body)
