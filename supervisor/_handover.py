"""Running tasks handed from one supervisor process to the next (a daemon's restart).

``await sup.hand_over()`` stops supervising without stopping anything: each running task's
driver lets go, its pipes are taken off the reactor unread, the keeper is told to leave the
root alone.  What the next process needs comes in two parts:

- :meth:`HandOver.fds`: named file descriptors to keep alive across the restart (systemd's fd
  store holds them: ``FDSTORE=1`` with ``FDNAME=<name>``).  ``root`` is the root's directory,
  the same open file description as our flock, so the root stays locked (no other corral's
  reaper touches it) for as long as anything holds it.  Per task: ``<id>.pidfd``, its pipe
  read ends ``<id>.stdout``/``<id>.stderr``, a write end of each (``<id>.stdout.w``: PID 1 drops
  a stored fd on which it sees POLLHUP, which a pipe shows once every writer is gone, and would
  take the unread output with it), ``<id>.stdin`` and ``<id>.tty`` (with ``<id>.tty.peer``, the
  terminal's other side, for the same reason).
- :meth:`HandOver.to_json`: the rest (ids, what each task was told, its stop so far,
  deadlines on the monotonic clock, what was kept of its output).

The next process rebuilds it with :meth:`HandOver.from_json` and passes it to
``open_supervisor(adopt=...)``: the tasks go on with their limits, stops, output and records.
Output written meanwhile waits in the pipes (1 MiB each: a task that writes more during the
restart blocks until it is read again; nothing is lost).  The main processes are no longer our
children: their exit statuses come from PIDFD_INFO_EXIT (Linux >= 6.15).

Here too: freezing a running task for the hand-over (:func:`export_task`) and resuming it in
the next supervisor process (:func:`adopt_task`).  Times cross the restart on the monotonic
clock (``time.monotonic()``: since boot, the same for every process); trio's clock is converted
on each side (``_clock.py``).  Each part exports and restores its own state (``Driver``,
``StopState``, ``Tracker``, ``StreamCapture``); this module only gathers them.  What cannot
cross: a process's exit status once it is no longer our child (see ``_main.py``).
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from cgroupfs import Cgroup

from ._capture import StreamCapture
from ._clock import HandOverClock
from ._drive import Driver
from ._ending import Ending, Launch
from ._life import drive, new_driver
from ._main import MainProcess
from ._output import StdinFeed
from ._result import Cleanup, Outcome, SignalSent, TaskResult
from ._spec import TaskSpec
from ._stdio import TaskIo, register
from ._task import DRIVEN, HANDED_OVER, Runtime, Task, finish

__all__ = ["FORMAT", "HandOver", "TaskState", "adopt_all", "adopt_task", "export_task"]

FORMAT = 1  # the JSON's "format"; a newer one is refused


@dataclass
class TaskState:
    """One running task as it is handed over: everything but its fds (named in ``fds``)."""

    id: str
    state: dict[str, Any]  # see export_task / adopt_task below
    fds: dict[str, int] = field(default_factory=dict)  # kind -> fd: pidfd, stdout, ...


@dataclass
class HandOver:
    """Everything a next supervisor process needs to adopt the running tasks."""

    root_path: str
    root_fd: int
    tasks: list[TaskState] = field(default_factory=list)

    def fds(self) -> dict[str, int]:
        """Every fd to keep alive, by name (``root``, ``<id>.<kind>``)."""
        out = {"root": self.root_fd}
        for t in self.tasks:
            out.update({f"{t.id}.{kind}": fd for kind, fd in t.fds.items()})
        return out

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "root": self.root_path,
                           "tasks": [{"id": t.id, "fds": sorted(t.fds), **t.state}
                                     for t in self.tasks]})

    @classmethod
    def from_json(cls, text: str, fds: dict[str, int]) -> HandOver:
        """Rebuild from :meth:`to_json`'s text and the fds by the names :meth:`fds` gave.
        ValueError when the text is not a hand-over this corral can read, or an fd is
        missing (then nothing of it may be adopted: the caller closes what it has)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a corral hand-over this version can read (format "
                             f"{data.get('format') if isinstance(data, dict) else '?'}, "
                             f"expected {FORMAT})")
        if "root" not in fds:
            raise ValueError("the hand-over's root fd is missing")
        tasks = []
        for entry in data["tasks"]:
            kinds = entry.pop("fds")
            missing = [k for k in kinds if f"{entry['id']}.{k}" not in fds]
            if missing:
                raise ValueError(f"task {entry['id']}: fds {missing} are missing")
            task_id = entry.pop("id")
            tasks.append(TaskState(task_id, entry, {k: fds[f"{task_id}.{k}"] for k in kinds}))
        return cls(data["root"], fds["root"], tasks)

    def close(self) -> None:
        """Close every fd (once adopted, or when giving up on it)."""
        for fd in self.fds().values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.tasks.clear()


