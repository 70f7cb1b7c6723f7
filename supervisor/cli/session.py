"""``corral session open|exec|show|ls|close``: the daemon's sessions from the shell
(docs/api.md, "Sessions": each command a task of its own; ``cd`` and ``export`` carry).

    id=$(corral session open --cwd /src)
    corral session exec "$id" -- 'cd lib && export CFLAGS=-O2'
    corral session exec --wait 30s "$id" -- make     # its output, and its status
    corral session close "$id"                       # what of it still runs is stopped

(``exec``'s options come before the id: what follows the id is the command.)  ``exec``
prints the command's output (stdout, then stderr) once it ends and exits with its
status, as ``corral run`` would; if ``--wait`` passes first, it prints the output so far and
the task's id (``corral logs -f ID`` follows it, ``corral wait ID`` waits) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys

from .clientutil import add_socket, run_client
from .printable import printable

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("session", help="a shell's cd and export carried between commands",
                       description="The daemon's sessions: each command runs as a task of "
                                   "its own; the directory and exported variables it leaves "
                                   "are the next one's.")
    verbs = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    o = verbs.add_parser("open", help="open a session; prints its id")
    o.add_argument("--cwd", metavar="DIR")
    o.add_argument("--shell", metavar="PATH")
    o.add_argument("--time-limit", metavar="DURATION", help="each command's, unless it says")
    o.add_argument("-E", "--setenv", action="append", default=[], metavar="NAME=VALUE")
    o.add_argument("-p", "--property", action="append", default=[], metavar="NAME=VALUE")
    e = verbs.add_parser("exec", help="run a command in a session")
    e.add_argument("id")
    e.add_argument("--wait", default="1h", metavar="DURATION",
                   help="answer by then at the latest: a command still running goes on, "
                        "and corral exits 75 (default 1h)")
    e.add_argument("--background", action="store_true",
                   help="beside the foreground command; carries nothing; prints its id")
    e.add_argument("--time-limit", metavar="DURATION")
    e.add_argument("--cwd", metavar="DIR",
                   help="run it in DIR, not the session's directory (what it leaves carries)")
    e.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND LINE")
    others = [verbs.add_parser(name, help=what) for name, what in (
        ("show", "a session as JSON"), ("close", "close it: stop what runs"))]
    for parser in others:
        parser.add_argument("id")
    others.append(verbs.add_parser("ls", help="your sessions"))
    for parser in (o, e, *others):
        add_socket(parser)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    from . import die

    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            die(f"{what} {item!r}: give NAME=VALUE")
        out[name] = value
    return out


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        if args.action == "open":
            options = {k: v for k, v in (("cwd", args.cwd), ("shell", args.shell),
                                         ("time_limit", args.time_limit)) if v}
            if args.setenv:
                options["env"] = _pairs(args.setenv, "-E")
            if args.property:
                options["properties"] = _pairs(args.property, "-p")
            print(client.open_session(**options)["id"])
            return 0
        if args.action == "exec":
            return _exec(client, args)
        if args.action == "ls":
            for s in client.sessions():
                # (a tenant's cwd, escaped: root's terminal acts on no one's sequences)
                print(f"{s['id']:>6}  {s['state']:<6}  {printable(s['cwd'])}  "
                      f"{'running ' + ','.join(s['running']) if s['running'] else ''}")
            return 0
        if args.action == "close":
            stopped = client.close_session(args.id)["stopped"]
            print(f"session {args.id}: closed" + (f"; stopped {', '.join(stopped)}"
                                                  if stopped else ""), file=sys.stderr)
            return 0
        print(json.dumps(client.show_session(args.id), indent=2))
        return 0

    return run_client(args, body)


def _exec(client: Any, args: argparse.Namespace) -> int:
    from . import die
    from .submit import _bound, still_running
    from .wait import report

    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        die("no command given: corral session exec ID -- COMMAND LINE")
    options: dict[str, Any] = {k: v for k, v in (("time_limit", args.time_limit),
                                                  ("cwd", args.cwd)) if v}
    if args.background:
        print(client.exec(args.id, " ".join(words), background=True, **options)["id"])
        return 0
    answer = client.exec(args.id, " ".join(words), wait=args.wait, **options)
    if answer["state"] != "finished":
        for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            so_far = answer["output"][stream]
            out.write(so_far["head"] + (f"\n[... {so_far['dropped_bytes']} bytes ...]\n"
                                        if so_far["dropped_bytes"] else "") + so_far["tail"])
        return still_running(answer["id"], _bound(args.wait))
    result = answer["result"]
    for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        part = result["output"][stream]
        out.write(part["head"] + (f"\n[... {part['dropped_bytes']} bytes: corral logs "
                                  f"{answer['id']} ...]\n" if part["dropped_bytes"] else "")
                  + part["tail"])
    return report(answer["id"], result, answer["exit_status"], quiet=True)
