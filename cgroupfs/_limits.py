"""Resource limits as a validated value, and the exact text the kernel expects.

A bad limit must be refused before anything is created, with a message that
names the field, the value, the rule and the fix; and the translation to
interface files (``cpu.max`` wants ``"50000 100000"``, ``io.weight`` wants
``"default 100"``) must be testable without a kernel. So ``Limits`` validates
in ``__post_init__`` and ``files()`` is pure; ``Cgroup.set_limits`` only
checks the controllers are there and writes.

Every field defaults to ``None``, meaning "leave the kernel's value as it is"
(a fresh cgroup has no limits).
"""

from __future__ import annotations

from typing import Literal

from ._errors import InvalidLimit
from ._record import record

__all__ = ["CpuMax", "Limits"]

# field, interface file, controller; also the order files() writes in.
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("memory_max", "memory.max", "memory"),
    ("memory_high", "memory.high", "memory"),
    ("memory_swap_max", "memory.swap.max", "memory"),
    ("pids_max", "pids.max", "pids"),
    ("cpu_max", "cpu.max", "cpu"),
    ("cpu_weight", "cpu.weight", "cpu"),
    ("io_weight", "io.weight", "io"),
)


def _is_int(value: object) -> bool:
    # bool is an int subclass; Limits(pids_max=True) is a bug, not "1".
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count_or_max(field: str, value: object, rule: str, fix: str) -> None:
    if value is None or value == "max":
        return
    if not (_is_int(value) and isinstance(value, int) and value >= 0):
        raise InvalidLimit(field, value, rule, fix)


def _check_weight(field: str, value: object) -> None:
    if value is None:
        return
    if not (_is_int(value) and isinstance(value, int) and 1 <= value <= 10_000):
        raise InvalidLimit(
            field, value, "an int between 1 and 10000", "100 is the default weight"
        )


@record
class CpuMax:
    """``cpu.max``: at most ``quota_us`` of CPU time every ``period_us``.

    ``CpuMax(50_000)`` is half a CPU, ``CpuMax(200_000)`` two CPUs,
    ``CpuMax(None)`` no limit ("max").
    """

    quota_us: int | None
    period_us: int = 100_000

    def __post_init__(self) -> None:
        quota = self.quota_us
        if quota is not None and (not _is_int(quota) or quota < 1000):
            raise InvalidLimit(
                "cpu_max.quota_us",
                quota,
                "an int >= 1000 (microseconds per period) or None for no limit",
                "the kernel's smallest quota is 1 ms; 50_000 with the default 100_000 "
                "period is half a CPU",
            )
        period = self.period_us
        if not _is_int(period) or not 1000 <= period <= 1_000_000:
            raise InvalidLimit(
                "cpu_max.period_us",
                period,
                "an int between 1000 and 1000000 (microseconds)",
                "the kernel accepts periods from 1 ms to 1 s; 100_000 is its default",
            )

    def text(self) -> str:
        """The line to write to ``cpu.max``."""
        quota = "max" if self.quota_us is None else str(self.quota_us)
        return f"{quota} {self.period_us}"


@record
class Limits:
    """Limits for one cgroup; ``None`` fields are left alone.

    Memory sizes are bytes; ``"max"`` removes a limit. Raises ``InvalidLimit``
    (a ``ValueError``) on a value the kernel would refuse.
    """

    memory_max: int | Literal["max"] | None = None
    memory_high: int | Literal["max"] | None = None
    memory_swap_max: int | Literal["max"] | None = None
    pids_max: int | Literal["max"] | None = None
    cpu_max: CpuMax | None = None
    cpu_weight: int | None = None
    io_weight: int | None = None

    def __post_init__(self) -> None:
        for field in ("memory_max", "memory_high", "memory_swap_max"):
            _check_count_or_max(
                field,
                getattr(self, field),
                'a byte count >= 0 or "max"',
                'pass an int number of bytes (e.g. 512 * 1024**2) or "max" for no limit',
            )
        _check_count_or_max(
            "pids_max",
            self.pids_max,
            'a process count >= 0 or "max"',
            'pass an int (processes and threads) or "max" for no limit',
        )
        if self.cpu_max is not None and not isinstance(self.cpu_max, CpuMax):
            raise InvalidLimit(
                "cpu_max",
                self.cpu_max,
                "a CpuMax(quota_us, period_us)",
                "e.g. CpuMax(50_000) for half a CPU, CpuMax(None) for no limit",
            )
        _check_weight("cpu_weight", self.cpu_weight)
        _check_weight("io_weight", self.io_weight)

    def is_empty(self) -> bool:
        """True when no field is set (nothing would be written)."""
        return all(getattr(self, field) is None for field, _, _ in _FIELDS)

    def controllers(self) -> frozenset[str]:
        """The controllers the set fields need enabled for the cgroup."""
        return frozenset(ctl for field, _, ctl in _FIELDS if getattr(self, field) is not None)

    def needed_by(self, controller: str) -> tuple[str, ...]:
        """The set fields that need ``controller``, e.g. ``("memory_max",)``."""
        return tuple(
            field
            for field, _, ctl in _FIELDS
            if ctl == controller and getattr(self, field) is not None
        )

    def files(self) -> list[tuple[str, str]]:
        """``(interface file, exact text)`` for each set field, in write order."""
        result = []
        for field, filename, _ in _FIELDS:
            value = getattr(self, field)
            if value is None:
                continue
            if isinstance(value, CpuMax):
                text = value.text()
            elif field == "io_weight":
                # io.weight's first line is the default for devices without an
                # override; "default N" sets that line (a bare "N" works too).
                text = f"default {value}"
            else:
                text = str(value)
            result.append((filename, text))
        return result
