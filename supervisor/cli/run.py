"""``corral run [OPTIONS] -- CMD [ARGS...]``: a command in the foreground, in its own leaf.

systemd-run style: the command runs in the foreground in its own cgroup leaf with our stdin,
stdout and stderr (live, unbuffered, a terminal stays a terminal), and corral exits with the
task's status (:data:`EPILOG` says which, and what each key does at a terminal).

Signals: the job-control signals are blocked before anything else, in :func:`add_parser` (the
first of this module the command line calls) and again in :func:`main`, and read from a
signalfd (``terminal.py`` says why, and how their origin is told apart), so no KeyboardInterrupt
is ever raised.  That is why this module imports only the standard library at its top: the
core (~0.3 s of imports, trio among them) is imported inside the functions that use it, once
the signals are blocked.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from . import EXIT_FAILURE, die, missing_cgroup_root
from .terminal import (
    JOB_SIGNALS,
    WAY_OUT_PRESSES,
    WAY_OUT_WINDOW,
    Act,
    Delivery,
    Keys,
    Terminal,
    block_job_signals,
    die_by_signal,
    may_suspend,
    read_deliveries,
    screen_reset,
    sender_cgroup,
)

if TYPE_CHECKING:
    import logging

    from .. import Supervisor, TaskHandle, TaskResult, TaskSpec
    from .relay import PtyRelay

__all__ = ["add_parser", "main"]


EPILOG = f"""\
keys at a terminal (the task stays in the terminal's foreground process group, so it can
read the terminal and gets the keys itself, as it would without corral):
  Ctrl-C, Ctrl-\\  the task's own: a command that ends on them ends (reported as it ended),
                  a REPL goes on; before the task has started, it never starts
  Ctrl-C {WAY_OUT_PRESSES} times within {WAY_OUT_WINDOW:g}s
                  the way out of a program that ignores Ctrl-C: corral stops the task
                  (stop signal, grace, kill; a hint after the second); once corral is
                  stopping it, every further Ctrl-C kills it now
  Ctrl-Z          suspends corral and the task; fg / bg resume both.  The time limit
                  counts the time spent stopped (as timeout(1)): past it, the task is
                  stopped as soon as corral resumes
  the terminal's modes are restored when the task ends, also when it was killed, and a
  killed full-screen program's alternate screen and hidden cursor are put back too

with --pty the task runs on a terminal of its own (programs colour and line-buffer), its
output mirrored here and kept in the record.  At a terminal this one is in raw mode while
the task runs: every key is typed into the task's terminal, whose modes decide what it does:
  Ctrl-C, Ctrl-\\  the task's SIGINT / SIGQUIT when its terminal makes them signals (a REPL
                  goes on); {WAY_OUT_PRESSES} Ctrl-C within {WAY_OUT_WINDOW:g}s stop it, as above
  Ctrl-D          end of input for a program reading its terminal (a REPL exits)
  Ctrl-Z          a lone program: suspends corral and freezes the task (frozen time is not
                  counted by the time limit); a job-control shell in the task: that shell's
                  key, for its own jobs
  window size     follows this terminal's (SIGWINCH)
  stdin not a terminal: typed into the task's terminal as it comes (echoed and read as
  keys), its end typed as Ctrl-D; stdout not a terminal: the task's terminal output as is
  (CR LF line ends, colours).  stdout closing early stops the task (exit status 141)

signals sent to corral's pid by another process (kill, a CI runner, systemd):
  SIGINT, SIGTERM, SIGHUP, SIGQUIT: the first stops the task gracefully (stop signal,
  grace, kill), the second kills it now; corral exits after the cleanup.  Told apart from
  the terminal's keys by the signal's origin (si_code); one the task's own processes send
  (to the process group corral shares with them) is theirs, and ignored

