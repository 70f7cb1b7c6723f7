"""The records' SQL: pure functions of an sqlite3 connection (run in the records' worker
thread by ``records.Records``, never on the trio thread).

A row comes back as a dict of its columns, ``seq`` as ``id`` (a string: the task's id) and the
JSON columns (``spec``, ``result``, ``groups``) decoded.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, NamedTuple

__all__ = ["COLUMNS", "MAX_TOMBSTONES", "Retention", "execute", "expire", "find_key", "get",
           "insert", "insert_run", "list_rows", "row_of", "runs", "select", "update"]

MAX_TOMBSTONES = 100_000  # expired ids remembered (~50 bytes each); the oldest go first
COLUMNS = ("seq", "uid", "gid", "peer_pid", "groups", "name", "idempotency_key", "spec",
           "state", "created_at", "started_at", "ended_at", "pid", "leaf", "run", "outcome",
           "exit_status", "bytes", "notified", "result")


class Retention(NamedTuple):
    """How long finished tasks are kept (records and output files); None: no limit."""

    max_age: float | None = 7 * 86400.0
    max_count: int | None = 10_000
    max_bytes: int | None = 2 << 30


def row_of(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    row = {d[0]: v for d, v in zip(cursor.description, values, strict=True)}
    if "seq" in row:
        row["id"] = str(row.pop("seq"))
    for key in ("spec", "result", "groups"):
        if row.get(key) is not None:
            row[key] = json.loads(row[key])
    return row


def select(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    cur = db.execute(sql, args)
    return [row_of(cur, v) for v in cur.fetchall()]


def execute(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> None:
    db.execute(sql, args)


def insert(db: sqlite3.Connection, row: dict[str, Any]) -> str:
    row = dict(row, spec=json.dumps(row["spec"]), groups=json.dumps(row.get("groups") or []))
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    cur = db.execute(f"INSERT INTO tasks ({names}) VALUES ({marks})", tuple(row.values()))
    return str(cur.lastrowid)


def insert_run(db: sqlite3.Connection, pid: int, now: float) -> int:
    cur = db.execute("INSERT INTO runs (pid, started_at) VALUES (?, ?)", (pid, now))
    assert cur.lastrowid is not None
    return cur.lastrowid


def runs(db: sqlite3.Connection) -> dict[int, dict[str, Any]]:
    cur = db.execute("SELECT * FROM runs")
    return {r["id"]: r for r in (row_of(cur, v) for v in cur.fetchall())}


def update(db: sqlite3.Connection, seq: int, values: dict[str, Any]) -> None:
    sets = ", ".join(f"{k} = ?" for k in values)
    db.execute(f"UPDATE tasks SET {sets} WHERE seq = ?", (*values.values(), seq))


def get(db: sqlite3.Connection, task_id: str) -> dict[str, Any] | None:
    if not (task_id.isascii() and task_id.isdigit()):
        return None
    rows = select(db, "SELECT * FROM tasks WHERE seq = ?", (int(task_id),))
    return rows[0] if rows else None


def list_rows(db: sqlite3.Connection, uid: int | None, state: str | None,
          limit: int) -> list[dict[str, Any]]:
    where: list[str] = []
    args: list[Any] = []
    if uid is not None:
        where.append("uid = ?")
        args.append(uid)
    if state is not None:
        where.append("state = ?")
        args.append(state)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    columns = ", ".join(c for c in COLUMNS if c != "result")
    return select(db, f"SELECT {columns} FROM tasks {clause} ORDER BY seq DESC LIMIT ?",
                   (*args, limit))


def find_key(db: sqlite3.Connection, uid: int, key: str) -> dict[str, Any] | None:
    rows = select(db, "SELECT * FROM tasks WHERE uid = ? AND idempotency_key = ?", (uid, key))
    if rows:
        return rows[0]
    gone = select(db, "SELECT seq, expired_at FROM expired WHERE uid = ? AND "
                   "idempotency_key = ?", (uid, key))
    return {**gone[0], "state": "expired"} if gone else None


_EXPIRED = """
WITH f AS (
    SELECT seq, uid, idempotency_key, ended_at,
           row_number() OVER w AS n, sum(coalesce(bytes, 0)) OVER w AS total
    FROM tasks WHERE state = 'finished'
    WINDOW w AS (ORDER BY ended_at DESC, seq DESC)
)
SELECT seq, uid, idempotency_key, ended_at,
       CASE WHEN ended_at < ? THEN 'age' WHEN n > ? THEN 'count' ELSE 'bytes' END AS why
FROM f WHERE ended_at < ? OR n > ? OR total > ?
"""


def expire(db: sqlite3.Connection, policy: Retention, now: float) -> list[dict[str, Any]]:
    inf = float("inf")
    oldest = -inf if policy.max_age is None else now - policy.max_age
    count = 1 << 62 if policy.max_count is None else policy.max_count
    size = 1 << 62 if policy.max_bytes is None else policy.max_bytes
    gone = select(db, _EXPIRED, (oldest, count, oldest, count, size))
    for g in gone:
        db.execute("INSERT OR REPLACE INTO expired (seq, uid, idempotency_key, ended_at, "
                   "expired_at, why) VALUES (?, ?, ?, ?, ?, ?)",
                   (int(g["id"]), g["uid"], g["idempotency_key"], g["ended_at"], now,
                    g["why"]))
        db.execute("DELETE FROM tasks WHERE seq = ?", (int(g["id"]),))
    if gone:
        db.execute("DELETE FROM expired WHERE seq IN (SELECT seq FROM expired ORDER BY seq "
                   "DESC LIMIT -1 OFFSET ?)", (MAX_TOMBSTONES,))
    return gone
