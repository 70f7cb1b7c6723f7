"""systemd.exec(5)'s value syntax for isolation, read into the numbers the spawn takes.

``Isolation`` (``_isolation.py``) accepts each setting the way a unit file spells it
(``LimitNOFILE=1024:4096``, ``UMask=0027``, ``CapabilityBoundingSet=~CAP_SYS_ADMIN``) or as a
Python value; this module is the reading of that syntax, kept apart from what the host allows
(``_isohost.py``) so that a value's rules are in one place and testable without privileges.
The readers look at nothing but their argument, except that capability numbers stop at the
running kernel's last one (``cap_last_cap``).  Each raises :class:`SpecError` naming the
field, the value, the rule and the fix.

Limit*= values follow systemd's rlimit-util.c: ``"SOFT:HARD"`` or one value for both,
``"infinity"``, seconds for CPU (rounded up), microseconds for RTTIME, sizes with units, and
RLIMIT_NICE as a nice level (``"-20"``..``"+19"``) or the raw 0..40.
"""

from __future__ import annotations

import functools
import math
import resource
from collections.abc import Iterable
from typing import Any

from ._errors import SpecError
from ._spawn import CAPABILITIES, cap_last_cap, capability_name
from ._units import UnitsError, parse_duration, parse_size, whole_number

__all__ = [
    "INFINITY",
    "RLIMITS",
    "capability_names",
    "every_capability",
    "merge_capability_line",
    "parse_boolean",
    "parse_id",
    "parse_rlimit",
    "parse_rlimit_key",
    "parse_umask",
    "refuse",
    "rlimit_label",
    "show",
]

INFINITY = 2**64 - 1  # RLIM_INFINITY as the kernel has it (Python's resource says -1)
MAX_ID = 2**32 - 2  # uid_t/gid_t: (uid_t)-1 means "unchanged" to setresuid, never an id


def is_number(text: str) -> bool:
    """Only ASCII digits (str.isdigit() also takes "\u00b9", which int() refuses)."""
    return text.isascii() and text.isdigit()
_RLIMIT_LOCKS = 10  # Linux's number; Python's resource module has no name for it

# Limit*= as systemd spells them, and how each value is read (rlimit-util.c).
RLIMITS: dict[str, tuple[int, str]] = {
    "CPU": (resource.RLIMIT_CPU, "seconds"), "FSIZE": (resource.RLIMIT_FSIZE, "size"),
    "DATA": (resource.RLIMIT_DATA, "size"), "STACK": (resource.RLIMIT_STACK, "size"),
    "CORE": (resource.RLIMIT_CORE, "size"), "RSS": (resource.RLIMIT_RSS, "size"),
    "NOFILE": (resource.RLIMIT_NOFILE, "count"), "AS": (resource.RLIMIT_AS, "size"),
    "NPROC": (resource.RLIMIT_NPROC, "count"), "MEMLOCK": (resource.RLIMIT_MEMLOCK, "size"),
    "LOCKS": (_RLIMIT_LOCKS, "count"),
    "SIGPENDING": (resource.RLIMIT_SIGPENDING, "count"),
    "MSGQUEUE": (resource.RLIMIT_MSGQUEUE, "size"), "NICE": (resource.RLIMIT_NICE, "nice"),
    "RTPRIO": (resource.RLIMIT_RTPRIO, "count"), "RTTIME": (resource.RLIMIT_RTTIME, "usec"),
}
_RLIMIT_RULES = {
    "seconds": 'seconds or a duration like "30s" or "5min"',
    "size": 'a size in bytes like "65536", "8M" or "1G"',
    "count": 'a whole number like "1024"',
    "nice": 'a nice level from "-20" to "+19", or the raw limit 0 to 40',
    "usec": 'microseconds, or a duration like "500ms"',
}


def show(value: object) -> str:
    """``value`` as an error message quotes it: strings in double quotes, the rest repr'd;
    past 80 characters, its first 60 and its length (a message is read, and sent back to
    a daemon's client: 5,000 digits quoted whole were 5 KB of it)."""
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def refuse(what: str, rule: str, value: object, fix: str = "") -> SpecError:
    """The SpecError for ``what``: "<what> must be <rule>, got <value>[; <fix>]"."""
    return SpecError(what, f"{what} must be {rule}, got {show(value)}" + (f"; {fix}" if fix
                                                                            else ""))


