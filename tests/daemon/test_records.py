"""The records: versioned and migrated, one daemon per state directory, retention by age,
count and bytes while running (an expired task says so), results that outlive their client
and the daemon."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_util import CORRAL, RunningDaemon, User, as_users, raw, wait_for
from hypothesis import given
from hypothesis import strategies as st

from supervisor.client import ApiError, Client
from supervisor.serve.schema import _V1, SCHEMA_VERSION

Start = Callable[..., RunningDaemon]


def _v1_database(state: Path) -> None:
    """A state directory as corral serve with schema version 1 left it: one finished task
    with its output file, one queued task."""
    (state / "output").mkdir(parents=True)
    db = sqlite3.connect(state / "state.db", isolation_level=None)
    db.executescript(_V1)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA user_version=1")
    result = {"schema_version": 1, "id": "x-1", "outcome": "succeeded", "exit": {"code": 0},
              "output": {"stdout": {"total_bytes": 3}, "stderr": {"total_bytes": 0}}}
    now = time.time()
    db.execute("INSERT INTO tasks (uid, gid, peer_pid, spec, state, created_at, started_at, "
               "ended_at, outcome, exit_status, result) VALUES (0, 0, 1, ?, 'finished', ?, ?, "
               "?, 'succeeded', 0, ?)", (json.dumps({"argv": ["echo", "hi"]}), now - 5, now - 5,
                                         now - 4, json.dumps(result)))
    db.execute("INSERT INTO tasks (uid, gid, peer_pid, spec, state, created_at) VALUES (0, 0, 1, "
               "?, 'queued', ?)", (json.dumps({"argv": ["sh", "-c", "echo queued-ran"]}), now))
    db.close()
    (state / "output" / "1").write_bytes(b"hi\n")


def test_a_version_1_database_is_migrated_and_its_queued_task_runs(start_daemon: Start,
                                                                    tmp_path: Path) -> None:
    first = start_daemon()
    first.stop()
    state = tmp_path / "old-state"
    _v1_database(state)
    d = start_daemon("--state-dir", str(state), like=first)
    with d.client() as c:
        old = c.show("1")
        assert old.outcome == "succeeded" and [f.data for f in c.output("1")
                                                if f.kind == "data"] == [b"hi\n"]
        queued = c.wait("2")
        assert queued.outcome == "succeeded"
        assert b"".join(f.data for f in c.output("2")) == b"queued-ran\n"
        new = c.wait(c.submit(["true"]).id)
        assert new.id == "3"
    db = sqlite3.connect(f"file:{state}/state.db?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT bytes FROM tasks WHERE seq = 1").fetchone()[0] > 0
        # rewritten once to give deleted rows' pages back to the filesystem (incremental)
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    finally:
        db.close()


def test_version_5_moves_each_request_out_of_its_row_and_keeps_its_session(
        tmp_path: Path) -> None:
    from supervisor.serve.schema import MIGRATIONS, migrate

    db = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    for version in range(1, 5):
        MIGRATIONS[version](db, str(tmp_path))
    db.execute("PRAGMA user_version=4")
    for spec in ({"argv": ["true"]}, {"argv": ["pwd"], "session": {"id": 7, "cwd": "/"}}):
        db.execute("INSERT INTO tasks (uid, gid, spec, state, created_at) VALUES (0, 0, ?, "
                   "'queued', 1)", (json.dumps(spec),))
    assert migrate(db, "state.db", str(tmp_path)) == 4
    db.row_factory = sqlite3.Row
    tasks = [dict(r) for r in db.execute("SELECT * FROM tasks ORDER BY seq")]
    assert "spec" not in tasks[0] and [t["session"] for t in tasks] == [None, 7]
    joined = [(r["seq"], json.loads(r["spec"])["argv"], r["session"])
              for r in db.execute("SELECT * FROM task_rows ORDER BY seq")]
    assert joined == [(1, ["true"], None), (2, ["pwd"], 7)]
    db.close()


def test_each_uids_tombstones_are_counted_as_they_come_and_go(tmp_path: Path) -> None:
    """Found by an independent attack: a retention pass read every tombstone to weigh each
    uid's (three times when a start waited for the disk's room): 181 ms of the records'
    thread at 100,000 of them, run at each start of another tenant's while one task of the
    attacker's held room: its median 6 -> 70 ms.  Schema 10 keeps each uid's count and bytes
    (``expired_usage``) by triggers: migrated from version 9's tombstones, and equal to a
    count of them after tombstones are added (a key re-expired included), trimmed, re-keyed
    and deleted."""
    import random

    from supervisor.serve import rows
    from supervisor.serve.schema import MIGRATIONS, migrate

    db = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    for version in range(1, 10):
        MIGRATIONS[version](db, str(tmp_path))
    db.execute("PRAGMA user_version=9")
    rng = random.Random(7)
    for seq in range(1, 301):
        key = None if seq % 3 else f"key-{seq}-" + "\u00e9" * rng.randrange(40)
        db.execute("INSERT INTO expired (seq, uid, idempotency_key, expired_at, why) VALUES "
                   "(?, ?, ?, 1, 'count')", (seq, 1000 + seq % 4, key))

    def counted() -> dict[int, tuple[int, int]]:
        return {uid: (n, b) for uid, n, b in db.execute(
            f"SELECT uid, count(*), sum({rows._TOMB_SQL}) FROM expired GROUP BY uid")}

    def kept() -> dict[int, tuple[int, int]]:
        return {uid: (n, b) for uid, n, b in db.execute(
            "SELECT uid, n, bytes FROM expired_usage")}

    assert migrate(db, "state.db", str(tmp_path)) == 9
    assert kept() == counted() and len(kept()) == 4
    db.execute("BEGIN")
    gone = [{"id": str(seq), "uid": 1000 + seq % 5, "ended_at": 1.0,
             "idempotency_key": f"key-{seq - 300}-" if seq % 2 else None}
            for seq in range(301, 401)]  # (keys some tombstones of the same uid have)
    rows._tombstone(db, gone, "count", 2.0)
    rows._tombstone(db, gone[:10], "count", 3.0)  # (the same ones again)
    db.execute("COMMIT")
    assert kept() == counted() and 1004 in kept()
    assert rows.trim_tombstones(db, 120) > 0 and sum(n for n, _ in kept().values()) == 120
    assert kept() == counted()
    db.execute("UPDATE expired SET uid = 2000, idempotency_key = 'moved' WHERE seq = "
               "(SELECT max(seq) FROM expired)")
    assert kept() == counted()
    db.execute("DELETE FROM expired WHERE uid = 1001")
    assert kept() == counted() and 1001 not in kept()
    assert rows.held_bytes(db) == sum(b for _, b in counted().values())
    db.close()


def test_a_row_from_before_version_6_is_listed_from_its_request_cut_short(
        tmp_path: Path) -> None:
    """Schema 6 keeps each task's command as a listing shows it (``listed``); an older row has
    none, and its listing is cut out of the request by SQLite: the same entry, whatever the
    command's length, without its arguments taken whole."""
    from supervisor.serve import rows
    from supervisor.serve.daemontask import listed_json
    from supervisor.serve.schema import MIGRATIONS, migrate

    db = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    for version in range(1, 6):
        MIGRATIONS[version](db, str(tmp_path))
    db.execute("PRAGMA user_version=5")
    commands = [["true"], ["a" * 5000], ["x"] * 70, ["ab" * 1000, "c" * 3000, "d"],
                ["\u00e9" * 3000, "\u00fc" * 2000], [str(i) * (i * 7 % 300) for i in range(100)],
                ["a" * 4096], ["a" * 4095, "b", "c"], []]
    for argv in commands:
        seq = db.execute("INSERT INTO tasks (uid, gid, state, created_at) VALUES (0, 0, "
                         "'finished', 1)").lastrowid
        db.execute("INSERT INTO requests (seq, spec) VALUES (?, ?)",
                   (seq, json.dumps({"argv": argv})))
    assert migrate(db, "state.db", str(tmp_path)) == 5
    db.row_factory = sqlite3.Row
    listed = dict(rows.list_entries(db, None, None, 100))
    for seq, argv in enumerate(commands, 1):
        cut = db.execute(f"SELECT listed, argv FROM (SELECT {rows._LISTED} FROM tasks t JOIN "
                         f"requests r ON r.seq = t.seq WHERE t.seq = ?)", (seq,)).fetchone()
        assert cut[0] is None and sum(map(len, json.loads(cut[1]))) <= 2 * 4097  # (cut)
        entry = json.loads(listed[seq])  # (as a listing shows it)
        assert entry["argv"] == json.loads(listed_json(argv)), argv
        assert (entry["id"], entry["state"]) == (str(seq), "finished")
    db.close()