exit status:
  the task's own     it exited
  128+N              signal N ended it (137: SIGKILL or an OOM kill)
  124                stopped at its time limit
  130                stopped by Ctrl-C (or SIGINT); 143 by SIGTERM, 129 by SIGHUP,
                     131 by SIGQUIT
  125                corral itself failed, bad arguments included (nothing was started)
  126 / 127          the command cannot be run / was not found
"""

# options that take a value: they take the next word whatever it starts with (as getopt does)
_VALUE_OPTIONS = frozenset({"--time-limit", "--grace", "--stop-signal", "-p", "--property",
                            "-E", "--setenv", "--chdir", "--cgroup-root", "--json-file",
                            "--json-fd", "--plot"})


def prepare_argv(words: list[str]) -> list[str]:
    """``--grace -1s`` -> ``--grace=-1s`` for each value option before the command, so that
    ``--time-limit -1s`` reaches our validation (a message naming the rule and the fix)
    instead of argparse's "expected one argument": argparse takes a word starting with '-' for
    an option unless it looks like a plain negative number."""
    out: list[str] = []
    i = 0
    while i < len(words) and words[i] != "--" and words[i].startswith("-"):
        word = words[i]
        if word in _VALUE_OPTIONS and i + 1 < len(words):
            value = words[i + 1]
            out += [f"{word}={value}"] if value.startswith("-") and value != "--" \
                else [word, value]
            i += 2
        else:
            out.append(word)
            i += 1
    return out + words[i:]


# Run by the dispatcher before anything else of `corral run`: from here on a Ctrl-C waits on
# the signalfd (see the module docstring), never a KeyboardInterrupt.
EARLY = block_job_signals
# once main() has returned, nothing is left to tear down: the process exits at once (cli/)
EXIT_AT_ONCE = True


def add_parser(sub: Any) -> None:
    block_job_signals()  # (again, for callers that build the parser themselves: idempotent)
    from ..syntax import SUPPORTED

    run = sub.add_parser("run", help="run a command in the foreground in its own cgroup",
                         usage="corral run [OPTIONS] -- CMD [ARGS...]",
                         description="Run CMD in its own cgroup leaf; exit with its status.",
                         epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    run.add_argument("--pty", action="store_true",
                     help="run the task on a pseudo-terminal of its own, mirrored here (its "
                          "output is also kept in the record; keys below)")
    run.add_argument("--summary", action="store_true",
                     help="print a summary when the task ends (always, unless --quiet, when "
                          "it did not succeed)")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="nothing but the task's own output and fatal errors: no summary, "
                          "notes, warnings or hints")
    run.add_argument("--json-file", metavar="PATH",
                     help="write the JSON result to PATH (made at the start, empty, so that a "
                          "path that cannot be written is refused before the run; the result "
                          "is written at the end: read it once corral has exited)")
    run.add_argument("--json-fd", metavar="FD", type=int,
                     help="write the JSON result to this file descriptor, open for writing")
    run.add_argument("--plot", metavar="FILE", type=_plot_target,
                     help="draw the usage over time to FILE.svg or FILE.png (needs the plot "
                          "extra: pip install 'corral[plot]')")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def _plot_target(value: str) -> str:
    from .plot import check_target  # only when --plot is given: nothing of plotting otherwise

    return check_target(value)


def _spec_from_args(args: argparse.Namespace, pty: PtyRelay | None) -> TaskSpec:
    from cgroupfs import Limits

    from .. import TaskSpec
    from ..syntax import parse_properties

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
    stdio: dict[str, Any] = {"stdin": "inherit", "stdout": "inherit", "stderr": "inherit"}
    if pty is not None:  # its own terminal, our size and modes; captured, mirrored by a tap
        stdio = {"stdin": None, "stdout": "capture", "stderr": "capture", **pty.spec_options()}
    return TaskSpec(tuple(command), ignored_signals=_inherited_ignored(), **stdio, **options)


def _inherited_ignored() -> tuple[int, ...]:
    """The job-control signals corral was started with ignored (a shell's background job,
    nohup): the command gets them ignored too, as it would run without corral.  (Python
    itself ignores SIGPIPE and SIGXFSZ at start: those are never passed on.)"""
    return tuple(sig for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
                 if signal.getsignal(sig) == signal.SIG_IGN)


# ---- the run: signals in, stop requests out --------------------------------------------------

class Control:
    """The task's stop requests, from the signals corral gets, before and after it exists.

    Runs on the trio thread, called by the signal watcher (and under ``--pty`` by the relay,
    for the keys it reads as bytes); no I/O but a hint on stderr, a read of the sender's
    /proc/PID/cgroup, and the relay's terminal work.
    """

    def __init__(self, sigfd: int, quiet: bool, said: set[str],
                 pty: PtyRelay | None = None) -> None:
        self.sigfd = sigfd  # the signalfd of JOB_SIGNALS
        self.keys = Keys()
        self.quiet = quiet
        self.said = said  # what the library's warnings said already
        self.task: TaskHandle | None = None
        self.root: str | None = None  # the supervisor's cgroup root (filesystem path)
        self.pending: list[int] = []  # stop requests that came before the task existed
        self.interrupted_by: int | None = None  # the signal of the first stop request
        self.terminal_interrupt = False  # a Ctrl-C or Ctrl-\ typed at the terminal was seen
        self.pty = pty  # --pty: the task's own terminal, mirrored to ours
        if pty is not None:
            pty.on_press = self.press
            pty.on_gone = self.output_gone

    def attach(self, task: TaskHandle) -> None:
        self.task = task
        for signo in self.pending:
            self._stop(signo)
        self.pending.clear()

    def poll(self) -> None:
        """Handle what the signalfd holds now, without waiting."""
        for delivery in read_deliveries(self.sigfd):
            self.on_signal(delivery)

    def on_signal(self, d: Delivery) -> None:
        if d.from_terminal and d.signo in (signal.SIGINT, signal.SIGQUIT):
            self.terminal_interrupt = True
            if self.pty is not None and self.task is not None:
                self.pty.type_key(d.signo)  # the task's terminal is not this one: type it there
        act = self.keys.decide(d, time.monotonic(), started=self.task is not None,
                               from_task=self._from_task(d))
        self._act(act, d.signo)

    def press(self) -> None:
        """A Ctrl-C typed into the task's terminal under ``--pty`` (ours in raw mode)."""
        self.terminal_interrupt = True
        self._act(self.keys.press(time.monotonic()), signal.SIGINT)

    def output_gone(self, why: str) -> None:
        """Under ``--pty`` our stdout stopped taking the task's output (its reader went
        away): the task is stopped, as writing there itself would have ended it (SIGPIPE)."""
        task = self.task
        if task is None or task.result is not None or task.stop_requested is not None:
            return  # ended, or being stopped already (a hangup): never a second request
        if not self.quiet:
            _say(f"corral: stdout: {why}; stopping the task (its output has nowhere to go)")
        self._stop(signal.SIGPIPE)

    def _act(self, act: Act, signo: int) -> None:
        if act is Act.STOP:
            self._stop(signo)
        elif act is Act.HINT and not self.quiet:
            line = _after_echo(self.keys.hint())
            if self.pty is not None and self.pty.raw_active:
                line = line.replace("\n", "\r\n") + "\r"  # raw mode: no newline translation
            _say(line)
        elif act is Act.SUSPEND and may_suspend():
            if self.pty is not None:
                self.pty.suspend()  # its modes back, the task frozen, then stopped
            else:
                # SIGTSTP is blocked, so its default (stop) never happens: do it ourselves;
                # the task got the same SIGTSTP.  `fg`/`bg` send SIGCONT to both.
                os.kill(os.getpid(), signal.SIGSTOP)
        elif act is Act.RESIZE and self.pty is not None:
            self.pty.resize()
        elif act is Act.RESUMED and self.pty is not None:
            self.pty.resumed()

    def _stop(self, signo: int) -> None:
        if self.interrupted_by is None:
            self.interrupted_by = signo
        self.keys.stopping = True
        if self.task is None:
            self.pending.append(signo)  # before the spawn: the task never starts
        else:
            self.task.stop(by_signal=signo)  # the first asks gracefully; the next kills
            if self.pty is not None and self.task.result is not None:
                self.pty.abandon()  # ended, and its last output does not drain: stop waiting

    def _from_task(self, d: Delivery) -> bool:
        """Did one of the task's own processes send it (to its process group, ours too)?"""
        import cgroupfs

        if d.from_terminal or self.root is None or not d.pid:
            return False
        path = sender_cgroup(d.pid)
        if path is None:
            return False
        try:
            where = cgroupfs.cgroup_fs_path(cgroupfs.find_cgroup2_mount(), path)
        except cgroupfs.CgroupError:
            return False
        return where.startswith(self.root.rstrip("/") + "/")


