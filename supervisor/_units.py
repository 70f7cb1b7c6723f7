"""Parsers for the systemd value syntax corral's users write, checked before anything runs.

Users set limits the way they would in a systemd unit: ``time_limit = "1h 30min"``,
``MemoryMax = "2G"``, ``CPUQuota = "150%"``, ``TasksMax = "25%"``, ``stop_signal = "INT"``.
A typo there has to fail while the spec is read, before a cgroup is created or a process
started, with a message that names the value, the rule and the fix::

    time_limit must be a positive duration like "30s", "5min" or "1h 30min", got "-5s"

Everything here is pure: no I/O, no trio, nothing else from corral. A total that a percentage
refers to (physical memory, the kernel's pid_max) is passed in by the caller. Arithmetic is
exact (``Fraction``), so "1.5G" is exactly 1610612736 bytes and "0.1s 0.2s" exactly 0.3s.

Errors::

    ValueError
    └── UnitsError    a value breaks the rule; .what names the field, .value is what was given
"""

from __future__ import annotations

import json
import math
import re
import signal
from fractions import Fraction
from typing import Literal

__all__ = [
    "DEFAULT_GRACE",
    "UnitsError",
    "format_duration",
    "parse_count",
    "parse_cpu_quota",
    "parse_duration",
    "parse_signal",
    "parse_size",
    "parse_weight",
    "whole_number",
]


DEFAULT_GRACE = 5.0  # seconds between a task's stop signal and its kill, unless it asks


class UnitsError(ValueError):
    """A user-supplied value does not follow systemd's syntax or corral's bounds.

    The message starts with ``what`` (the field, e.g. ``"MemoryMax"``) and quotes the value
    as given; ``what`` and ``value`` are kept as attributes for callers that point at fields.
    """

    def __init__(self, message: str, *, what: str, value: object) -> None:
        super().__init__(message)
        self.what = what
        self.value = value


def _show(value: object) -> str:
    # Double quotes as in a unit file; JSON escapes control characters so they stay visible.
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _refuse(what: str, rule: str, value: object, detail: str = "") -> UnitsError:
    message = f"{what} must be {rule}, got {_show(value)}"
    return UnitsError(f"{message}; {detail}" if detail else message, what=what, value=value)


def _too_big(what: str, value: object, why: str, rule: str) -> UnitsError:
    return UnitsError(f"{what} {_show(value)} is {why}; it must be {rule}", what=what, value=value)


def _type_detail(value: object, kind: str) -> str:
    return f"a bool is not {kind}" if isinstance(value, bool) else ""


# [0-9], not \d: \d would let Arabic-Indic and other Unicode digits through.
_NUMBER = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_INTEGER = re.compile(r"[0-9]+")
_PERCENT = re.compile(rf"({_NUMBER})%")
_INT64_MAX = 2**63 - 1
_HUGE = 10**100  # stands in for numbers with more digits than anyone means


def _exact(token: str) -> Fraction:
    # Clipping keeps int() under Python's 4300-digit limit; such values are refused anyway.
    whole, _, decimals = token.partition(".")
    if len(whole) > 100:
        return Fraction(_HUGE)
    return Fraction(f"{whole or '0'}.{decimals[:100] or '0'}")


def whole_number(text: str) -> int:
    """``int(text)`` of ASCII digits; past 100 digits, 10**100 (int() refuses past 4,300, with
    a message about Python's own limit: such a number is out of any range anyway)."""
    return int(text) if len(text) <= 100 else _HUGE


# --- durations -----------------------------------------------------------------------------

_MONTH = Fraction(2_629_800)  # systemd's USEC_PER_MONTH: 365.25 / 12 days
_YEAR = Fraction(31_557_600)  # systemd's USEC_PER_YEAR: 365.25 days
_ABSURD = 100 * _YEAR
_ABSURD_S = float(_ABSURD)
_TIME_UNITS: dict[str, Fraction] = {
    # man systemd.time; case-sensitive: "M" is months, "m" minutes.
    **dict.fromkeys(("usec", "us", "µs", "μs"), Fraction(1, 1_000_000)),
    **dict.fromkeys(("msec", "ms"), Fraction(1, 1000)),
    **dict.fromkeys(("seconds", "second", "sec", "s", ""), Fraction(1)),
    **dict.fromkeys(("minutes", "minute", "min", "m"), Fraction(60)),
    **dict.fromkeys(("hours", "hour", "hr", "h"), Fraction(3600)),
    **dict.fromkeys(("days", "day", "d"), Fraction(86_400)),
    **dict.fromkeys(("weeks", "week", "w"), Fraction(604_800)),
    **dict.fromkeys(("months", "month", "M"), _MONTH),
    **dict.fromkeys(("years", "year", "y"), _YEAR),
}
# One component: a number, then a unit made of letters ([^\W\d_]), spaces allowed around both.
_DURATION_PART = re.compile(rf"\s*({_NUMBER})\s*([^\W\d_]*)\s*")


