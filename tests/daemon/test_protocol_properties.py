"""Property tests (hypothesis) of what the daemon does with whatever a client sends.

No daemon process: the protocol module's parsers, the submit verb's spec building, and one
HTTP connection driven over an in-memory stream.  Nothing may escape but an ``ApiError``
(a 4xx with a field and a message), and valid requests survive a round trip unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.serve.http import HttpLimits, Request, json_response, serve_connection
from supervisor.serve.peers import Peer
from supervisor.serve.protocol import (
    MAX_KEY,
    MAX_TTY,
    SUBMIT_FIELDS,
    ApiError,
    SubmitRequest,
    dumps_in_slices,
    parse_exec,
    parse_json_body,
    parse_resize,
    parse_session,
    parse_signal,
    parse_stop,
    parse_submit,
    pop_wait,
    query_bool,
    query_int,
    sorted_in_slices,
)
from supervisor.serve.specs import build_spec

ROOT = Peer(1, 0, 0, ())
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)
field_values = st.fixed_dictionaries({}, optional={
    f: json_values | st.text() for f in SUBMIT_FIELDS}) | st.dictionaries(
        st.sampled_from([*SUBMIT_FIELDS, "bogus"]), json_values, max_size=6)
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                min_size=1, max_size=20)
valid_requests = st.builds(
    SubmitRequest,
    argv=st.lists(texts, min_size=1, max_size=4),
    env=st.dictionaries(texts.filter(lambda k: "=" not in k), texts, max_size=3),
    cwd=st.none() | st.just("/tmp"),
    time_limit=st.none() | st.sampled_from(["30s", "5min", "1h 30min", 2.5]),
    grace=st.none() | st.sampled_from(["0", "1s", 3]),
    stop_signal=st.none() | st.sampled_from(["TERM", "INT", 9]),
    properties=st.dictionaries(st.sampled_from(["RuntimeMaxSec", "KillSignal",
                                                "TimeoutStopSec"]),
                               st.sampled_from(["10s", "TERM", "5"]), max_size=2),
    name=st.none() | texts,
    stdin=st.none(),
    stdin_data=st.none() | st.binary(max_size=32),
    idempotency_key=st.none() | texts.filter(str.isprintable))


def _is_refusal(e: ApiError) -> None:
    assert 400 <= e.status < 500
    assert e.code and len(e.message) > 10
    assert e.to_json()["error"]["message"] == e.message


@given(st.binary(max_size=300))
def test_any_bytes_are_json_or_a_400(body: bytes) -> None:
    try:
        parse_json_body(body)
    except ApiError as e:
        _is_refusal(e)
        assert e.code in ("invalid_utf8", "malformed_json")


@given(json_values | field_values)
def test_any_json_is_a_request_or_a_400_naming_the_field(obj: Any) -> None:
    try:
        r = parse_submit(obj)
    except ApiError as e:
        _is_refusal(e)
        assert e.field is not None
        return
    assert isinstance(r.argv, list) and r.argv and all(isinstance(a, str) for a in r.argv)


@given(valid_requests)
def test_valid_requests_survive_the_wire_unchanged(r: SubmitRequest) -> None:
    wire = json.loads(json.dumps(r.to_json()).encode())
    back = parse_submit(wire)
    assert back.to_json() == r.to_json()


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(field_values | valid_requests.map(lambda r: r.to_json()))
def test_building_a_spec_raises_nothing_but_api_errors(obj: Any) -> None:
    try:
        spec = build_spec(ROOT, parse_submit(obj), controllers=frozenset(),
                          root="/sys/fs/cgroup/x", output_cap=1 << 20, stdin_pipes=False)
    except ApiError as e:
        _is_refusal(e)
        return
    assert spec.argv and spec.inherit_env is False


@given(json_values)
def test_stop_bodies(obj: Any) -> None:
    try:
        assert isinstance(parse_stop(obj), bool)
    except ApiError as e:
        _is_refusal(e)


SESSION_FIELDS = ["cwd", "env", "shell", "time_limit", "grace", "properties", "bogus"]
EXEC_FIELDS = ["command", "background", "time_limit", "grace", "stdin", "tty", "name",
               "idempotency_key", "bogus"]
session_bodies = st.dictionaries(st.sampled_from(SESSION_FIELDS), json_values, max_size=5)
exec_bodies = st.dictionaries(st.sampled_from(EXEC_FIELDS), json_values | texts, max_size=5)


@settings(deadline=None)
@given(json_values | session_bodies | exec_bodies)
def test_every_new_verbs_body_is_a_request_or_a_400_naming_the_field(obj: Any) -> None:
    # the agents' verbs: a session, a command of one, a signal, a resize, a wait bound
    for parse in (parse_session, parse_exec, parse_signal, parse_resize, pop_wait):
        try:
            parse(json.loads(json.dumps(obj)))  # (each is given its own copy)
        except ApiError as e:
            _is_refusal(e)
            assert e.field is not None or parse in (parse_session, parse_exec), (parse, e)


@given(st.dictionaries(st.sampled_from(["signal", "rows", "cols", "wait"]),
                       json_values | st.integers(-5, 100_000) | st.sampled_from(
                           ["INT", "SIGINT", "KILL", "STOP", "int", "1s", "2h", "-1s"]),
                       max_size=3))
def test_signal_resize_and_wait_keep_their_bounds(obj: dict[str, Any]) -> None:
    try:
        name = parse_signal(dict(obj))
        assert name in ("INT", "QUIT", "HUP", "TERM", "USR1", "USR2", "WINCH", "CONT")
    except ApiError as e:
        _is_refusal(e)
    try:
        rows, cols = parse_resize(dict(obj))
        assert 1 <= rows <= MAX_TTY and 1 <= cols <= MAX_TTY, (rows, cols)
    except ApiError as e:
        _is_refusal(e)
    try:
        wait = pop_wait(dict(obj))
        assert wait is None or 0 <= wait <= 3600
    except ApiError as e:
        _is_refusal(e)


@given(st.dictionaries(st.sampled_from(["eof", "limit", "x"]), st.text(max_size=8)))
def test_query_values(query: dict[str, str]) -> None:
    for call in (lambda: query_bool(query, "eof"), lambda: query_int(query, "limit", 5, 1, 99)):
        try:
            call()
        except ApiError as e:
            _is_refusal(e)


async def _exchange(data: bytes) -> bytes:
    """``data`` sent on one connection, then EOF; everything the daemon answered."""
    client, server = trio.testing.memory_stream_pair()

    async def ok(req: Request) -> Any:
        return json_response(200, {"path": req.path})

    def router(req: Request) -> Any:
        return ok, False, "test"

    limits = HttpLimits(max_body=1024, max_header_bytes=2048, header_timeout=0.5,
                        idle_timeout=0.5, send_timeout=0.5)
    answer = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server, ROOT, limits, router,
                           lambda verb, status: None)
        await client.send_all(data)
        await client.send_eof()
        with trio.move_on_after(5):
            while chunk := await client.receive_some():
                answer += chunk
    return answer


http_noise = st.binary(max_size=400) | st.builds(
    lambda method, target, headers, body: method + b" " + target + b" HTTP/1.1\r\n" +
    b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body,
    st.sampled_from([b"GET", b"POST", b"PUT", b"\xff", b""]),
    st.binary(max_size=30) | st.sampled_from([b"/v1/tasks", b"/v1/tasks?limit=%ff"]),
    st.lists(st.sampled_from([b"host: x", b"content-length: 5", b"content-length: -1",
                              b"transfer-encoding: chunked", b"x" * 3000, b": bad"]),
             max_size=4),
    st.binary(max_size=50))


@settings(deadline=None, max_examples=150)
@given(http_noise)
def test_any_bytes_on_a_connection_get_http_answers_and_never_crash_it(data: bytes) -> None:
    answer = trio.run(_exchange, data)
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 "):
            status = int(line.split()[1])
            assert status == 200 or 400 <= status < 500, answer


# ---- what a non-root submitter may have: checked on the parsed spec --------------------------

TENANT = Peer(2, 4242, 4242, (4242,))
ROOT_ONLY = ("User", "Group", "SupplementaryGroups", "AmbientCapabilities")
PADDING = ["", " ", "  ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u2003", "\ufeff", "\x0b"]
names = st.builds(lambda pad1, name, pad2, upper: pad1 + (name.upper() if upper else name) + pad2,
                  st.sampled_from(PADDING), st.sampled_from([
                      *ROOT_ONLY, "CapabilityBoundingSet", "NoNewPrivileges", "PrivateNetwork",
                      "PrivateTmp", "ProtectControlGroups", "UMask", "LimitNOFILE",
                      "LimitRTPRIO", "LimitNICE", "LimitMEMLOCK", "LimitCORE", "CPUWeight",
                      "IOWeight", "MemoryMax", "TasksMax", "RuntimeMaxSec", "DynamicUser"]),
                  st.sampled_from(PADDING), st.booleans())
values = st.sampled_from([
    "", "root", "0", "nobody", "65534", "CAP_SETUID CAP_SETGID CAP_DAC_OVERRIDE CAP_SYS_ADMIN",
    "~CAP_SYS_ADMIN", "~", "CAP_NET_BIND_SERVICE", "yes", "no", "0022", "1024", "1024:4096",
    "infinity", "99", "10000", "1", "100", "101", "10s", " CAP_SYS_ADMIN ", "\u00a0CAP_SETUID"])


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=400)
@given(st.dictionaries(names, values, max_size=4))
def test_a_non_root_submitters_task_never_gets_more_than_it_has(props: dict[str, str]) -> None:
    """Whatever the property names look like (padded with any blank, Unicode's included) and
    whatever their values, a non-root submitter's spec runs as exactly that submitter, with no
    capability raised, no resource limit above the daemon's own hard limit and no share above
    the default: or the request is refused with a 4xx."""
    import resource

    from supervisor._isovalues import INFINITY, RLIMITS

    request = parse_submit({"argv": ["true"], "properties": props})
    try:
        spec = build_spec(TENANT, request, controllers=frozenset({"cpu", "io", "memory",
                                                                  "pids"}),
                          root="/sys/fs/cgroup/x", output_cap=1 << 20, stdin_pipes=True)
    except ApiError as e:
        _is_refusal(e)
        return
    iso = spec.isolation
    assert (iso.user, iso.group, tuple(iso.supplementary_groups)) == (4242, 4242, (4242,))
    assert iso.ambient_capabilities == ()
    for name, (soft, hard) in iso.rlimits.items():
        ours = resource.getrlimit(RLIMITS[name][0])[1]
        ceiling = INFINITY if ours == resource.RLIM_INFINITY else ours
        assert max(soft, hard) <= ceiling, (name, soft, hard)
    for weight in (spec.limits.cpu_weight, spec.limits.io_weight):
        assert weight is None or weight <= 100
    # a root-only property that the parser read as itself, with a value, was never accepted
    for raw, value in props.items():
        assert not (raw.strip(" \t") in ROOT_ONLY and value.strip()), (raw, value)


@settings(deadline=None)
@given(st.sampled_from(ROOT_ONLY), st.sampled_from(PADDING), st.sampled_from(PADDING))
def test_a_padded_root_only_name_is_refused_for_a_user(name: str, before: str,
                                                       after: str) -> None:
    value = {"User": "root", "Group": "root", "SupplementaryGroups": "root",
             "AmbientCapabilities": "CAP_SETUID CAP_SYS_ADMIN"}[name]
    request = parse_submit({"argv": ["true"], "properties": {before + name + after: value}})
    try:
        build_spec(TENANT, request, controllers=frozenset(), root="/sys/fs/cgroup/x",
                   output_cap=1 << 20, stdin_pipes=True)
    except ApiError as e:
        # read as the name it spells: refused (403) for a user; not a name at all: 400
        assert (e.status, e.code) in ((403, "forbidden"), (400, "invalid")), e.to_json()
        assert e.status == 403 or (before + after).strip(" \t"), e.to_json()
        return
    raise AssertionError(f"{before + name + after!r}={value!r} was accepted for a user")


def test_every_field_a_tenant_could_set_has_a_rule_and_unknown_ones_are_refused() -> None:
    """Deny by default: a value with no rule (a field the core learns later) is root's."""
    import dataclasses

    import supervisor
    from supervisor.serve.policy import RULES, denied_paths

    iso_fields = {f"isolation.{f.name}" for f in dataclasses.fields(supervisor.Isolation)
                  if not f.name.startswith("_")}
    limit_fields = {f"limits.{f.name}" for f in dataclasses.fields(supervisor.Limits)}
    assert iso_fields | limit_fields <= set(RULES), sorted((iso_fields | limit_fields)
                                                           - set(RULES))
    assert list(denied_paths(iter([("isolation.bind_paths", ("/", "/mnt"))]))) == [
        ("isolation.bind_paths", "it is not known to be harmless for a task of another user "
                                 "(only root may set it)")]
    assert list(denied_paths(iter([("limits.memory_max", 1 << 20), ("env", {})]))) == []


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=3), st.one_of(
    json_values,
    st.integers(0, 3000).map(lambda n: [f"a{i}\u00e9\"" for i in range(n)]),
    st.integers(0, 3000).map(lambda n: {f"K{i}": [i, None] for i in range(n)})), max_size=4))
