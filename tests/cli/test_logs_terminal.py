"""``corral logs`` at a terminal: printable.TerminalFilter shows what a task's output would make
the terminal do (a clipboard write, a title, a report typed back, a forged line) as escapes,
and lets text, line breaks and SGR colours through; write_frames applies it only when asked.
"""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.cli.clientutil import write_frames
from supervisor.cli.printable import TerminalFilter
from supervisor.client import Frame

SGR = re.compile(rb"\x1b\[[0-9;]*m")
BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

# one of each: what the end-to-end test prints too
HOSTILE = (b"title\x1b]0;pwned\x07 clip\x1b]52;c;ZWNobyBoaQ==\x07 "
           b"report\x1b[21t dcs\x1bP$q\"p\x1b\\ apc\x1b_x\x1b\\ "
           b"up\x1b[2A\x1b[2Kforged\r\n\x1b[31mred\x1b[0m caf\xc3\xa9 \xc2\x9b\x9b\xff "
           b"\xe2\x80\xaeevil\n")


def shown(*chunks: bytes) -> bytes:
    """What the filter writes for ``chunks`` fed one after another, then flushed."""
    f = TerminalFilter()
    return b"".join(f.feed(c) for c in chunks) + f.flush()


def assert_inert(out: bytes) -> None:
    """``out`` is UTF-8 with no character a terminal acts on but text, line breaks and SGR."""
    text = SGR.sub(b"", out).decode("utf-8")
    acting = [c for c in text if (ord(c) < 0x20 and c not in "\n\r\t\b")
              or 0x7f <= ord(c) <= 0x9f or c in BIDI]
    assert not acting, (acting, out)


def test_an_osc_52_clipboard_write_is_shown_not_sent() -> None:
    out = shown(b"a\x1b]52;c;ZWNobyBoaQ==\x07b")
    assert out == rb"a\x1b]52;c;ZWNobyBoaQ==\x07b"
    assert_inert(out)


def test_an_osc_0_or_2_title_is_shown_not_set() -> None:
    assert shown(b"\x1b]0;pwned\x07") == rb"\x1b]0;pwned\x07"
    assert shown(b"\x1b]2;pwned\x1b\\") == b"\\x1b]2;pwned\\x1b\\"


def test_report_requests_are_shown_not_answered() -> None:
    # title report, cursor position report, device attributes, DECRQSS
    out = shown(b"\x1b[21t\x1b[6n\x1b[c\x1bZ\x1bP$q\"p\x1b\\")
    assert out == rb'\x1b[21t\x1b[6n\x1b[c\x1bZ\x1bP$q"p' + b"\\x1b\\"


@pytest.mark.parametrize("opener", [b"P", b"_", b"^", b"X"], ids=["dcs", "apc", "pm", "sos"])
def test_a_dcs_apc_pm_or_sos_string_is_shown(opener: bytes) -> None:
    out = shown(b"\x1b" + opener + b"1;2|payload\x1b\\")
    assert out == b"\\x1b" + opener + b"1;2|payload\\x1b\\"
    assert_inert(out)


def test_cursor_moves_and_clears_are_shown() -> None:
    out = shown(b"\x1b[2A\x1b[H\x1b[2J\x1b[K\x1b7\x1b8\x1bc\x1b[?1049h")
    assert out == rb"\x1b[2A\x1b[H\x1b[2J\x1b[K\x1b7\x1b8\x1bc\x1b[?1049h"


def test_a_lone_escape_is_shown_mid_text_and_at_the_end() -> None:
    assert shown(b"a\x1bb") == rb"a\x1bb"
    assert shown(b"end\x1b") == rb"end\x1b"
    assert shown(b"end\x1b[1;3") == rb"end\x1b[1;3"


def test_other_c0_controls_and_del_are_shown() -> None:
    assert shown(b"\x00\x07\x0b\x0c\x0e\x1f\x7f") == rb"\x00\x07\x0b\x0c\x0e\x1f\x7f"


def test_c1_controls_are_shown_as_utf_8_and_as_raw_bytes() -> None:
    as_utf8 = "".join(map(chr, range(0x80, 0xa0))).encode()
    assert shown(as_utf8) == "".join(f"\\x{c:02x}" for c in range(0x80, 0xa0)).encode()
    assert shown(b"\x9b2J") == rb"\x9b2J"  # the 8-bit CSI


def test_bidi_overrides_are_shown() -> None:
    out = shown(f"a{BIDI}b".encode())
    assert out == ("a" + "".join(f"\\u{ord(c):04x}" for c in BIDI) + "b").encode()


def test_invalid_utf_8_is_shown_as_byte_escapes() -> None:
    assert shown(b"\xff\xfe") == rb"\xff\xfe"
    assert shown(b"\xc0\xaf") == rb"\xc0\xaf"  # an overlong "/"
    assert shown(b"\xed\xa0\x80") == rb"\xed\xa0\x80"  # a surrogate
    assert shown(b"cut\xe6\x97") == rb"cut\xe6\x97"  # a character cut short by the end