@pytest.mark.parametrize("name", [None, "", "plain", 'q"uote\\back', "\u00e9\u4e2d\U0001f600",
                                  "\x00\x1b]52;c;x\x07\n\t", "\ud800"])
@pytest.mark.parametrize("times", [(1, None, None), (1733430000.1234567, 1733430000.5, 2e-7),
                                   (0.1 + 0.2, 1e21, 123456789.0)])
def test_a_listing_entry_is_the_json_of_its_fields_whatever_they_hold(
        name: str | None, times: tuple[float, float | None, float | None]) -> None:
    """A listing's entries are JSON text made by hand, the command's kept JSON spliced in
    (``rows.listed_entry``): the text is valid JSON whose values are exactly the fields."""
    from supervisor.serve.rows import listed_entry, listed_json

    argv = ["echo", name or "", "\u00fc" * 2000]
    more = {"signals": [{"signal": "SIGTERM", "at": 1.5}], "queue_position": 3}
    text = listed_entry("12", "finished", listed_json(argv), 1000, 1000, name, *times, 4242,
                        "succeeded", 0, "7", json.dumps({"cwd": "/tmp", "env": ["A"]}), more)
    assert json.loads(text) == {
        "id": "12", "state": "finished", "argv": json.loads(listed_json(argv)), "uid": 1000,
        "gid": 1000, "name": name, "created_at": times[0], "started_at": times[1],
        "ended_at": times[2], "pid": 4242, "outcome": "succeeded", "exit_status": 0,
        "session": "7", "carried": {"cwd": "/tmp", "env": ["A"]}, **more}
    assert text.isascii()


