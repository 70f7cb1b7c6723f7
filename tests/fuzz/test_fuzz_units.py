"""Fuzz of the systemd value parsers (supervisor/_units.py) against what they promise.

Whatever a user types, a parser returns a value inside its documented range or raises
``UnitsError`` (a ValueError) whose message starts with the field's name and quotes the value:
never another exception, never a value out of range.  Values built from the grammar parse to
exactly what they say, and ``format_duration`` reads back through ``parse_duration``.
"""

from __future__ import annotations

import math
import signal
from fractions import Fraction

from hypothesis import example, given
from hypothesis import strategies as st

from supervisor._units import (
    UnitsError,
    format_duration,
    parse_count,
    parse_cpu_quota,
    parse_duration,
    parse_signal,
    parse_size,
    parse_weight,
)

YEAR = Fraction(31_557_600)
INT64_MAX = 2**63 - 1
# Values of every type a caller might pass, and text close to the grammar.
anything = st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.booleans(), st.none(),
                     st.binary(max_size=4), st.lists(st.integers(), max_size=2),
                     st.sampled_from([10**400, -(10**400), "9" * 5000, "1" + "0" * 400 + "s"]))
near_durations = st.text(alphabet="0123456789. \tsmhdwMyuµμecinortay-+", max_size=24)
near_sizes = st.text(alphabet="0123456789. \tKMGTPEBkmgb%-+infitymax", max_size=16)
near_signals = st.text(alphabet="SIGTERMKLHUPQUSR0123456789 rtmin+-", max_size=12)

UNITS = {"us": Fraction(1, 10**6), "ms": Fraction(1, 1000), "s": Fraction(1), "min": Fraction(60),
         "h": Fraction(3600), "d": Fraction(86400), "w": Fraction(604800),
         "M": Fraction(2_629_800), "y": YEAR}
SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
            "P": 1 << 50, "E": 1 << 60}


def refusal(e: UnitsError, what: str, value: object) -> None:
    """What every refusal owes the user: the field first, the value kept."""
    assert isinstance(e, ValueError)
    assert str(e).startswith(f"{what} "), str(e)
    assert e.what == what and e.value is value


@given(st.one_of(anything, near_durations), st.booleans(), st.booleans())
@example("1" + "0" * 400 + "s", False, False)  # more digits than int() takes by default
@example(10**400, False, False)  # OverflowError from float(), before the fix in issue 7
@example(5e-324, False, False)  # the smallest float: positive, rounds to 0 us
def test_parse_duration_returns_a_duration_in_range_or_refuses(value: object, zero: bool,
                                                               infinity: bool) -> None:
    try:
        seconds = parse_duration(value, "time_limit", allow_zero=zero,  # type: ignore[arg-type]
                                 allow_infinity=infinity)
    except UnitsError as e:
        refusal(e, "time_limit", value)
        return
    assert isinstance(seconds, float)
    if seconds == math.inf:
        assert infinity
        return
    assert seconds > 0 or (zero and seconds == 0)
    assert seconds <= 100 * YEAR


@st.composite
def durations(draw: st.DrawFn) -> tuple[str, Fraction]:
    """A systemd time span built from its grammar, and its exact value."""
    parts, total = [], Fraction(0)
    for _ in range(draw(st.integers(1, 4))):
        whole = draw(st.integers(0, 999))
        decimals = draw(st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=6)))
        unit = draw(st.sampled_from(sorted(UNITS)))
        number = f"{whole}.{decimals}" if decimals else str(whole)
        gap = draw(st.sampled_from(["", " "]))
        parts.append(f"{number}{gap}{unit}")
        total += Fraction(number) * UNITS[unit]
    return draw(st.sampled_from([" ", "  ", ""])).join(parts), total


@given(durations())
@example(("0.1s 0.2s", Fraction(3, 10)))
def test_a_time_span_from_the_grammar_parses_to_exactly_its_value(
        case: tuple[str, Fraction]) -> None:
    text, total = case
    if total > 100 * YEAR:
        try:
            parse_duration(text, "grace", allow_zero=True)
        except UnitsError as e:
            assert "absurdly long" in str(e)
            return
        raise AssertionError(f"{text!r} ({float(total)} s) was accepted")
    assert parse_duration(text, "grace", allow_zero=True) == float(total)


