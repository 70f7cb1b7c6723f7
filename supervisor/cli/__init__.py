"""The ``corral`` command: one module per verb, loaded only when that verb runs.

    corral run [OPTIONS] -- CMD [ARGS...]     run a command in its own cgroup leaf (run.py)
    corral check [--json]                     what works on this machine (check.py)

Each verb module has ``add_parser(subparsers)`` and ``main(args) -> int``, and may have
``prepare_argv(words) -> words`` (its own reading of the words after the verb, before
argparse), ``fast_args(words) -> namespace or None`` (the words after the verb read without
argparse, which brings ``re`` and ``enum``: ~10 ms of a client's start-up; None for anything
but the plain forms, and argparse reads them as always, its help and errors included) and
``EARLY`` (a callable run first of all, before anything heavy is imported: ``corral run``
blocks its signals there).  This module imports neither trio nor the
supervisor's core, so that a verb that does not need them (a client of the daemon) starts as
fast as Python itself.

Exit statuses are shared by every verb: 125 is corral's own failure, bad arguments included,
and nothing was started.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing costs every client verb's start-up
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType
    from typing import NoReturn

__all__ = ["EXIT_FAILURE", "VERBS", "die", "fast_options", "main", "missing_cgroup_root"]

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


def fast_options(words: Sequence[str], flags: Sequence[str], valued: Sequence[str],
                 operands: int = 0) -> dict[str, str | bool] | None:
    """``words`` read as options and ``operands`` operands, in any order: each of ``flags``
    (``--json``), each of ``valued`` with its value (``--limit 5``, ``--limit=5``, ``-n 5``,
    ``-n5``); keyed by the option as written in ``flags`` and ``valued``, the operands by
    their place (``"0"``...).  None for anything else (an abbreviation, ``--help``, a word or
    value that looks like an option, ``--``, too few or too many operands, a valued option
    given twice: argparse checks each value, ``--limit=x --limit=0`` is an error): the verb's
    ``fast_args`` then leaves the words to argparse."""
    found: dict[str, str | bool] = {}
    given = 0
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in flags:
            found[word] = True
            continue
        if word and not word.startswith("-"):
            found[str(given)] = word
            given += 1
            continue
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if not eq and len(name) > 2 and name[1] != "-" and name[:2] in valued:
            name, eq, value = name[:2], "=", name[2:]  # (-n5)
        if name not in valued:
            return None
        if not eq:
            if i == len(words):
                return None
            value = words[i]
            i += 1
        if not value or value.startswith("-") or name in found:
            return None
        found[name] = value
    return found if given == operands else None


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
    import _signal  # type: ignore[import-not-found]  # (signal's core, without its enums: ~2 ms)

    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, (
        _signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGTSTP,
        _signal.SIGWINCH, _signal.SIGCONT))
    return True


def _verb_module(verb: str) -> ModuleType:
    """The verb's module (by ``__import__``: ``importlib``'s package costs every client verb
    ~0.3 ms of start-up)."""
    name = __name__ + VERBS[verb]
    __import__(name)
    return sys.modules[name]


def main(argv: Sequence[str] | None = None) -> int:
    _std_fds_open()
    args_list = list(sys.argv[1:] if argv is None else argv)
    verb = _find_verb(args_list)
    early = None
    if verb is not None:
        module = _verb_module(verb)
        early = getattr(module, "EARLY", None)
    launched = _launched(early)
    if verb is not None:
        if early is not None:
            early()
        prepare = getattr(module, "prepare_argv", None)
        if prepare is not None:
            at = args_list.index(verb) + 1
            args_list[at:] = prepare(args_list[at:])
    args = None
    fast = getattr(module, "fast_args", None) if verb is not None else None
    if fast is not None and args_list[:1] == [verb]:
        args = fast(args_list[1:])
    if args is None:
        from .parsing import parser

        args = parser(verb).parse_args(args_list)
    else:
        args.verb = verb
    module = _verb_module(args.verb)
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
