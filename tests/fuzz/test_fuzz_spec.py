"""Fuzz of TaskSpec against what validation promises (supervisor/_spec.py).

- Whatever is passed, ``TaskSpec(...)`` returns or raises ``SpecError`` (a ValueError naming a
  field): no TypeError, OverflowError or other escape.
- Through a supervisor: options it refuses raise ``SpecError`` from ``run()`` and create
  nothing (no leaf, no process, no record).
- Options it accepts run, and come back through the JSON result (``TaskResult.to_dict()``,
  strict UTF-8 JSON): the argv, the name, the time limit; and the output byte-exact
  (``printf '%s\\n' ARGS...``: each argument on its own line, head and tail kept as asked).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import trio
from fuzz_util import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cgroupfs
import supervisor
from supervisor import Isolation, Limits, SpecError, TaskSpec

anything = st.one_of(st.text(max_size=8), st.integers(), st.floats(), st.booleans(), st.none(),
                     st.binary(max_size=4), st.lists(st.integers(), max_size=2),
                     st.sampled_from([10**400, -(10**400), math.inf, -math.inf, math.nan]))
durations = st.one_of(anything, st.sampled_from(
    ["30s", "1us", "0", "-1s", "infinity", "100y", "101y", "1e3", 1e-300, 1e300, -0.0,
     5e-324, "0.05s", "1h 30min"]))
texts = st.text(max_size=8)
# Every field, from values of every type and values near its rule.
any_fields = st.fixed_dictionaries({}, optional={
    "env": st.one_of(anything, st.dictionaries(texts, texts | st.integers(), max_size=3)),
    "cwd": st.one_of(anything, texts),
    "stdin": st.one_of(anything, st.sampled_from(["pipe", "inherit"]),
                       st.builds(bytearray, st.binary(max_size=4))),
    "tty": anything,
    "tty_size": st.one_of(anything, st.tuples(anything, anything),
                          st.tuples(st.integers(), st.integers())),
    "stdout": st.one_of(anything, st.just("capture")),
    "stderr": st.one_of(anything, st.just("capture")),
    "time_limit": durations, "grace": durations, "stop_signal_repeat": durations,
    "stop_signal": st.one_of(anything, st.sampled_from(["TERM", "sigkill", "SIGSTOP", "0", "99",
                                                        "RTMIN", 34, 64, 65])),
    "output_head": anything, "output_tail": anything, "log_max_bytes": anything,
    "log_lazy": anything,
    "limits": st.one_of(anything, st.just(Limits())),
    "isolation": st.one_of(anything, st.just(Isolation())),
    "name": st.one_of(anything, st.text(max_size=300)),
})
any_argv = st.one_of(anything, st.lists(st.one_of(texts, anything), max_size=3),
                     st.lists(texts, min_size=1, max_size=3))


@given(any_argv, any_fields)
@example(["x"], {"time_limit": 10**400})  # issue 7: OverflowError, not SpecError
@example(["x"], {"stop_signal_repeat": "1us"})  # below the floor: would busy-loop
@example(["x\udcff"], {"name": "\udcff"})  # undecodable bytes, as os.fsdecode gives them
@example(["x"], {"tty_size": (True, 1)})  # a bool is not a size
def test_task_spec_is_made_or_refused_with_a_spec_error(argv: object,
                                                        fields: dict[str, object]) -> None:
    try:
        spec = TaskSpec(argv, **fields)  # type: ignore[arg-type]
    except SpecError as e:
        assert isinstance(e, ValueError) and e.field
        return
    assert isinstance(spec.argv, tuple) and spec.argv
    assert spec.time_limit is None or 0 < spec.time_limit_s <= 100 * 365.25 * 86400  # type: ignore[operator]
    assert spec.grace_s >= 0


def run_in_supervisor(base: str, argv: list[str], fields: dict[str, object]) -> object:
    """``sup.run(argv, **fields)`` in a fresh supervisor: its result, or the error it raised
    with what existed right after (children of the root, tasks, records)."""

    async def main() -> object:
        async with supervisor.open_supervisor(cgroup_root=base) as sup:
            try:
                return await sup.run(argv, **fields)
            except SpecError as e:
                return e, os.listdir(sup.cgroup_root), sup.tasks, dict(sup.results)

    return trio.run(main)


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(texts, max_size=2), fields=any_fields.filter(
    lambda f: f.get("stdin") != "inherit"))
def test_refused_options_raise_spec_error_and_create_nothing(
        argv: list[str], fields: dict[str, object], test_cgroup: cgroupfs.Cgroup) -> None:
    try:
        TaskSpec(["printf", *argv], **fields)  # type: ignore[arg-type]
    except SpecError:
        pass
    else:
        return  # accepted: the next test's business
    got = run_in_supervisor(test_cgroup.path, ["printf", *argv], fields)
    assert isinstance(got, tuple), f"refused by TaskSpec, but run() returned {got}"
    error, entries, tasks, results = got
    assert isinstance(error, SpecError)
    leaves = [e for e in entries if os.path.isdir(os.path.join(test_cgroup.path, e))]
    assert (leaves, tasks, results) == ([], [], {}), "something was created"
    assert test_cgroup.children() == []


printable = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
accepted_fields = st.fixed_dictionaries({}, optional={
    "env": st.dictionaries(printable.filter(lambda k: k != "" and "=" not in k), printable,
                           max_size=2),
    "inherit_env": st.booleans(),
    "cwd": st.sampled_from([None, "/", "/tmp"]),
    "stdin": st.one_of(st.none(), st.binary(max_size=8)),
    "time_limit": st.one_of(st.none(), st.sampled_from(["30s", "1min", 60, 0.5, "1h 30min"])),
    "grace": st.sampled_from(["0", "1s", 0.2, "5s"]),
    "stop_signal": st.sampled_from(["TERM", "INT", "KILL", 1, "hup"]),
    "stop_signal_repeat": st.one_of(st.none(), st.sampled_from(["0.1s", "1s"])),
    "output_head": st.integers(0, 64), "output_tail": st.integers(0, 64),
    "name": st.one_of(st.none(), printable),
})


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.one_of(printable, st.sampled_from(["-n", "%s", "\\n", "a\udcffb"])),
                     max_size=4),
       fields=accepted_fields)
@example(args=["\u00e9", "a\udcffb"], fields={"name": "caf\u00e9", "output_head": 1,
                                              "output_tail": 1})
def test_accepted_options_run_and_round_trip_through_the_json_result(
        args: list[str], fields: dict[str, object], test_cgroup: cgroupfs.Cgroup) -> None:
    argv = ["printf", "%s\\n", *args]
    spec = TaskSpec(argv, **fields)  # type: ignore[arg-type]
    r = run_in_supervisor(test_cgroup.path, argv, fields)
    assert isinstance(r, supervisor.TaskResult), r
    assert r.outcome == "succeeded", (r.outcome, r.error, r.output_stderr.data)
    text = json.dumps(r.to_dict(), ensure_ascii=False)
    d = json.loads(text.encode("utf-8"))  # strict UTF-8: no lone surrogates anywhere
    assert d["argv"] == [a.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                         for a in argv]
    assert d["name"] == spec.name
    assert d["time_limit_s"] == spec.time_limit
    assert d["outcome"] == "succeeded" and d["exit"]["code"] == 0 and d["stop"] is None
    want = b"".join(os.fsencode(a) + b"\n" for a in args) if args else b"\n"
    out = r.output_stdout
    assert out.total == len(want) == len(out.head) + len(out.tail) + out.dropped
    assert out.head == want[:len(out.head)] and len(out.head) == min(spec.output_head,
                                                                     len(want))
    assert out.tail == want[len(want) - len(out.tail):]
    assert d["output"]["stdout"]["total_bytes"] == len(want)
    assert test_cgroup.children() == []


def test_a_name_with_undecodable_bytes_is_valid_utf8_in_the_json_result(
        test_cgroup: cgroupfs.Cgroup) -> None:
    r = run_in_supervisor(test_cgroup.path, ["/bin/true"], {"name": os.fsdecode(b"job-\xff")})
    assert isinstance(r, supervisor.TaskResult)
    json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")


def test_inherit_env_must_be_a_bool() -> None:
    with pytest.raises(SpecError):
        TaskSpec(["true"], inherit_env="no")  # type: ignore[arg-type]