log = logging.getLogger(__name__)

_TIOCGPTPEER = 0x5441  # ioctl: open the other side of this pseudo-terminal (Linux >= 4.13)


def export_task(into: HandOver, task: Task, leaf: Cgroup, main: MainProcess, driver: Driver,
                started: Launch) -> None:
    """``task``'s driver has let go: take its fds off the reactor (unread, unclosed), describe
    the rest, and add it to ``into``.  The task is handed over: no record here."""
    clock = HandOverClock()
    fds: dict[str, int] = {"pidfd": main.pidfd}
    if task.io is not None:
        fds.update(_detach_io(task, task.io))
    leaf.close()
    state = {"spec": _spec_state(task.spec), "time_limit": task.time_limit, "pid": main.pid,
             "created_at": task.created_at, "started_at": started.started_at,
             "t0": clock.out(started.t0), "method": started.method,
             "fallback_errno": started.fallback_errno, "notes": list(task.notes),
             "isolation": task.spec.isolation.describe(),
             "captures": {name: cap.export() for name, cap in (("stdout", task.stdout),
                                                               ("stderr", task.stderr))
                          if cap is not None},
             "driver": driver.export(clock), "stop": _stop_state(task, clock),
             "signals": [[int(x.signal), x.after_s, x.to, x.by] for x in task.signals],
             "signals_omitted": task.signals_omitted, "group": task.group}
    into.tasks.append(TaskState(task.id, state, fds))
    task.handed_over = True
    task.stage = HANDED_OVER
    task.done.set()


def _spec_state(spec: TaskSpec) -> dict[str, Any]:
    return {"argv": list(spec.argv), "name": spec.name, "grace": spec.grace_s,
            "stop_signal": int(spec.stop_signal), "repeat": spec.repeat_s,
            "idle_timeout": spec.idle_timeout_s, "output_head": spec.output_head,
            "output_tail": spec.output_tail, "log_file": spec.log_file,
            "log_max_bytes": spec.log_max_bytes, "log_lazy": spec.log_lazy, "tty": spec.tty,
            "stdin_pipe": spec.stdin == "pipe" or spec.tty}


