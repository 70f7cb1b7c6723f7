"""systemd-style ``-p NAME=VALUE`` properties, turned into TaskSpec options.

``corral run -p MemoryMax=512M -p TasksMax=64 -p CPUQuota=50%`` reads like ``systemd-run``; the
names and value syntax are systemd's.  Each property maps onto one TaskSpec option (a limit, the
time limit, the grace...); an unknown name is refused with the list of the supported ones.
The isolation properties of systemd.exec(5) (User=, PrivateNetwork=, Limit*=, ...) are gathered
in order and become one ``Isolation`` (``options["isolation"]``), which checks them against
the host (users exist, namespaces allowed) as it is made.  The CLI collects the options and
builds one TaskSpec from them.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cgroupfs import CpuMax

from ._errors import SpecError
from ._isolation import ISOLATION_PROPERTIES, Isolation
from ._units import (
    UnitsError,
    parse_count,
    parse_cpu_quota,
    parse_duration,
    parse_signal,
    parse_size,
    parse_weight,
)

__all__ = ["SUPPORTED", "parse_properties"]

_CPU_PERIOD_US = 100_000


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _pid_max() -> int | None:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _memory(field: str) -> Callable[[str, str], tuple[str, Any]]:
    def parse(name: str, value: str) -> tuple[str, Any]:
        return f"limits.{field}", parse_size(value, name, allow_percent_of=_physical_memory())
    return parse


def _tasks_max(name: str, value: str) -> tuple[str, Any]:
    return "limits.pids_max", parse_count(value, name, allow_percent_of=_pid_max())


def _cpu_quota(name: str, value: str) -> tuple[str, Any]:
    quota = max(1000, round(parse_cpu_quota(value, name) * _CPU_PERIOD_US))
    return "limits.cpu_max", CpuMax(quota, _CPU_PERIOD_US)


def _weight(field: str) -> Callable[[str, str], tuple[str, Any]]:
    def parse(name: str, value: str) -> tuple[str, Any]:
        return f"limits.{field}", parse_weight(value, name)
    return parse


def _duration(option: str, *, allow_zero: bool = False) -> Callable[[str, str], tuple[str, Any]]:
    def parse(name: str, value: str) -> tuple[str, Any]:
        return option, parse_duration(value, name, allow_zero=allow_zero)
    return parse


def _signal(name: str, value: str) -> tuple[str, Any]:
    return "stop_signal", int(parse_signal(value, name))


# characters of one Environment= value (a large environment is a request's ``env``); split by
# ``split_words``: 0.15 ms for that many plain, 2.6 at worst (shlex: 3-5 ms), and a daemon's
# start re-reads every queued request
MAX_ENVIRONMENT = 8192

# one piece of a word as POSIX ``shlex.split`` reads it: spaces between words, a run of plain
# characters and backslash escapes, a single-quoted run, a double-quoted one; anything else
# (a quote never closed, a backslash at the end) is the last alternative, an error
# (possessive: a quote never closed is found in one scan, never by backtracking)
_PIECE = re.compile(r"""([ \t\r\n]++)|((?:[^ \t\r\n\\'"]++|\\[\s\S])++)|'([^']*+)'"""
                    r"""|"((?:[^"\\]++|\\[\s\S])*+)"|[\s\S]""")
_SPACES = re.compile(r"[ \t\r\n]+")
_QUOTING = re.compile(r"""['"\\]""")
# an escape, and the character ``split`` keeps of it (each backslash pairs with what follows)
_UNESCAPE = re.compile(r"\\([\s\S])")
_UNESCAPE_QUOTED = re.compile(r'\\(["\\])')


def split_words(value: str) -> list[str]:
    """``shlex.split(value)`` (POSIX, no comments), a piece of a word at a time by the regex
    engine: shlex builds each word a character at a time in Python, ~0.6 us a character and
    quadratic in a long word.  Raises shlex's own ValueError for what it refuses."""
    if not _QUOTING.search(value):
        return [w for w in _SPACES.split(value) if w]
    words: list[str] = []
    word: list[str] | None = None
    for m in _PIECE.finditer(value):
        kind = m.lastindex
        if kind == 1:
            if word is not None:
                words.append("".join(word))
                word = None
            continue
        if word is None:
            word = []
        piece = m[kind] if kind else ""
        if kind == 2:
            word.append("".join(_UNESCAPE.split(piece)) if "\\" in piece else piece)
        elif kind == 3:
            word.append(piece)
        elif kind == 4:
            word.append("".join(_UNESCAPE_QUOTED.split(piece)) if "\\" in piece else piece)
        else:
            return shlex.split(value)  # raises, with shlex's message
    if word is not None:
        words.append("".join(word))
    return words


def _environment(name: str, value: str) -> tuple[str, Any]:
    env = {}
    if len(value) > MAX_ENVIRONMENT:
        raise UnitsError(f"{name} must be at most {MAX_ENVIRONMENT} characters, got "
                         f"{len(value)}; give a large environment as the task's own (corral "
                         f"run -E, a request's \"env\")", what=name, value=value[:80])
    try:
        items = split_words(value)
    except ValueError as e:  # an unbalanced quote, a backslash at the end
        raise UnitsError(f'{name} must be space-separated NAME=VALUE assignments, quoted as a '
                         f'shell would ("A=1 B=\'two words\'"): {e} in "{_cut(value)}"; close '
                         f'the quote or escape it with a backslash', what=name,
                         value=value) from None
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise UnitsError(f'{name} must be space-separated NAME=VALUE assignments like '
                             f'"A=1 B=2", got "{_cut(value)}"', what=name, value=value)
        env[key] = val
    return "env", env


def _cut(value: str) -> str:
    """``value`` as an error names it: at most 80 characters of it."""
    return value if len(value) <= 80 else value[:77] + "..."


def _directory(name: str, value: str) -> tuple[str, Any]:
    if not value.startswith("/"):
        raise UnitsError(f'{name} must be an absolute path, got "{value}"', what=name,
                         value=value)
    return "cwd", value


def _isolation(name: str, value: str) -> tuple[str, Any]:
    return "isolation", (name, value)  # checked together, in order, by Isolation


SUPPORTED: dict[str, Callable[[str, str], tuple[str, Any]]] = {
    "MemoryMax": _memory("memory_max"),
    "MemoryHigh": _memory("memory_high"),
    "MemorySwapMax": _memory("memory_swap_max"),
    "TasksMax": _tasks_max,
    "CPUQuota": _cpu_quota,
    "CPUWeight": _weight("cpu_weight"),
    "IOWeight": _weight("io_weight"),
    "RuntimeMaxSec": _duration("time_limit"),
    "TimeoutStopSec": _duration("grace", allow_zero=True),
    "KillSignal": _signal,
    "Environment": _environment,
    "WorkingDirectory": _directory,
    **dict.fromkeys(ISOLATION_PROPERTIES, _isolation),
}


def _supported_list() -> str:
    limits = [n.removeprefix("Limit") for n in SUPPORTED if n.startswith("Limit")]
    names = [n for n in SUPPORTED if not n.startswith("Limit")]
    return ", ".join(names) + f", Limit{{{','.join(limits)}}}"


@dataclass
class Collected:
    """Options gathered from properties: TaskSpec keywords (``isolation`` among them, when
    any isolation property was given) and Limits fields."""

    options: dict[str, Any]
    limits: dict[str, Any]


def parse_properties(items: Iterable[str]) -> Collected:
    """Parse ``NAME=VALUE`` strings; raises SpecError naming the property, rule and fix."""
    out = Collected({}, {})
    isolation: list[tuple[str, str]] = []
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip(" \t")  # (ASCII blanks only: "\u00a0User" names no property)
        if not eq:
            raise SpecError("property", f'property must be NAME=VALUE like "MemoryMax=512M", '
                                        f'got "{item}"')
        parser = SUPPORTED.get(name)
        if parser is None:
            raise SpecError("property", f"unknown or unsupported property {name!r}; supported: "
                                        f"{_supported_list()}")
        try:
            key, parsed = parser(name, value.strip())
        except UnitsError as e:
            raise SpecError(name, str(e)) from None
        if key == "isolation":
            isolation.append(parsed)
        elif key.startswith("limits."):
            out.limits[key.removeprefix("limits.")] = parsed
        elif key == "env":
            out.options.setdefault("env", {}).update(parsed)
        else:
            out.options[key] = parsed
    if isolation:
        out.options["isolation"] = Isolation.from_properties(isolation)
    return out
