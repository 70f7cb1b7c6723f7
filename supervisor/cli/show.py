"""``corral show ID [--json]``: one task of the daemon's, with its result once finished."""

from __future__ import annotations

from .clientutil import add_socket, fast_client_args, run_client
from .printable import printable
from .wait import why

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    import argparse
    from typing import Any

__all__ = ["add_parser", "fast_args", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("show", help="show one task of the daemon's",
                       description="Show a task: state, request, and its result once ended.")
    p.add_argument("id")
    p.add_argument("--json", action="store_true",
                   help="the task as JSON (its result as `corral run --json-file` writes it)")
    add_socket(p)


def _seconds(value: float | None) -> str:
    """A figure of the record in seconds, or "n/a" where it has none (a task that never ran,
    a leaf without the accounting)."""
    return "n/a" if value is None else f"{value:.3f}s"


def fast_args(words: list[str]) -> Any:
    """:func:`add_parser`'s words in their plain forms, without argparse (``cli/__init__``)."""
    return fast_client_args(words, {"--json": "json"}, ("id",))


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        t = client.show(args.id)
        if args.json:
            import json  # (only here: see supervisor/serve/fastjson.py)

            print(json.dumps(t._asdict(), indent=2, sort_keys=True))
            return 0
        print(f"Task {t.id}: {t.state}  (uid {t.uid}, gid {t.gid})")
        print(f"Command: {printable(' '.join(t.argv))}")
        if t.name:
            print(f"Name: {printable(t.name)}")
        if t.pid is not None:
            print(f"Main PID: {t.pid}")
        if t.queue_position is not None:
            print(f"Queued: {t.queue_position} ahead of it")
        r = t.result
        if r is not None:
            reason = why(r)
            print(f"Outcome: {r['outcome']}  exit status {t.exit_status}"
                  + (f"  ({reason})" if reason else ""))
            usage = r.get("usage") or {}
            print(f"Wall: {_seconds(usage.get('wall_s'))}  "
                  f"CPU: {_seconds(usage.get('cpu_total_s'))}")
            print(f"Cleanup: {r['cleanup']['state']}")
            for note in r.get("notes") or ():
                print(f"Note: {printable(note)}")
        return 0

    return run_client(args, body)
