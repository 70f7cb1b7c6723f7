"""``corral wait ID``: wait for a task of the daemon's; exit with its status (as corral run)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..serve.protocol import exit_status
from .clientutil import add_socket, run_client

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("wait", help="wait for a task; exit with its status",
                       description="Wait for a task of the daemon's to end; exit with its "
                                   "status, as `corral run` would.")
    p.add_argument("id")
    p.add_argument("-q", "--quiet", action="store_true", help="no line when it did not succeed")
    add_socket(p)


def report(result: dict[str, Any], quiet: bool) -> int:
    status = exit_status(result)
    if not quiet and result.get("outcome") != "succeeded":
        detail = result.get("error") or f"exit status {status}"
        print(f"corral: task {result.get('outcome')}: {detail}", file=sys.stderr)
    return status


def main(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        t = client.wait(args.id)
        assert t.result is not None
        return report(t.result, args.quiet)

    return run_client(args, body)
