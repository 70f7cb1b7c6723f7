"""The keeper: a tiny process that ends the supervisor's root if the supervisor dies.

A supervisor that is SIGKILLed, crashes or is OOM-killed cannot stop its tasks, which would then
outlive their time limits.  So each supervisor starts a keeper beside it::

    keeper = Keeper.start(root)     # returns once the keeper is armed
    ...                             # run tasks in leaves below root
    keeper.close()                  # after removing root ourselves: the keeper just exits

If the supervisor dies first, the keeper writes 1 to the root's ``cgroup.kill``, thaws the
subtree, waits for ``populated 0``, removes every cgroup of it depth-first, prints one line on
its stderr (the supervisor's) saying what it did, and exits.  ``release()`` hands the tasks
over on purpose (a daemon restarting): the keeper exits without killing anything.

The keeper is a small C program (native/corral_keeper.c) installed beside the extension module
as ``supervisor/corral-keeper``, not a forked copy of the supervisor nor a Python process:
- a child forked without exec lives as long as the supervisor and keeps a copy-on-write
  snapshot of the parent's whole heap, which the supervisor then pays for in copied pages
  with every write (and the snapshot holds the supervisor's fds and locks);
- a Python keeper costs ~10-20 ms to start and ~8 MB of memory per supervisor;
- the C keeper is armed ~2 ms after ``start()`` is called and costs ~130 KiB of private
  memory (1.5 MiB RSS, nearly all of it libc pages shared with every other process).

What it is given, and why:
- a pidfd of the supervisor: it turns readable when the whole thread group has exited
  (pidfd_open(2)), wherever the keeper was reparented, with no pid that could be reused and
  none of PR_SET_PDEATHSIG's pitfalls (that fires when the parent *thread* exits, and some LSMs
  reset it on credential changes);
- the root's directory fd: the keeper works relative to it only (openat, unlinkat), and since
  it is the same open file description it shares the supervisor's ``flock``, so the root stays
  locked (no other corral's reaper touches it) until the keeper has cleaned up and exited;
- a control pipe (the keeper's stdin): one byte per command.  EOF without a command is not a
  command: the supervisor may have exec'd itself, or a forked child may hold a copy; the keeper
  keeps waiting on the pidfd;
- a ready pipe (its stdout): ``ok`` once its signal dispositions are set and its fds checked.

It runs in its own session, in the supervisor's own cgroup (never inside the root it guards),
with an empty environment and ``/`` as its working directory, and ignores SIGINT, SIGTERM,
SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU and SIGPIPE: Ctrl-C at a terminal, a service
manager's stop or a closed terminal's hangup stop the supervisor, which then stops its tasks
and tells the keeper; only the supervisor's death makes the keeper act.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import select
import signal
import time
from collections.abc import Iterator

from cgroupfs import Cgroup, NoCgroup2Error, own_cgroup

from ._errors import SupervisorError
from ._spawn import spawn

__all__ = ["KEEPER_PATH", "Keeper", "KeeperError"]

log = logging.getLogger(__name__)

KEEPER_PATH = pathlib.Path(__file__).with_name("corral-keeper")
_READY_TIMEOUT = 10.0  # only a broken keeper takes more than a few ms to arm
_EXIT_TIMEOUT = 5.0  # after a command: only a wedged keeper takes longer than a few ms
_RELEASE, _EXIT = b"R", b"X"


class KeeperError(SupervisorError):
    """The keeper could not be started or armed; the message says why and what to do."""


def _ensure_outside(root: Cgroup) -> None:
    """Raise KeeperError if this process lives in ``root`` or below: the keeper stays in our
    cgroup, and would kill itself (and us) along with the tasks."""
    try:
        ours = os.path.realpath(own_cgroup())
    except (NoCgroup2Error, OSError):
        return  # not found through a mount: then it cannot be below root's path either
    mine = os.path.realpath(root.path)
    if ours == mine or ours.startswith(mine + os.sep):
        raise KeeperError(
            f"cannot guard {root.path} with a keeper: this process lives in {ours}, inside it, "
            f"and the keeper (which stays in our cgroup) would kill itself with the tasks; "
            f"guard a cgroup that holds only tasks")


@contextlib.contextmanager
def _stderr_fd() -> Iterator[int]:
    """Our fd 2 if it is open; else /dev/null (a keeper must never get a closed stderr)."""
    try:
        os.fstat(2)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)
        return
    yield 2


def _read_ready(fd: int, deadline: float) -> bytes:
    """What the keeper wrote on its ready pipe, up to EOF or the first newline; b"" if
    ``deadline`` (monotonic) passed first."""
    data = b""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 512)
        if not chunk:
            break
        data += chunk
    return data


class Keeper:
    """A started, armed keeper guarding one cgroup root; see the module docstring.

    Not thread-safe; call ``close()`` or ``release()`` exactly when the supervisor gives the
    root up.  In a child forked from the supervisor both only close the child's copies of the
    fds: the keeper belongs to the process that started it.
    """

    __slots__ = ("_control", "_owner", "_pidfd", "_ready", "_root", "pid", "returncode",
                 "root_path")

    def __init__(self, pid: int, pidfd: int, control: int, ready: int, root: Cgroup) -> None:
        """Adopt a running keeper (its pid, a pidfd, the control pipe's write end and the ready
        pipe's read end, -1 once read) guarding ``root``; prefer :meth:`start`."""
        self.pid = pid
        self.root_path = root.path
        self.returncode: int | None = None  # as subprocess: -N for a signal, once reaped
        self._pidfd = pidfd
        self._control = control
        self._ready = ready
        self._root = root
        self._owner = os.getpid()

    @classmethod
    def start(cls, root: Cgroup, *, supervisor_pid: int | None = None,
              force_fallback: bool = False) -> Keeper:
        """Start a keeper guarding ``root``; return once it is armed.

        ``supervisor_pid`` is the process whose death sets it off (default: this one; another
        pid is for tests and wrappers).  ``force_fallback`` makes it kill by freeze and
        SIGKILL per process as on kernels without ``cgroup.kill`` (a test seam).  Raises
        :class:`KeeperError` (the executable is missing, the keeper refused its arguments or
        did not arm in time; nothing is left running then) or OSError from pidfd_open.
        """
        if not os.access(KEEPER_PATH, os.X_OK):
            raise KeeperError(
                f"the keeper executable {KEEPER_PATH} is missing or not executable: reinstall "
                f"corral (pip install .), or in a checkout run python native/build_keeper.py")
        _ensure_outside(root)
        pid = os.getpid() if supervisor_pid is None else supervisor_pid
        argv = [str(KEEPER_PATH), "--pid", str(pid), "--root", root.path]
        if force_fallback:
            argv += ["--kill", "signal"]
        keeper = cls._spawn(argv, pid, root)
        try:
            answer = _read_ready(keeper._ready, time.monotonic() + _READY_TIMEOUT)
            if answer != b"ok\n":
                keeper._kill_and_reap()
                raise KeeperError(keeper._refusal(answer))
        except BaseException:
            keeper._kill_and_reap()
            keeper._close_fds()
            raise
        os.close(keeper._ready)
        keeper._ready = -1
        log.debug("keeper pid %d guards %s", keeper.pid, root.path)
        return keeper

    @classmethod
    def _spawn(cls, argv: list[str], pid: int, root: Cgroup) -> Keeper:
        """Spawn the keeper with its fds; ours are closed again on any failure."""
        fds = [os.pidfd_open(pid)]
        try:
            fds += os.pipe2(os.O_CLOEXEC)  # control: the keeper's stdin
            fds += os.pipe2(os.O_CLOEXEC)  # ready: the keeper's stdout
            sup_pidfd, control_r, control_w, ready_r, ready_w = fds
            with _stderr_fd() as err:
                child = spawn([*argv, "--pidfd", str(sup_pidfd), "--root-fd", str(root.fd)],
                              env={}, cwd="/", cgroup_fd=-1, stdin=control_r, stdout=ready_w,
                              stderr=err, new_session=True, pass_fds=[sup_pidfd, root.fd])
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        for fd in (sup_pidfd, control_r, ready_w):
            os.close(fd)  # the keeper's ends: EOF on ready_r once it exits
        return cls(child.pid, child.pidfd, control_w, ready_r, root)

    def fileno(self) -> int:
        """The keeper's pidfd: readable once it has exited (whoever killed it)."""
        return self._pidfd

    def rearm(self) -> int | None:
        """The keeper died on its own (an operator's kill, the OOM killer): reap it and start
        another in its place, guarding the same root.  Returns the dead one's status; raises
        as :meth:`start` does (then this object stays closed)."""
        self._reap()
        status = self.returncode
        self._close_fds()
        new = Keeper.start(self._root)
        self.pid, self.returncode = new.pid, None
        self._pidfd, self._control, self._ready = new._pidfd, new._control, new._ready
        new._pidfd = new._control = new._ready = -1
        return status

    def alive(self) -> bool:
        """Whether the keeper is still running.  One that died is left unreaped (a zombie)
        until ``close()`` or ``release()``, which reap it and log that it had died."""
        if self.returncode is not None:
            return False
        try:
            info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return info is None or info.si_pid == 0

    def release(self) -> None:
        """The supervisor hands its tasks over on purpose (a daemon restarting): the keeper
        exits without killing anything.  Returns once it has exited (and dropped its share of
        the root's lock).  Idempotent."""
        self._finish(_RELEASE)

    def close(self) -> None:
        """Normal shutdown, after the supervisor removed its cgroups itself: the keeper exits
        without touching them; reaped before this returns.  Idempotent; a keeper that died
        meanwhile is reaped and logged, never raised about."""
        self._finish(_EXIT)

    def __enter__(self) -> Keeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"<Keeper pid {self.pid} guarding {self.root_path}: {state}>"

    # -- internals ----------------------------------------------------------------------

    def _finish(self, command: bytes) -> None:
        """Send ``command``, wait for the keeper to exit (SIGKILL after _EXIT_TIMEOUT), reap
        it and close our fds; in a forked child, only close the fds."""
        if self._control < 0:
            return
        if os.getpid() == self._owner:
            if self.alive():
                self._send(command)
                self._wait(_EXIT_TIMEOUT)
            else:
                self._reap()
                log.warning("the keeper (pid %d) guarding %s had exited (status %s) before it "
                            "was told to: from then on nothing guarded the tasks against the "
                            "supervisor's death", self.pid, self.root_path, self.returncode)
        self._close_fds()

    def _send(self, command: bytes) -> None:
        """Write one command byte; a keeper that died meanwhile (EPIPE) is not an error."""
        try:
            os.write(self._control, command)
        except BrokenPipeError:
            pass

    def _wait(self, timeout: float) -> None:
        """Reap the keeper, SIGKILLing it first if it has not exited within ``timeout`` s."""
        if self.returncode is not None:
            return
        if not select.select([self._pidfd], [], [], timeout)[0]:
            log.warning("the keeper (pid %d) guarding %s did not exit within %g s: killing it",
                        self.pid, self.root_path, timeout)
            self._kill_and_reap()
            return
        self._reap()

    def _kill_and_reap(self) -> None:
        """SIGKILL the keeper (through its pidfd) unless reaped already, and reap it."""
        if self.returncode is not None:
            return
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap()

    def _reap(self) -> None:
        """Wait for the keeper's exit and set ``returncode`` (blocks until it exits)."""
        if self.returncode is not None:
            return
        try:
            info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
        except ChildProcessError:
            self.returncode = -1  # reaped elsewhere: the status is unknown
            return
        assert info is not None
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        self.returncode = -info.si_status if killed else info.si_status

    def _close_fds(self) -> None:
        """Close our fds of the keeper (control pipe, pidfd, ready pipe); idempotent."""
        for fd in (self._control, self._pidfd, self._ready):
            if fd >= 0:
                os.close(fd)
        self._control = self._pidfd = self._ready = -1

    def _refusal(self, answer: bytes) -> str:
        """The message for a keeper that did not arm (call after reaping it)."""
        text = answer.decode("utf-8", "replace").strip()
        if text.startswith("error: "):
            return f"the keeper for {self.root_path} refused to start: {text[7:]}"
        if answer.endswith(b"\n") or self.returncode != -signal.SIGKILL:
            return (f"the keeper for {self.root_path} exited with status {self.returncode} "
                    f"before it was armed{': ' + text if text else ''}")
        return f"the keeper for {self.root_path} did not arm within {_READY_TIMEOUT:g} s"