# --- booleans, umask, user and group names ------------------------------------------------

_TRUE = {"1", "yes", "y", "true", "t", "on"}
_FALSE = {"0", "no", "n", "false", "f", "off"}


def parse_boolean(value: Any, what: str) -> bool:
    """A bool, or systemd's boolean words (yes/no, true/false, on/off, 1/0); else SpecError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise refuse(what, 'a boolean: "yes" or "no" (also true/false, on/off, 1/0)', value)


def parse_umask(value: Any, what: str) -> int | None:
    """None, an int up to 0o777, or octal text like "0027"; else SpecError."""
    rule = 'an octal mode like "0022" or "0077" (at most 0777)'
    if value is None:
        return None
    if isinstance(value, str) and value.strip() and set(value.strip()) <= set("01234567"):
        value = int(value.strip(), 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise refuse(what, rule, value)
    return value


def parse_id(value: Any, what: str, kind: str) -> str | int:
    """A user or group (``kind``) as given: a number below 2**32-1, or a stripped name with
    no NUL or colon; else SpecError.  Whether it exists is the host's business."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32 - 1:
        return value
    if isinstance(value, str) and value.strip() and "\0" not in value and ":" not in value:
        return value.strip()
    raise refuse(what, f"a {kind} name or number like \"nobody\" or \"65534\"", value)


# --- Limit*= ------------------------------------------------------------------------------


def rlimit_label(name: str, prefix: str) -> str:
    """How errors call limit ``name``: ``LimitNOFILE`` (properties) or ``rlimits['NOFILE']``."""
    return f"Limit{name}" if prefix == "Limit" else f"rlimits[{name!r}]"


def parse_rlimit_key(key: Any, what: str) -> str:
    """systemd's limit name for ``key`` ("NOFILE", "nofile", "RLIMIT_NOFILE", "LimitNOFILE");
    SpecError for anything else."""
    name = key.upper().removeprefix("RLIMIT_") if isinstance(key, str) else ""
    if isinstance(key, str) and key.startswith("Limit"):
        name = key.removeprefix("Limit")
    if name not in RLIMITS:
        raise refuse(what, f"keyed by systemd's Limit names without the prefix "
                           f"({', '.join(RLIMITS)})", key)
    return name


def parse_rlimit(name: str, value: Any, what: str) -> tuple[int, int]:
    """``(soft, hard)`` of one Limit*= value: "N", "SOFT:HARD", "infinity", an int, a pair."""
    if type(value) in (int, str) or (type(value) is tuple and all(
            type(v) in (int, str, type(None)) for v in value)):
        return _parse_rlimit_again(name, value, what)
    return _parse_rlimit(name, value, what)


# (a daemon's tenant's task starts with its submitter's 16 limits, the same ones at every
# request, each parsed as its text: keyed by exact types, so that True is never taken for 1)
@functools.lru_cache(maxsize=1024)
def _parse_rlimit_again(name: str, value: Any, what: str) -> tuple[int, int]:
    return _parse_rlimit(name, value, what)


def _parse_rlimit(name: str, value: Any, what: str) -> tuple[int, int]:
    kind = RLIMITS[name][1]
    if isinstance(value, tuple | list) and len(value) == 2:
        parts = ["infinity" if v is None or v == INFINITY else str(v) for v in value]
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = ["infinity" if value == INFINITY else str(value)]
    elif isinstance(value, str) and value.strip() and value.count(":") <= 1:
        parts = [p.strip() for p in value.split(":")]
    else:
        raise refuse(what, f'{_RLIMIT_RULES[kind]}, "infinity", or "SOFT:HARD"', value)
    soft = _rlimit_one(parts[0], kind, what, value)
    hard = _rlimit_one(parts[-1], kind, what, value)
    if soft > hard:
        raise refuse(what, "SOFT:HARD with the soft limit at most the hard one", value,
                     "swap them, or raise the hard limit")
    return soft, hard