def _serve_fails(tmp_path: Path, state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, "serve", "--socket", str(tmp_path / "never.sock"),
                           "--state-dir", str(state), *extra], capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_newer_schema_is_refused_at_start_with_the_fix(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / "state.db")
    db.execute("PRAGMA user_version=99")
    db.close()
    r = _serve_fails(tmp_path, state)
    assert r.returncode == 125, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert f"{state}/state.db has schema version 99" in line
    assert f"up to {SCHEMA_VERSION}" in line and "run the newer corral" in line, line
    assert not (tmp_path / "never.sock").exists()


def test_a_database_that_is_not_corrals_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / "state.db")
    db.execute("CREATE TABLE other (x)")
    db.commit()
    db.close()
    r = _serve_fails(tmp_path, state)
    assert r.returncode == 125 and "not corral's" in r.stderr, r.stderr


def test_one_daemon_per_state_directory(start_daemon: Start, tmp_path: Path) -> None:
    d = start_daemon()
    r = _serve_fails(tmp_path, d.state)
    assert r.returncode == 125, r.stderr
    assert f"another corral serve (pid {d.proc.pid}) uses the state directory " \
           f"{d.state}" in r.stderr, r.stderr


def test_retention_by_count_expires_the_oldest_and_says_so(start_daemon: Start) -> None:
    d = start_daemon("--retain-count", "2", "--keep-finished", "1")
    with d.client() as c:
        ids = [c.wait(c.submit(["echo", str(i)], idempotency_key=f"k{i}").id).id
               for i in range(4)]
        wait_for(lambda: len(c.list()) == 2, "retention to expire two tasks")
        assert [t.id for t in c.list()] == ids[:1:-1]
        with pytest.raises(ApiError) as caught:
            c.show(ids[0])
        e = caught.value
        assert e.status == 410 and e.code == "expired" and e.field == "id"
        assert f"task {ids[0]} expired" in e.message and "--retain-count" in e.message
        for call in (lambda: c.wait(ids[1]), lambda: list(c.output(ids[1])),
                     lambda: c.stop(ids[1])):
            with pytest.raises(ApiError) as caught:
                call()
            assert caught.value.code == "expired"
        with pytest.raises(ApiError) as caught:
            c.submit(["echo", "0"], idempotency_key="k0")
        assert caught.value.status == 410 and "use a new key" in caught.value.message
    shown = d.corral("show", ids[0])
    assert shown.returncode == 125
    assert f"corral: task {ids[0]} expired" in shown.stderr.decode()
    assert {n.split(".")[0] for n in os.listdir(d.state / "output")} == set(ids[2:])
    assert [r["seq"] for r in d.rows("expired")] == [int(i) for i in ids[:2]]