def parse_duration(
    value: str | int | float,
    what: str,
    *,
    allow_zero: bool = False,
    allow_infinity: bool = False,
) -> float:
    """Seconds in a systemd time span: ``"90"``, ``"2.5s"``, ``"1h 30min"``, ``"1h30min"``.

    Numbers (not bools) are seconds. ``"infinity"`` (or ``math.inf``) gives ``math.inf`` when
    ``allow_infinity``; zero only when ``allow_zero``; more than 100 years never.
    """
    if type(value) is float and 0 < value <= _ABSURD_S:
        return value  # the common case (a default, a number of seconds): nothing to read
    rule = "a positive duration" if not allow_zero else "a duration (zero or more)"
    rule += ' like "30s", "5min" or "1h 30min"' + (', or "infinity"' if allow_infinity else "")
    total = _duration_value(value, what, rule)  # None is infinity
    if total is None:
        if allow_infinity:
            return math.inf
        raise _refuse(what, rule, value, "there is no infinity here; give a finite duration")
    if total < 0 or (total == 0 and not allow_zero):
        raise _refuse(what, rule, value)
    if total > _ABSURD:
        raise _too_big(what, value, "absurdly long (more than 100 years)", rule)
    return float(total)


MAX_DURATION_TEXT = 64  # characters: "1h 30min 20s" is 12; systemd's longest sane spans fit