def _rlimit_one(text: str, kind: str, what: str, value: object) -> int:
    """One side of a Limit*= value, in the kernel's unit for that limit."""
    rule = f'{_RLIMIT_RULES[kind]}, "infinity", or "SOFT:HARD" of those'
    if text == "infinity":
        return INFINITY
    try:
        found = _rlimit_with_units(text, kind, what) if kind in ("seconds", "size", "usec") \
            else None
    except UnitsError:
        raise refuse(what, rule, value) from None
    if found is None:
        found = _rlimit_plain(text, kind)
    if found is None:
        raise refuse(what, rule, value)
    if not 0 <= found < INFINITY:  # the kernel's INFINITY is written "infinity"
        raise refuse(what, rule, value, f"the kernel takes at most {INFINITY - 1}; for no "
                                        f"limit write \"infinity\"")
    return found


def _rlimit_with_units(text: str, kind: str, what: str) -> int | None:
    """A seconds, usec or size value in the kernel's unit; UnitsError for bad syntax."""
    if kind == "seconds":  # whole seconds, rounded up (rlimit_parse_sec)
        return math.ceil(parse_duration(text, what, allow_zero=True))
    if kind == "usec":  # a bare number is microseconds (rlimit_parse_usec)
        return whole_number(text) if is_number(text) else round(
            parse_duration(text, what, allow_zero=True) * 1_000_000)
    size = parse_size(text, what, allow_max=False)
    assert isinstance(size, int)
    return size


def _rlimit_plain(text: str, kind: str) -> int | None:
    """A count, or a nice level ("-20".."+19" is 40..1 as RLIMIT_NICE; 0..40 raw)."""
    if kind == "nice" and text[:1] in "+-" and is_number(text[1:]):
        level = -whole_number(text[1:]) if text[0] == "-" else whole_number(text[1:])
        return 20 - level if -20 <= level <= 19 else None
    number = whole_number(text) if is_number(text) else None
    if number is not None and (kind != "nice" or number <= 40) and number < INFINITY:
        return number
    return None


# --- CapabilityBoundingSet=, AmbientCapabilities= -----------------------------------------


def every_capability() -> int:
    """The mask of every capability the running kernel knows."""
    return (1 << (cap_last_cap() + 1)) - 1


def merge_capability_line(value: Any, what: str, current: int | None, everything: int) -> int:
    """One systemd assignment applied to ``current`` (None: never set).

    As systemd.exec(5) says: names keep only those (merged by OR with earlier lines), "~names"
    drop those (merged by AND), "" resets to the empty set and "~" alone to the full one.
    A list (not a string) is the set kept.
    """
    if isinstance(value, str):
        text = value.strip()
        invert = text.startswith("~")
        words: list[str | int] = list(text.removeprefix("~").split())
        if not words:
            return everything if invert else 0
    elif isinstance(value, Iterable):
        invert, words = False, list(value)
    else:
        raise _capability_error(what, value)
    mask = 0
    for word in words:
        mask |= 1 << _capability(word, what, value)
    if invert:
        mask = everything & ~mask
        return mask if current is None else current & mask
    return mask if current is None else current | mask


def _capability(word: str | int, what: str, value: object) -> int:
    """The number of capability ``word`` (a name like CAP_SYS_ADMIN, or a number the kernel
    knows); SpecError for anything else, with the fix for a name missing its CAP_."""
    if isinstance(word, int) and not isinstance(word, bool) and 0 <= word <= cap_last_cap():
        return word
    if isinstance(word, str):
        text = word.strip().upper()
        if is_number(text) and whole_number(text) <= cap_last_cap():
            return int(text)
        if text in CAPABILITIES:
            return CAPABILITIES.index(text)
        if f"CAP_{text}" in CAPABILITIES:
            raise refuse(what, "capability names like CAP_SYS_ADMIN", value,
                         f'write "CAP_{text}"')
    raise refuse(what, "capability names like CAP_SYS_ADMIN or CAP_NET_BIND_SERVICE "
                       "(capabilities(7)), space-separated, optionally after \"~\"", value,
                 f"{show(word)} is not one")


def _capability_error(what: str, value: object) -> SpecError:
    """The SpecError for a capability setting that is neither a string nor a list."""
    return refuse(what, 'capability names like "CAP_SYS_ADMIN CAP_NET_RAW", "~CAP_SYS_ADMIN" '
                        "to drop them, or a list of names", value)


@functools.lru_cache(maxsize=256)
def capability_names(mask: int) -> tuple[str, ...]:
    """The names of the capabilities in ``mask``, lowest number first (cached)."""
    return tuple(capability_name(n) for n in range(mask.bit_length()) if (mask >> n) & 1)