def test_sgr_colours_pass_through() -> None:
    for sgr in (b"\x1b[m", b"\x1b[0m", b"\x1b[31m", b"\x1b[1;38;5;208m",
                b"\x1b[38;2;255;128;0;48;2;0;0;0m"):
        assert shown(b"x" + sgr + b"y") == b"x" + sgr + b"y"


def test_only_digits_and_semicolons_make_an_sgr() -> None:
    assert shown(b"\x1b[38:2:1:2:3m") == rb"\x1b[38:2:1:2:3m"
    assert shown(b"\x1b[?25m") == rb"\x1b[?25m"


def test_a_parameter_list_longer_than_any_colour_is_not_held_back() -> None:
    f = TerminalFilter()
    long = b"\x1b[" + b"1;" * 40
    assert f.feed(long) == b"\\x1b[" + b"1;" * 40
    assert f.feed(b"m") + f.flush() == b"m"


def test_plain_utf_8_text_is_unchanged() -> None:
    text = "naïve café, 日本語, 🐍\ttab\rcr\bbs\n".encode()
    assert shown(text) == text


def test_an_escape_split_across_chunks_is_caught_at_every_position() -> None:
    whole = shown(HOSTILE)
    assert_inert(whole)
    assert b"\x1b[31mred\x1b[0m" in whole and "café".encode() in whole
    for i in range(len(HOSTILE) + 1):
        assert shown(HOSTILE[:i], HOSTILE[i:]) == whole, i
    assert shown(*(HOSTILE[i:i + 1] for i in range(len(HOSTILE)))) == whole


# bytes mostly made of the pieces of sequences, so that most examples hold a few
PIECES = st.sampled_from([b"\x1b", b"\x1b[", b"\x1b[31m", b"\x1b[1;38;5;208m", b"1", b";",
                          b"m", b"\x1b]0;t\x07", b"\x1bP", b"\x1b\\", b"\x9b", b"\xc2\x9b",
                          b"\xe2\x80", b"\xae", "é".encode(), b"a", b"\n"])


@settings(database=None, max_examples=300, deadline=None)
@given(data=st.lists(st.one_of(PIECES, st.binary(max_size=4)), max_size=30).map(b"".join),
       cuts=st.lists(st.floats(0, 1), max_size=6))
def test_any_bytes_split_anyhow_come_out_inert_and_the_same(data: bytes,
                                                            cuts: list[float]) -> None:
    at = sorted({round(c * len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True)]
    out = shown(*chunks)
    assert out == shown(data)
    assert_inert(out)


def test_write_frames_filters_across_frames_only_when_asked() -> None:
    frames = [Frame("data", "stdout", 0, b"a\x1b]5"), Frame("data", "stdout", 4, b"2;c;eA==\x07"),
              Frame("data", "stdout", 14, b"\x1b[3"), Frame("data", "stdout", 17, b"1mz\x1b"),
              Frame("end", "stdout", 21, finished=True, exit_status=0)]
    filtered, raw = io.BytesIO(), io.BytesIO()
    assert write_frames(frames, filtered, "stdout", TerminalFilter()) == frames[-1]
    assert filtered.getvalue() == rb"a\x1b]52;c;eA==\x07" + b"\x1b[31mz\\x1b"
    assert write_frames(frames, raw, "stdout") == frames[-1]
    assert raw.getvalue() == b"".join(f.data for f in frames)


def test_write_frames_does_not_join_the_bytes_either_side_of_a_gap(
        capsys: pytest.CaptureFixture[str]) -> None:
    frames = [Frame("data", "stdout", 0, b"x\x1b["), Frame("gap", "stdout", 3, end=10),
              Frame("data", "stdout", 10, b"2m")]
    out = io.BytesIO()
    assert write_frames(frames, out, "stdout", TerminalFilter()) is None
    assert out.getvalue() == rb"x\x1b[" + b"2m"
    assert "bytes 3..10 are no longer held" in capsys.readouterr().err


@given(st.text(alphabet=st.characters(codec=None), max_size=40) |
       st.text(alphabet="ab\t\n\r\x1b\x07\x7f\x85\u061c\u200e\u2028\u202e\u2066\u00a0\u3000",
               max_size=20))
def test_a_text_shown_is_escaped_as_the_rule_says_whether_or_not_re_was_needed(
        text: str) -> None:
    """``printable`` returns a text ``str.isprintable`` takes without compiling its pattern
    (a client's start-up without ``re``): the same as the pattern's escaping, for any text."""
    from supervisor.cli import printable as module

    pattern = re.compile(module._UNSAFE)
    assert module.printable(text) == pattern.sub(module._escape, text)
