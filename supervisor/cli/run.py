"""``corral run [OPTIONS] -- CMD [ARGS...]``: a command in the foreground, in its own leaf.

systemd-run style: the command runs in the foreground in its own cgroup leaf with our stdin,
stdout and stderr (live, unbuffered, a terminal stays a terminal), and corral exits with the
task's status.  Exit statuses (as coreutils ``timeout`` and ``env``):

    the task's own     it exited
    128+N              a signal N ended it (137 for an OOM kill)
    124                stopped at its time limit
    130                cancelled from the terminal (SIGINT); 143 for SIGTERM, 129 for SIGHUP
    125                corral itself failed, bad arguments included (nothing was started)
    126 / 127          the command cannot be run / was not found

The first SIGINT or SIGTERM stops the task gracefully, a second kills it now; corral exits only
after the cleanup, with the summary.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
from typing import Any

import trio

from cgroupfs import CgroupError, Limits

from .._errors import PlacementError, SupervisorError, first_leaf
from .._properties import SUPPORTED, parse_properties
from .._result import Outcome, TaskResult
from .._spec import TaskSpec
from .._supervisor import open_supervisor
from ..placement import check_limits, planned_controllers
from . import EXIT_FAILURE, die
from .summary import summary_lines

__all__ = ["add_parser", "exit_status", "main"]

EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127
EXIT_TIMED_OUT = 124


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run a command in the foreground in its own cgroup",
                         usage="corral run [OPTIONS] -- CMD [ARGS...]",
                         description="Run CMD in its own cgroup leaf; exit with its status.")
    run.add_argument("--time-limit", metavar="DURATION",
                     help='stop the task after this long ("30s", "5min", "1h 30min")')
    run.add_argument("--grace", metavar="DURATION",
                     help="how long the stop signal has before the kill (default 5s)")
    run.add_argument("--stop-signal", metavar="SIGNAL", help="the stop signal (default TERM)")
    run.add_argument("-p", "--property", action="append", default=[], metavar="NAME=VALUE",
                     help=f"a systemd property: {', '.join(SUPPORTED)}")
    run.add_argument("-E", "--setenv", action="append", default=[], metavar="NAME[=VALUE]",
                     help="set an environment variable (NAME alone copies ours)")
    run.add_argument("--chdir", metavar="DIR", help="working directory of the command")
    run.add_argument("--cgroup-root", metavar="PATH",
                     help="a delegated cgroup v2 directory to run under (default: discovered)")
    run.add_argument("--summary", action="store_true",
                     help="print a summary when the task ends (always, unless --quiet, when "
                          "it did not succeed)")
    run.add_argument("-q", "--quiet", action="store_true", help="no summary, ever")
    run.add_argument("--json-file", metavar="PATH", help="write the JSON result to PATH")
    run.add_argument("--json-fd", metavar="FD", type=int,
                     help="write the JSON result to this open file descriptor")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def _spec_from_args(args: argparse.Namespace) -> TaskSpec:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        die("no command given: corral run [OPTIONS] -- CMD [ARGS...]")
    props = parse_properties(args.property)
    options: dict[str, Any] = dict(props.options)
    for flag, key in (("time_limit", "time_limit"), ("grace", "grace"),
                      ("stop_signal", "stop_signal"), ("chdir", "cwd")):
        value = getattr(args, flag)
        if value is not None:
            options[key] = value
    env = dict(options.pop("env", {}))
    for item in args.setenv:
        name, eq, value = item.partition("=")
        if not name:
            die(f'--setenv must be NAME=VALUE or NAME, got "{item}"')
        if not eq:
            if name not in os.environ:
                die(f'--setenv {name}: no such variable in corral\'s environment; give '
                     f'{name}=VALUE')
            value = os.environ[name]
        env[name] = value
    if env:
        options["env"] = env
    if props.limits:
        options["limits"] = Limits(**props.limits)
    return TaskSpec(tuple(command), stdin="inherit", stdout="inherit", stderr="inherit",
                    **options)


def exit_status(result: TaskResult, interrupted_by: int | None) -> int:
    """corral's exit status for ``result`` (see the module docstring)."""
    if result.outcome == Outcome.SPAWN_FAILED:
        if result.error_step == "exec":
            return EXIT_NOT_FOUND if result.error_errno == errno.ENOENT else EXIT_CANNOT_RUN
        return EXIT_FAILURE
    if result.outcome == Outcome.TIMED_OUT:
        return EXIT_TIMED_OUT
    if result.outcome == Outcome.CANCELLED:
        return 128 + (interrupted_by or signal.SIGINT)
    if result.signal is not None:
        return 128 + result.signal
    if result.exit_code is not None:
        return result.exit_code
    return EXIT_FAILURE


async def _run(spec: TaskSpec, args: argparse.Namespace) -> tuple[TaskResult, int | None]:
    interrupted_by: int | None = None
    # SIGHUP too: a closed terminal must not kill corral and orphan the task's cgroup
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with open_supervisor(cgroup_root=args.cgroup_root) as sup, \
                trio.open_nursery() as nursery:
            if not args.quiet:
                for note in sup.placement_notes:
                    print(f"corral: note: {note}", file=sys.stderr)
            task = await nursery.start(sup.start, spec)

            async def watch_signals() -> None:
                nonlocal interrupted_by
                async for signum in signals:
                    if interrupted_by is None:
                        interrupted_by = signum
                    task.stop()  # the first asks gracefully; a second one kills now

            nursery.start_soon(watch_signals)
            result = await task.wait()
            nursery.cancel_scope.cancel()
    return result, interrupted_by


def _write_json(args: argparse.Namespace, json_file: Any, result: TaskResult,
                status: int) -> None:
    data = {"exit_status": status, **result.to_dict()}
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if json_file is not None:
        with json_file:
            json_file.write(text)
    if args.json_fd is not None:
        with os.fdopen(args.json_fd, "w", closefd=False) as f:
            f.write(text)
            f.flush()


def main(args: argparse.Namespace) -> int:
    try:
        spec = _spec_from_args(args)
        if not spec.limits.is_empty():
            # refused before anything is made: what the root would offer, read, not created
            check_limits(spec.limits, *planned_controllers(args.cgroup_root))
    except (ValueError, PlacementError) as e:
        die(str(e))
    if args.json_fd is not None:
        try:
            os.fstat(args.json_fd)
        except OSError as e:
            die(f"--json-fd {args.json_fd}: {e.strerror}; open it first, e.g. 3>result.json")
    json_file = None
    if args.json_file:
        # opened now: a result that cannot be written must not be found out after the run
        try:
            json_file = open(args.json_file, "w")  # noqa: SIM115 (closed in _write_json)
        except OSError as e:
            die(f"--json-file {args.json_file}: {e.strerror}; give a writable path")
    try:
        result, interrupted_by = trio.run(_run, spec, args)
    except* (PlacementError, SupervisorError, CgroupError, ValueError) as eg:
        die(str(first_leaf(eg)))
    status = exit_status(result, interrupted_by)
    if result.outcome == Outcome.SPAWN_FAILED:
        print(f"corral: {result.error}", file=sys.stderr)
    if not args.quiet and (args.summary or result.outcome != Outcome.SUCCEEDED):
        for line in summary_lines(result, status):
            print(line, file=sys.stderr)
    if json_file is not None or args.json_fd is not None:
        _write_json(args, json_file, result, status)
    return status
