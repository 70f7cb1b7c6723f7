"""Usage over time: each running task's leaf sampled at an interval, into bounded series.

One :class:`Sampler` task per supervisor wakes every ``interval`` (default 1 s) while tasks
run and reads, per task, what the leaf's controllers offer: ``cpu.stat`` (always there),
``memory.current``, ``pids.current``, ``io.stat``.  A :class:`Series` never grows without
bound: it keeps at most ``MAX_POINTS`` points, and when full it halves its resolution (each
pair of points becomes one: the later time, the larger memory/pids, the later counters), so a
task that runs for a day costs what one that runs for two minutes does.

The same pass lists the leaf's processes, so that a process seen there and later found outside
it is recognised as an escape (the driver keeps it as a pidfd; see ``_drive``).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from typing import Any

import trio

from cgroupfs import Cgroup, CgroupError, CgroupNotFound, CpuStat

__all__ = ["MAX_POINTS", "Sampler", "Series", "read_pressure"]

log = logging.getLogger(__name__)

MAX_POINTS = 64


_NONE = -1.0  # a reading that was not there (every column stays in step with ``t``)


class Series:
    """Bounded series of one task's usage.  ``t``: seconds after the spawn; ``cpu``: CPU
    seconds used so far (a counter); ``memory``/``pids``: current values; ``io``: bytes read
    and written so far (a counter).  Every column has a value per point (``_NONE`` where a
    reading was missing), so each stays in step with ``t``; a kind the leaf never offered
    comes out as None."""

    __slots__ = ("cpu", "io", "memory", "pids", "t")

    def __init__(self) -> None:
        self.t = array("f")
        self.cpu = array("f")
        self.memory = array("d")
        self.pids = array("f")
        self.io = array("d")

    def add(self, t: float, cpu: float | None, memory: int | None, pids: int | None,
            io: int | None) -> None:
        if len(self.t) >= MAX_POINTS:
            self._halve()
        self.t.append(t)
        for column, value in ((self.cpu, cpu), (self.memory, memory), (self.pids, pids),
                              (self.io, io)):
            column.append(_NONE if value is None else value)

    def _halve(self) -> None:
        """Every pair of points becomes one: counters and times keep the later value, the
        levels (memory, pids) the larger, so a peak is never smoothed away."""
        for column in (self.t, self.cpu, self.io):
            column[:] = array(column.typecode, column[1::2])
        for column in (self.memory, self.pids):
            column[:] = array(column.typecode,
                              (max(column[i:i + 2]) for i in range(0, len(column), 2)))

    def __len__(self) -> int:
        return len(self.t)

    @classmethod
    def restore(cls, state: dict[str, Any]) -> Series:
        """The series :meth:`to_dict` described (a hand-over carries it on)."""
        series = cls()
        length = len(state["t_s"] or ())
        for name, column in (("t_s", series.t), ("cpu_s", series.cpu),
                             ("memory_bytes", series.memory), ("pids", series.pids),
                             ("io_bytes", series.io)):
            column.extend(_NONE if v is None else v for v in state[name] or [None] * length)
        return series

    def to_dict(self) -> dict[str, Any]:
        def values(column: array[Any], digits: int | None) -> list[Any] | None:
            if all(v == _NONE for v in column):
                return None
            return [None if v == _NONE else round(v, digits) if digits is not None else int(v)
                    for v in column]

        return {"t_s": values(self.t, 3), "cpu_s": values(self.cpu, 6),
                "memory_bytes": values(self.memory, None), "pids": values(self.pids, None),
                "io_bytes": values(self.io, None)}


def _int(read: Callable[[str], str | None], name: str) -> int | None:
    text = read(name)
    return None if text is None else int(text.split()[0])


def _io_bytes(text: str | None) -> int | None:
    """Bytes read and written by every device in io.stat (``8:0 rbytes=... wbytes=...``)."""
    if text is None:
        return None
    total = 0
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if key in ("rbytes", "wbytes"):
                total += int(value)
    return total


def sample(leaf: Cgroup, controllers: frozenset[str]) -> tuple[float | None, int | None,
                                                                int | None, int | None]:
    """One reading of ``leaf``: CPU seconds, memory bytes, pids, io bytes (None: not here)."""
    read = leaf.read_file_optional
    cpu_text = read("cpu.stat")
    cpu = None if cpu_text is None else CpuStat.parse(cpu_text).usage_usec
    memory = _int(read, "memory.current") if "memory" in controllers else None
    pids = _int(read, "pids.current") if "pids" in controllers else None
    io = _io_bytes(read("io.stat")) if "io" in controllers else None
    return None if cpu is None else cpu / 1e6, memory, pids, io


def read_pressure(leaf: Cgroup) -> dict[str, Any] | None:
    """PSI totals of the leaf, in seconds: ``{"cpu": {"some": s, "full": s}, "memory":
    {...}, "io": {...}}``; a resource whose file is absent is left out; None if none is."""
    out: dict[str, Any] = {}
    for resource in ("cpu", "memory", "io"):
        try:
            text = leaf.read_file_optional(f"{resource}.pressure")
        except CgroupError:
            text = None
        if text is None:
            continue
        kinds = {}
        for line in text.splitlines():  # "some avg10=0.00 avg60=0.00 avg300=0.00 total=123"
            kind, *fields = line.split()
            for field in fields:
                if field.startswith("total="):
                    kinds[kind] = round(int(field[6:]) / 1e6, 6)
        out[resource] = kinds
    return out or None


class Sampled:
    """What a task offers the sampler: called once per interval on the event loop."""

    def sample(self, now: float) -> None:  # pragma: no cover - an interface
        raise NotImplementedError


class Sampler:
    """Wakes every ``interval`` while anything is registered and samples it."""

    def __init__(self, interval: float | None) -> None:
        self.interval = interval
        self._tasks: set[Sampled] = set()
        self._wake = trio.Event()

    def add(self, task: Sampled) -> None:
        if self.interval is not None:
            self._tasks.add(task)
            self._wake.set()

    def remove(self, task: Sampled) -> None:
        self._tasks.discard(task)

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the main task, not here
    async def run(self) -> None:
        """Sample until cancelled (the supervisor cancels it when it closes)."""
        if self.interval is None:
            return
        while True:
            if not self._tasks:
                self._wake = trio.Event()
                await self._wake.wait()
            await trio.sleep(self.interval)
            now = trio.current_time()
            for task in list(self._tasks):
                try:
                    task.sample(now)
                except CgroupNotFound:
                    self._tasks.discard(task)  # its leaf is gone: it is ending
                except CgroupError as e:
                    log.warning("sampling a task's usage: %s", e)
