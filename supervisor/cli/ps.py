"""``corral ps``: the caller's tasks in the daemon (root: every uid's), newest first."""

from __future__ import annotations

import time

from . import fast_options
from .clientutil import add_socket, run_client
from .printable import printable

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    import argparse
    from typing import Any

__all__ = ["add_parser", "fast_args", "main"]

_STATES = ("queued", "starting", "running", "stopping", "finished")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ps", help="list tasks in the daemon",
                       description="List your tasks in the corral daemon, newest first.")
    p.add_argument("--state", choices=_STATES)
    p.add_argument("-n", "--limit", type=int, default=100, metavar="N")
    p.add_argument("--json", action="store_true", help="one JSON object with the tasks")
    add_socket(p)


def fast_args(words: list[str]) -> Any:
    """:func:`add_parser`'s options in their plain forms, without argparse (see
    ``cli/__init__.py``); None for anything else."""
    import types

    found = fast_options(words, ("--json",), ("--state", "--limit", "-n", "--socket"))
    if found is None:
        return None
    state, limit = found.get("--state"), found.get("-n", found.get("--limit", "100"))
    if state is not None and state not in _STATES:
        return None
    if "-n" in found and "--limit" in found:
        return None  # (which came last is argparse's to say)
    try:
        number = int(str(limit))
    except ValueError:
        return None
    return types.SimpleNamespace(state=state, limit=number, json=bool(found.get("--json")),
                                 socket=found.get("--socket"))


def _age(t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0, int(time.time() - t))
    return f"{s}s" if s < 120 else f"{s // 60}min" if s < 7200 else f"{s // 3600}h"


def _how(t: Any) -> str:
    """The outcome and exit status; a task that never started has no status of its own (its
    record's is the conventional one of its outcome: 143 for a cancelled task)."""
    if t.outcome is None:
        return "-"
    if t.started_at is None:
        return f"{t.outcome} (not run)"
    return f"{t.outcome} ({t.exit_status})"


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        tasks = client.list(state=args.state, limit=args.limit)
        if args.json:
            import json  # (only here: see supervisor/serve/fastjson.py)

            print(json.dumps({"tasks": [t._asdict() for t in tasks]}, indent=2))
            return 0
        print(f"{'ID':>8}  {'STATE':<9} {'UID':>6}  {'AGE':>6}  {'ENDED':<18} COMMAND")
        for t in tasks:
            command = printable(" ".join(t.argv))
            print(f"{t.id:>8}  {t.state:<9} {t.uid:>6}  {_age(t.created_at):>6}  "
                  f"{_how(t):<18} {command[:60]}")
        return 0

    return run_client(args, body)
