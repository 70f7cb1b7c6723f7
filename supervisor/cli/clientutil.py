"""What the daemon's client verbs share: ``--socket``, one Client, errors as corral's own.

A client started right after ``corral serve &`` waits up to :data:`START_WAIT` seconds for the
daemon's socket to appear and listen.  Ctrl-C (SIGINT) has its default action: the client just
ends, by that signal (status 130 in a shell), as ``tail -f`` does, never with a traceback;
``corral submit --wait/--follow`` asks the daemon to stop the task instead (submit.py).

No trio and no core import here: ``corral ps`` must start about as fast as Python does.
"""

from __future__ import annotations

import sys

from ..client import ApiError, Client, DaemonUnavailable
from . import EXIT_FAILURE, fast_options

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

    from .printable import TerminalFilter

__all__ = ["START_WAIT", "add_socket", "fast_client_args", "run_client"]

START_WAIT = 5.0  # seconds a client waits for a daemon that is starting (its socket bound)


def add_socket(p: Any) -> None:
    p.add_argument("--socket", metavar="PATH",
                   help="the daemon's socket (default: $CORRAL_SOCKET, else "
                        "/run/corral/corral.sock)")


def fast_client_args(words: list[str], flags: dict[str, str], operands: tuple[str, ...]
                     ) -> Any:
    """A client verb's words (``flags``: option -> attribute, ``--socket``, the ``operands``
    by name) read without argparse, as argparse would (``fast_options``); None for anything
    else (argparse then reads them, its help and errors included)."""
    import types

    found = fast_options(words, tuple(flags), ("--socket",), len(operands))
    if found is None:
        return None
    values: dict[str, object] = {attr: False for attr in flags.values()}
    values.update({attr: True for flag, attr in flags.items() if found.get(flag)})
    values.update({name: found[str(i)] for i, name in enumerate(operands)})
    return types.SimpleNamespace(socket=found.get("--socket"), **values)


def run_client(args: argparse.Namespace, body: Callable[[Client], int]) -> int:
    """``body(client)``; an error of the daemon's or of the connection is printed as
    ``corral: message`` and gives exit status 125."""
    import _signal  # type: ignore[import-not-found]  # (signal's core, without its enums: ~2 ms)

    if _signal.getsignal(_signal.SIGINT) != _signal.SIG_IGN:  # (ignored: `corral logs &`)
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    try:
        with Client(args.socket, start_wait=START_WAIT) as client:
            return body(client)
    except ApiError as e:
        print(f"corral: {e.message}", file=sys.stderr)
    except DaemonUnavailable as e:
        print(f"corral: {e}", file=sys.stderr)
    except BrokenPipeError:
        return 141  # our reader went away (corral logs | head)
    return EXIT_FAILURE


def write_frames(frames: Any, out: Any, stream: str,
                 terminal: TerminalFilter | None = None) -> Any:
    """Write data frames' bytes to ``out`` (binary), through ``terminal`` if given, gaps as
    notes on stderr; the end frame (None if the stream ended without one, or the task has not
    finished)."""
    end = None
    for frame in frames:
        if frame.kind == "data":
            out.write(terminal.feed(frame.data) if terminal else frame.data)
            out.flush()
        elif frame.kind == "gap":
            if terminal:  # the bytes either side of a gap were never adjacent
                out.write(terminal.flush())
                out.flush()
            print(f"corral: {stream} bytes {frame.offset}..{frame.end} are no longer held "
                  f"(past the daemon's --output-cap)", file=sys.stderr)
        elif frame.kind == "end":
            end = frame
            break
    if terminal:
        out.write(terminal.flush())
        out.flush()
    return end if end is not None and end.finished else None
