"""``corral wait ID``: wait for a task of the daemon's; exit with its status (as corral run)."""

from __future__ import annotations

import sys

from .clientutil import add_socket, fast_client_args, run_client
from .printable import printable

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    import argparse
    from typing import Any

__all__ = ["add_parser", "fast_args", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("wait", help="wait for a task; exit with its status",
                       description="Wait for a task of the daemon's to end; exit with its "
                                   "status, as `corral run` would.")
    p.add_argument("id")
    p.add_argument("-q", "--quiet", action="store_true", help="no line when it did not succeed")
    add_socket(p)


def report(task_id: str, result: dict[str, Any] | None, status: int | None,
           quiet: bool) -> int:
    """Print what ended the task unless it succeeded (or ``quiet``): one line with its outcome,
    the reason its record gives and the exit status, then its notes; the exit status to
    give."""
    status = 125 if status is None else status
    result = result or {}
    outcome = result.get("outcome") or "ended"
    if not quiet and outcome != "succeeded":
        reason = why(result)
        print(f"corral: task {task_id} {outcome}" + (f": {reason}" if reason else "")
              + f"; exit status {status}", file=sys.stderr)
        for note in result.get("notes") or ():
            print(f"corral: note: {printable(note)}", file=sys.stderr)
    return status


def why(result: dict[str, Any]) -> str:
    """What ended the task, as its record says: the error of a task that never ran (or was
    lost) with the step that failed, else how the main process ended; "" if the record says
    neither."""
    error = result.get("error") or {}
    if error.get("message"):
        step = f" (step: {error['step']})" if error.get("step") else ""
        return printable(str(error["message"])) + step
    exit_ = result.get("exit") or {}
    if exit_.get("signal_name") or exit_.get("signal"):
        return f"killed by {exit_.get('signal_name') or 'signal ' + str(exit_['signal'])}"
    if exit_.get("code") is not None:
        return f"exited with code {exit_['code']}"
    return ""


def fast_args(words: list[str]) -> Any:
    """:func:`add_parser`'s words in their plain forms, without argparse (``cli/__init__``)."""
    return fast_client_args(words, {"-q": "quiet", "--quiet": "quiet"}, ("id",))


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        t = client.wait(args.id)
        return report(t.id, t.result, t.exit_status, args.quiet)

    return run_client(args, body)
