"""Typed records of what a cgroup reports about itself, and the pure parsers.

A task's usage (CPU time, peak memory, OOM kills, peak pids) comes from these
files. What a machine does not offer must stay visibly absent: a file that
does not exist (controller not enabled, kernel too old) gives ``None``, never
0, and a key missing from a file gives ``None`` for that field.

Reading stats of a cgroup that is being removed can race with the rmdir: a
file that vanishes (ENOENT) is treated like a file that was never there, so
``read_stats`` returns ``None`` for it instead of raising.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from ._record import record

__all__ = [
    "CgroupEvents",
    "CgroupStat",
    "CgroupStats",
    "CpuStat",
    "MemoryEvents",
    "PidsEvents",
    "parse_events",
    "parse_flat_keyed",
    "read_stats",
]

_EMPTY: Mapping[str, int] = types.MappingProxyType({})


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Parse a flat-keyed file (``key value`` lines): cpu.stat, memory.events, ...

    Raises ``ValueError`` naming the line if a line is not ``key integer``.
    """
    result = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        try:
            result[key] = int(value)
        except ValueError:
            raise ValueError(f"not a 'key integer' line: {line!r}") from None
    return result


@record
class CgroupEvents:
    """cgroup.events: ``populated`` (any process in the subtree), ``frozen``."""

    populated: bool
    frozen: bool


def parse_events(text: str) -> CgroupEvents:
    """Parse cgroup.events. ``frozen`` is False on kernels < 5.2 (no such key)."""
    values = parse_flat_keyed(text)
    if "populated" not in values:
        raise ValueError(f"cgroup.events has no 'populated' line: {text!r}")
    return CgroupEvents(populated=values["populated"] == 1, frozen=values.get("frozen") == 1)


@record
class CpuStat:
    """cpu.stat, microseconds; other keys (nr_periods, throttled_usec...) in ``extra``."""

    usage_usec: int | None
    user_usec: int | None
    system_usec: int | None
    extra: Mapping[str, int] = dataclasses.field(default_factory=lambda: _EMPTY, hash=False)

    @classmethod
    def parse(cls, text: str) -> CpuStat:
        values = parse_flat_keyed(text)
        main = ("usage_usec", "user_usec", "system_usec")
        extra = {k: v for k, v in values.items() if k not in main}
        return cls(
            usage_usec=values.get("usage_usec"),
            user_usec=values.get("user_usec"),
            system_usec=values.get("system_usec"),
            extra=types.MappingProxyType(extra),
        )


@record
class MemoryEvents:
    """memory.events counters; ``oom_kill`` counts processes the OOM killer took."""

    low: int | None
    high: int | None
    max: int | None
    oom: int | None
    oom_kill: int | None
    oom_group_kill: int | None  # kernel >= 5.17

    @classmethod
    def parse(cls, text: str) -> MemoryEvents:
        values = parse_flat_keyed(text)
        return cls(
            low=values.get("low"),
            high=values.get("high"),
            max=values.get("max"),
            oom=values.get("oom"),
            oom_kill=values.get("oom_kill"),
            oom_group_kill=values.get("oom_group_kill"),
        )


@record
class PidsEvents:
    """pids.events: ``max`` counts forks refused at pids.max."""

    max: int | None

    @classmethod
    def parse(cls, text: str) -> PidsEvents:
        return cls(max=parse_flat_keyed(text).get("max"))


@record
class CgroupStat:
    """cgroup.stat: live and dying (removed, not yet freed) descendant cgroups."""

    nr_descendants: int | None
    nr_dying_descendants: int | None

    @classmethod
    def parse(cls, text: str) -> CgroupStat:
        values = parse_flat_keyed(text)
        return cls(
            nr_descendants=values.get("nr_descendants"),
            nr_dying_descendants=values.get("nr_dying_descendants"),
        )


@record
class CgroupStats:
    """Everything ``Cgroup.read_stats`` gathers; ``None`` = file not available."""

    cpu: CpuStat | None
    memory_current: int | None
    memory_peak: int | None  # kernel >= 5.19
    memory_events: MemoryEvents | None
    pids_current: int | None
    pids_peak: int | None  # kernel >= 6.1
    pids_events: PidsEvents | None
    cgroup: CgroupStat | None


def _single_int(text: str | None) -> int | None:
    if text is None:
        return None
    return int(text.strip())


_T = TypeVar("_T")


def _parsed(text: str | None, parse: Callable[[str], _T]) -> _T | None:
    return None if text is None else parse(text)


def read_stats(read_optional: Callable[[str], str | None],
               controllers: Collection[str] | None = None,
               only: Collection[str] | None = None) -> CgroupStats:
    """Gather ``CgroupStats`` with ``read_optional(name)`` (``None`` if absent).

    With ``controllers`` (those enabled for this cgroup), the files of the others are not even
    tried: they cannot exist, and each miss costs a failed open.  With ``only`` (file names),
    just those are read and every other field is ``None``.
    """
    def absent(name: str) -> None:
        return None

    def wanted(name: str) -> str | None:
        return read_optional(name) if only is None or name in only else None

    mem = wanted if controllers is None or "memory" in controllers else absent
    pids = wanted if controllers is None or "pids" in controllers else absent
    return CgroupStats(
        cpu=_parsed(wanted("cpu.stat"), CpuStat.parse),
        memory_current=_single_int(mem("memory.current")),
        memory_peak=_single_int(mem("memory.peak")),
        memory_events=_parsed(mem("memory.events"), MemoryEvents.parse),
        pids_current=_single_int(pids("pids.current")),
        pids_peak=_single_int(pids("pids.peak")),
        pids_events=_parsed(pids("pids.events"), PidsEvents.parse),
        cgroup=_parsed(wanted("cgroup.stat"), CgroupStat.parse),
    )
