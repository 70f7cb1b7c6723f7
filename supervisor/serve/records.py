"""Task records in SQLite: one row per task, written at accept, start and end.

``state.db`` in the state directory; WAL; schema versioned with ``PRAGMA user_version`` (a
newer schema than this daemon knows is refused at start, with the fix).  Every call runs in one
worker thread, one at a time (``trio.to_thread.run_sync`` under a limiter of 1), never on the
trio thread: a slow disk delays records, not the event loop.  Writes are group-committed:
every write waiting at a moment goes into one transaction and one thread hop, so sixteen
busy clients cost about what one does; each caller still returns only once its own write is
committed.

The row keeps the request as accepted (``spec``), the submitter, the timestamps and the
result JSON (``TaskResult.to_dict()``, as it is).  Seams for restart adoption and retention
(the next issue): ``unfinished()`` lists rows an earlier run left without an end.  A task's output
files are ``output/<id>`` (stdout) and ``output/<id>.stderr`` beside the database.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import trio

__all__ = ["SCHEMA_VERSION", "Records", "RecordsError"]

SCHEMA_VERSION = 1
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- the task id is str(seq): never reused
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    peer_pid INTEGER,
    name TEXT,
    idempotency_key TEXT,
    spec TEXT NOT NULL,                      -- the submission, as accepted (JSON)
    state TEXT NOT NULL,                     -- queued | running | finished
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    pid INTEGER,                             -- the main process, once started
    leaf TEXT,                               -- the core's task id: the cgroup leaf's name
    outcome TEXT,
    exit_status INTEGER,                     -- what corral run would exit with
    result TEXT                              -- TaskResult.to_dict(), JSON
);
CREATE UNIQUE INDEX IF NOT EXISTS tasks_idempotency ON tasks (uid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_uid ON tasks (uid, seq);
"""

COLUMNS = ("seq", "uid", "gid", "peer_pid", "name", "idempotency_key", "spec", "state",
           "created_at", "started_at", "ended_at", "pid", "leaf", "outcome", "exit_status",
           "result")


class RecordsError(Exception):
    """The database cannot be used: names the file, the reason and the fix."""


class Records:
    """The daemon's task records.  Open with :meth:`open` (in a worker thread)."""

    def __init__(self, path: str, db: sqlite3.Connection) -> None:
        self.path = path
        self._db = db
        self._limiter = trio.CapacityLimiter(1)
        self._batch: list[_Write] = []
        self._flushing = False

    async def _write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Queue a write and return once it is committed.  The first writer to find no
        flush running flushes (its own write and every one queued meanwhile, batch after
        batch); the others wait for theirs.  Shielded: once asked for, a write is finished
        (a record is never half written)."""
        w = _Write(fn, args)
        self._batch.append(w)
        with trio.CancelScope(shield=True):
            if self._flushing:
                await w.done.wait()
            else:
                self._flushing = True
                try:
                    while self._batch:
                        batch, self._batch = self._batch, []
                        await self._call(_commit, self._db, batch)
                        for done in batch:
                            done.done.set()
                finally:
                    self._flushing = False
        if w.error is not None:
            raise w.error
        return w.result

    @classmethod
    async def open(cls, state_dir: str) -> Records:
        path = os.path.join(state_dir, "state.db")
        db = await trio.to_thread.run_sync(_connect, path)
        return cls(path, db)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter,
                                             abandon_on_cancel=False)

    async def accept(self, row: dict[str, Any]) -> str:
        """Write a new task's row (state queued); returns its id."""
        task_id: str = await self._write(_insert, row)
        return task_id

    async def started(self, task_id: str, started_at: float, pid: int | None,
                      leaf: str | None) -> None:
        await self._write(_update, task_id, {
            "state": "running", "started_at": started_at, "pid": pid, "leaf": leaf})

    async def ended(self, task_id: str, outcome: str, exit_status: int,
                    started_at: float | None, ended_at: float, result: dict[str, Any]) -> None:
        """The end row: the result JSON exactly as the core made it."""
        await self._write(_update, task_id, {
            "state": "finished", "outcome": outcome, "exit_status": exit_status,
            "started_at": started_at, "ended_at": ended_at, "result": json.dumps(result)})

    async def get(self, task_id: str) -> dict[str, Any] | None:
        return await self._call(_get, self._db, task_id)

    async def list_rows(self, uid: int | None, state: str | None,
                        limit: int) -> list[dict[str, Any]]:
        """Newest first; ``uid`` None means every uid."""
        return await self._call(_list, self._db, uid, state, limit)

    async def find_key(self, uid: int, key: str) -> dict[str, Any] | None:
        return await self._call(_find_key, self._db, uid, key)

    async def unfinished(self) -> list[dict[str, Any]]:
        """Rows without an end (an earlier run's, at start-up): the adoption seam."""
        return await self._call(_list_unfinished, self._db)

    async def close(self) -> None:
        await self._call(self._db.close)


