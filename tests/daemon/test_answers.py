"""Large answers: encoded in pieces at the caller's uid's turn, and exactly what one
json.dumps would have made (supervisor/serve/http.py:json_pieces); output frames made without
the JSON encoder (verbs/output.py:_data_line).  What it buys, another tenant's latency while
one asks for large answers, is measured by benchmarks/bench_tenants.py, not asserted here."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from daemon_util import RunningDaemon, User, as_user, raw
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import ApiError, Client
from supervisor.serve import rows
from supervisor.serve.daemontask import row_json
from supervisor.serve.http import json_pieces
from supervisor.serve.verbs.output import _data_line

Start = Callable[..., RunningDaemon]

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=12) | st.dictionaries(
    st.text(max_size=6), inner, max_size=12), max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(1, 5))
def test_the_pieces_are_exactly_what_one_dumps_makes(obj: Any, piece: int) -> None:
    pieces = list(json_pieces(obj, piece))
    assert "".join(pieces) == json.dumps(obj, separators=(",", ":"))


def test_no_piece_walks_more_than_its_share_of_a_long_list() -> None:
    argv = ["x" * 10] * 10_000
    pieces = list(json_pieces({"argv": argv, "spec": {"argv": argv}}, 1000))
    assert max(len(p) for p in pieces) <= 1000 * 13 + 1
    assert json.loads("".join(pieces)) == {"argv": argv, "spec": {"argv": argv}}


@given(st.sampled_from(["stdout", "stderr"]), st.integers(0, 2**62), st.binary(max_size=300))
def test_an_output_frame_is_the_json_of_its_fields(stream: str, offset: int,
                                                   data: bytes) -> None:
    line = _data_line(stream, offset, data)
    assert line.endswith(b"\n") and line == json.dumps(
        {"stream": stream, "offset": offset, "data": base64.b64encode(data).decode()},
        separators=(",", ":")).encode() + b"\n"


def test_a_tenants_large_answers_arrive_whole(start_daemon: Start, users: list[User]) -> None:
    """A task with a MiB of argv, shown in full, waited for and listed, and a session's
    large environment, each answered in pieces: every byte as one encoding would give."""
    d = start_daemon()
    argv = ["true", *(f"argument-{i:06d}" for i in range(45_000))]  # (~900 KB of JSON)
    big = "v" * 100_000  # (a variable may not pass 128 KiB: the kernel's limit for one)

    def ask() -> Any:
        with Client(d.socket, timeout=60) as c:
            t = c.submit(argv, wait=30)
            shown = c.show(t.id)
            waited = c.wait(t.id)
            s = c.open_session(env={"SMALL": "1"})
            done = c.exec(s["id"], "B=$(head -c 100000 /dev/zero | tr '\\0' v); export "
                                   'B1="$B" B2="$B" B3="$B" B4="$B" B5="$B" B6="$B"', wait=30)
            after = c.show_session(s["id"])
            return [t.argv == argv, shown.argv == argv, waited.argv == argv,
                    shown.result["argv"] == argv, done["result"]["outcome"],
                    [after["env"][f"B{i}"] == big for i in range(1, 7)]]

    assert as_user(users[0], ask) == [True, True, True, True, "succeeded",
                                       [True] * 6]


def test_a_large_answer_kept_once_made_is_still_shown_to_its_owner_alone(
        start_daemon: Start, users: list[User]) -> None:
    """A finished task's large answer is kept once made and sent again as it is (no read of
    its MiB-long row): to whoever may see the task, and no one else."""
    d = start_daemon()
    argv = ["true", *(f"argument-{i:06d}" for i in range(10_000))]  # (~200 KB of JSON)

    def mine() -> tuple[str, list[bool]]:
        with Client(d.socket, timeout=60) as c:
            t = c.submit(argv, wait=30)
            return t.id, [c.show(t.id).argv == argv for _ in range(3)]

    task_id, shown = as_user(users[0], mine)

    def theirs() -> int:
        with Client(d.socket, timeout=60) as c:
            try:
                c.show(task_id)
            except ApiError as e:
                return e.status
            return 200

    assert shown == [True] * 3
    assert as_user(users[1], theirs) == 404
    with Client(d.socket, timeout=60) as c:  # (root may see every task)
        assert c.show(task_id).argv == argv


def test_a_large_answer_from_the_records_is_the_rows_answer_value_for_value(
        start_daemon: Start, users: list[User]) -> None:
    """A finished task no longer in memory whose answer is large is put together from its
    record's texts (``daemontask.answer_text``: its request never decoded): its show, its
    wait and its output's last frame are, value for value, what the row decoded makes
    (``row_json``), for commands long, non-ASCII, with an environment kept apart, of a
    session, past the output's cap; and only to whoever may see the task."""
    d = start_daemon("--keep-finished", "1", "--output-cap", "1K")
    wide = ["printf", "%s", *(f"\u00e9\u4e2d-{i}" for i in range(8_000))]  # (~200 KB of JSON)
    env = {f"V{i}": "x" * 100 for i in range(700)}  # (~75 KB, kept apart)

    def make() -> list[str]:
        with Client(d.socket, timeout=60) as c:
            ids = [c.submit(wide, wait=30).id,
                   c.submit(["sh", "-c", "head -c 5000 /dev/zero; exit 3"], env=env,
                            wait=30).id]
            s = c.open_session()
            ids.append(c.exec(s["id"], "echo " + "w" * 70_000, wait=30)["id"])
            c.submit(["true"], wait=30)  # (the others evicted from memory)
            return ids

    ids = as_user(users[0], make)
    db = sqlite3.connect(f"file:{d.state}/state.db?mode=ro", uri=True)
    try:
        expected = {i: row_json(rows.get(db, i) or {}, output_dir=str(d.state / "output"))
                    for i in ids}
    finally:
        db.close()

    def get(path: str) -> Any:
        status, answer = raw(d, f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        assert status == 200, (path, answer)
        return answer

    def read() -> list[Any]:
        with Client(d.socket, timeout=60) as c:
            ends = [list(c.output(i))[-1] for i in ids]
            return [[get(f"/v1/tasks/{i}"), get(f"/v1/tasks/{i}/wait"),
                     [end.kind, end.result, end.exit_status]]
                    for i, end in zip(ids, ends, strict=True)]

    for (shown, waited, end), i in zip(as_user(users[0], read), ids, strict=True):
        assert shown == waited == expected[i], i
        assert end == ["end", expected[i]["result"], expected[i]["exit_status"]], i
    assert expected[ids[0]]["argv"] == wide and expected[ids[1]]["spec"]["env"] == env
    assert expected[ids[2]]["session"] and "w" * 70_000 in expected[ids[2]]["result"]["argv"][-1]

    def theirs() -> list[int]:
        statuses = []
        with Client(d.socket, timeout=60) as c:
            for i in ids:
                try:
                    c.show(i)
                    statuses.append(200)
                except ApiError as e:
                    statuses.append(e.status)
        return statuses

    assert as_user(users[1], theirs) == [404] * 3