def test_retention_by_age_works_while_running(start_daemon: Start) -> None:
    d = start_daemon("--retain-age", "2s")
    with d.client() as c:
        t = c.wait(c.submit(["echo", "old"]).id)
        assert c.show(t.id).outcome == "succeeded"
        running = c.submit(["sleep", "600"])
        wait_for(lambda: not c.list(state="finished"), "the finished task to expire",
                 timeout=15)
        with pytest.raises(ApiError) as caught:
            c.show(t.id)
        assert "--retain-age" in caught.value.message
        assert c.show(running.id).state == "running"  # running tasks never expire
        c.stop(running.id, force=True)


def test_retention_by_bytes_counts_output_files(start_daemon: Start) -> None:
    limit = 100_000
    d = start_daemon("--retain-bytes", str(limit))
    with d.client() as c:
        ids = [c.wait(c.submit(["sh", "-c", "yes | head -c 20000"]).id).id for _ in range(6)]
        wait_for(lambda: len(c.list()) < 6, "retention by bytes")
        time.sleep(1.5)  # (one pass a second at most: let the last one run)
        kept = [t.id for t in c.list()]
    rows = {str(r["seq"]): r for r in d.rows()}
    assert kept == ids[::-1][:len(kept)], kept  # the newest are kept
    assert sum(rows[i]["bytes"] for i in kept) <= limit
    assert all(rows[i]["bytes"] > 20000 for i in kept)  # the output file counts
    assert {r["why"] for r in d.rows("expired")} == {"bytes"}
    assert not any((d.state / "output" / i).exists() for i in ids if i not in kept)