def _detach_io(task: Task, io: TaskIo) -> dict[str, int]:
    """Our ends of the task's stdio, named, with a second end of each so that PID 1 never sees
    POLLHUP on a stored fd (it drops those, unread output with them)."""
    reactor, fds = task.rt.reactor, {}
    for stream in io.streams:
        fd = reactor.detach(stream)
        if fd is None:
            continue  # ended already: nothing more will come
        kind = "tty" if task.spec.tty else ("stdout" if stream.capture is task.stdout
                                            else "stderr")
        fds[kind] = fd
        if kind == "tty":
            fds["tty.peer"] = fcntl.ioctl(fd, _TIOCGPTPEER,
                                          os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        else:
            fds[f"{kind}.w"] = os.open(f"/proc/self/fd/{fd}",
                                       os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if io.feed_stream is not None:
        fd = reactor.detach(io.feed_stream)
        if fd is not None and task.spec.tty:
            os.close(fd)  # a dup of the terminal: the next process makes its own
        elif fd is not None:
            fds["stdin"] = fd
    return fds


def _stop_state(task: Task, clock: HandOverClock) -> dict[str, Any]:
    """The task's stop, and (in the same part of the JSON, as corral has always put it) what
    of its stdin is still to be written."""
    feed = task.io.feed if task.io is not None else None
    return {**task.stop.export(clock),
            "stdin_pending": None if feed is None else base64.b64encode(feed.buffer).decode(),
            "stdin_eof": None if feed is None else feed.eof}


def adopt_task(rt: Runtime, state: TaskState, register_task: Callable[[Task], None]
               ) -> Callable[[], Awaitable[TaskResult | None]]:
    """The task ``state`` describes, made ours again: registered with ``register_task``, its
    stdio back on the reactor, its driver where it left off.  Returns its life, to be run in
    the supervisor's nursery.  Takes ownership of ``state.fds``."""
    s, clock = state.state, HandOverClock()
    spec = _spec_back(s["spec"])
    task = Task(rt, state.id, spec, s["time_limit"], tuple(s["notes"]))
    task.created_at, task.pid, task.began = s["created_at"], s["pid"], True
    task.group = s.get("group")
    parent = rt.parent_of(task.group)
    task.cgroup = os.path.join(parent.path, state.id)
    caps = s["captures"]
    task.stdout = StreamCapture.restore(caps["stdout"]) if "stdout" in caps else None
    task.stderr = StreamCapture.restore(caps["stderr"]) if "stderr" in caps else None
    task.stop.restore(s["stop"], clock)
    task.signals = [SignalSent(signal.Signals(sig), after, to, by)
                    for sig, after, to, by in s.get("signals", ())]
    task.signals_omitted = int(s.get("signals_omitted", 0))
    task.io = _attach_io(task, state.fds, s["stop"])
    register_task(task)
    leaf = parent.child(state.id)
    main = MainProcess(s["pid"], state.fds["pidfd"], adopted=True)
    t0 = clock.back(s["t0"])
    driver = new_driver(task, leaf, main, t0)
    driver.restore(s["driver"], clock)
    task.driver, task.stage = driver, DRIVEN
    started = Launch(s["method"], s["fallback_errno"], t0, s["started_at"])

    async def life() -> TaskResult | None:
        try:
            return await drive(task, leaf, main, driver, started)
        finally:
            rt.on_end(task)

    return life


def _spec_back(s: dict[str, Any]) -> TaskSpec:
    """What the adopted task was told (limits and isolation were applied at its spawn)."""
    return TaskSpec(tuple(s["argv"]), name=s["name"], grace=s["grace"],
                    stop_signal=s["stop_signal"], stop_signal_repeat=s["repeat"],
                    idle_timeout=s["idle_timeout"], output_head=s["output_head"],
                    output_tail=s["output_tail"], log_file=s["log_file"],
                    log_max_bytes=s["log_max_bytes"], log_lazy=s.get("log_lazy", False),
                    tty=s["tty"],
                    stdin="pipe" if s["stdin_pipe"] and not s["tty"] else None)


def _attach_io(task: Task, fds: dict[str, int], stop: dict[str, Any]) -> TaskIo:
    io = TaskIo()
    for kind, cap in (("stdout", task.stdout), ("stderr", task.stderr), ("tty", task.stdout)):
        if kind in fds and cap is not None:
            os.set_blocking(fds[kind], False)
            io.readers.append((fds[kind], cap))
    if "tty" in fds:
        io.master = fds["tty"]
        io.feed_fd = os.dup(fds["tty"])
    elif "stdin" in fds:
        io.feed_fd = fds["stdin"]
    if io.feed_fd >= 0:
        pending = base64.b64decode(stop["stdin_pending"] or "")
        io.feed = StdinFeed(pending, eof=bool(stop["stdin_eof"]))
    register(io, task.rt.reactor, tty=task.spec.tty)
    for extra in ("stdout.w", "stderr.w", "tty.peer"):  # our second ends: EOF works again
        if extra in fds:
            os.close(fds[extra])
    return io


def adopt_all(rt: Runtime, handover: HandOver, nursery: trio.Nursery,
              register_task: Callable[[Task], None]) -> None:
    """Adopt every task of ``handover``, each life in ``nursery``; one that cannot be adopted
    gets its record now (``lost``, saying why), so that each still has exactly one."""
    for state in handover.tasks:
        try:
            life = adopt_task(rt, state, register_task)
        except Exception as e:  # its leaf vanished, an fd is not what it claims...
            log.exception("adopting task %s", state.id)
            _lost_in_handover(rt, state, e)
            continue
        nursery.start_soon(life)
    handover.tasks.clear()


def _lost_in_handover(rt: Runtime, state: TaskState, error: Exception) -> None:
    for fd in state.fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    spec = TaskSpec(tuple(state.state["spec"]["argv"]), name=state.state["spec"]["name"])
    task = Task(rt, state.id, spec, state.state["time_limit"], ())
    finish(task, Ending(Outcome.LOST, started=True, error=error, step="adopt",
                        cleanup=Cleanup("incomplete", detail=f"could not be adopted: {error}"),
                        started_at=state.state["started_at"],
                        notes=("handed over by an earlier corral process, but could not be "
                               "adopted",)))
