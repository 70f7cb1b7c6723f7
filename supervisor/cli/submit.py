"""``corral submit [OPTIONS] -- CMD [ARGS...]``: hand a command to the daemon.

Prints the task's id (stdout) and returns at once; ``--wait`` waits and exits like ``corral
run`` (the task's status, 124 timed out, ...); ``--follow`` also streams its stdout and stderr
as they come.  The command runs in the daemon's cgroup tree as your uid, in your current
directory unless ``--chdir``; its environment is a clean login-like one plus ``-E``.

Ctrl-C while it waits or follows stops the task as ``corral run``'s does (:class:`Interrupts`):
the first asks the daemon for a graceful stop (stop signal, grace, kill) and goes on until the
record, then exits with the record's status; the next kills the task now.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from . import die
from .clientutil import add_socket, run_client, write_frames
from .wait import report

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True
if TYPE_CHECKING:
    from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("submit", help="submit a command to the daemon",
                       usage="corral submit [OPTIONS] -- CMD [ARGS...]",
                       description="Submit CMD to the corral daemon; print its task id.")
    p.add_argument("--wait", nargs="?", const=True, default=None, metavar="DURATION",
                   help="wait; exit with the task's status.  With a DURATION, at most that "
                        "long: a task still running then goes on, and corral exits "
                        f"{STILL_RUNNING} (corral wait ID, corral logs -f ID)")
    p.add_argument("-t", "--tty", action="store_true",
                   help="a terminal of its own, this terminal's size, and attach this terminal "
                        "to it (corral attach: detach with Ctrl-], q; it goes on)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="stream its output until it ends (implies --wait)")
    p.add_argument("--time-limit", metavar="DURATION")
    p.add_argument("--grace", metavar="DURATION")
    p.add_argument("--stop-signal", metavar="SIGNAL")
    p.add_argument("-p", "--property", action="append", default=[], metavar="NAME=VALUE",
                   help="a systemd property (MemoryMax=1G, TasksMax=64, ...)")
    p.add_argument("-E", "--setenv", action="append", default=[], metavar="NAME[=VALUE]")
    p.add_argument("--chdir", metavar="DIR", help="working directory (default: the current)")
    p.add_argument("--name", help="a label for corral ps")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="a retry with the same key returns the first task, never a second")
    add_socket(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    properties = {}
    for item in args.property:
        name, eq, value = item.partition("=")
        if not eq or not name:
            die(f'--property must be NAME=VALUE like "MemoryMax=1G", got "{item}"')
        properties[name.strip()] = value.strip()
    env = {}
    for item in args.setenv:
        name, eq, value = item.partition("=")
        if not eq:
            if name not in os.environ:
                die(f"--setenv {name}: no such variable here; give {name}=VALUE")
            value = os.environ[name]
        env[name] = value
    options: dict[str, Any] = {"cwd": os.path.abspath(args.chdir or os.getcwd()),
                               "env": env, "properties": properties}
    for key in ("time_limit", "grace", "stop_signal", "name", "idempotency_key"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    return options


STILL_RUNNING = 75  # (sysexits' EX_TEMPFAIL) the task still runs at the --wait bound


def _bound(wait: str | bool | None) -> float | None:
    """``--wait DURATION`` in seconds (None: no bound)."""
    if wait is None or wait is True:
        return None
    from ..syntax import UnitsError, parse_duration

    try:
        return parse_duration(str(wait), "--wait", allow_zero=True)
    except UnitsError as e:
        die(str(e))


def still_running(task_id: str, bound: float | None) -> int:
    """Say that the task goes on past the wait bound; the exit status that says it."""
    print(f"corral: task {task_id} is still running after the {bound:g}s wait bound; it goes "
          f"on (corral wait {task_id}, corral logs -f {task_id}, corral stop {task_id})",
          file=sys.stderr)
    return STILL_RUNNING


class Interrupts:
    """While installed (``with``): SIGINT asks the daemon to stop task ``task_id`` (a second
    one: kill it now) and returns, so that the wait or the follow in progress goes on (its
    system call is restarted, PEP 475) until the record.  The request goes on a connection
    of its own, from the signal handler (Python runs it in the main thread, between
    bytecodes); presses that come while one is being sent are counted and sent after it."""

    def __init__(self, socket_path: str, task_id: str) -> None:
        self.socket_path = socket_path
        self.task_id = task_id
        self.presses = 0
        self.sent = 0
        self._sending = False
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        self._previous = signal.getsignal(signal.SIGINT)
        if self._previous is not signal.SIG_IGN:  # (started with it ignored: `... &`)
            signal.signal(signal.SIGINT, self._press)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._previous)

    def _press(self, signo: int, frame: object) -> None:
        self.presses += 1
        if self._sending:
            return  # (a press during a request: the loop below sends it next)
        self._sending = True
        try:
            while self.sent < min(self.presses, 2):
                self._send(force=self.sent > 0)
                self.sent += 1
        finally:
            self._sending = False

    def _send(self, force: bool) -> None:
        from ..client import ApiError, Client, DaemonUnavailable

        try:
            with Client(self.socket_path) as other:
                changed = other.stop(self.task_id, force=force)
        except (ApiError, DaemonUnavailable) as e:
            _say(f"could not stop task {self.task_id}: {getattr(e, 'message', None) or e}")
            return
        if changed:
            _say(f"{'killing' if force else 'stopping'} task {self.task_id}"
                 + ("" if force else " (Ctrl-C again: kill it now)"))


def _say(line: str) -> None:
    """``corral: line`` on stderr, unbuffered: from a signal handler, sys.stderr's buffer may
    be in the middle of a write of the interrupted code (a reentrant call is refused)."""
    try:
        os.write(2, f"corral: {line}\n".encode())
    except OSError:
        pass  # (stderr gone: nothing to tell)


def _follow(client: Any, task_id: str) -> Any:
    """stdout here and stderr in a thread (each its own connection, each reconnecting across
    a restart of the daemon); the end frame."""
    import threading

    from ..client import Client

    def copy_stderr() -> None:
        with Client(client.socket_path) as other:
            write_frames(other.follow(task_id, "stderr"), sys.stderr.buffer, "stderr")

    thread = threading.Thread(target=copy_stderr, daemon=True)
    thread.start()
    result = write_frames(client.follow(task_id, "stdout"), sys.stdout.buffer, "stdout")
    thread.join()
    return result


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        die("no command given: corral submit [OPTIONS] -- CMD [ARGS...]")
    options = _options(args)
    bound = _bound(args.wait)
    if args.tty:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            die("-t needs a terminal on stdin and stdout (it attaches it to the task)")
        import os

        size = os.get_terminal_size(1)  # (a terminal never sized says 0 x 0: then 24 x 80)
        options["tty"] = {"rows": size.lines or 24, "cols": size.columns or 80}

    def body(client: Any) -> int:
        task = client.submit(command, **options)
        if args.tty:
            from .attach import attach, detach_sequence

            return attach(client, task.id, detach_sequence("ctrl-],q"))
        if not (args.wait or args.follow):
            print(task.id)
            return 0
        with Interrupts(client.socket_path, task.id):
            print(f"corral: task {task.id}", file=sys.stderr)
            end = _follow(client, task.id) if args.follow else None
            if end is not None:
                return report(task.id, end.result, end.exit_status, quiet=False)
            info = client.wait(task.id, timeout=bound)
        if info.state != "finished":
            return still_running(task.id, bound)
        return report(task.id, info.result, info.exit_status, quiet=False)

    return run_client(args, body)