@given(st.floats(min_value=0, max_value=float(100 * YEAR)))
@example(0.0)
@example(1e-7)  # below a microsecond: "0"
@example(59.9999995)  # rounds up to a whole minute
def test_format_duration_reads_back_to_the_microsecond(seconds: float) -> None:
    text = format_duration(seconds)
    back = parse_duration(text, "grace", allow_zero=True)
    assert back == float(round(Fraction(seconds) * 10**6) / 10**6), (seconds, text, back)


@given(st.one_of(anything, near_sizes), st.booleans(), st.none() | st.integers(0, 2**70))
@example("1.5G", True, None)
@example("0.5", True, None)  # a fraction of a byte: refused
@example("100%", True, 2**70)  # a percentage of more than the kernel's most
def test_parse_size_and_count_return_a_number_in_range_or_refuse(
        value: object, allow_max: bool, percent_of: int | None) -> None:
    for parse, low in ((parse_size, 0), (parse_count, 1)):
        try:
            n = parse(value, "MemoryMax", allow_max=allow_max,  # type: ignore[arg-type]
                      allow_percent_of=percent_of)
        except UnitsError as e:
            refusal(e, "MemoryMax", value)
            continue
        if n == "max":
            assert allow_max
        else:
            assert isinstance(n, int) and low <= n <= INT64_MAX, (parse, value, n)


@given(st.integers(0, 10**6), st.text("0123456789", max_size=4), st.sampled_from(sorted(SUFFIXES)),
       st.sampled_from(["", " "]))
def test_a_size_from_the_grammar_parses_to_its_bytes_rounded_down(
        whole: int, decimals: str, suffix: str, gap: str) -> None:
    number = f"{whole}.{decimals}" if decimals else str(whole)
    text = f"{number}{gap}{suffix}"
    exact = Fraction(number) * SUFFIXES[suffix]
    try:
        got = parse_size(text, "MemoryMax")
    except UnitsError as e:
        # a fraction of a byte without a suffix, or more than the kernel takes
        assert (decimals and SUFFIXES[suffix] == 1) or exact > INT64_MAX, (text, str(e))
        return
    assert got == math.floor(exact)


@given(st.one_of(anything, near_sizes), st.integers(1, 10**6), st.integers(1, 10**6))
@example("idle", 1, 10000)
def test_parse_cpu_quota_and_weight_stay_in_range_or_refuse(value: object, lo: int,
                                                            span: int) -> None:
    try:
        quota = parse_cpu_quota(value, "CPUQuota")  # type: ignore[arg-type]
    except UnitsError as e:
        refusal(e, "CPUQuota", value)
    else:
        assert 0 < quota <= 10_000
    try:
        weight = parse_weight(value, "CPUWeight", lo, lo + span)  # type: ignore[arg-type]
    except UnitsError as e:
        refusal(e, "CPUWeight", value)
    else:
        assert lo <= weight <= lo + span


@given(st.one_of(anything, near_signals))
@example("SIGSTOP")
@example("0")
@example("RTMIN")
def test_parse_signal_gives_a_signal_that_can_stop_or_refuses(value: object) -> None:
    try:
        sig = parse_signal(value, "stop_signal")  # type: ignore[arg-type]
    except UnitsError as e:
        refusal(e, "stop_signal", value)
        return
    assert isinstance(sig, signal.Signals) and sig not in (signal.SIGSTOP, 0)


@given(st.sampled_from(sorted(set(signal.Signals) - {signal.SIGSTOP})),
       st.sampled_from(["name", "short", "lower", "number", "int", "padded"]))
def test_every_signal_is_accepted_by_name_and_number(sig: signal.Signals, form: str) -> None:
    forms: dict[str, str | int] = {"name": sig.name, "short": sig.name[3:],
                                   "lower": sig.name[3:].lower(), "number": str(int(sig)),
                                   "int": int(sig), "padded": f"  {sig.name} "}
    value = forms[form]
    assert parse_signal(value, "KillSignal") == sig