def test_results_outlive_the_client_and_the_daemon(start_daemon: Start) -> None:
    d = start_daemon()
    code = ("import sys; from supervisor.client import Client\n"
            f"c = Client({d.socket!r}); print(c.submit(['sh', '-c', 'echo kept; exit 4']).id)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    task_id = out.stdout.strip()  # the submitting client is gone
    with d.client() as c:
        assert c.wait(task_id).exit_status == 4
    d.stop()
    d2 = start_daemon(like=d)
    with Client(d2.socket) as c:
        t = c.show(task_id)
        assert t.outcome == "failed" and t.exit_status == 4
        assert b"".join(f.data for f in c.output(task_id)) == b"kept\n"


def test_output_files_without_a_record_are_removed_at_start(start_daemon: Start) -> None:
    d = start_daemon()
    with d.client() as c:
        kept = c.wait(c.submit(["echo", "x"]).id).id
    d.stop()
    for name in ("77", "77.stderr", "77.tail"):
        (d.state / "output" / name).write_bytes(b"left by an interrupted retention pass")
    start_daemon(like=d)
    assert {n.split(".")[0] for n in os.listdir(d.state / "output")} == {kept}


def test_a_sessions_commands_keep_its_environment_once_and_expire_it_with_the_last(
        start_daemon: Start) -> None:
    """Each command of a session runs with the session's environment, and its request says
    so; the records keep a large environment once for every request naming the same (schema
    9: 8.7 KiB a command of a session with a 3.9 KiB environment, 4.9 after), each request
    read back whole, in memory or from the records, and an environment goes with the last
    request naming it.  A small one stays in its request."""
    d = start_daemon("--retain-count", "4", "--keep-finished", "1")
    opened = {f"VAR_{i}": f"value {i} " * 8 for i in range(40)}
    with d.client() as c:
        sid = c.open_session(env=opened)["id"]
        commands = [c.exec(sid, "true", wait="20s")["id"] for _ in range(3)]
        carried = c.show_session(sid)["env"]
        small = c.wait(c.submit(["true"], env={"A": "1"}).id).id
        envs = d.rows("envs")
        requests = {str(r["seq"]): r for r in d.rows("requests")}
        # (the first command ran with the opener's; the next ones with what it carried)
        assert sorted(json.loads(e["env"]) == opened for e in envs) == [False, True]
        assert {requests[i]["env"] for i in commands} == {e["hash"] for e in envs}
        assert all("env" not in json.loads(requests[i]["spec"]) for i in commands)
        assert requests[small]["env"] is None
        assert json.loads(requests[small]["spec"])["env"] == {"A": "1"}
        for i, env in zip(commands, (opened, carried, carried), strict=True):
            shown = c.show(i)
            assert shown.spec is not None and shown.spec["env"] == env, i
            assert shown.spec["session"]["id"] == sid and shown.outcome == "succeeded"
        for _ in range(4):  # (retention keeps 4: the session's commands go)
            c.wait(c.submit(["true"]).id)
        wait_for(lambda: not any(r["session"] for r in d.rows("tasks")),
                 "retention to expire the session's commands")
        assert d.rows("envs") == []


@given(st.dictionaries(st.text(), st.none() | st.integers() | st.text() | st.lists(st.text())),
       st.dictionaries(st.text(), st.text()))
def test_a_request_kept_apart_from_its_environment_reads_back_as_it_was(
        spec: dict[str, Any], env: dict[str, str]) -> None:
    """``rows.with_env`` puts a request's environment, kept apart (schema 9), back into the
    request's JSON text: the same request, whatever the two hold."""
    from supervisor.serve.protocol import dumps_in_slices, dumps_value_in_slices
    from supervisor.serve.rows import with_env

    spec.pop("env", None)
    for text in (json.dumps(spec), dumps_in_slices(spec)):
        assert json.loads(with_env(text, dumps_value_in_slices(env))) == {**spec, "env": env}


def test_a_sessions_command_is_listed_as_its_shell_runs_it(start_daemon: Start) -> None:
    """A listing (and ``corral ps``) showed a session's command as the script corral wraps it
    in (``bash -c __corral_command=$1...``, ~400 characters of every command's row, none of
    them the command): it is listed as ``[shell, "-c", command]``, from memory and from the
    records alike, and ``show`` has the whole argv."""
    d = start_daemon("--keep-finished", "1")
    with d.client() as c:
        sid = c.open_session(shell="/bin/sh")["id"]
        first = c.exec(sid, "echo 'one two'", wait="20s")["id"]
        last = c.exec(sid, "true", wait="20s")["id"]
        listed = {t.id: t.argv for t in c.list(session=sid)}
        shown = c.show(first)
    assert listed == {first: ["/bin/sh", "-c", "echo 'one two'"],
                      last: ["/bin/sh", "-c", "true"]}  # (the first from the records)
    assert shown.argv[:2] == ["/bin/sh", "-c"] and len(shown.argv) == 5
    assert shown.argv[4] == "echo 'one two'" and "__corral_command" in shown.argv[2]
    assert [len(r["listed"]) < 40 for r in d.rows("tasks")] == [True, True]
    ps = d.corral("ps")
    assert ps.returncode == 0 and "/bin/sh -c echo 'one two'" in ps.stdout.decode()


def test_a_queued_task_with_its_environment_kept_apart_runs_with_it_after_a_crash(
        start_daemon: Start) -> None:
    """A queued request is read back from the records at the next start and run as it was
    accepted: its environment, kept apart from it (schema 9), is back in it, and the same
    request with its idempotency key is still the same task (not a 409 conflict)."""
    d = start_daemon("--max-running", "1")
    env = {f"VAR_{i}": f"value {i} " * 8 for i in range(40)}
    command = ["sh", "-c", 'printf "%s|%s" "$VAR_0" "$VAR_39"']
    with d.client() as c:
        c.submit(["sleep", "600"])
        queued = c.submit(command, env=env, idempotency_key="apart")
        assert queued.state == "queued"
    assert [r["env"] is not None for r in d.rows("requests")] == [False, True]
    d.kill()
    d2 = start_daemon(like=d)
    with d2.client() as c:
        done = c.wait(queued.id, timeout=30)
        assert done.outcome == "succeeded" and done.result is not None
        assert done.result["output"]["stdout"]["head"] == f"{env['VAR_0']}|{env['VAR_39']}"
        again = c.submit(command, env=env, idempotency_key="apart")
        assert again.id == queued.id


def test_a_rows_bytes_count_what_its_records_keep_escapes_and_all(start_daemon: Start) -> None:
    """Retention and the disk's room go by each row's ``bytes``: a request was counted by
    its body, and kept as JSON whose escapes make a character outside ASCII six or twelve
    bytes (a tenant's emoji filled a state disk at three times what the ledger said, and every
    uid was refused), and a session command's ``carried`` was not counted at all."""
    d = start_daemon()
    names = [f"V{i:03d}_" + "x" * 96 for i in range(60)]
    # (sent as UTF-8, as any client may: 4 bytes an emoji in the body, 12 in the records)
    body = json.dumps({"argv": ["true", "\U0001f600" * 20000], "wait": "30s"},
                      ensure_ascii=False).encode()
    status, task = raw(d, b"POST /v1/tasks HTTP/1.1\r\nHost: corral\r\nContent-Length: "
                       b"%d\r\n\r\n%s" % (len(body), body))
    assert status == 200 and len(body) < 81_000
    with d.client() as c:
        sid = c.open_session()["id"]
        command = c.exec(sid, "".join(f"export {n}=1; " for n in names), wait="20s")
    assert task["outcome"] == "succeeded" and command["outcome"] == "succeeded"
    db = sqlite3.connect(f"file:{d.state}/state.db?mode=ro", uri=True)
    kept = dict(db.execute(
        "SELECT t.seq, length(r.spec) + coalesce(length(e.env), 0) + length(t.result) + "
        "length(t.listed) + coalesce(length(t.carried), 0) + coalesce(length(t.rlimits), 0) "
        "FROM tasks t JOIN requests r ON r.seq = t.seq LEFT JOIN envs e ON e.hash = r.env"))
    counted = dict(db.execute("SELECT seq, bytes FROM tasks"))
    db.close()
    assert kept[int(task["id"])] > 240_000
    for seq in (int(task["id"]), int(command["id"])):
        assert counted[seq] >= kept[seq], (seq, counted[seq], kept[seq])


def test_a_tenants_rows_bytes_are_what_their_pages_take(start_daemon: Start,
                                                        users: list[User]) -> None:
    """Found by an independent attack: the disk's ledger counted what a row keeps, but SQLite
    keeps whole rows in a page (a row of 2.1 KB takes a 4 KiB page alone), and a tenant's
    `true` (its result and its limits, ~2.9 KB) was counted 3.2 KB and took 4.4: a state disk
    filled a third faster than the ledger said.  Each row now counts its share of its
    table's pages; root's and a tenant's rows, by SQLite's own count (dbstat)."""
    d = start_daemon()

    def run_true(n: int) -> None:
        with Client(d.socket) as c:
            for _ in range(n):
                c.submit(["true"], wait="30s")

    as_users([(None, lambda: run_true(150)), (users[0], lambda: run_true(150))])
    d.stop()
    db = sqlite3.connect(f"file:{d.state}/state.db?mode=ro", uri=True)
    (rows, counted), = db.execute("SELECT count(*), sum(bytes) FROM tasks")
    (pages,), = db.execute("SELECT sum(pgsize) FROM dbstat WHERE name IN "
                           "(SELECT name FROM sqlite_schema WHERE tbl_name IN "
                           "('tasks', 'requests', 'envs'))")
    db.close()
    assert rows == 300 and counted >= 0.97 * pages, (counted / rows, pages / rows)


def test_a_commands_carried_names_are_bounded_and_a_listing_shows_them_cut(
        start_daemon: Start) -> None:
    """A session command's ``carried`` names every variable it set: 500 names of a thousand
    characters made it half a MB, in every listing of it (80 such commands made one listing
    216 MB, and the daemon 1.4 GB).  It names 2 KiB of them and counts the rest
    (``omitted``); a listing shows it cut to about 1 KiB (``"cut": true``); ``show`` has it
    as kept."""
    d = start_daemon()
    names = [f"V{i:03d}_" + "x" * 200 for i in range(200)]
    with d.client() as c:
        sid = c.open_session()["id"]
        answer = c.exec(sid, "".join(f"export {n}=1; " for n in names), wait="20s")
        carried = answer["carried"]
        listed = next(t for t in c.list(session=sid) if t.id == answer["id"])
        shown = c.show(answer["id"])
        env = c.show_session(sid)["env"]
    assert all(n in env for n in names)  # (every one carried: only the list is cut)
    assert carried["set"] == names[:len(carried["set"])] and 8 <= len(carried["set"]) < 12
    assert carried["omitted"] == 200 - len(carried["set"])
    assert len(json.dumps(carried["set"])) <= 2048
    assert shown.carried == carried
    assert listed.carried is not None and listed.carried["cut"] is True
    assert len(json.dumps(listed.carried, separators=(",", ":"))) <= 1100
    assert listed.carried["set"] == names[:len(listed.carried["set"])]