def test_a_request_encoded_in_slices_is_what_json_dumps_makes(obj: dict[str, Any]) -> None:
    assert dumps_in_slices(obj) == json.dumps(obj)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.dictionaries(st.text(max_size=4), st.text(max_size=3), max_size=40),
                 st.integers(0, 5000).map(lambda n: {f"V{(i * 7919) % 5003}": str(i)
                                                     for i in range(n)})))
def test_an_environment_sorted_in_slices_is_the_dict_of_its_sorted_items(
        env: dict[str, str]) -> None:
    got = sorted_in_slices(env)
    assert got == env and list(got.items()) == sorted(env.items())


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_an_idempotency_key_is_taken_up_to_128_printable_bytes_and_refused_past_them(
        key: str) -> None:
    # (a key is kept in its row, its tombstone and both their indexes: 4,000-character keys
    # filled a state disk; the bound is on bytes, since that is what the disk keeps)
    # (and printable: a NUL or another control character in a key was taken, and stored)
    fits = len(key.encode()) <= MAX_KEY
    for parse, body in ((parse_submit, {"argv": ["true"], "idempotency_key": key}),
                        (parse_exec, {"command": "true", "idempotency_key": key})):
        try:
            assert parse(body).idempotency_key == key and fits and key.isprintable()
        except ApiError as e:
            assert not (fits and key.isprintable()), e
            assert e.status == 400 and e.field == "idempotency_key", e
            assert (f"got {len(key.encode())}" if not fits else "printable") in e.message


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(_JSON_VALUES, st.sampled_from(["", " ", "\n\t ", "\ufeff"]))
def test_the_clients_json_is_jsons(value: Any, pad: str) -> None:
    """The clients' JSON (``supervisor.serve.fastjson``: the C scanner and encoder without the
    json module's start-up) encodes and decodes as json does, errors included."""
    from supervisor.serve import fastjson

    text = json.dumps(value)
    assert fastjson.dumps(value) == text
    for data in (pad + text + pad.strip("\ufeff"), (pad + text).encode()):
        try:
            expected: Any = ("ok", json.loads(data))
        except ValueError as e:
            expected = ("error", type(e), str(e))
        try:
            got: Any = ("ok", fastjson.loads(data))
        except ValueError as e:
            got = ("error", type(e), str(e))
        assert repr(got) == repr(expected), data


