"""``corral mcp [--socket PATH | --local] [OPTIONS]``: a Model Context Protocol server on stdio.

An MCP host starts it as a subprocess; the server is ``supervisor.mcp`` (its options are
defined there, once, for this verb and for ``python -m supervisor.mcp``).  Nothing heavy is
imported until the verb runs.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # not typing's: every verb's start-up (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    from ..mcp import DESCRIPTION, EPILOG, add_options

    p = sub.add_parser("mcp", help="a Model Context Protocol server on stdio (for agents)",
                       description=DESCRIPTION, epilog=EPILOG)
    add_options(p)


def main(args: argparse.Namespace) -> int:
    from ..mcp import run

    return run(args)
