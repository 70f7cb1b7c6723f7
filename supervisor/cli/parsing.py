"""The ``corral`` command's argparse parser: built only for a verb that needs it (every verb's
``--help``, and any words a verb's :func:`fast_args` does not read), since argparse brings
``re``, ``enum`` and ``gettext``: ~10 ms of a client verb's start-up."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import EXIT_FAILURE, VERBS

TYPE_CHECKING = False  # not typing's: importing typing costs every client verb's start-up
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["Parser", "parser"]


def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size() finds it ($COLUMNS, then stdout's
    terminal, else 80), without importing shutil."""
    import os

    try:
        columns = int(os.environ.get("COLUMNS", ""))
        if columns > 0:
            return columns
    except ValueError:
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter given its width: its own way of finding it imports shutil (~2 ms
    of every client verb's start-up, on each ``add_argument``), for help nobody asked for."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is corral's own failure: one line, exit 125."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_FAILURE, f"corral: {message} (see: {self.prog} --help)\n")


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked
    (importlib.metadata costs tens of milliseconds at every start otherwise)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show corral's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("corral")
        except PackageNotFoundError:
            text = "unknown (not installed)"
        parser.exit(0, f"corral {text}\n")


def parser(verb: str | None) -> Parser:
    p = Parser(prog="corral", description="Run commands in their own cgroup v2 leaf: time "
               "limits, resource limits, graceful-then-forced stops, nothing left behind.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="verb", required=True, parser_class=Parser)
    # Only the verb being run is imported and given a parser (each costs a few hundred us);
    # without one (--help, a typo) every verb is there to be listed or suggested.
    for name, module in VERBS.items():
        if verb is None or name == verb:
            importlib.import_module(module, __package__).add_parser(sub)
    return p