def test_the_clients_json_fails_as_json_does() -> None:
    import pytest

    from supervisor.serve import fastjson

    for bad in (b'{"a": }', b"[1,]", b'{"a": 1} x', b"", b"   ", b'"\xff"', b"[" * 100000,
                b'{"a": 1}{}', "\ud800"):
        with pytest.raises((ValueError, RecursionError)) as theirs:
            json.loads(bad)
        with pytest.raises((ValueError, RecursionError)) as ours:
            fastjson.loads(bad)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def _big(x: str) -> bytes:
    """A submission of 1,000 objects holding brackets in their strings (``x``: the last of
    its field ``x``'s items): more ``{`` and ``[`` than ``MAX_CONTAINERS``, fewer objects
    and lists."""
    items = ",".join(['{"a": "s\\u00e9 [{ [{ [{", "b": 2.5, "c": null}'] * 999 + [x])
    return (f'{{"argv": ["true", "{{[" ], "env": {{"A": "b"}}, "x": [{items}]}}').encode()


@pytest.mark.parametrize("last", [
    '{"b": {}}', '{"a": 1, "a": 2}', '{"n": NaN}', '{"n": -Infinity}', '{"a": 1,}',
    '{"s": "\\ud800"}', '{"s": "\\udfff\\ud800"}', '[1 2]', '"unterminated'])