def _duration_value(value: object, what: str, rule: str) -> Fraction | None:
    """The exact seconds ``value`` says, None for infinity; refuses what is no duration."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _refuse(what, rule, value, _type_detail(value, "a duration"))
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_DURATION_TEXT:  # (read piece by piece: a long one costs a while)
            error = _refuse(what, rule, value[:40] + "...", f"it is {len(text)} characters "
                            f"long; a duration is at most {MAX_DURATION_TEXT}")
            error.value = value  # (the message shows its start)
            raise error
        return None if text == "infinity" else _sum_duration(text, what, rule, value)
    if isinstance(value, float) and (math.isnan(value) or value == -math.inf):
        raise _refuse(what, rule, value, "NaN is not a duration" if math.isnan(value) else "")
    return None if value == math.inf else Fraction(value)


def _sum_duration(text: str, what: str, rule: str, value: object) -> Fraction:
    if not text:
        raise _refuse(what, rule, value, "it is empty")
    if text.startswith("-"):
        raise _refuse(what, rule, value)
    total, pos = Fraction(0), 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise _refuse(what, rule, value, f"cannot read {_show(text[pos:])}")
        number, unit = match.groups()
        if unit == "" and (pos > 0 or match.end() < len(text)):
            raise _refuse(
                what, rule, value, f'"{number}" has no unit; only a lone number means seconds'
            )
        if unit not in _TIME_UNITS:
            guess = f'did you mean "{unit.lower()}"? ' if unit.lower() in _TIME_UNITS else ""
            units = "us, ms, s, min, h, d, w, M for months, y; case matters"
            raise _refuse(
                what, rule, value, f'"{unit}" is not a time unit ({guess}units are {units})'
            )
        total += _exact(number) * _TIME_UNITS[unit]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """systemd-style display of a duration: ``"1h 30min"``, ``"2.5s"``, ``"90ms"``, ``"0"``.

    Rounded to the microsecond; weeks are the largest unit (months and years are not whole
    days, so they would print odd hours). ``parse_duration`` reads every result back.
    """
    if isinstance(seconds, bool) or math.isnan(seconds) or seconds < 0:
        raise UnitsError(
            f"format_duration needs zero or more seconds, got {seconds!r}",
            what="format_duration",
            value=seconds,
        )
    if seconds == math.inf:
        return "infinity"
    usec = round(Fraction(seconds) * 1_000_000)
    parts = []
    for name, size in (("w", 604_800), ("d", 86_400), ("h", 3600), ("min", 60)):
        if usec >= size * 1_000_000:
            count, usec = divmod(usec, size * 1_000_000)
            parts.append(f"{count}{name}")
    # Like systemd, what is left under a minute is one decimal number: "2.5s", not "2s 500ms".
    for name, size in (("s", 1_000_000), ("ms", 1000)):
        if usec >= size:
            whole, rest = divmod(usec, size)
            decimals = f".{rest:0{len(str(size)) - 1}d}".rstrip("0") if rest else ""
            parts.append(f"{whole}{decimals}{name}")
            break
    else:
        if usec:
            parts.append(f"{usec}us")
    return " ".join(parts) or "0"


# --- sizes and counts ----------------------------------------------------------------------

# Base 1024 as systemd uses for MemoryMax= and friends; "B" (bytes) is in systemd's table too.
_SIZE_SUFFIXES = {"": 1, "B": 1, **{s: 1024 ** (i + 1) for i, s in enumerate("KMGTPE")}}
_SIZE = re.compile(rf"({_NUMBER})\s*([^\W\d_]*)")


def _rule(*alternatives: str) -> str:
    return ", or ".join(alternatives)


def _percent_of(text: str, total: int | None, what: str, rule: str, value: object) -> int:
    match = _PERCENT.fullmatch(text)
    if total is None:
        raise _refuse(what, rule, value, f"{what} does not take a percentage")
    if match is None or _exact(match.group(1)) > 100:
        raise _refuse(what, rule, value, "a percentage is a number from 0 to 100 followed by %")
    return math.floor(_exact(match.group(1)) * total / 100)


def parse_size(
    value: str | int,
    what: str,
    *,
    allow_max: bool = True,
    allow_percent_of: int | None = None,
) -> int | Literal["max"]:
    """Bytes in systemd's size syntax: ``"1048576"``, ``"512M"``, ``"1.5G"`` (rounded down).

    Suffixes K, M, G, T, P, E are powers of 1024 and case-sensitive. ``"infinity"`` and
    ``"max"`` give ``"max"`` when ``allow_max``; ``"50%"`` is that share of
    ``allow_percent_of`` bytes (rounded down) when it is given. Zero is accepted.
    """
    rule = _rule(
        'a size in bytes like "1048576", "512M" or "2G"',
        *(['a percentage like "50%"'] if allow_percent_of is not None else []),
        *(['"infinity"'] if allow_max else []),
    )
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _refuse(what, rule, value, _type_detail(value, "a size"))
    if isinstance(value, int):
        size = value
    else:
        text = value.strip()
        if text in ("infinity", "max"):
            if allow_max:
                return "max"
            raise _refuse(what, rule, value, "a finite size is needed here")
        size = _size_text(text, what, rule, value, allow_percent_of)
    if size < 0:
        raise _refuse(what, rule, value, "sizes cannot be negative")
    if size > _INT64_MAX:
        more = '; use "infinity" for no limit' if allow_max else ""
        raise _refuse(what, rule, value, f"that is over 2**63-1 bytes, the kernel's most{more}")
    return size


def _size_text(text: str, what: str, rule: str, value: object, percent_of: int | None) -> int:
    """Bytes in a size's text: a number with a suffix, or a percentage of ``percent_of``."""
    if not text:
        raise _refuse(what, rule, value, "it is empty")
    if text.endswith("%"):
        return _percent_of(text, percent_of, what, rule, value)
    match = _SIZE.fullmatch(text)
    if match is None:
        raise _refuse(what, rule, value, "sizes cannot be negative" if text.startswith("-")
                      else "")
    number, suffix = match.groups()
    if suffix not in _SIZE_SUFFIXES:
        letter = suffix[0].upper()
        fix = f'; write "{number}{letter}"' if letter in tuple("KMGTPE") else ""
        why = "K, M, G, T, P, E are powers of 1024; case matters"
        raise _refuse(what, rule, value, f'"{suffix}" is not a size suffix{fix} ({why})')
    if "." in number and _SIZE_SUFFIXES[suffix] == 1:
        raise _refuse(what, rule, value, f'"{number}" is not a whole number of bytes')
    return int(_exact(number) * _SIZE_SUFFIXES[suffix])  # not negative: int() is floor