async def _watch_signals(control: Control) -> None:
    import trio

    while True:
        await trio.lowlevel.wait_readable(control.sigfd)
        control.poll()


async def _run(spec: TaskSpec, args: argparse.Namespace, control: Control) -> TaskResult:
    import trio

    from .. import open_supervisor

    async with trio.open_nursery() as outer:
        outer.start_soon(_watch_signals, control)
        async with open_supervisor(cgroup_root=args.cgroup_root) as sup:
            control.root = sup.cgroup_root
            if not args.quiet:
                for note in sup.placement_notes:
                    if note not in control.said:
                        _say(f"corral: note: {note}")
            result = await _start_and_wait(sup, spec, control)
        outer.cancel_scope.cancel()
    return result


async def _start_and_wait(sup: Supervisor, spec: TaskSpec, control: Control) -> TaskResult:
    import trio

    async with trio.open_nursery() as nursery:
        # A key typed just now is still corral's (the program does not exist yet): read it
        # now rather than at the watcher's next turn, which may come after the spawn.
        control.poll()
        if control.pending:
            # a stop came first (Ctrl-C, kill): the task never starts, and its record says
            # which signal asked
            return sup.record_unstarted(spec, by_signal=control.pending[0])
        task: TaskHandle = await nursery.start(sup.start, spec)
        control.attach(task)
        if control.pty is not None:
            control.pty.begin(task)  # no checkpoint since start(): the tap misses nothing
            await control.pty.run()  # until all its output is written
        return await task.wait()