class _Write:
    __slots__ = ("args", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _commit(db: sqlite3.Connection, batch: list[_Write]) -> None:
    """Every write of ``batch`` in one transaction (worker thread).  If the transaction
    fails, each write is retried alone, so that one bad write fails only its caller."""
    try:
        with db:
            for w in batch:
                w.result = w.fn(db, *w.args)
        return
    except sqlite3.Error:
        pass
    for w in batch:
        try:
            with db:
                w.result = w.fn(db, *w.args)
        except sqlite3.Error as e:
            w.error = RecordsError(f"writing the task records at {_path(db)}: {e}")


def _path(db: sqlite3.Connection) -> str:
    return str(db.execute("PRAGMA database_list").fetchone()[2])


def _connect(path: str) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RecordsError(
                f"{path} has schema version {version}; this corral knows up to "
                f"{SCHEMA_VERSION}: run the newer corral, or move the file aside to start "
                f"with empty records")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        with db:
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        os.chmod(path, 0o600)  # specs hold environments: root only
        return db
    except sqlite3.Error as e:
        raise RecordsError(f"cannot use the task records at {path}: {e}; check that the state "
                           f"directory is writable and the file is a corral database") from e


def _row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    row = {d[0]: v for d, v in zip(cursor.description, values, strict=True)}
    row["id"] = str(row.pop("seq"))
    for key in ("spec", "result"):
        if row.get(key) is not None:
            row[key] = json.loads(row[key])
    return row


def _insert(db: sqlite3.Connection, row: dict[str, Any]) -> str:
    row = dict(row, spec=json.dumps(row["spec"]), state="queued")
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    cur = db.execute(f"INSERT INTO tasks ({names}) VALUES ({marks})", tuple(row.values()))
    return str(cur.lastrowid)


def _update(db: sqlite3.Connection, task_id: str, values: dict[str, Any]) -> None:
    sets = ", ".join(f"{k} = ?" for k in values)
    db.execute(f"UPDATE tasks SET {sets} WHERE seq = ?", (*values.values(), int(task_id)))


def _get(db: sqlite3.Connection, task_id: str) -> dict[str, Any] | None:
    if not task_id.isdigit():
        return None
    cur = db.execute("SELECT * FROM tasks WHERE seq = ?", (int(task_id),))
    values = cur.fetchone()
    return None if values is None else _row(cur, values)


def _list(db: sqlite3.Connection, uid: int | None, state: str | None,
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
    cur = db.execute(f"SELECT {', '.join(c for c in COLUMNS if c != 'result')} FROM tasks "
                     f"{clause} ORDER BY seq DESC LIMIT ?", (*args, limit))
    return [_row(cur, v) for v in cur.fetchall()]


def _find_key(db: sqlite3.Connection, uid: int, key: str) -> dict[str, Any] | None:
    cur = db.execute("SELECT * FROM tasks WHERE uid = ? AND idempotency_key = ?", (uid, key))
    values = cur.fetchone()
    return None if values is None else _row(cur, values)


def _list_unfinished(db: sqlite3.Connection) -> list[dict[str, Any]]:
    cur = db.execute("SELECT * FROM tasks WHERE state != 'finished' ORDER BY seq")
    return [_row(cur, v) for v in cur.fetchall()]
