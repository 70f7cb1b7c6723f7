"""Text a task controls, made safe to print on an operator's terminal.

A task's command line, its processes' names, its name and the paths it made (sub-cgroups)
reach our summaries and listings.  Raw, a control sequence in them would be run by the
terminal (clear the screen, set the title, move the cursor), and a newline would forge a line
of ours ("Exit status: 0").  Every control character (C0 but the tab, DEL, C1) and every
bidirectional override is shown as a Python-style escape instead: ``\\x1b``, ``\\n``,
``\\u202e``.

A task's output (``corral logs`` at a terminal) is escaped the same way by
:class:`TerminalFilter`, bytes that are not UTF-8 as ``\\xff``, but it keeps its lines and
colours: newline, carriage return, tab, backspace and SGR sequences (``ESC [ digits;... m``,
what ``less -R`` passes) go through.  Escaping the ESC is what disarms a sequence: the rest of
it (``]52;c;...``) is plain text.
"""

from __future__ import annotations

import codecs  # (loaded by the interpreter itself at start-up: free)

TYPE_CHECKING = False  # not typing's: a client verb's start-up (see cli/__init__.py)
if TYPE_CHECKING:
    import re

__all__ = ["TerminalFilter", "printable"]

_BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_BIDI}]"
_unsafe: re.Pattern[str] | None = None  # (compiled at the first text that needs it)
_NAMED = {"\n": "\\n", "\r": "\\r"}

# Longer parameter lists than any real SGR (38;2;R;G;B;48;2;R;G;B is 33) are not held back,
# so what is carried between chunks stays small.
_SGR_PARAMS = 64
# Output is decoded with surrogateescape: a byte that is not UTF-8 arrives as U+DC80-U+DCFF.
# (Patterns, compiled by TerminalFilter: `corral show` imports this module and never needs them.)
_OUTPUT_UNSAFE = (f"\x1b\\[[0-9;]{{0,{_SGR_PARAMS}}}m|"
                  f"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}\udc80-\udcff]")
_SGR_PREFIX = f"\x1b(?:\\[[0-9;]{{0,{_SGR_PARAMS}}})?\\Z"


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def _escape_output(m: re.Match[str]) -> str:
    c = m.group()
    if len(c) > 1:  # an SGR sequence
        return c
    if "\udc80" <= c <= "\udcff":
        return f"\\x{ord(c) - 0xdc00:02x}"
    return _escape(m)


def printable(text: str) -> str:
    """``text`` with what a terminal would act on shown as escapes (unchanged otherwise).

    A text ``str.isprintable`` takes is returned as it is, without importing ``re`` (~5 ms of
    a client verb's start-up): every character escaped here is a control or a format
    character, which it refuses."""
    if text.isprintable():
        return text
    global _unsafe
    if _unsafe is None:
        import re

        _unsafe = re.compile(_UNSAFE)
    return _unsafe.sub(_escape, text)


class TerminalFilter:
    """``feed(chunk)``: the stream's bytes so far made safe for a terminal, bar an unfinished
    UTF-8 character or SGR sequence held back; ``flush()``: that, escaped.  Pure; the output
    is the same however the input was split."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        import re

        self._held = ""  # the start of what may still become an SGR sequence
        self._unsafe = re.compile(_OUTPUT_UNSAFE)
        self._sgr_prefix = re.compile(_SGR_PREFIX)

    def feed(self, data: bytes) -> bytes:
        text = self._held + self._decoder.decode(data)
        prefix = self._sgr_prefix.search(text)
        cut = prefix.start() if prefix else len(text)
        self._held = text[cut:]
        return self._unsafe.sub(_escape_output, text[:cut]).encode()

    def flush(self) -> bytes:
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        self._decoder.reset()
        return self._unsafe.sub(_escape_output, text).encode()
