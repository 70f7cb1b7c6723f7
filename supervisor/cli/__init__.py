"""The ``corral`` command: one module per verb, loaded only when that verb runs.

    corral run [OPTIONS] -- CMD [ARGS...]     run a command in its own cgroup leaf (run.py)
    corral check [--json]                     what works on this machine (check.py)

Each verb module has ``add_parser(subparsers)`` and ``main(args) -> int``, and may have
``prepare_argv(words) -> words`` (its own reading of the words after the verb, before
argparse) and ``EARLY`` (a callable run first of all, before anything heavy is imported:
``corral run`` blocks its signals there).  This module imports neither trio nor the
supervisor's core, so that a verb that does not need them (a client of the daemon) starts as
fast as Python itself.

Exit statuses are shared by every verb: 125 is corral's own failure, bad arguments included,
and nothing was started.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # not typing's: importing typing costs every client verb's start-up
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["EXIT_FAILURE", "VERBS", "die", "main", "missing_cgroup_root"]

EXIT_FAILURE = 125

# verb -> module (relative to this package), in the order --help lists them
VERBS: dict[str, str] = {
    "run": ".run",
    "check": ".check",
    "serve": ".serve",
    "submit": ".submit",
    "ps": ".ps",
    "show": ".show",
    "wait": ".wait",
    "logs": ".logs",
    "attach": ".attach",
    "stop": ".stop",
    "signal": ".signal",
    "session": ".session",
    "mcp": ".mcp",
}


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


def die(message: str) -> NoReturn:
    """Print ``corral: message`` on stderr and exit 125 (corral's own failure)."""
    print(f"corral: {message}", file=sys.stderr)
    raise SystemExit(EXIT_FAILURE)


def missing_cgroup_root(path: str | None) -> str | None:
    """Why ``--cgroup-root PATH`` cannot be used because it does not exist, with the fix (make
    it inside the cgroup2 mount, or mount one); None if it exists (or none was given): the
    core then checks what it is."""
    import os

    if path is None or os.path.exists(path):
        return None
    from cgroupfs import NoCgroup2Error, find_cgroup2_mount

    try:
        mount = find_cgroup2_mount().mount_point
    except NoCgroup2Error:
        return (f"--cgroup-root {path} does not exist, and this host has no cgroup2 mount to "
                f"make it in; mount one (mount -t cgroup2 none /sys/fs/cgroup) and make the "
                f"directory there")
    absolute = os.path.abspath(path)
    if os.path.commonpath([absolute, mount]) == mount:
        return (f"--cgroup-root {path} does not exist; make it first (mkdir -p {path}), or "
                f"give an existing cgroup")
    return (f"--cgroup-root {path} does not exist, and is not inside the cgroup2 mount "
            f"({mount}); give a cgroup there, e.g. mkdir -p {mount}/corral and "
            f"--cgroup-root {mount}/corral")


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked
    (importlib.metadata costs tens of milliseconds at every start otherwise)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show corral's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("corral")
        except PackageNotFoundError:
            text = "unknown (not installed)"
        parser.exit(0, f"corral {text}\n")


def _parser(verb: str | None) -> Parser:
    p = Parser(prog="corral", description="Run commands in their own cgroup v2 leaf: time "
               "limits, resource limits, graceful-then-forced stops, nothing left behind.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="verb", required=True, parser_class=Parser)
    # Only the verb being run is imported and given a parser (each costs a few hundred us);
    # without one (--help, a typo) every verb is there to be listed or suggested.
    for name, module in VERBS.items():
        if verb is None or name == verb:
            importlib.import_module(module, __name__).add_parser(sub)
    return p


def _find_verb(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if arg in VERBS:
            return arg
        if not arg.startswith("-"):
            return None
    return None


def _std_fds_open() -> None:
    """Started with fd 0, 1 or 2 closed, the next file we open would take that number (and a
    task inheriting our stdio would get it: corral run's signalfd as its stdin).  Each closed
    one is opened on /dev/null first, as daemons and shells do."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one


def _launched(early: object) -> bool:
    """The launcher (native/corral_launch.c) started Python with the job signals blocked, so
    that a Ctrl-C while Python starts is never a traceback.  A verb with an ``EARLY`` hook
    decides for itself (``corral run`` keeps them blocked and reads them from a signalfd;
    ``corral serve`` keeps its stop signals until its receiver is open); every other verb gets
    them back, as a plain Python program has them.  The marker goes from the environment, so
    that no task inherits it.  The process is named ``corral`` again (the exec of Python named
    it python3), as ps, top and pgrep knew it.  True if the launcher started us."""
    import os

    if os.environ.pop("CORRAL_LAUNCHER", None) is None:
        return False
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write("corral")
    except OSError:
        pass  # (no /proc: only the name is lost)
    if early is not None:
        return True
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, (
        signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
        signal.SIGWINCH, signal.SIGCONT))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    _std_fds_open()
    args_list = list(sys.argv[1:] if argv is None else argv)
    verb = _find_verb(args_list)
    early = None
    if verb is not None:
        module = importlib.import_module(VERBS[verb], __name__)
        early = getattr(module, "EARLY", None)
    launched = _launched(early)
    if verb is not None:
        if early is not None:
            early()
        prepare = getattr(module, "prepare_argv", None)
        if prepare is not None:
            at = args_list.index(verb) + 1
            args_list[at:] = prepare(args_list[at:])
    args = _parser(verb).parse_args(args_list)
    module = importlib.import_module(VERBS[args.verb], __name__)
    status: int = module.main(args)
    if launched and getattr(module, "EXIT_AT_ONCE", False):
        _exit_at_once(status)
    return status


def _exit_at_once(status: int) -> None:
    """The command's work is done (its files written and closed, its processes and cgroups
    gone): exit without tearing the interpreter down (freeing every module and object took
    ~20 ms of ``corral run``'s start-up).  Output is flushed first; if that fails, the usual
    exit reports it."""
    import os

    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
