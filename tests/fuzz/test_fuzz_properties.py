"""Fuzz of ``-p NAME=VALUE`` properties (supervisor/_properties.py and the isolation set).

Promise: a property list either becomes TaskSpec options or is refused with a ``SpecError``
that names the property; a limit's value is what the unit parser says; and a property set that
is accepted runs (an OS refusal at the spawn is a ``spawn_failed`` record with its errno,
never an internal error), with the isolation described in the JSON result.
"""

from __future__ import annotations

import json
import string

import pytest
import trio
from fuzz_util import examples
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import cgroupfs
import supervisor
from supervisor import InternalError, Isolation, SpecError
from supervisor._isolation import ISOLATION_PROPERTIES
from supervisor._properties import SUPPORTED, parse_properties
from supervisor._units import parse_count, parse_size

NAMES = sorted(SUPPORTED)


CLEAN = st.characters(codec="utf-8") | st.sampled_from(string.digits)
values = st.one_of(
    st.text(CLEAN, max_size=16),
    st.sampled_from(["", "0", "1", "yes", "no", "true", "512M", "1.5G", "50%", "200%", "100",
                     "infinity", "max", "30s", "1h 30min", "TERM", "9", "root", "nobody",
                     "0022", "0777", "CAP_KILL", "~CAP_KILL", "~", "1024:4096", "-5", "+19",
                     "A=1 B=2", "/tmp", "relative", "65534", "4294967294"]),
)
items = st.lists(st.builds(lambda n, v: f"{n}={v}", st.sampled_from(NAMES), values) |
                 st.text(CLEAN, max_size=20), max_size=4)


@given(items)
@example(["MemoryMax=1.5G", "TasksMax=25%", "CPUQuota=150%"])
@example(["Environment=A=1 B", "KillSignal=STOP"])
@example(["User=nobody", "User=root"])  # the later one wins, as in a unit file
def test_properties_become_options_or_a_spec_error_naming_the_property(
        props: list[str]) -> None:
    try:
        got = parse_properties(props)
    except SpecError as e:
        named = {p.partition("=")[0].strip() for p in props} | {"property"}
        assert e.field in named, (e.field, props)
        return
    for prop in props:
        name, _, value = prop.partition("=")
        if name == "MemoryMax" and prop == [p for p in props if p.startswith("MemoryMax=")][-1]:
            want = parse_size(value.strip(), name, allow_percent_of=got_total_memory())
            assert got.limits["memory_max"] == want
        if name == "TasksMax" and prop == [p for p in props if p.startswith("TasksMax=")][-1]:
            assert got.limits["pids_max"] == parse_count(value.strip(), name,
                                                          allow_percent_of=pid_max())
    if any(p.partition("=")[0] in ISOLATION_PROPERTIES for p in props):
        assert isinstance(got.options["isolation"], Isolation)


def got_total_memory() -> int:
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read())


BOOLEANS = ["yes", "no", "true", "false", "1", "0", "on", "off"]
CAPS = ["CAP_KILL", "~CAP_SYS_ADMIN", "", "~", "CAP_NET_RAW CAP_CHOWN", "cap_kill"]
LIKELY = {"User": ["root", "nobody", "0", "65534"],
          "Group": ["root", "nogroup", "0", "65534", "4294967294"],
          "SupplementaryGroups": ["", "0 65534", "nogroup", "4294967294"],
          "NoNewPrivileges": BOOLEANS, "PrivateNetwork": BOOLEANS, "PrivateTmp": BOOLEANS,
          "ProtectControlGroups": BOOLEANS, "UMask": ["0022", "0077", "0777", "022", "7"],
          "CapabilityBoundingSet": CAPS, "AmbientCapabilities": CAPS}
LIMITS = ["64", "1024:4096", "infinity", "8M", "30s", "-5", "+19", "500ms", "0", "1:infinity"]


def isolation_item(name: str) -> st.SearchStrategy[str]:
    """``NAME=VALUE``, the value likely valid for that property two times out of three."""
    likely = st.sampled_from(LIKELY.get(name, LIMITS))
    return st.one_of(likely, likely, values).map(lambda v: f"{name}={v}")