def _supervise(spec: TaskSpec, args: argparse.Namespace,
               control: Control) -> tuple[TaskResult | None, BaseException | None]:
    """Run the task; its result (None if it never got one) and corral's own failure."""
    import trio

    from cgroupfs import CgroupError

    from .. import SupervisorError
    from ..lowlevel import first_leaf

    try:
        return trio.run(_run, spec, args, control), None
    except BaseExceptionGroup as group:
        error = first_leaf(group)
        if not isinstance(error, SupervisorError | CgroupError | ValueError | OSError):
            raise
    except (SupervisorError, CgroupError, ValueError, OSError) as e:
        error = e
    task = control.task
    return (task.result if task is not None else None), error


def _signalfd() -> int:
    from ..lowlevel import signalfd

    return signalfd(JOB_SIGNALS)


# ---- before and after ------------------------------------------------------------------------

class _Sink(NamedTuple):
    """Where the JSON result goes: ``label`` names it in errors; ``owned`` fds are ours to
    close."""

    label: str
    fd: int
    owned: bool


def _open_sinks(args: argparse.Namespace) -> list[_Sink]:
    """Check and open the JSON destinations now: a result that cannot be written must not be
    found out after the run."""
    from ..lowlevel import open_output
    sinks = []
    if args.json_fd is not None:
        fd = args.json_fd
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError as e:
            die(f"--json-fd {fd}: {e.strerror}; open it for writing first, e.g. {fd}>result.json")
        if flags & os.O_ACCMODE == os.O_RDONLY:
            die(f"--json-fd {fd}: the descriptor is open read-only and the result is written to "
                f"it; open it for writing, e.g. {fd}>result.json")
        sinks.append(_Sink(f"--json-fd {fd}", fd, owned=False))
    if args.json_file:
        try:
            # (O_NONBLOCK: a FIFO nobody reads yet answers ENXIO at once instead of holding
            # corral in open(), deaf to its signals; a pipe, e.g. >(jq .), opens as usual)
            fd = open_output(args.json_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                             | os.O_NONBLOCK, "--json-file")
        except OSError as e:
            if e.errno == errno.ENXIO:
                die(f"--json-file {args.json_file}: a FIFO that nobody reads; start its reader "
                    f"first (e.g. cat {args.json_file} &), or give a file")
            die(f"--json-file {args.json_file}: {e.strerror}; give a writable path")
        os.set_blocking(fd, True)  # the result is written whole, at the end
        sinks.append(_Sink(f"--json-file {args.json_file}", fd, owned=True))
    return sinks


