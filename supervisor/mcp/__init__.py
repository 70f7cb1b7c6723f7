"""``corral mcp``: a Model Context Protocol server on stdio, for an agent's shell.

An MCP host starts it as a subprocess (``corral mcp`` or ``python -m supervisor.mcp``) and
calls its tools: ``run`` a command in a session (cwd and exported variables persist from one
command to the next; a time limit; a ``wait`` bound after which the answer says "still
running" and the task goes on; output head and tail with the dropped count), ``output`` from
an offset, ``signal``, ``stop`` (the whole tree), ``list``, ``new_session``.  Each command is
a corral task: its own cgroup leaf, so a stop or the time limit reaches everything it
started.  The policy (time limit and ceiling, properties such as ``MemoryMax``) is fixed by
the server's options; no tool changes it.  On stdin EOF the server exits: in-process, it
stops what it started first; on the daemon, the tasks still running go on.

Layout (one concern per module)::

    __init__.py   main(argv) / run(args): options, the backend chosen, app.serve under trio
    app.py        the SDK's low-level Server on stdio, over a backend
    tools.py      the tools: descriptions, one handler each, results and isError
    schemas.py    each tool's input and output JSON Schema
    backend.py    the Backend protocol the tools call, and its request/limit types
    daemon.py     DaemonBackend: corral serve's sessions over its socket (supervisor.client)
    local.py      LocalBackend: an in-process supervisor; sessions on serve/sessions.py

Backends, behind ``backend.Backend`` (the tools know only that protocol): ``daemon.py``,
``corral serve``'s session API through ``supervisor.client`` (tasks outlive the host; its
``Limits`` come from ``/v1/limits``), and ``local.py``'s in-process supervisor (tasks end
with the server).  :func:`main` chooses: ``--socket PATH`` the daemon, ``--local`` in-process,
neither: the daemon if the default socket answers, else in-process.  The instructions say
which.
"""

from __future__ import annotations

import argparse
import logging
import sys

__all__ = ["DESCRIPTION", "EPILOG", "add_options", "choose_socket", "main", "run"]

DEFAULT_TIME_LIMIT = "10min"


DESCRIPTION = ("A Model Context Protocol server on stdio, for an MCP host to start: shell "
               "commands in sessions (cd and export carry over), each a corral task (own "
               "cgroup, time limit, stop of the whole tree, a record).")
EPILOG = ("Backend: with --socket PATH, the corral serve daemon there (tasks outlive this "
          "server and its host); with --local, an in-process supervisor (tasks end when the "
          "host closes stdin); with neither, the daemon if $CORRAL_SOCKET (else "
          "/run/corral/corral.sock) answers, else in-process.  An MCP host's config: "
          '{"mcpServers": {"corral": {"command": "corral", "args": ["mcp"]}}}')


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of ``corral mcp`` (also the CLI verb's: supervisor/cli/mcp.py)."""
    p.add_argument("--socket", metavar="PATH",
                   help="use the corral serve daemon at PATH (tasks outlive this server)")
    p.add_argument("--local", action="store_true",
                   help="run commands in an in-process supervisor (they end with this server)")
    p.add_argument("--time-limit", metavar="DURATION", default=DEFAULT_TIME_LIMIT,
                   help=f"time limit of a command that gives none (default "
                        f"{DEFAULT_TIME_LIMIT})")
    p.add_argument("--max-time-limit", metavar="DURATION",
                   help="the ceiling of any command's time limit (default: --time-limit)")
    p.add_argument("-p", "--property", metavar="NAME=VALUE", action="append", default=[],
                   help="systemd-style property for every command (as corral run -p); "
                        "the model cannot change these")
    p.add_argument("--cgroup-root", metavar="PATH",
                   help="cgroup v2 directory for the in-process supervisor's root (implies "
                        "--local)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="corral mcp", description=DESCRIPTION, epilog=EPILOG)
    add_options(p)
    return p


def main(argv: list[str]) -> int:
    """``python -m supervisor.mcp ARGS``: :func:`run` on the parsed options."""
    return run(_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the server until stdin ends; the exit status (2: bad options, 1: the supervisor
    or the daemon could not be used)."""
    if args.socket is not None and args.local:
        print("corral mcp: --socket and --local exclude each other", file=sys.stderr)
        return 2
    if args.socket is not None and args.cgroup_root is not None:
        print("corral mcp: --cgroup-root is for the in-process supervisor (--local); the "
              "daemon has its own", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="corral mcp: %(levelname)s: %(message)s")
    import trio

    from .. import SupervisorError
    from .app import serve

    socket = choose_socket(args.socket, args.local or args.cgroup_root is not None)
    try:
        trio.run(lambda: serve(socket=socket, cgroup_root=args.cgroup_root,
                               time_limit=args.time_limit,
                               max_time_limit=args.max_time_limit,
                               properties=list(args.property)))
    except Exception as e:
        cause = _alone(e)
        if not isinstance(cause, ValueError | SupervisorError | OSError):
            raise
        print(f"corral mcp: {cause}", file=sys.stderr)
        return 2 if isinstance(cause, ValueError) else 1
    except KeyboardInterrupt:
        return 130
    return 0


def choose_socket(socket: str | None, local: bool) -> str | None:
    """The daemon's socket to serve on, or None for in-process: ``--socket`` forces the
    daemon, ``--local`` (or ``--cgroup-root``) in-process; neither: the daemon if its socket
    ($CORRAL_SOCKET, else /run/corral/corral.sock) answers now."""
    if socket is not None or local:
        return socket
    from ..client import default_socket
    from .daemon import answering

    found = default_socket()
    return found if answering(found) else None


def _alone(e: BaseException) -> BaseException:
    """The one exception a nest of one-exception groups (trio's nurseries) holds, else e."""
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e