isolation_items = st.lists(st.sampled_from(ISOLATION_PROPERTIES).flatmap(isolation_item),
                           min_size=1, max_size=2)


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(props=isolation_items)
@example(props=["PrivateNetwork=yes", "User=nobody", "PrivateTmp=yes"])
@example(props=["LimitNOFILE=64", "NoNewPrivileges=yes",
                "CapabilityBoundingSet=~CAP_SYS_ADMIN"])
def test_accepted_isolation_runs_and_is_described_in_the_result(
        props: list[str], test_cgroup: cgroupfs.Cgroup) -> None:
    try:
        isolation = parse_properties(props).options["isolation"]
    except SpecError:
        event("refused")
        return
    event("accepted: ran")

    async def main() -> supervisor.TaskResult:
        async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as sup:
            return await sup.run(["/bin/true"], isolation=isolation, cwd="/")

    try:
        r = trio.run(main)
    except InternalError as e:
        pytest.fail(f"{props} was accepted, then failed inside corral: {e}")
    # a tiny LimitAS= may well kill /bin/true (SIGSEGV): it ran, and said how it ended
    assert r.outcome in ("succeeded", "failed", "signaled", "spawn_failed"), (props, r.outcome,
                                                                             r.error)
    if r.outcome == "spawn_failed":
        assert r.error_errno is not None, (props, r.error)  # the OS said no, with a reason
    d = json.loads(json.dumps(r.to_dict()))
    assert d["containment"]["isolation"] == json.loads(json.dumps(isolation.describe()))
    assert test_cgroup.children() == []


# ---- found by the fuzz (fixed in e179cfc), kept as regression cases ---------------------


@pytest.mark.parametrize("prop", ['Environment=A="1', "Environment=A=1\\"])
def test_environment_with_bad_quoting_is_a_spec_error(prop: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_properties([prop])
    assert info.value.field == "Environment"


@pytest.mark.parametrize("prop", ["User=\u00b9", "Group=\u00b2", "SupplementaryGroups=\u00b2",
                                  "LimitNOFILE=\u00b9"])
def test_non_ascii_digits_in_isolation_properties_are_a_spec_error(prop: str) -> None:
    with pytest.raises(SpecError):
        parse_properties([prop])


@pytest.mark.parametrize("prop", ["Group=4294967296", "SupplementaryGroups=4294967296",
                                  "LimitRTTIME=99999999999999999999999999",
                                  # (past Python's 4,300 digits: its own ValueError, unnamed)
                                  "User=" + "1" * 5000, "LimitNOFILE=" + "1" * 5000,
                                  "LimitNICE=-" + "1" * 5000, "LimitRTTIME=" + "1" * 5000,
                                  "CapabilityBoundingSet=" + "1" * 5000])
def test_ids_and_rlimits_beyond_the_kernels_range_are_refused(prop: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_properties([prop])
    assert refused.value.field == prop.partition("=")[0] and len(str(refused.value)) < 400


# ---- Environment= is split as POSIX shlex splits it, in one regex pass ------------------

# the characters that mean something to shlex, the whitespace it does not split on, and a few
# plain ones, so that quotes, escapes and spaces meet in every order
SHELLISH = st.text(st.sampled_from(list(" \t\r\n\\'\"=aZ\x0b\x0c\u00a0\u3000#$")), max_size=40)


@given(SHELLISH | st.text(max_size=40))
@example("a ''")
@example('"a\\b\\"c\\\\"')
@example("\\\\\\")
@example("'unclosed")
@settings(max_examples=examples(600))
def test_environment_words_are_split_exactly_as_shlex_splits_them(value: str) -> None:
    """``split_words`` replaced ``shlex.split`` (0.6 us a character, quadratic in a long word:
    a daemon's start re-reads every queued request): the same words, or the same refusal."""
    import shlex

    from supervisor._properties import split_words

    try:
        expected: list[str] | str = shlex.split(value)
    except ValueError as e:
        expected = f"refused: {e}"
    try:
        got: list[str] | str = split_words(value)
    except ValueError as e:
        got = f"refused: {e}"
    assert got == expected
