"""Tests for supervisor._units: systemd value syntax, accepted exactly or refused helpfully.

Every refusal is checked for the three parts a message owes the user: the field and the value
as given, the rule, and a hint at the fix.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Callable
from typing import Any

import pytest

from supervisor import _units
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

K, M, G, T, P, E = (1024**i for i in range(1, 7))
YEAR = 365.25 * 86400


def refused(parse: Callable[..., object], value: Any, what: str, **kwargs: Any) -> str:
    """Call ``parse`` expecting a UnitsError about ``value``; return its message."""
    with pytest.raises(UnitsError) as info:
        parse(value, what, **kwargs)
    error = info.value
    assert isinstance(error, ValueError)
    assert error.what == what
    assert error.value is value
    message = str(error)
    assert message.startswith(f"{what} ")
    shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)
    assert shown in message, message
    return message


def test_module_exports_exactly_its_api() -> None:
    assert sorted(_units.__all__) == sorted(
        [
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
    )
    assert issubclass(UnitsError, ValueError)


# --- parse_duration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90", 90.0),
        ("0.5", 0.5),
        (".5s", 0.5),
        ("30s", 30.0),
        ("2.5s", 2.5),
        ("5 s", 5.0),
        ("  5min  ", 300.0),
        ("1h 30min", 5400.0),
        ("1h30min", 5400.0),
        ("1.5h", 5400.0),
        ("2min 3s", 123.0),
        ("2min3s", 123.0),
        ("1h  30min   15s", 5415.0),
        ("0.1s 0.2s", 0.3),  # exact arithmetic: not 0.30000000000000004
        ("1d 2h", 93600.0),
        ("1w", 604800.0),
        ("1M", 2629800.0),  # months: capital M
        ("1m", 60.0),  # minutes: small m
        ("1y", YEAR),
        ("100y", 100 * YEAR),  # the most allowed
        ("1 year 2 months", YEAR + 2 * 2629800),
        ("3 weeks 1 day", 22 * 86400.0),
        ("2 hours", 7200.0),
        ("1 hr", 3600.0),
        ("10 minutes 1 minute", 660.0),
        ("1 second 2 seconds 3 sec", 6.0),
        ("250ms", 0.25),
        ("250msec", 0.25),
        ("10us", 10e-6),
        ("10usec", 10e-6),
        ("10µs", 10e-6),  # U+00B5 MICRO SIGN
        ("10μs", 10e-6),  # U+03BC GREEK SMALL LETTER MU
        ("1s 500ms", 1.5),
        (30, 30.0),
        (2.5, 2.5),
        (1e-6, 1e-6),
    ],
)
def test_parse_duration_accepts_systemd_time_spans(value: str | float, seconds: float) -> None:
    assert parse_duration(value, "time_limit") == seconds


@pytest.mark.parametrize(
    ("value", "kwargs", "seconds"),
    [
        ("0", {"allow_zero": True}, 0.0),
        ("0s", {"allow_zero": True}, 0.0),
        (0, {"allow_zero": True}, 0.0),
        ("0h 0min", {"allow_zero": True}, 0.0),
        ("infinity", {"allow_infinity": True}, math.inf),
        (" infinity ", {"allow_infinity": True}, math.inf),
        (math.inf, {"allow_infinity": True}, math.inf),
        ("5min", {"allow_zero": True, "allow_infinity": True}, 300.0),
    ],
)
def test_parse_duration_allows_zero_and_infinity_only_when_asked(
    value: str | float, kwargs: dict[str, bool], seconds: float
) -> None:
    assert parse_duration(value, "grace", **kwargs) == seconds


POSITIVE_DURATION = 'must be a positive duration like "30s", "5min" or "1h 30min"'


@pytest.mark.parametrize(
    ("value", "kwargs", "hint"),
    [
        ("-5s", {}, ""),
        ("-0.5", {}, ""),
        ("0", {}, ""),
        ("0s", {}, ""),
        (0, {}, ""),
        (0.0, {}, ""),
        (-1, {}, ""),
        (-math.inf, {}, ""),
        ("", {}, "it is empty"),
        ("   ", {}, "it is empty"),
        ("5 parsecs", {}, '"parsecs" is not a time unit (units are us, ms, s, min, h, d, w'),
        ("5S", {}, 'did you mean "s"?'),
        ("5H", {}, 'did you mean "h"?'),
        ("5MIN", {}, 'did you mean "min"?'),
        ("5Ms", {}, 'did you mean "ms"?'),
        ("5mins", {}, '"mins" is not a time unit'),
        ("5e3s", {}, '"e" is not a time unit'),
        ("5s5", {}, '"5" has no unit; only a lone number means seconds'),
        ("5 5", {}, '"5" has no unit; only a lone number means seconds'),
        ("1h 30", {}, '"30" has no unit'),
        ("5s!", {}, 'cannot read "!"'),
        ("1h,30min", {}, 'cannot read ",30min"'),
        ("+5s", {}, 'cannot read "+5s"'),
        ("1h -5min", {}, 'cannot read "-5min"'),
        ("5.s", {}, '"5" has no unit'),
        ("1.2.3s", {}, '"1.2" has no unit'),
        ("\u0661\u0662s", {}, "cannot read"),  # Arabic-Indic digits are not digits here
        ("s", {}, 'cannot read "s"'),
        ("infinity", {}, "there is no infinity here; give a finite duration"),
        ("Infinity", {"allow_infinity": True}, 'cannot read "Infinity"'),
        ("inf", {"allow_infinity": True}, 'cannot read "inf"'),
        (math.inf, {}, "there is no infinity here"),
        (math.nan, {}, "NaN is not a duration"),
        (True, {}, "a bool is not a duration"),
        (False, {"allow_zero": True}, "a bool is not a duration"),
        (None, {}, ""),
        ([5], {}, ""),
    ],
)
def test_parse_duration_refuses_with_rule_and_hint(
    value: object, kwargs: dict[str, bool], hint: str
) -> None:
    message = refused(parse_duration, value, "time_limit", **kwargs)
    if kwargs.get("allow_zero"):
        assert "must be a duration (zero or more) like" in message
    else:
        assert POSITIVE_DURATION in message
    assert ('or "infinity"' in message) == bool(kwargs.get("allow_infinity"))
    assert hint in message


def test_parse_duration_message_matches_the_style_guide_example() -> None:
    with pytest.raises(UnitsError) as info:
        parse_duration("-5s", "time_limit")
    assert str(info.value) == (
        'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got "-5s"'
    )


def test_parse_duration_with_allow_zero_still_refuses_negative() -> None:
    message = refused(parse_duration, "-1s", "grace", allow_zero=True)
    assert 'grace must be a duration (zero or more) like "30s"' in message


@pytest.mark.parametrize("value", ["101y", "100y 1s", "1201M", "5300w", 101 * YEAR, "1" * 60])
def test_parse_duration_refuses_more_than_100_years_as_absurd(value: str | float) -> None:
    message = refused(parse_duration, value, "time_limit")
    assert "is absurdly long (more than 100 years)" in message
    assert 'it must be a positive duration like "30s"' in message


@pytest.mark.parametrize("value", ["1" * 65, "1y" * 8000, " 1s" * 30])
def test_parse_duration_refuses_a_text_too_long_to_be_one_before_reading_it(value: str) -> None:
    with pytest.raises(UnitsError) as info:
        parse_duration(value, "time_limit")
    message = str(info.value)
    assert info.value.what == "time_limit" and info.value.value is value
    assert message.startswith('time_limit must be a positive duration like "30s"')
    assert f"it is {len(value.strip())} characters long; a duration is at most 64" in message
    assert len(message) < 250  # (the value's start only)


def test_parse_duration_absurd_message_offers_infinity_when_allowed() -> None:
    message = refused(parse_duration, "200y", "time_limit", allow_infinity=True)
    assert message == (
        'time_limit "200y" is absurdly long (more than 100 years); it must be a positive'
        ' duration like "30s", "5min" or "1h 30min", or "infinity"'
    )


def test_parse_duration_shows_control_characters_escaped() -> None:
    message = refused(parse_duration, "5\x07s", "time_limit")
    assert '"5\\u0007s"' in message


# --- format_duration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0"),
        (0.0, "0"),
        (1e-6, "1us"),
        (0.0005, "500us"),
        (0.09, "90ms"),
        (0.0015, "1.5ms"),
        (1, "1s"),
        (2.5, "2.5s"),
        (1.0005, "1.0005s"),
        (1.000001, "1.000001s"),
        (59.999, "59.999s"),
        (60, "1min"),
        (61.5, "1min 1.5s"),
        (300, "5min"),
        (3600, "1h"),
        (5400, "1h 30min"),
        (10801.25, "3h 1.25s"),
        (86400, "1d"),
        (93600, "1d 2h"),
        (90061, "1d 1h 1min 1s"),
        (604800, "1w"),
        (864000, "1w 3d"),
        (math.inf, "infinity"),
    ],
)
def test_format_duration_is_systemd_like(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "seconds", [1e-6, 0.25, 1.5, 59.000001, 61, 123.456, 5400, 93600.5, 864000, 100 * YEAR]
)
def test_format_duration_reads_back_with_parse_duration(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "t") == seconds


@pytest.mark.parametrize("text", ["1h 30min", "1.5h", "2min 3s", "90ms", "1d 2h", "2.5s", "7us"])
def test_parse_then_format_gives_the_canonical_spelling(text: str) -> None:
    assert parse_duration(format_duration(parse_duration(text, "t")), "t") == parse_duration(
        text, "t"
    )


@pytest.mark.parametrize("seconds", [-1, -1e-9, math.nan, -math.inf])
def test_format_duration_refuses_negative_and_nan(seconds: float) -> None:
    with pytest.raises(UnitsError, match="format_duration needs zero or more seconds, got"):
        format_duration(seconds)


# --- parse_size ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kwargs", "size"),
    [
        ("1048576", {}, 1048576),
        ("0", {}, 0),
        (0, {}, 0),
        (4096, {}, 4096),
        ("512B", {}, 512),
        ("1K", {}, K),
        ("512M", {}, 512 * M),
        ("2G", {}, 2 * G),
        ("1.5G", {}, G + G // 2),
        ("0.5K", {}, 512),
        ("1.001K", {}, 1025),  # 1025.024 rounds down
        (".5M", {}, M // 2),
        ("3T", {}, 3 * T),
        ("2P", {}, 2 * P),
        ("7E", {}, 7 * E),
        ("8191.999P", {}, 8191 * P + math.floor(0.999 * P)),
        ("9223372036854775807", {}, 2**63 - 1),
        (2**63 - 1, {}, 2**63 - 1),
        (" 1 G ", {}, G),
        ("infinity", {}, "max"),
        ("max", {}, "max"),
        ("50%", {"allow_percent_of": 8 * G}, 4 * G),
        ("100%", {"allow_percent_of": 8 * G}, 8 * G),
        ("0%", {"allow_percent_of": 8 * G}, 0),
        ("12.5%", {"allow_percent_of": 1000}, 125),
        ("33%", {"allow_percent_of": 10}, 3),  # 3.3 rounds down
        ("1G", {"allow_max": False, "allow_percent_of": 8 * G}, G),
    ],
)
def test_parse_size_accepts_systemd_sizes(
    value: str | int, kwargs: dict[str, Any], size: int | str
) -> None:
    assert parse_size(value, "MemoryMax", **kwargs) == size


SIZE_RULE = 'must be a size in bytes like "1048576", "512M" or "2G"'


@pytest.mark.parametrize(
    ("value", "kwargs", "hint"),
    [
        ("-1", {}, "sizes cannot be negative"),
        ("-1G", {}, "sizes cannot be negative"),
        (-5, {}, "sizes cannot be negative"),
        ("", {}, "it is empty"),
        (" ", {}, "it is empty"),
        ("abc", {}, ""),
        ("1G 512M", {}, ""),
        ("1.5.3G", {}, ""),
        ("G", {}, ""),
        ("1KB", {}, '"KB" is not a size suffix; write "1K" (K, M, G, T, P, E are powers of'),
        ("1k", {}, 'write "1K"'),
        ("2GiB", {}, 'write "2G"'),
        ("1.5gb", {}, 'write "1.5G"'),
        ("1b", {}, '"b" is not a size suffix (K, M, G, T, P, E are powers of 1024; case matters)'),
        ("1X", {}, '"X" is not a size suffix (K'),
        ("1.5", {}, '"1.5" is not a whole number of bytes'),
        ("1.5B", {}, '"1.5" is not a whole number of bytes'),
        ("8E", {}, 'that is over 2**63-1 bytes, the kernel\'s most; use "infinity" for no limit'),
        ("9223372036854775808", {}, "over 2**63-1 bytes"),
        (2**63, {}, "over 2**63-1 bytes"),
        ("1" * 300, {}, "over 2**63-1 bytes"),
        ("8E", {"allow_max": False}, "the kernel's most"),
        ("max", {"allow_max": False}, "a finite size is needed here"),
        ("infinity", {"allow_max": False}, "a finite size is needed here"),
        ("Infinity", {}, ""),
        ("MAX", {}, ""),
        ("50%", {}, "MemoryMax does not take a percentage"),
        ("150%", {"allow_percent_of": G}, "a percentage is a number from 0 to 100 followed by %"),
        ("-5%", {"allow_percent_of": G}, "a percentage is a number from 0 to 100"),
        ("%", {"allow_percent_of": G}, "a percentage is a number from 0 to 100"),
        ("5 %", {"allow_percent_of": G}, "a percentage is a number from 0 to 100"),
        (True, {}, "a bool is not a size"),
        (1.5, {}, ""),
        (None, {}, ""),
    ],
)
def test_parse_size_refuses_with_rule_and_hint(
    value: object, kwargs: dict[str, Any], hint: str
) -> None:
    message = refused(parse_size, value, "MemoryMax", **kwargs)
    assert SIZE_RULE in message
    assert ('or "infinity"' in message) == kwargs.get("allow_max", True)
    assert ('or a percentage like "50%"' in message) == ("allow_percent_of" in kwargs)
    assert hint in message


# --- parse_count ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kwargs", "count"),
    [
        ("512", {}, 512),
        ("1", {}, 1),
        (1, {}, 1),
        (" 64 ", {}, 64),
        ("9223372036854775807", {}, 2**63 - 1),
        ("infinity", {}, "max"),
        ("max", {}, "max"),
        ("25%", {"allow_percent_of": 4194304}, 1048576),
        ("100%", {"allow_percent_of": 4194304}, 4194304),
        ("0.5%", {"allow_percent_of": 1000}, 5),
        ("33%", {"allow_percent_of": 10}, 3),
        ("10", {"allow_max": False}, 10),
    ],
)
def test_parse_count_accepts_positive_counts(
    value: str | int, kwargs: dict[str, Any], count: int | str
) -> None:
    assert parse_count(value, "TasksMax", **kwargs) == count


@pytest.mark.parametrize(
    ("value", "kwargs", "hint"),
    [
        ("0", {}, ""),
        (0, {}, ""),
        ("-1", {}, ""),
        (-1, {}, ""),
        ("1.5", {}, ""),
        ("1K", {}, ""),
        ("+5", {}, ""),
        ("", {}, "it is empty"),
        ("9223372036854775808", {}, "that is more than 2**63-1, the kernel's most"),
        (2**63, {}, "more than 2**63-1"),
        ("max", {"allow_max": False}, "a finite count is needed here"),
        ("25%", {}, "TasksMax does not take a percentage"),
        ("0%", {"allow_percent_of": 4194304}, "0% of 4194304 rounds down to 0"),
        ("0.00001%", {"allow_percent_of": 4194304}, "0.00001% of 4194304 rounds down to 0"),
        ("101%", {"allow_percent_of": 100}, "a percentage is a number from 0 to 100 followed by"),
        (True, {}, "a bool is not a count"),
        (None, {}, ""),
    ],
)
def test_parse_count_refuses_with_rule_and_hint(
    value: object, kwargs: dict[str, Any], hint: str
) -> None:
    message = refused(parse_count, value, "TasksMax", **kwargs)
    assert 'must be a positive whole number like "512"' in message
    assert ('or "infinity"' in message) == kwargs.get("allow_max", True)
    assert ('or a percentage like "25%"' in message) == ("allow_percent_of" in kwargs)
    assert hint in message


# --- parse_cpu_quota -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fraction"),
    [
        ("50%", 0.5),
        ("100%", 1.0),
        ("200%", 2.0),
        ("150%", 1.5),
        ("12.5%", 0.125),
        ("0.5%", 0.005),
        (" 25% ", 0.25),
        ("1000000%", 10000.0),  # the most: ten thousand CPUs
    ],
)
def test_parse_cpu_quota_gives_fraction_of_one_cpu(value: str, fraction: float) -> None:
    assert parse_cpu_quota(value) == fraction


QUOTA_RULE = 'must be a positive percentage of one CPU like "50%", or "200%" for two CPUs, got'


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("0%", ""),
        ("0.0%", ""),
        ("-5%", ""),
        ("", ""),
        ("abc", ""),
        ("50", 'write "50%" if you mean percent'),
        ("0.5", 'write "0.5%" if you mean percent'),
        ("50 %", ""),
        ("50%%", ""),
        ("infinity", ""),
        (0.5, 'write it with "%"'),
        (50, 'write it with "%"'),
        (True, "a bool is not a quota"),
        (None, ""),
    ],
)
def test_parse_cpu_quota_refuses_with_rule_and_hint(value: object, hint: str) -> None:
    message = refused(parse_cpu_quota, value, "CPUQuota")
    assert QUOTA_RULE in message
    assert hint in message


@pytest.mark.parametrize("value", ["1000001%", "2000000%", "1" * 200 + "%"])
def test_parse_cpu_quota_refuses_absurd_quotas(value: str) -> None:
    message = refused(parse_cpu_quota, value, "CPUQuota")
    assert "is absurdly large (more than 1000000%, that is 10000 CPUs)" in message
    assert 'it must be a positive percentage of one CPU like "50%"' in message


def test_parse_cpu_quota_uses_the_given_name() -> None:
    message = refused(parse_cpu_quota, "half", "cpu_quota")
    assert message.startswith('cpu_quota must be a positive percentage of one CPU like "50%"')


# --- parse_weight --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kwargs", "weight"),
    [
        ("100", {}, 100),
        ("1", {}, 1),
        ("10000", {}, 10000),
        (500, {}, 500),
        (" 42 ", {}, 42),
        ("0100", {}, 100),
        ("5", {"lo": 5, "hi": 10}, 5),
        (10, {"lo": 5, "hi": 10}, 10),
    ],
)
def test_parse_weight_accepts_integers_in_range(
    value: str | int, kwargs: dict[str, int], weight: int
) -> None:
    assert parse_weight(value, "CPUWeight", **kwargs) == weight


@pytest.mark.parametrize(
    ("value", "kwargs", "hint"),
    [
        ("0", {}, ""),
        (0, {}, ""),
        ("10001", {}, ""),
        (10001, {}, ""),
        ("-5", {}, ""),
        ("+5", {}, ""),
        ("1.5", {}, ""),
        ("", {}, ""),
        ("1e3", {}, ""),
        ("1_000", {}, ""),
        ("\u0661\u0662", {}, ""),
        ("9" * 5000, {}, ""),
        ("idle", {}, '"idle" is not supported; use 1, the lowest weight'),
        ("idle", {"lo": 5, "hi": 10}, '"idle" is not supported; use 5, the lowest weight'),
        (True, {}, "a bool is not a weight"),
        (1.0, {}, ""),
        (None, {}, ""),
    ],
)
def test_parse_weight_refuses_with_range_and_hint(
    value: object, kwargs: dict[str, int], hint: str
) -> None:
    message = refused(parse_weight, value, "CPUWeight", **kwargs)
    lo, hi = kwargs.get("lo", 1), kwargs.get("hi", 10000)
    assert f"must be a whole number from {lo} to {hi}" in message
    assert ("(100 is the default)" in message) == (lo <= 100 <= hi)
    assert hint in message


# --- parse_signal --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "sig"),
    [
        ("SIGTERM", signal.SIGTERM),
        ("TERM", signal.SIGTERM),
        ("term", signal.SIGTERM),
        ("sigterm", signal.SIGTERM),
        ("SigInt", signal.SIGINT),
        (" HUP ", signal.SIGHUP),
        ("SIGQUIT", signal.SIGQUIT),
        ("USR1", signal.SIGUSR1),
        ("SIGKILL", signal.SIGKILL),  # allowed: it means no grace
        ("KILL", signal.SIGKILL),
        ("SIGIOT", signal.SIGABRT),  # an alias
        ("15", signal.SIGTERM),
        (" 2 ", signal.SIGINT),
        (str(int(signal.SIGUSR2)), signal.SIGUSR2),
        (9, signal.SIGKILL),
        (int(signal.SIGHUP), signal.SIGHUP),
        (signal.SIGINT, signal.SIGINT),
    ],
)
def test_parse_signal_accepts_names_and_numbers(value: str | int, sig: signal.Signals) -> None:
    result = parse_signal(value)
    assert result is sig
    assert isinstance(result, signal.Signals)


COMMON = "common ones: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGKILL"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("SIGFOO", f"no signal has that name; {COMMON}"),
        ("FOO", f"no signal has that name; {COMMON}"),
        ("", "no signal has that name"),
        ("SIG", "no signal has that name"),
        ("SIG TERM", "no signal has that name"),
        ("RTMIN+3", "no signal has that name"),
        ("-15", "no signal has that name"),
        ("999", f"no signal has that number; {COMMON}"),
        (999, "no signal has that number"),
        (-15, "no signal has that number"),
        ("9" * 5000, "no signal has that number"),
        ("0", "signal 0 only probes a process and stops nothing"),
        (0, "signal 0 only probes a process and stops nothing"),
        ("SIGSTOP", "SIGSTOP only pauses the process; use SIGTERM, or SIGKILL to skip the grace"),
        ("stop", "SIGSTOP only pauses the process"),
        (int(signal.SIGSTOP), "SIGSTOP only pauses the process"),
        (str(int(signal.SIGSTOP)), "SIGSTOP only pauses the process"),
        (True, "a bool is not a signal"),
        (None, ""),
        (15.0, ""),
    ],
)
def test_parse_signal_refuses_with_rule_and_hint(value: object, hint: str) -> None:
    message = refused(parse_signal, value, "stop_signal")
    assert 'must be a signal name or number like "SIGTERM", "TERM" or "15"' in message
    assert hint in message


def test_parse_signal_uses_the_given_name() -> None:
    assert refused(parse_signal, "NOPE", "KillSignal").startswith("KillSignal must be a signal")
