"""The records' schema and its migrations (pure sqlite3, run in the records' worker thread).

``PRAGMA user_version`` is the schema's version.  A new database is made at version 1 and
migrated like any other, so every migration runs on every fresh start (and the tests).  A
database newer than :data:`SCHEMA_VERSION` is refused: an older corral must not write rows it
does not understand.  Each migration runs in one transaction with its version bump: a crash or a
full disk in the middle leaves the database at the version before, never half migrated.

Versions::

    1  tasks (one row per task: accept, start, end)
    2  tasks.groups (the submitter's supplementary groups, to run a queued task after a
       restart as it was submitted), tasks.run (which daemon run started it), tasks.bytes
       (what a finished task holds on disk, for retention), tasks.notified (the completion
       callback: 0 pending, 1 delivered); the state "starting" (written before the spawn, so
       a task is never started twice); runs (each daemon run: its cgroup root, how it ended);
       expired (what retention removed, so that a late request is told so)
    3  tasks.rlimits (a non-root submitter's resource limits when it submitted, JSON
       ``{"NOFILE": [soft, hard], ...}``: a queued task run after a restart gets no more
       than its submitter had; NULL for root's tasks and for rows of earlier versions)
    4  tasks.carried (a session's command: the directory and environment it carried over);
       sessions (one row per session: its owner, shell, directory and environment)
    5  the request moves out of ``tasks`` into ``requests`` (``spec``): SQLite rewrites a
       whole row, overflow pages and all, at each update, and a task's row is updated at its
       start and its end (a request of a MiB was written four times over); tasks.session (the
       session's id, indexed: a session's commands are found without reading requests);
       the view ``task_rows`` joins the two as one row
    6  tasks.listed (the command as a listing shows it)
    7  runs.room (the output's room the run measured, and grew to: a later run on a disk
       something else has filled takes no less: ``state.OutputDisk.measure``)
    8  no table changes: a result's capability lists are kept as their masks
       (``daemontask.kept_result``), which an older corral would serve as they are
    9  envs (a request's environment, once for every request of its uid naming the same: each
       command of a session carried the session's whole environment in its request, and a
       KiB of it was written again with every ``true``); requests.env (its hash, or NULL:
       the environment is in ``spec``, as in every row before); the view ``task_rows`` gives
       it beside the request (``spec_env``), which ``rows.row_of`` puts back in
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

__all__ = ["SCHEMA_VERSION", "SchemaError", "migrate"]

SCHEMA_VERSION = 10

_V1 = """
CREATE TABLE tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- the task id is str(seq): never reused
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    peer_pid INTEGER,
    name TEXT,
    idempotency_key TEXT,
    spec TEXT NOT NULL,                      -- the submission, as accepted (JSON)
    state TEXT NOT NULL,                     -- queued | starting | running | finished
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    pid INTEGER,                             -- the main process, once started
    leaf TEXT,                               -- the core's task id: the cgroup leaf's name
    outcome TEXT,
    exit_status INTEGER,                     -- what corral run would exit with
    result TEXT                              -- TaskResult.to_dict(), JSON
);
CREATE UNIQUE INDEX tasks_idempotency ON tasks (uid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_uid ON tasks (uid, seq);
"""

_V2 = """
ALTER TABLE tasks ADD COLUMN groups TEXT;          -- JSON list of gids
ALTER TABLE tasks ADD COLUMN run INTEGER;          -- runs.id of the run that started it
ALTER TABLE tasks ADD COLUMN bytes INTEGER;        -- on disk once finished: row + output
ALTER TABLE tasks ADD COLUMN notified INTEGER;     -- callback: 0 pending, 1 done, NULL none
CREATE INDEX tasks_unfinished ON tasks (state) WHERE state != 'finished';
CREATE INDEX tasks_finished ON tasks (ended_at, seq) WHERE state = 'finished';
CREATE INDEX tasks_notify ON tasks (notified) WHERE notified = 0;
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    root TEXT,                               -- the supervisor's cgroup root
    ended_at REAL,
    ended TEXT                               -- stopped | handed_over; NULL: running or died
);
CREATE TABLE expired (
    seq INTEGER PRIMARY KEY,                 -- the task's id
    uid INTEGER NOT NULL,
    idempotency_key TEXT,
    ended_at REAL,
    expired_at REAL NOT NULL,
    why TEXT NOT NULL                        -- age | count | bytes
);
CREATE UNIQUE INDEX expired_idempotency ON expired (uid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""

_V3 = """
ALTER TABLE tasks ADD COLUMN rlimits TEXT;        -- the submitter's limits (JSON), non-root
"""

_V4 = """
ALTER TABLE tasks ADD COLUMN carried TEXT;        -- a session's command: what it carried over
CREATE TABLE sessions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- the session id is str(seq): never reused
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    groups TEXT,                             -- JSON list of gids
    created_at REAL NOT NULL,
    closed_at REAL,                          -- NULL: open
    shell TEXT NOT NULL,
    cwd TEXT NOT NULL,                       -- where its next command starts
    env TEXT,                                -- JSON: the environment carried (NULL: none yet)
    defaults TEXT                            -- JSON: time_limit, grace, properties, env asked
);
CREATE INDEX sessions_open ON sessions (uid) WHERE closed_at IS NULL;
"""


_V5 = """
CREATE TABLE requests (
    seq INTEGER PRIMARY KEY,                 -- the task's id (tasks.seq)
    spec TEXT NOT NULL                       -- the submission, as accepted (JSON)
);
INSERT INTO requests (seq, spec) SELECT seq, spec FROM tasks;
ALTER TABLE tasks DROP COLUMN spec;
ALTER TABLE tasks ADD COLUMN session INTEGER;      -- the session's id, for its commands
UPDATE tasks SET session = (SELECT json_extract(r.spec, '$.session.id') FROM requests r
                            WHERE r.seq = tasks.seq);
CREATE INDEX tasks_session ON tasks (session, seq) WHERE session IS NOT NULL;
CREATE VIEW task_rows AS SELECT t.*, r.spec AS spec FROM tasks t JOIN requests r
                                                       ON r.seq = t.seq;
"""


# the command as a listing shows it, made at acceptance (JSON: rows.listed_argv), so
# that a listing reads no request: a listing of a thousand tasks of a MiB of arguments each
# made SQLite hand over every argument whole, 0.8 GB of the daemon's memory for one request
# (an independent attack).  Older rows have none: theirs is cut out of the request in SQL.
_V6 = """
ALTER TABLE tasks ADD COLUMN listed TEXT;
"""


# the output's room (state.OutputDisk): a start on a disk a tenant's own files had filled
# measured a room of a few KB, and retention expired every uid's results for the queued tasks
# waiting for it (an independent attack); the next run takes the room an earlier one had
_V7 = """
ALTER TABLE runs ADD COLUMN room INTEGER;
"""


# a request's environment kept apart from it, once however many requests name the same
# (``rows.insert``; removed with the last request naming it, ``rows._tombstone``)
_V9 = """
CREATE TABLE envs (
    id INTEGER PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,               -- of the JSON text (rows.env_apart)
    env TEXT NOT NULL                        -- the environment (JSON object)
);
ALTER TABLE requests ADD COLUMN env TEXT;          -- envs.hash; NULL: in spec itself
CREATE INDEX requests_env ON requests (env) WHERE env IS NOT NULL;
DROP VIEW task_rows;
CREATE VIEW task_rows AS SELECT t.*, r.spec AS spec, e.env AS spec_env FROM tasks t
    JOIN requests r ON r.seq = t.seq LEFT JOIN envs e ON e.hash = r.env;
"""

# each uid's tombstones, counted and weighed as they come and go (a retention pass read them
# whole each time: 40 ms at 100,000 tombstones, and a pass that a start waiting for the disk's
# room ran took 181 ms of the records' thread, every uid's writes behind it: an independent
# attack).  A tombstone costs what ``rows.tomb_bytes`` says: TOMB_BYTES (64) and twice its key.
_V10 = """
CREATE TABLE expired_usage (
    uid INTEGER PRIMARY KEY,
    n INTEGER NOT NULL,                      -- its tombstones
    bytes INTEGER NOT NULL                   -- what they take (rows.tomb_bytes)
);
INSERT INTO expired_usage SELECT uid, count(*),
    sum(64 + 2 * coalesce(length(CAST(idempotency_key AS BLOB)), 0)) FROM expired GROUP BY uid;
CREATE TRIGGER expired_added AFTER INSERT ON expired BEGIN
    INSERT INTO expired_usage (uid, n, bytes) VALUES (NEW.uid, 1,
        64 + 2 * coalesce(length(CAST(NEW.idempotency_key AS BLOB)), 0))
    ON CONFLICT (uid) DO UPDATE SET n = n + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER expired_removed AFTER DELETE ON expired BEGIN
    UPDATE expired_usage SET n = n - 1,
        bytes = bytes - (64 + 2 * coalesce(length(CAST(OLD.idempotency_key AS BLOB)), 0))
    WHERE uid = OLD.uid;
    DELETE FROM expired_usage WHERE uid = OLD.uid AND n <= 0;
END;
CREATE TRIGGER expired_changed AFTER UPDATE OF uid, idempotency_key ON expired BEGIN
    UPDATE expired_usage SET n = n - 1,
        bytes = bytes - (64 + 2 * coalesce(length(CAST(OLD.idempotency_key AS BLOB)), 0))
    WHERE uid = OLD.uid;
    DELETE FROM expired_usage WHERE uid = OLD.uid AND n <= 0;
    INSERT INTO expired_usage (uid, n, bytes) VALUES (NEW.uid, 1,
        64 + 2 * coalesce(length(CAST(NEW.idempotency_key AS BLOB)), 0))
    ON CONFLICT (uid) DO UPDATE SET n = n + 1, bytes = bytes + excluded.bytes;
END;
"""


class SchemaError(Exception):
    """The database's schema cannot be used by this corral (the message has the fix)."""


def _script(db: sqlite3.Connection, text: str) -> None:
    """Each statement of ``text`` in the open transaction (``executescript`` would commit it
    first, and a migration must be one transaction)."""
    pending = ""
    for line in text.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            db.execute(pending)
            pending = ""


def _to_v2(db: sqlite3.Connection, state_dir: str) -> None:
    _script(db, _V2)
    # finished rows get their size now: the row's JSON and the output files beside it
    rows = db.execute("SELECT seq, length(spec) + coalesce(length(result), 0) FROM tasks "
                      "WHERE state = 'finished'").fetchall()
    for seq, size in rows:
        size += output_bytes(os.path.join(state_dir, "output", str(seq)))
        db.execute("UPDATE tasks SET bytes = ? WHERE seq = ?", (size, seq))


# version reached -> the step from the version before (run inside one transaction)
MIGRATIONS: dict[int, Callable[[sqlite3.Connection, str], None]] = {
    1: lambda db, _: _script(db, _V1),
    2: _to_v2,
    3: lambda db, _: _script(db, _V3),
    4: lambda db, _: _script(db, _V4),
    5: lambda db, _: _script(db, _V5),
    6: lambda db, _: _script(db, _V6),
    7: lambda db, _: _script(db, _V7),
    8: lambda db, _: None,  # (the rows' result JSON: its reader changed, not the tables)
    9: lambda db, _: _script(db, _V9),
    10: lambda db, _: _script(db, _V10),
}


def output_bytes(stdout_path: str, streams: tuple[str, ...] = ("stdout", "stderr")) -> int:
    """Bytes a task's output files take: stdout, stderr and their kept tails (of ``streams``
    alone: those that printed, when the caller knows; a silent one has no file)."""
    total = 0
    suffixes = {"stdout": ("", ".tail"), "stderr": (".stderr", ".stderr.tail")}
    for suffix in (x for stream in streams for x in suffixes[stream]):
        try:
            total += os.stat(stdout_path + suffix).st_blocks * 512
        except OSError:
            continue
    return total


def migrate(db: sqlite3.Connection, path: str, state_dir: str) -> int:
    """Bring ``db`` (autocommit connection) to :data:`SCHEMA_VERSION`; the version it had.
    SchemaError for a newer schema, or a file that is a database but not corral's."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{path} has schema version {version}; this corral knows versions up to "
            f"{SCHEMA_VERSION}: run the newer corral that wrote it, or move the file aside "
            f"(mv {path} {path}.v{version}) to start with empty records")
    if version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise SchemaError(
            f"{path} is an SQLite database, but not corral's (it has tables and no schema "
            f"version); give --state-dir a directory of corral's own")
    for target in range(version + 1, SCHEMA_VERSION + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[target](db, state_dir)
            db.execute(f"PRAGMA user_version={target}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return version
