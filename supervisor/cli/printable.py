"""Text a task controls, made safe to print on an operator's terminal.

A task's command line, its processes' names, its name and the paths it made (sub-cgroups)
reach our summaries and listings.  Raw, a control sequence in them would be run by the
terminal (clear the screen, set the title, move the cursor), and a newline would forge a line
of ours ("Exit status: 0").  Every control character (C0 but the tab, DEL, C1) and every
bidirectional override is shown as a Python-style escape instead: ``\\x1b``, ``\\n``,
``\\u202e``.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                     "\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: str) -> str:
    """``text`` with what a terminal would act on shown as escapes (unchanged otherwise)."""
    return _UNSAFE.sub(_escape, text)
