"""JSON for the clients, without importing :mod:`json`: the standard library's own C scanner
and encoder (``_json``), which :mod:`json` wraps.

:mod:`json`'s decoder compiles regular expressions when it is imported, and ``re`` brings
``enum``, ``functools`` and ``collections``' friends: ~10 ms of every ``corral ps``'s start-up
on this host, about what the rest of its Python takes.  The clients need none of that: they
decode the daemon's answers (always UTF-8 JSON objects) and encode small request bodies.
Anything the C scanner does not take whole (malformed text, a BOM) goes to :mod:`json`
itself, for its result or its exact error, so nothing here decides what JSON is.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see supervisor/cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["dumps", "loads"]

_SPACE = " \t\n\r"  # JSON's whitespace


class _Context:
    """What ``_json.make_scanner`` reads of a decoder: json.loads' defaults (``float`` reads
    NaN, Infinity and -Infinity as json's own table does)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float


_scan = _json.make_scanner(_Context)  # type: ignore[arg-type]  # (any object with these)


def _unencodable(obj: object) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# json.dumps' defaults: ASCII, ", " and ": ", no sorting, NaN allowed (as json.dumps writes
# it); no check for cycles (a body is made of fresh lists and dicts)
_encode = _json.make_encoder(None, _unencodable, _json.encode_basestring_ascii, None, ": ",
                             ", ", False, False, True)


def loads(data: bytes | str) -> Any:
    """``json.loads(data)`` for a UTF-8 text holding one JSON value."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        start = len(text) - len(text.lstrip(_SPACE))
        value, end = _scan(text, start)
        if text[end:].strip(_SPACE):
            raise ValueError("extra data")
        return value
    except (ValueError, StopIteration, RecursionError):
        import json

        return json.loads(data)  # (its value, or its error with the line and column)


def dumps(obj: Any) -> str:
    """``json.dumps(obj)``."""
    return "".join(_encode(obj, 0))