def test_the_python_scanner_and_the_c_one_agree_on_a_body_of_many_brackets(
        last: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of more ``{`` and ``[`` than ``MAX_CONTAINERS`` is parsed by the json module's
    Python scanner, which counts the objects and lists it makes: below the bound, the value,
    or the refusal (status, code, field and message), is the C scanner's."""
    import supervisor.serve.protocol as protocol

    body = _big(last)
    assert body.count(b"{") + body.count(b"[") > protocol.MAX_CONTAINERS

    def outcome() -> Any:
        try:
            return ("value", parse_json_body(body))
        except ApiError as e:
            return ("refused", e.status, e.code, e.field, str(e))

    import json.scanner

    made: list[Any] = []
    real = json.scanner.py_make_scanner
    monkeypatch.setattr(json.scanner, "py_make_scanner", lambda ctx: made.append(1) or real(ctx))
    python = outcome()
    assert made == [1]  # (the Python scanner parsed it)
    monkeypatch.setattr(protocol, "MAX_CONTAINERS", 1 << 40)
    assert outcome() == python and made == [1]
    if last == '{"b": {}}':
        assert python[0] == "value" and python[1]["x"][-1] == {"b": {}}
    else:
        assert python[0] == "refused" and python[1] == 400, python


@pytest.mark.parametrize("shape", [b"{}", b"[]", b'{"a": []}', b"[[[[[[[[]]]]]]]]"])
def test_a_body_of_more_objects_and_lists_than_a_request_holds_is_refused_once_past_them(
        shape: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by an independent attack: 1 MiB bodies of empty objects or lists one after
    another (each refused in the end) took another tenant's p99 to 61-123 ms, each parsed
    whole (375 ms of CPU by the Python scanner, 70-150 ms in one call holding the GIL by the
    C one).  Now refused at the object or list past ``MAX_CONTAINERS``, however large the
    body, naming the bound; a request's own fields hold a handful."""
    import json.decoder

    import supervisor.serve.protocol as protocol

    made = [0]
    for name in ("JSONObject", "JSONArray"):
        real = getattr(json.decoder, name)

        def counted(*args: Any, _real: Any = real) -> Any:
            made[0] += 1
            return _real(*args)

        monkeypatch.setattr(json.decoder, name, counted)
    body = b'{"argv": ["true"], "x": [' + b",".join([shape] * 400_000)[:1 << 20] + b"]}"
    with pytest.raises(ApiError) as e:
        parse_json_body(body)
    assert (e.value.status, e.value.code) == (400, "too_many_values"), e.value
    assert str(protocol.MAX_CONTAINERS) in str(e.value) and "objects and lists" in str(e.value)
    assert made[0] == protocol.MAX_CONTAINERS  # (the one past them refused before it is made)
    ok = b'{"argv": ["true"], "x": [' + b",".join([b"{}"] * (protocol.MAX_CONTAINERS - 3)) + b"]}"
    assert len(parse_json_body(ok)["x"]) == protocol.MAX_CONTAINERS - 3


def test_a_large_body_nested_too_deep_is_refused_by_either_scanner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor.serve.protocol as protocol

    body = b'{"argv": ["true"], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for containers in (protocol.MAX_CONTAINERS, 1 << 40):  # (too deep before too many)
        monkeypatch.setattr(protocol, "MAX_CONTAINERS", containers)
        with pytest.raises(ApiError) as e:
            parse_json_body(body)
        assert (e.value.status, e.value.code) == (400, "malformed_json")
