"""Exact refusal messages of the unit parsers (supervisor/_units.py).

The rule and the hint are what a user reads; these pin every hint, the field a default
``what`` names, and the "(100 is the default)" rule of weights, so that a change to any of them
is a decision, not an accident (written to kill the surviving mutants of the message texts;
see docs/testing.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

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

MESSAGES: list[tuple[Callable[..., object], tuple[Any, ...], dict[str, Any], str]] = [
    (parse_duration, ('inf', 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     '"inf"; cannot read "inf"'),
    (parse_duration, (None, 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     'None'),
    (parse_duration, (True, 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     'True; a bool is not a duration'),
    (parse_duration, (math.nan, 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     'nan; NaN is not a duration'),
    (parse_duration, (-math.inf, 'time_limit'), {},  # (no hint: not NaN)
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     '-inf'),
    (parse_duration, (-1.0, 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     '-1.0'),
    (parse_duration, (math.inf, 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     'inf; there is no infinity here; give a finite duration'),
    (parse_duration, ('', 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     '""; it is empty'),
    (parse_duration, ('5 parsecs', 'time_limit'), {},
     'time_limit must be a positive duration like "30s", "5min" or "1h 30min", got '
     '"5 parsecs"; "parsecs" is not a time unit (units are us, ms, s, min, h, d, w, '
     'M for months, y; case matters)'),
    (parse_duration, ('5S', 'grace'), {'allow_zero': True},
     'grace must be a duration (zero or more) like "30s", "5min" or "1h 30min", got '
     '"5S"; "S" is not a time unit (did you mean "s"? units are us, ms, s, min, h, '
     'd, w, M for months, y; case matters)'),
    (parse_size, ('max', 'MemorySwapMax'), {'allow_max': False},
     'MemorySwapMax must be a size in bytes like "1048576", "512M" or "2G", got '
     '"max"; a finite size is needed here'),
    (parse_size, ('-1', 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got "-1"; sizes cannot be negative'),
    (parse_size, ('', 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got ""; it is empty'),
    (parse_size, ('abc', 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got "abc"'),
    (parse_size, (None, 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got None'),
    (parse_size, (False, 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got False; a bool is not a size'),
    (parse_size, (-5, 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got -5; sizes cannot be negative'),
    (parse_size, ('150%', 'MemoryMax'), {'allow_percent_of': 1000},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or a '
     'percentage like "50%", or "infinity", got "150%"; a percentage is a number '
     'from 0 to 100 followed by %'),
    (parse_size, (18446744073709551616, 'MemoryMax'), {},
     'MemoryMax must be a size in bytes like "1048576", "512M" or "2G", or '
     '"infinity", got 18446744073709551616; that is over 2**63-1 bytes, the kernel\'s '
     'most; use "infinity" for no limit'),
    (parse_size, (18446744073709551616, 'MemoryLow'), {'allow_max': False},
     'MemoryLow must be a size in bytes like "1048576", "512M" or "2G", got '
     "18446744073709551616; that is over 2**63-1 bytes, the kernel's most"),
    (parse_count, ('0', 'TasksMax'), {},
     'TasksMax must be a positive whole number like "512", or "infinity", got "0"'),
    (parse_count, ('', 'TasksMax'), {},
     'TasksMax must be a positive whole number like "512", or "infinity", got ""; it '
     'is empty'),
    (parse_count, ('x', 'TasksMax'), {},
     'TasksMax must be a positive whole number like "512", or "infinity", got "x"'),
    (parse_count, ('max', 'TasksMax'), {'allow_max': False},
     'TasksMax must be a positive whole number like "512", got "max"; a finite count '
     'is needed here'),
    (parse_count, (18446744073709551616, 'TasksMax'), {},
     'TasksMax must be a positive whole number like "512", or "infinity", got '
     "18446744073709551616; that is more than 2**63-1, the kernel's most"),
    (parse_count, ('0%', 'TasksMax'), {'allow_percent_of': 100},
     'TasksMax must be a positive whole number like "512", or a percentage like '
     '"25%", or "infinity", got "0%"; 0% of 100 rounds down to 0'),
    (parse_cpu_quota, (5,), {},
     'CPUQuota must be a positive percentage of one CPU like "50%", or "200%" for '
     'two CPUs, got 5; write it with "%"'),
    (parse_cpu_quota, (True,), {},
     'CPUQuota must be a positive percentage of one CPU like "50%", or "200%" for '
     'two CPUs, got True; a bool is not a quota'),
    (parse_cpu_quota, (None,), {},
     'CPUQuota must be a positive percentage of one CPU like "50%", or "200%" for '
     'two CPUs, got None'),
    (parse_cpu_quota, ('5',), {},
     'CPUQuota must be a positive percentage of one CPU like "50%", or "200%" for '
     'two CPUs, got "5"; write "5%" if you mean percent'),
    (parse_cpu_quota, ('x',), {},
     'CPUQuota must be a positive percentage of one CPU like "50%", or "200%" for '
     'two CPUs, got "x"'),
    (parse_signal, ('0',), {},
     'stop_signal must be a signal name or number like "SIGTERM", "TERM" or "15", '
     'got "0"; signal 0 only probes a process and stops nothing'),
    (parse_signal, ('STOP',), {},
     'stop_signal must be a signal name or number like "SIGTERM", "TERM" or "15", '
     'got "STOP"; SIGSTOP only pauses the process; use SIGTERM, or SIGKILL to skip '
     'the grace period'),
    (parse_signal, (None,), {},
     'stop_signal must be a signal name or number like "SIGTERM", "TERM" or "15", '
     'got None'),
    (parse_signal, (-3,), {},
     'stop_signal must be a signal name or number like "SIGTERM", "TERM" or "15", '
     'got -3; no signal has that number; common ones: SIGTERM, SIGINT, SIGHUP, '
     'SIGQUIT, SIGUSR1, SIGUSR2, SIGKILL'),
    (parse_weight, ('0', 'CPUWeight', 1, 100), {},
     'CPUWeight must be a whole number from 1 to 100 (100 is the default), got "0"'),
    (parse_weight, ('0', 'X', 101, 200), {},
     'X must be a whole number from 101 to 200, got "0"'),
    (parse_weight, ('0', 'X', 100, 200), {},
     'X must be a whole number from 100 to 200 (100 is the default), got "0"'),
    (parse_weight, ('0', 'X', 1, 99), {},
     'X must be a whole number from 1 to 99, got "0"'),
    (parse_weight, (None, 'IOWeight'), {},
     'IOWeight must be a whole number from 1 to 10000 (100 is the default), got None'),
    (format_duration, (-1,), {},
     'format_duration needs zero or more seconds, got -1'),
]


@pytest.mark.parametrize(("parse", "args", "kwargs", "message"), MESSAGES)
def test_each_refusal_says_exactly_the_rule_and_the_hint(
        parse: Callable[..., object], args: tuple[Any, ...], kwargs: dict[str, Any],
        message: str) -> None:
    with pytest.raises(UnitsError) as info:
        parse(*args, **kwargs)
    assert str(info.value) == message
    assert info.value.what == message.split(" ", 1)[0]
    assert info.value.value is args[0] or info.value.value == args[0]