def parse_count(
    value: str | int,
    what: str,
    *,
    allow_max: bool = True,
    allow_percent_of: int | None = None,
) -> int | Literal["max"]:
    """A positive whole number like TasksMax: ``"512"``, or ``"infinity"``/``"max"``.

    ``"25%"`` is that share of ``allow_percent_of`` (rounded down, must come to at least 1)
    when it is given. No suffixes: systemd takes none for counts.
    """
    rule = _rule(
        'a positive whole number like "512"',
        *(['a percentage like "25%"'] if allow_percent_of is not None else []),
        *(['"infinity"'] if allow_max else []),
    )
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _refuse(what, rule, value, _type_detail(value, "a count"))
    detail = ""
    if isinstance(value, int):
        count = value
    else:
        text = value.strip()
        if text in ("infinity", "max"):
            if allow_max:
                return "max"
            raise _refuse(what, rule, value, "a finite count is needed here")
        if text.endswith("%"):
            count = _percent_of(text, allow_percent_of, what, rule, value)
            detail = f"{text} of {allow_percent_of} rounds down to 0"
        elif _INTEGER.fullmatch(text):
            count = whole_number(text)
        else:
            raise _refuse(what, rule, value, "" if text else "it is empty")
    if count < 1:
        raise _refuse(what, rule, value, detail)
    if count > _INT64_MAX:
        raise _refuse(what, rule, value, "that is more than 2**63-1, the kernel's most")
    return count


# --- CPU and IO shares ---------------------------------------------------------------------

_MOST_CPUS = 10_000


def parse_cpu_quota(value: str, what: str = "CPUQuota") -> float:
    """The fraction of one CPU in a systemd CPUQuota: ``"50%"`` -> 0.5, ``"200%"`` -> 2.0."""
    rule = 'a positive percentage of one CPU like "50%", or "200%" for two CPUs'
    if not isinstance(value, str):
        hint = 'write it with "%"' if isinstance(value, int | float) else ""
        hint = "a bool is not a quota" if isinstance(value, bool) else hint
        raise _refuse(what, rule, value, hint)
    text = value.strip()
    match = _PERCENT.fullmatch(text)
    if match is None:
        bare = re.fullmatch(_NUMBER, text) is not None
        raise _refuse(what, rule, value, f'write "{text}%" if you mean percent' if bare else "")
    fraction = _exact(match.group(1)) / 100
    if fraction == 0:
        raise _refuse(what, rule, value)
    if fraction > _MOST_CPUS:
        why = f"absurdly large (more than {_MOST_CPUS * 100}%, that is {_MOST_CPUS} CPUs)"
        raise _too_big(what, value, why, rule)
    return float(fraction)


def parse_weight(value: str | int, what: str, lo: int = 1, hi: int = 10000) -> int:
    """A whole number from ``lo`` to ``hi``, like CPUWeight and IOWeight (default 100)."""
    default = " (100 is the default)" if lo <= 100 <= hi else ""
    rule = f"a whole number from {lo} to {hi}{default}"
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _refuse(what, rule, value, _type_detail(value, "a weight"))
    if isinstance(value, int):
        weight = value
    else:
        text = value.strip()
        if text == "idle":
            raise _refuse(
                what, rule, value, f'"idle" is not supported; use {lo}, the lowest weight'
            )
        if not _INTEGER.fullmatch(text):
            raise _refuse(what, rule, value)
        weight = whole_number(text)
    if not lo <= weight <= hi:
        raise _refuse(what, rule, value)
    return weight


# --- signals -------------------------------------------------------------------------------

_COMMON_SIGNALS = "SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGKILL"


def parse_signal(value: str | int, what: str = "stop_signal") -> signal.Signals:
    """A signal by name or number: ``"SIGTERM"``, ``"TERM"``, ``"term"``, ``"15"``, ``15``.

    SIGKILL is allowed (no grace); SIGSTOP and 0 are refused, since neither stops anything.
    """
    rule = 'a signal name or number like "SIGTERM", "TERM" or "15"'
    common = f"common ones: {_COMMON_SIGNALS}"
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _refuse(what, rule, value, _type_detail(value, "a signal"))
    text = value.strip() if isinstance(value, str) else str(value)
    if isinstance(value, int) or _INTEGER.fullmatch(text):
        number = value if isinstance(value, int) else whole_number(text)
        if number == 0:
            raise _refuse(what, rule, value, "signal 0 only probes a process and stops nothing")
        try:
            sig = signal.Signals(number)
        except ValueError:
            raise _refuse(what, rule, value, f"no signal has that number; {common}") from None
    else:
        name = text.upper() if text.upper().startswith("SIG") else f"SIG{text.upper()}"
        found = signal.Signals.__members__.get(name)
        if found is None:
            raise _refuse(what, rule, value, f"no signal has that name; {common}")
        sig = found
    if sig == signal.SIGSTOP:
        hint = "SIGSTOP only pauses the process; use SIGTERM, or SIGKILL to skip the grace period"
        raise _refuse(what, rule, value, hint)
    return sig
