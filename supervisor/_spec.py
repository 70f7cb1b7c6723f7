"""What a task is: ``TaskSpec``, validated completely when it is made.

``run()`` and ``start()`` take these fields as keywords.  Every value a user can get wrong is
checked here, before any cgroup or process exists, and refused with a :class:`SpecError` that
names the field, the value, the rule and the fix.  Durations use systemd's syntax.
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import signal
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Literal

from cgroupfs import Limits
from cgroupfs._record import record

from ._errors import SpecError
from ._isolation import Isolation
from ._units import DEFAULT_GRACE, UnitsError, parse_duration, parse_signal

__all__ = ["DEFAULT_GRACE", "TaskSpec"]

NO_LIMITS = Limits()
NO_ISOLATION = Isolation()
DEFAULT_HEAD = 16 * 1024
DEFAULT_TAIL = 48 * 1024
_MAX_KEEP = 1 << 30

StdinSpec = None | bytes | Literal["inherit", "pipe"]
REPEAT_FLOOR = 0.1  # stop_signal_repeat below this would busy-loop the supervisor
OutputMode = Literal["capture", "inherit"]


def _duration(name: str, value: Any, *, allow_zero: bool = False) -> float:
    try:
        return parse_duration(value, name, allow_zero=allow_zero)
    except UnitsError as e:
        raise SpecError(name, str(e)) from None


def _byte_count(name: str, value: Any, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_KEEP:
        raise SpecError(name, f"{name} must be a whole number of bytes from {low} to "
                              f"{_MAX_KEEP} (1 GiB), got {value!r}")
    return value


def _no_nul(name: str, value: str) -> None:
    """A C string for the kernel: no NUL, and encodable as the filesystem encoding says."""
    if "\0" in value:
        raise SpecError(name, f"{name} cannot contain a NUL character, got {value!r}")
    try:
        os.fsencode(value)
    except UnicodeEncodeError as e:
        raise SpecError(name, f"{name} must be encodable as {e.encoding} (with "
                              f"surrogateescape), got {value!r}: {e.reason} at "
                              f"{e.start}; pass bytes decoded with os.fsdecode()") from None


def _no_nul_in_any(name: str, values: Sequence[str]) -> None:
    """:func:`_no_nul` for each of ``values``, in one pass over all of them (a command may
    have tens of thousands of arguments): the item at fault is looked for only on failure."""
    joined = "\n".join(values)
    try:
        if "\0" not in joined:
            os.fsencode(joined)
            return
    except UnicodeEncodeError:
        pass
    for value in values:
        _no_nul(name, value)


def _window_size(size: Any) -> tuple[int, int]:
    ok = isinstance(size, tuple | list) and len(size) == 2 and all(
        isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 65535 for n in size)
    if not ok:
        raise SpecError("tty_size", f"tty_size must be (rows, columns), each a whole number "
                                    f"from 1 to 65535, got {size!r}")
    return (size[0], size[1])


def _terminal_modes(modes: Any) -> list[Any]:
    if not (isinstance(modes, list | tuple) and len(modes) == 7
            and isinstance(modes[6], list | tuple)):
        raise SpecError("tty_modes", f"tty_modes must be what termios.tcgetattr() returns (a "
                                     f"list of 7 items), got {modes!r}")
    return [*modes[:6], list(modes[6])]


_TIOCGSID = 0x5429  # the session a terminal belongs to (ENOTTY: no session's terminal)


def _our_terminal(fd: int) -> bool:
    """Is ``fd`` the controlling terminal of our session?  (Whether we are in its foreground
    now does not matter: a job started in the background, then brought forward with ``fg``,
    must be in the group that comes forward.)"""
    try:
        buf = fcntl.ioctl(fd, _TIOCGSID, b"\0\0\0\0")
    except OSError:
        return False  # not a terminal, or no session's
    return int.from_bytes(buf, sys.byteorder, signed=True) == os.getsid(0)


@record
class TaskSpec:
    """One command to run, and how.

    ``argv``: the command, a list of strings (``["sh", "-c", "..."]`` for shell syntax).
    ``env``: variables to set; added to the supervisor's environment, or the whole environment
    when ``inherit_env=False``.  ``cwd``: working directory (checked as the task's user at
    spawn; a bad one ends the task ``spawn_failed``).  ``stdin``: ``None`` (/dev/null), bytes
    to feed (then end of file), ``"pipe"`` (fed later with ``TaskHandle.write_stdin()``), or
    ``"inherit"``.  ``tty``: run the task on a new pseudo-terminal (its controlling terminal,
    as ``systemd-run --pty`` and ``docker run -t`` do): programs that check isatty colour and
    line-buffer; stdout captures what it prints (stderr included), stdin bytes or
    ``write_stdin()`` are typed into it; ``tty_size`` is its (rows, columns), ``tty_modes``
    its initial modes as ``termios.tcgetattr()`` gives them (e.g. the real terminal's).
    ``stdout``/``stderr``: ``"capture"`` (head and tail kept, subscribers, log file) or
    ``"inherit"`` (the supervisor's own fd: live and unbuffered, as ``corral run`` does;
    nothing is kept).  ``time_limit``: a duration (``"30s"``, ``"5min"``, ``"1h
    30min"``, or seconds); ``None`` takes the supervisor's default.  ``grace``: how long the
    stop signal has before cgroup.kill (0: kill at once).  ``stop_signal``, repeated every
    ``stop_signal_repeat`` seconds while the task lives, for tools that want to be interrupted
    more than once.  ``idle_timeout``: stop a task that has printed nothing for this long
    (``timed_out``, stop reason ``idle``: an agent's shell stuck at a prompt).
    ``ignored_signals``: signals the task starts with ignored (every other disposition starts
    at its default), as nohup or a shell's background job would give them.
    ``process_group``: ``"own"`` (a process group of its own: what the task signals to its
    group, ``kill 0``, reaches it alone) or ``"shared"`` (the supervisor's: it may read a
    terminal the supervisor holds in the foreground, and that terminal's Ctrl-C reaches both;
    its ``kill 0`` reaches the supervisor too).  ``None``: ``"shared"`` when the task inherits
    a stream that is our session's terminal (an interactive command, in front or a job in the
    background that ``fg`` may bring forward), else ``"own"``.  A ``tty`` task has a session
    of its own anyway.
    ``output_head``/``output_tail``: bytes kept of each stream.  ``log_file``:
    write the full output there too, up to ``log_max_bytes``.  ``log_lazy``: make each log
    file at its stream's first byte rather than at the start, so a silent stream leaves none
    (a file that cannot be made then is logged and the output kept in memory as ever; a bad
    path is not refused before the task runs): for a caller that owns the directory, as
    ``corral serve`` its output directory.  ``limits``: cgroup limits.
    ``isolation``: user, namespaces, capabilities (systemd.exec's names).
    ``pass_fds``: file descriptors of the caller's that the task gets as fds 3, 4, ... in
    this order (at most 16; as systemd passes sockets; every other fd above 2 is closed at its
    exec); the caller keeps and closes its own (e.g. the write end of a pipe it reads a side
    channel from).
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    inherit_env: bool = True
    cwd: str | None = None
    stdin: StdinSpec = None
    tty: bool = False
    tty_size: tuple[int, int] | None = None
    tty_modes: list[Any] | None = None
    stdout: OutputMode = "capture"
    stderr: OutputMode = "capture"
    time_limit: float | str | None = None
    grace: float | str = DEFAULT_GRACE
    stop_signal: int | str = signal.SIGTERM
    stop_signal_repeat: float | str | None = None
    idle_timeout: float | str | None = None
    ignored_signals: tuple[int | str, ...] = ()
    process_group: Literal["own", "shared"] | None = None
    output_head: int = DEFAULT_HEAD
    output_tail: int = DEFAULT_TAIL
    log_file: str | None = None
    log_max_bytes: int | None = None
    log_lazy: bool = False
    limits: Limits = field(default_factory=lambda: NO_LIMITS)  # (one shared, frozen value)
    isolation: Isolation = field(default_factory=lambda: NO_ISOLATION)  # (the same)
    name: str | None = None
    pass_fds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # One check per field group, in the order of the fields; each refuses with a
        # SpecError naming the field, or stores the normalised value.
        self._check_argv()
        self._check_env()
        self._check_paths()
        self._check_stdio()
        self._check_tty()
        self._check_times()
        for name in ("output_head", "output_tail"):
            _byte_count(name, getattr(self, name))
        if self.log_max_bytes is not None:
            _byte_count("log_max_bytes", self.log_max_bytes, low=1)
        if not isinstance(self.log_lazy, bool):
            raise SpecError("log_lazy", f"log_lazy must be True or False, got "
                                        f"{self.log_lazy!r}")
        if not isinstance(self.limits, Limits):
            raise SpecError("limits", f"limits must be a cgroupfs.Limits, got {self.limits!r}: "
                                      f"build one like Limits(memory_max=512 * 2**20)")
        if not isinstance(self.isolation, Isolation):
            raise SpecError("isolation", f"isolation must be a supervisor.Isolation, got "
                                         f"{self.isolation!r}")
        fds: Any = self.pass_fds
        if not isinstance(fds, Sequence) or isinstance(fds, str | bytes) or any(
                isinstance(fd, bool) or not isinstance(fd, int) or fd < 0 for fd in fds) \
                or len(fds) > 16:
            raise SpecError("pass_fds", f"pass_fds must be a list of at most 16 file "
                                        f"descriptors (given to the task as 3, 4, ...), got "
                                        f"{fds!r}")
        object.__setattr__(self, "pass_fds", tuple(fds))
        if self.name is not None and (not isinstance(self.name, str) or len(self.name) > 256):
            raise SpecError("name", f"name must be a string of at most 256 characters, got "
                                    f"{self.name!r}")

    def _check_argv(self) -> None:
        argv: Any = self.argv
        if isinstance(argv, str | bytes):
            raise SpecError("argv", f"argv must be a list of strings like [\"make\", \"test\"], "
                                    f"got the string {argv!r}: split it into a list, or pass "
                                    f"[\"sh\", \"-c\", {argv!r}] for shell syntax")
        if not isinstance(argv, Sequence) or not argv:
            raise SpecError("argv", f"argv must be a non-empty list of strings naming the "
                                    f"command, got {argv!r}")
        for a in argv:
            if not isinstance(a, str):
                raise SpecError("argv", f"argv items must be strings, got {a!r} in {argv!r}: "
                                        f"convert it with str()")
        _no_nul_in_any("argv", argv)
        if not argv[0]:
            raise SpecError("argv", "argv[0] must name the command, got an empty string")
        object.__setattr__(self, "argv", tuple(argv))

    def _check_env(self) -> None:
        if not isinstance(self.inherit_env, bool):  # "no" would be true
            raise SpecError("inherit_env", f"inherit_env must be True or False, got "
                                           f"{self.inherit_env!r}")
        if self.env is None:
            return
        if not isinstance(self.env, Mapping):
            raise SpecError("env", f"env must be a mapping of names to strings, got {self.env!r}")
        for k, v in self.env.items():
            if not isinstance(k, str) or not k or "=" in k:
                raise SpecError("env", f"env names must be non-empty strings without '=', "
                                       f"got {k!r}")
            if not isinstance(v, str):
                raise SpecError("env", f"env[{k!r}] must be a string, got {v!r}: convert it "
                                       f"with str()")
        env = dict(self.env)
        _no_nul_in_any("env", [*env, *env.values()])
        object.__setattr__(self, "env", env)

    def _check_paths(self) -> None:
        for name, what in (("cwd", "a directory path"), ("log_file", "a file path")):
            value: Any = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str | os.PathLike) or not os.fspath(value):
                raise SpecError(name, f"{name} must be {what}, got {value!r}")
            object.__setattr__(self, name, os.path.abspath(os.fspath(value)))
            _no_nul(name, getattr(self, name))
        if self.log_file is not None:
            try:
                mode = os.lstat(self.log_file).st_mode
            except OSError:
                mode = None  # not there yet (made at the spawn), or not ours to see
            if mode is not None and not stat.S_ISREG(mode):
                raise SpecError("log_file", f"log_file must be a plain file (a FIFO or a device "
                                            f"could block corral's writes; a symbolic link is "
                                            f"not followed), got {self.log_file!r}; give the "
                                            f"path of the file itself")

    def _check_stdio(self) -> None:
        stdin: Any = self.stdin
        if isinstance(stdin, bytearray | memoryview):
            object.__setattr__(self, "stdin", bytes(stdin))
        elif not (stdin is None or stdin in ("inherit", "pipe") or isinstance(stdin, bytes)):
            raise SpecError("stdin", f"stdin must be None (/dev/null), bytes to feed, \"pipe\" "
                                     f"(TaskHandle.write_stdin) or \"inherit\", got {stdin!r}")
        for name in ("stdout", "stderr"):
            if getattr(self, name) not in ("capture", "inherit"):
                raise SpecError(name, f"{name} must be \"capture\" or \"inherit\", "
                                      f"got {getattr(self, name)!r}")

    def _check_times(self) -> None:
        set_ = object.__setattr__
        if self.time_limit is not None:
            set_(self, "time_limit", _duration("time_limit", self.time_limit))
        set_(self, "grace", _duration("grace", self.grace, allow_zero=True))
        if self.stop_signal_repeat is not None:
            repeat = _duration("stop_signal_repeat", self.stop_signal_repeat)
            if repeat < REPEAT_FLOOR:
                raise SpecError("stop_signal_repeat", (
                    f"stop_signal_repeat must be at least {REPEAT_FLOOR:g}s (the stop signal at "
                    f"most ten times a second), got {self.stop_signal_repeat!r}; give e.g. "
                    f"\"1s\", or leave it unset to send the stop signal once"))
            set_(self, "stop_signal_repeat", repeat)
        if self.idle_timeout is not None:
            set_(self, "idle_timeout", _duration("idle_timeout", self.idle_timeout))
            if self.stdout == "inherit" and self.stderr == "inherit":
                raise SpecError("idle_timeout", (
                    "idle_timeout watches the task's output, but stdout and stderr are both "
                    "\"inherit\" (passed through, unseen): capture one of them, or give the "
                    "task tty=True"))
        sig = signal.SIGTERM  # (the default needs no reading)
        if self.stop_signal is not signal.SIGTERM:
            try:
                sig = parse_signal(self.stop_signal, "stop_signal")
            except UnitsError as e:
                raise SpecError("stop_signal", str(e)) from None
        set_(self, "stop_signal", int(sig))
        values: Any = self.ignored_signals
        if isinstance(values, str | bytes | int):
            raise SpecError("ignored_signals", f"ignored_signals must be a list of signals like "
                                               f"[\"INT\", \"QUIT\"], got {values!r}")
        ignored = []
        for value in values:
            try:
                ignored.append(int(parse_signal(value, "ignored_signals")))
            except UnitsError as e:
                raise SpecError("ignored_signals", str(e)) from None
        if int(sig) in ignored:
            raise SpecError("ignored_signals", f"the stop signal {sig.name} cannot start "
                                               f"ignored: the task could not be stopped "
                                               f"gracefully; drop it from ignored_signals")
        set_(self, "ignored_signals", tuple(sorted(set(ignored))))

    def _check_tty(self) -> None:
        if not isinstance(self.tty, bool):
            raise SpecError("tty", f"tty must be True or False, got {self.tty!r}")
        if self.process_group not in (None, "own", "shared"):
            raise SpecError("process_group", f"process_group must be \"own\", \"shared\" or "
                                             f"None (chosen by the stdio), got "
                                             f"{self.process_group!r}")
        if self.tty and self.process_group == "shared":
            raise SpecError("process_group", "a task with tty=True has a session of its own, "
                                             "so it cannot share our process group: leave "
                                             "process_group unset")
        for name in ("tty_size", "tty_modes"):
            if getattr(self, name) is not None and not self.tty:
                raise SpecError(name, f"{name} is for a task with tty=True; set tty=True or "
                                      f"drop {name}")
        if self.tty_size is not None:
            object.__setattr__(self, "tty_size", _window_size(self.tty_size))
        if self.tty_modes is not None:
            object.__setattr__(self, "tty_modes", _terminal_modes(self.tty_modes))
        if self.tty and (self.stdin == "inherit" or "inherit" in (self.stdout, self.stderr)):
            raise SpecError("tty", "a task with tty=True has its own terminal: its stdin and "
                                   "output cannot also be \"inherit\"; drop one of the two")

    @classmethod
    def from_call(cls, argv: Any, kwargs: Mapping[str, Any]) -> TaskSpec:
        """``TaskSpec(argv, **kwargs)``, with an unknown keyword refused as a SpecError.

        ``argv`` may itself be a TaskSpec: then ``kwargs`` replace some of its fields.
        """
        for k in kwargs:
            if k not in _OPTIONS:
                raise SpecError(k, f"unknown task option {k!r}; the options are: "
                                   f"{', '.join(sorted(_OPTIONS))}")
        if isinstance(argv, TaskSpec):
            return dataclasses.replace(argv, **kwargs) if kwargs else argv
        return cls(argv, **kwargs)

    def environment(self) -> dict[str, str]:
        """The complete environment the task gets."""
        base = dict(os.environ) if self.inherit_env else {}
        base.update(self.env or {})
        return base

    def own_process_group(self) -> bool:
        """Whether the task gets a process group of its own (see ``process_group``); a
        ``tty`` task gets a session, which makes one too."""
        if self.tty or self.process_group is not None:
            return self.process_group != "shared"
        for fd, how in ((0, self.stdin), (1, self.stdout), (2, self.stderr)):
            if how == "inherit" and _our_terminal(fd):
                return False  # an interactive command: our terminal is its too
        return True

    def environment_or_none(self) -> dict[str, str] | None:
        """The task's environment, or None when it is the supervisor's own, unchanged (the
        spawn then takes it as it is, with no copy)."""
        return None if self.inherit_env and not self.env else self.environment()

    @property
    def grace_s(self) -> float:
        assert isinstance(self.grace, float)
        return self.grace

    @property
    def time_limit_s(self) -> float | None:
        assert self.time_limit is None or isinstance(self.time_limit, float)
        return self.time_limit

    @property
    def ignored_signal_numbers(self) -> tuple[int, ...]:
        return tuple(int(sig) for sig in self.ignored_signals)

    @property
    def idle_timeout_s(self) -> float | None:
        t = self.idle_timeout
        assert t is None or isinstance(t, float)
        return t

    @property
    def repeat_s(self) -> float | None:
        r = self.stop_signal_repeat
        assert r is None or isinstance(r, float)
        return None if r is None or math.isinf(r) else r


_OPTIONS = frozenset(f.name for f in dataclasses.fields(TaskSpec)) - {"argv"}