def _blocking_fds(fds: tuple[int, ...]) -> list[int]:
    """Which of ``fds`` are open and blocking now, before the task runs."""
    found = []
    for fd in dict.fromkeys(fds):
        try:
            if os.get_blocking(fd):
                found.append(fd)
        except OSError:
            pass
    return found


def _block_again(fds: list[int]) -> None:
    """The task shared these open descriptions with us (stdout, stderr, a --json-fd) and may
    have set O_NONBLOCK on them (node does, for a pipe): make them blocking again, as we found
    them, so that the record and the summary wait for a slow reader instead of being lost to
    EAGAIN."""
    for fd in fds:
        try:
            if not os.get_blocking(fd):
                os.set_blocking(fd, True)
        except OSError:
            pass


def _write_json(sinks: list[_Sink], result: TaskResult, status: int) -> None:
    """Write the record to every sink; a failure is one line on stderr, never a traceback."""
    import json

    data = {"exit_status": status, **result.to_dict()}
    view = memoryview((json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    for sink in sinks:
        try:
            written = 0
            while written < len(view):
                written += os.write(sink.fd, view[written:])
            if sink.owned:
                os.close(sink.fd)
        except OSError as e:
            _say(f"corral: {sink.label}: writing the result failed: {e.strerror}; the task's "
                 f"exit status is {status}")


def _after_echo(line: str) -> str:
    """``line`` on a line of its own after the ``^C`` a terminal echoes without a newline."""
    return f"\n{line}" if _stderr_is_terminal() else line


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (OSError, ValueError):
        return False


def _say(line: str) -> None:
    """A line on stderr; a stderr that is gone (a hung-up terminal, a closed pipe) is not an
    error of the task's."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


_said: set[str] | None = None  # what the command's log handler printed, once it has one


def configure_logging(quiet: bool) -> set[str]:
    """The library logs and never configures logging; the command does: one line per
    warning on stderr (``corral: warning: ...``), nothing under ``--quiet`` (Python's
    last-resort handler included).  Returns the messages said so far (a live set), so that
    a placement note that repeats a warning is not printed twice."""
    import logging

    global _said
    if _said is not None:
        return _said  # configured already (main() called twice in one process)
    said: set[str] = set()

    def remember(record: logging.LogRecord) -> bool:
        said.add(record.getMessage())
        return True

    handler = logging.StreamHandler()
    handler.addFilter(remember)
    handler.setFormatter(_one_line_formatter())
    if quiet:
        handler.setLevel(logging.CRITICAL + 1)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    _said = said
    return said


def _one_line_formatter() -> logging.Formatter:
    """``corral: warning: ...``: one line per record, an exception as its repr."""
    import logging

    class OneLine(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            text = " ".join(record.getMessage().split("\n"))
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({record.exc_info[1]!r})"
            level = "warning" if record.levelno < logging.ERROR else "error"
            return f"corral: {level}: {text}"

    return OneLine()


def _report(args: argparse.Namespace, sinks: list[_Sink], result: TaskResult, status: int,
            after_key: bool) -> None:
    """The JSON record first (it matters most), then the lines on stderr.  ``after_key``: a
    key typed at the terminal ended the task, and its ``^C`` echo ends no line."""
    from .summary import summary_lines

    _write_json(sinks, result, status)
    if result.outcome == "spawn_failed":
        _say(f"corral: {result.error}")
    if not args.quiet and (args.summary or result.outcome != "succeeded"):
        lines = summary_lines(result, status)
        if after_key:
            lines[0] = _after_echo(lines[0])
        for line in lines:
            _say(line)


def _open_pty() -> PtyRelay:
    from .relay import PtyRelay

    try:
        return PtyRelay.open()
    except OSError as e:
        die(f"--pty: corral's own stdio cannot be relayed: {e}; run without --pty")


def _leave_full_screen(result: TaskResult) -> None:
    """A program that held the terminal (it left the modes changed) and was killed could not
    leave its alternate screen or show its cursor again: do it, at a terminal.  Without --pty
    corral does not see the output, so whether it was in the alternate screen is a guess:
    left in a way that changes nothing outside it (``known=False``)."""
    if result.signal is None or not os.isatty(1):
        return
    try:
        os.write(1, screen_reset(1, alternate=True, cursor=True, known=False))
    except OSError:
        pass  # hung up: no screen to put back


def _prepare(args: argparse.Namespace, pty: PtyRelay | None) -> TaskSpec:
    from .. import PlacementError

    missing = missing_cgroup_root(args.cgroup_root)
    if missing is not None:
        die(missing)
    try:
        spec = _spec_from_args(args, pty)
        if not spec.limits.is_empty():
            from ..placement import check_limits, planned_controllers

            # refused before anything is made: what the root would offer, read, not created
            check_limits(spec.limits, *planned_controllers(args.cgroup_root))
    except (ValueError, PlacementError) as e:
        die(str(e))
    return spec


def main(args: argparse.Namespace) -> int:
    # First of all: from here on no Ctrl-C, kill or Ctrl-Z can interrupt corral anywhere;
    # they wait on the signalfd for the watcher.
    block_job_signals()
    said = configure_logging(args.quiet)
    pty = _open_pty() if args.pty else None
    spec = _prepare(args, pty)
    sinks = _open_sinks(args)
    terminal = Terminal.open()
    control = Control(_signalfd(), args.quiet, said, pty)
    held = False  # the task left the terminal's modes changed
    blocking = _blocking_fds((1, 2, *(s.fd for s in sinks)))
    try:
        result, error = _supervise(spec, args, control)
    finally:
        os.close(control.sigfd)
        if pty is not None:
            pty.finish()  # our modes, and the screen it left, before anything is printed
            pty.close()
        if terminal is not None:
            held = terminal.restore()  # before anything is printed: the summary in sane modes
            terminal.close()
        _block_again(blocking)
    if result is None:
        die(str(error))
    if held and pty is None:
        _leave_full_screen(result)
    status = EXIT_FAILURE if error is not None else result.exit_status
    ended_by_key = control.terminal_interrupt and (
        result.outcome == "cancelled" or result.signal in (signal.SIGINT, signal.SIGQUIT))
    _report(args, sinks, result, status, ended_by_key)
    if args.plot:
        from .plot import write_plot

        write_plot(result, args.plot)
    if error is not None:
        die(str(error))
    if status == 128 + signal.SIGINT and ended_by_key:
        die_by_signal(signal.SIGINT)
    return status
