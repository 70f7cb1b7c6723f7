"""The records' SQL: pure functions of an sqlite3 connection (run in the records' worker
thread by ``records.Records``, never on the trio thread).

A row comes back as a dict of its columns, ``seq`` as ``id`` (a string: the task's id) and the
JSON columns (``spec``, ``result``, ``groups``, ``rlimits``, ``carried``; a session's ``env``,
``defaults``) decoded.
"""

from __future__ import annotations

import collections
import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "COLUMNS",
    "MAX_TOMBSTONES",
    "Expired",
    "Retention",
    "answer_parts",
    "close_session",
    "compact_json",
    "ended_in_session",
    "execute",
    "expire",
    "fair_level",
    "find_key",
    "get",
    "get_session",
    "held_bytes",
    "in_pages",
    "insert",
    "insert_run",
    "insert_session",
    "json_bytes",
    "key_bytes",
    "keyed",
    "last_foreground",
    "limits_bytes",
    "list_entries",
    "list_sessions",
    "listed_argv",
    "listed_carried",
    "listed_entry",
    "listed_json",
    "names_within",
    "open_sessions",
    "owner",
    "row_bytes",
    "row_of",
    "runs",
    "select",
    "tomb_bytes",
    "trim_tombstones",
    "update",
    "update_session",
]

MAX_TOMBSTONES = 100_000  # expired ids remembered at most; each uid's oldest go first
# What a task's row takes on disk beside what it keeps (its result, listing, what it carried,
# its submitter's limits: ``end_values``): its other columns (its leaf's path, times, ids) and
# its entries in the tasks' indexes, and its idempotency key twice more (the column and the
# unique index); a tombstone: its columns, its key twice (the column and its index).  Measured
# with SQLite's dbstat (500 rows of `true`: root's 2,392 bytes of pages a task, a tenant's
# 4,440), a tombstone ~40 bytes, each plus its key twice.
ROW_COLUMNS = 128
ROW_INDEXES = 128
TOMB_BYTES = 64
# SQLite's page (the records' default), and what of it a table's leaf gives its rows: a leaf
# holds whole rows only, so a row of 2.1 KB takes a page alone (a tenant's `true` was counted
# 3.2 KB and took 4.4: its result and limits are ~2.9 KB); a row past that overflows into pages
# of PAGE - 4
PAGE = 4096
PAGE_ROWS = 4061


def key_bytes(key: str | None) -> int:
    return 0 if key is None else len(key.encode("utf-8", "surrogatepass"))


def in_pages(size: int) -> int:
    """What a row of ``size`` bytes takes of its table's pages (:data:`PAGE_ROWS`): its share
    of a page, rows sharing one whole, or the pages it overflows into."""
    cell = size + 12  # (its header and its rowid)
    if cell <= PAGE_ROWS:
        return PAGE // (PAGE_ROWS // cell)
    return PAGE * -(-cell // (PAGE - 4))


def limits_bytes(rlimits: Mapping[str, Any] | None) -> int:
    """What a submitter's limits take in its task's row (its ``rlimits`` column), as accepted
    or as read back."""
    return 0 if rlimits is None else len(json.dumps(rlimits))


def row_bytes(kept: int, key: str | None, name: str | None) -> int:
    """What a task's row takes with ``kept`` bytes of its own (its result, listing, what it
    carried, its submitter's limits) in it (counted in ``bytes``, with its request's)."""
    return in_pages(kept + ROW_COLUMNS + key_bytes(key) + key_bytes(name)) + ROW_INDEXES + \
        key_bytes(key)


def tomb_bytes(key: str | None) -> int:
    """What a tombstone takes (counted as held by the disk's room until it is trimmed)."""
    return TOMB_BYTES + 2 * key_bytes(key)


_TOMB_SQL = f"{TOMB_BYTES} + 2 * coalesce(length(CAST(idempotency_key AS BLOB)), 0)"
COLUMNS = ("seq", "uid", "gid", "peer_pid", "groups", "name", "idempotency_key", "spec",
           "state", "created_at", "started_at", "ended_at", "pid", "leaf", "run", "outcome",
           "exit_status", "bytes", "notified", "rlimits", "carried", "session", "result",
           "listed")


class Expired(NamedTuple):
    """A retention pass: the rows it expired (id, uid, idempotency_key, ended_at, bytes, why),
    the bytes it gave back (theirs, less their tombstones', plus the tombstones trimmed), and
    what each uid's finished rows and tombstones hold after it (with a ``room``)."""

    gone: list[dict[str, Any]]
    freed: int
    held: dict[int, int] | None = None


class Retention(NamedTuple):
    """How long finished tasks are kept (records and output files); None: no limit."""

    max_age: float | None = 7 * 86400.0
    max_count: int | None = 10_000
    max_bytes: int | None = 2 << 30


def row_of(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    row = {d[0]: v for d, v in zip(cursor.description, values, strict=True)}
    if "seq" in row:
        row["id"] = str(row.pop("seq"))
    env = row.pop("spec_env", None)
    if env is not None:  # (kept apart: ``insert``)
        row["spec"] = with_env(row["spec"], env)
    for key in ("spec", "result", "groups", "rlimits", "carried", "env", "defaults"):
        if row.get(key) is not None:
            row[key] = json.loads(row[key])
    return row


def select(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    cur = db.execute(sql, args)
    return [row_of(cur, v) for v in cur.fetchall()]


def execute(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> None:
    db.execute(sql, args)


ENV_APART = 512  # bytes of a request's environment (as env_weight counts) kept apart from it


def env_apart(uid: int, env_text: str) -> tuple[str, str]:
    """A request's environment (its JSON text) as ``insert`` keeps it apart: (its hash, it).
    The hash is of the submitter's uid too: two uids never share one (were they shared, the
    disk's free space after a submission would tell a tenant whether another had sent that
    very environment: a secret in it guessed one submission at a time)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{uid}\0".encode())
    h.update(env_text.encode("utf-8", "surrogatepass"))
    return h.hexdigest(), env_text


def with_env(spec: str, env: str, *, compact: bool = False) -> str:
    """A request's JSON text (``{...}``, as ``json.dumps`` makes it; ``compact``: without
    spaces) with its environment (JSON text) put back as its ``env``."""
    comma, colon = (",", ":") if compact else (", ", ": ")
    return f'{spec[:-1]}{comma if spec != "{}" else ""}"env"{colon}{env}}}'


def insert(db: sqlite3.Connection, row: dict[str, Any]) -> str:
    """A new task's row and its request (``row["spec"]``: the JSON text, or a dict); its id.
    ``row["env"]``, if there, is the request's environment kept apart (``env_apart``: it is
    not in ``spec``): written once however many requests name the same (each command of a
    session carries its session's), given back in ``spec`` by ``row_of``."""
    spec = row["spec"] if isinstance(row["spec"], str) else json.dumps(row["spec"])
    env: tuple[str, str] | None = row.get("env")
    row = {k: v for k, v in row.items() if k not in ("spec", "env")}
    row.update(groups=json.dumps(row.get("groups") or []),
               rlimits=None if row.get("rlimits") is None else json.dumps(row["rlimits"]))
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    cur = db.execute(f"INSERT INTO tasks ({names}) VALUES ({marks})", tuple(row.values()))
    if env is not None and db.execute("SELECT 1 FROM envs WHERE hash = ?",
                                      (env[0],)).fetchone() is None:
        db.execute("INSERT INTO envs (hash, env) VALUES (?, ?)", env)
    db.execute("INSERT INTO requests (seq, spec, env) VALUES (?, ?, ?)",
               (cur.lastrowid, spec, None if env is None else env[0]))
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
    rows = select(db, "SELECT * FROM task_rows WHERE seq = ?", (int(task_id),))
    return rows[0] if rows else None


def owner(db: sqlite3.Connection, task_id: str) -> dict[str, Any] | None:
    """A task's id, uid and state alone (a stop, a signal or stdin for a task no longer in
    memory needs no more: :func:`get` decodes its request and result, MiBs of them)."""
    if not (task_id.isascii() and task_id.isdigit()):
        return None
    found = db.execute("SELECT seq, uid, state FROM tasks WHERE seq = ?",
                       (int(task_id),)).fetchone()
    return None if found is None else {"id": str(found[0]), "uid": found[1], "state": found[2]}


def ending(db: sqlite3.Connection, task_id: str) -> dict[str, Any] | None:
    """A task's id, uid, state, exit status and result, without its request (an output
    stream's end needs no more until its last frame: :func:`get` decodes the request, a MiB
    with a long command, and a tenant's readers of such a task each had it decoded)."""
    if not (task_id.isascii() and task_id.isdigit()):
        return None
    found = db.execute("SELECT seq, uid, state, exit_status, result FROM tasks WHERE seq = ?",
                       (int(task_id),)).fetchone()
    if found is None:
        return None
    return {"id": str(found[0]), "uid": found[1], "state": found[2], "exit_status": found[3],
            "result": None if found[4] is None else json.loads(found[4])}


def answer_parts(db: sqlite3.Connection, task_id: str, uid: int | None,
                 heavier: int) -> dict[str, Any] | None:
    """A finished task's row, ``uid``'s (None: anyone's) and weighing more than ``heavier``
    (``bytes``), as its answer is put together from (``daemontask.answer_text``): its columns
    and its result, decoded, and its request as SQLite gives it, never decoded here: compact
    (``spec_text``; its environment apart, compact too: ``env_text``), its command
    (``argv_text``) and its session's id, each made by SQLite in C, the GIL let go (and only
    for such a row); None for any other."""
    if not (task_id.isascii() and task_id.isdigit()):
        return None
    cur = db.execute("SELECT t.*, json(r.spec) AS spec_text, json(e.env) AS env_text, "
                     "json_extract(r.spec, '$.argv') AS argv_text, "
                     "json_extract(r.spec, '$.session.id') AS session_id "
                     "FROM tasks t JOIN requests r ON r.seq = t.seq "
                     "LEFT JOIN envs e ON e.hash = r.env WHERE t.seq = ? "
                     "AND t.state = 'finished' AND coalesce(t.bytes, 0) > ? "
                     "AND (? IS NULL OR t.uid = ?)", (int(task_id), heavier, uid, uid))
    found = cur.fetchone()
    return None if found is None else row_of(cur, found)


LISTED_ARGS = 64  # arguments a listing shows at most (listed_argv)
LISTED_ARGV = 1024  # bytes of JSON of a command a listing shows (``show`` has all of it)

# A listing's row: the few columns it shows and the command as made at acceptance
# (``listed``).  A row from before schema 6 has none: its command's first arguments are taken
# out of the request by SQLite (which lets the GIL go meanwhile), each cut to a listing's
# length and no more of them than a listing shows: never the request whole.
_LISTED = ("t.seq, uid, gid, name, state, created_at, started_at, ended_at, pid, outcome, "
           "exit_status, carried, session, listed, CASE WHEN listed IS NULL THEN "
           "json_array_length(r.spec, '$.argv') END AS argc, CASE WHEN listed IS NULL THEN "
           "(SELECT json_group_array(v) FROM (SELECT substr(value, 1, "
           f"{LISTED_ARGV + 1}) AS v, sum(length(value)) OVER (ORDER BY key) - length(value) "
           f"AS before FROM json_each(r.spec, '$.argv') WHERE key < {LISTED_ARGS + 1} "
           f"ORDER BY key) WHERE before <= {LISTED_ARGV}) END AS argv")


def list_entries(db: sqlite3.Connection, uid: int | None, state: str | None,
                 limit: int, session: str | None = None, before: int | None = None
                 ) -> list[tuple[int, str]]:
    """Listed tasks, newest first: each its id and its listing's entry, JSON text made here
    (:func:`listed_entry`), in the records' thread: the command's ``listed`` JSON is spliced
    in as kept, never decoded (a row from before schema 6 has none: its first arguments,
    cut short by SQLite, make it)."""
    where: list[str] = []
    args: list[Any] = []
    if before is not None:
        where.append("t.seq < ?")
        args.append(before)
    if session is not None:
        where.append("session = ?")
        args.append(int(session))
    if uid is not None:
        where.append("uid = ?")
        args.append(uid)
    if state is not None:
        where.append("state = ?")
        args.append(state)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    found = db.execute(f"SELECT {_LISTED} FROM tasks t JOIN requests r ON r.seq = t.seq "
                       f"{clause} ORDER BY t.seq DESC LIMIT ?", (*args, limit)).fetchall()
    out = []
    for (seq, uid_, gid, name, state_, created, started, ended, pid, outcome, status, carried,
         session_, listed, argc, argv) in found:
        if listed is None:
            listed = compact_json(listed_argv(json.loads(argv), argc))
        out.append((seq, listed_entry(
            str(seq), state_, listed, uid_, gid, name, created, started, ended, pid, outcome,
            status, None if session_ is None else str(session_),
            None if session_ is None else listed_carried(carried or "null"))))
    return out


LISTED_CARRIED = 1024  # bytes of JSON of a command's ``carried`` a listing shows


def listed_carried(text: str) -> str:
    """A session command's ``carried`` (JSON text) as a listing shows it: as kept if it is
    at most :data:`LISTED_CARRIED` bytes, else its directory and names cut to about that and
    ``"cut": true`` (``show`` has it whole).  A command's report may carry a directory of
    4 KiB and 2 KiB of names, and a listing has a thousand commands."""
    if len(text) <= LISTED_CARRIED:
        return text
    carried = json.loads(text)
    budget = [LISTED_CARRIED // 2]
    for key in ("cwd", "nothing"):
        if isinstance(carried.get(key), str):
            carried[key] = _cut_text(carried[key], budget[0] // 2)
    for key in ("set", "unset", "not_carried"):
        if isinstance(carried.get(key), list):
            carried[key] = names_within(carried[key], budget)
    carried["cut"] = True
    return compact_json(carried)


def names_within(names: list[str], budget: list[int]) -> list[str]:
    """The first of ``names`` while their JSON fits ``budget[0]`` (which they use up)."""
    kept = []
    for name in names:
        cost = json_bytes(name) + 4
        if cost > budget[0]:
            budget[0] = 0
            break
        budget[0] -= cost
        kept.append(name)
    return kept


def _cut_text(text: str, budget: int) -> str:
    """``text``'s first characters whose JSON fits ``budget`` bytes."""
    if json_bytes(text) <= budget:
        return text
    low, high = 0, min(len(text), budget)
    while low < high:  # (the longest prefix that fits: escapes make a character 1-12 bytes)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if json_bytes(text[:mid]) <= budget else (low, mid - 1)
    return text[:low]


def listed_entry(task_id: str, state: str, listed: str, uid: int, gid: int, name: str | None,
                 created_at: float, started_at: float | None, ended_at: float | None,
                 pid: int | None, outcome: str | None, exit_status: int | None,
                 session: str | None, carried: str | None,
                 more: Mapping[str, Any] | None = None) -> str:
    """A listing's entry as JSON text (what ``json.dumps`` makes of it, compact), with the
    command's ``listed`` and a session command's ``carried`` JSON spliced in as they are
    kept: a listing of a thousand long commands never decodes nor re-encodes them.  ``id``
    is digits and ``state`` and ``outcome`` words of ours; ``more``: keys after those."""
    text = (f'{{"id":"{task_id}","state":"{state}","argv":{listed},"uid":{uid},"gid":{gid},'
            f'"name":{_value(name)},"created_at":{_value(created_at)},'
            f'"started_at":{_value(started_at)},"ended_at":{_value(ended_at)},'
            f'"pid":{_value(pid)},"outcome":{_value(outcome)},'
            f'"exit_status":{_value(exit_status)}')
    if session is not None:
        text += f',"session":"{session}","carried":{carried}'
    if more:
        text += "," + compact_json(more)[1:-1]
    return text + "}"


def _value(v: str | float | None) -> str:
    """One scalar as ``json.dumps`` writes it."""
    if v is None:
        return "null"
    if isinstance(v, str):
        return json.dumps(v)
    return float.__repr__(v) if isinstance(v, float) else str(int(v))


def compact_json(value: Any) -> str:
    """``value`` as JSON without spaces."""
    return json.dumps(value, separators=(",", ":"))


def listed_argv(argv: Sequence[str], count: int | None = None) -> list[str]:
    """A command as a listing shows it: whole if short, else its first arguments up to
    :data:`LISTED_ARGV` bytes of JSON and a last item saying how many more there are (a
    listing of a thousand tasks is at most a few MiB however long their commands, and
    whatever their characters: a non-ASCII or control character is six bytes of JSON).
    ``argv`` may be the command's first arguments only (65 or more), ``count`` the number
    of them all."""
    count = len(argv) if count is None else count
    out: list[str] = []
    room = LISTED_ARGV
    for a in argv:
        cost = json_bytes(a)
        if cost > room or len(out) == LISTED_ARGS:
            break
        out.append(a)
        room -= cost
    if len(out) == count:
        return out
    return [*out, f"... ({count - len(out)} more arguments: GET /v1/tasks/ID shows "
                  f"them all)"]


def json_bytes(text: str) -> int:
    """What ``text`` takes in JSON as the records keep it (ASCII: a character outside it is
    six or twelve bytes there), without its quotes."""
    if text.isascii() and text.isprintable():
        return len(text) + text.count('"') + text.count("\\")
    return len(json.dumps(text)) - 2


def listed_json(argv: Sequence[str]) -> str:
    """:func:`listed_argv` as the records keep it (ASCII JSON: its length is its bytes)."""
    return compact_json(listed_argv(argv))


def find_key(db: sqlite3.Connection, uid: int, key: str) -> dict[str, Any] | None:
    rows = select(db, "SELECT * FROM task_rows WHERE uid = ? AND idempotency_key = ?",
                  (uid, key))
    if rows:
        return rows[0]
    return _expired_key(db, uid, key)


def keyed(db: sqlite3.Connection, uid: int, key: str, spec: str = "",
          env: str | None = None) -> dict[str, Any] | None:
    """The task a request of ``uid``'s with idempotency ``key`` made, its request left where
    it is: ``{"id", "state", "same", "long"}``, ``same``: its request is kept as the text
    ``spec`` with its environment apart as ``env`` (``env_apart``'s hash; None: none apart),
    compared by SQLite; ``long``: it is kept in more than ``SAME_TEXT`` characters.  Or
    ``{"id", "state": "expired", "expired_at"}`` once retention removed it; or None.  (A MiB
    command sent again with its key had its row read and decoded whole to be compared.)"""
    got = db.execute("SELECT t.seq, t.state, r.spec = ? AND r.env IS ?, length(r.spec) > ? "
                     "FROM tasks t JOIN requests r ON r.seq = t.seq "
                     "WHERE t.uid = ? AND t.idempotency_key = ?",
                     (spec, env, SAME_TEXT, uid, key)).fetchone()
    if got is not None:
        return {"id": str(got[0]), "state": got[1], "same": bool(got[2]), "long": bool(got[3])}
    return _expired_key(db, uid, key)


# a request kept in more characters than this, and written otherwise than its copy sent
# again (``keyed``), is another request; a shorter one is decoded and compared as values
# (what an older corral wrote may be spaced or ordered otherwise)
SAME_TEXT = 64 << 10


def _expired_key(db: sqlite3.Connection, uid: int, key: str) -> dict[str, Any] | None:
    gone = select(db, "SELECT seq, expired_at FROM expired WHERE uid = ? AND "
                   "idempotency_key = ?", (uid, key))
    return {**gone[0], "state": "expired"} if gone else None


def fair_level(usage: Mapping[int, int], cap: int,
               floors: Mapping[int, int] | None = None) -> float:
    """Max-min fairness: the level L at which keeping ``min(usage[u], L)`` of each uid's
    finished tasks (a count, or bytes) totals ``cap``; infinity when everything fits.  A uid
    that uses no more than an equal share (``cap / len(usage)``) is never above L.

    ``floors``: the part of a uid's usage that cannot go (its running tasks, a waiting
    start's worst case), if together they fit ``cap``: then each uid keeps
    ``max(floors[u], min(usage[u], L))``, and L is where that totals ``cap``.  Without them a
    start whose worst case alone was above the equal share of a small room waited for good:
    the other uid, within its share, lost nothing, and the start never fit."""
    total = sum(usage.values())
    if total <= cap:
        return float("inf")
    if floors and 0 < sum(floors.values()) < cap:
        low = {u: min(floors.get(u, 0), used) for u, used in usage.items()}
        lo, hi = 0.0, float(max(usage.values()))
        for _ in range(64):  # (bisection: what is kept grows with L)
            mid = (lo + hi) / 2
            if sum(max(low[u], min(used, mid)) for u, used in usage.items()) > cap:
                hi = mid
            else:
                lo = mid
        return lo
    remaining, values = float(cap), sorted(usage.values())
    for i, value in enumerate(values):
        share = remaining / (len(values) - i)
        if value > share:
            return share
        remaining -= value
    return float(values[-1])  # (not reached: total > cap)


def expire(db: sqlite3.Connection, policy: Retention, now: float,
           bytes_cap: int | None = None, running: Mapping[int, int] | None = None,
           room: tuple[int, Mapping[int, int]] | None = None,
           tombs: int | None = None) -> Expired:
    """Expire finished rows past ``policy`` (tombstones left in ``expired``, at most
    :data:`MAX_TOMBSTONES` and ``tombs`` bytes of them: :func:`trim_tombstones`).

    Age is per task.  Count and bytes (``bytes_cap``, else ``policy.max_bytes``) are shared
    fairly between uids: when the total is over, the uids above their max-min fair share
    lose their oldest tasks, down to that share; a uid within an equal share loses nothing
    to another's flood.  ``running``: what each uid's running tasks' files hold now, counted
    as that uid's in the bytes share (a uid's idle running tasks cost nobody anything; one
    whose running tasks write much loses its own finished ones first).  ``room``: the disk's
    room for output and what each uid's running tasks may take of it at most (``room.py``),
    shared the same way, when a start waits for it: each uid's tombstones count as its own
    there too, as the ledger counts them (retention that counted only the finished rows
    found that everything fit while the ledger said a start did not, expired nothing, and
    every uid's queue waited behind that start for good: an independent attack)."""
    gone: list[dict[str, Any]] = []
    if policy.max_age is not None:
        gone += _tombstone(db, select(
            db, "SELECT seq, uid, idempotency_key, ended_at, bytes FROM tasks WHERE "
                "state = 'finished' AND ended_at < ?", (now - policy.max_age,)), "age", now)
    per_uid = {r["uid"]: r for r in select(
        db, "SELECT uid, count(*) AS n, coalesce(sum(bytes), 0) AS b FROM tasks WHERE "
            "state = 'finished' GROUP BY uid", ())}
    if policy.max_count is not None:
        level = fair_level({u: r["n"] for u, r in per_uid.items()}, policy.max_count)
        for uid, r in per_uid.items():
            over = r["n"] - max(int(level), 0) if r["n"] > level else 0
            if over > 0:
                oldest = select(db, "SELECT seq, uid, idempotency_key, ended_at, bytes FROM "
                                    "tasks WHERE uid = ? AND state = 'finished' ORDER BY "
                                    "ended_at, seq LIMIT ?", (uid, over))
                gone += _tombstone(db, oldest, "count", now)
                r["b"] -= sum(o["bytes"] or 0 for o in oldest)
    cap = policy.max_bytes if bytes_cap is None else bytes_cap
    if cap is not None:
        gone += _share_bytes(db, per_uid, cap, running or {}, now)
    held: dict[int, int] | None = None
    if room is not None:
        fixed = collections.Counter(room[1])
        fixed.update(_tombs_by_uid(db))
        gone += _share_bytes(db, per_uid, room[0], fixed, now)
    freed = sum((g["bytes"] or 0) - tomb_bytes(g["idempotency_key"]) for g in gone)
    if gone:  # (tombstones grow only then)
        freed += trim_tombstones(db, MAX_TOMBSTONES, tombs)
    if room is not None:
        held = collections.Counter({u: r["b"] for u, r in per_uid.items()})
        held.update(_tombs_by_uid(db))
    return Expired(gone, freed, held)


def _tombs_by_uid(db: sqlite3.Connection) -> dict[int, int]:
    """Each uid's tombstones' bytes (``expired_usage``, kept by the schema's triggers)."""
    return {uid: int(b) for uid, b in db.execute(
        "SELECT uid, bytes FROM expired_usage").fetchall()}


def trim_tombstones(db: sqlite3.Connection, cap: int = MAX_TOMBSTONES,
                    cap_bytes: int | None = None) -> int:
    """Keep at most ``cap`` tombstones and ``cap_bytes`` of them (:func:`tomb_bytes`), each
    shared fairly between uids (max-min, as the results are): a uid that expires a hundred
    thousand tasks of its own forgets its own oldest, never another uid's, whose expired ids
    must still answer 410 and whose expired idempotency keys must never start a task again.
    The bytes it gave back."""
    usage = {uid: (n, b) for uid, n, b in db.execute(
        "SELECT uid, n, bytes FROM expired_usage").fetchall()}
    count_level = fair_level({u: n for u, (n, _) in usage.items()}, cap)
    bytes_level = float("inf") if cap_bytes is None else fair_level(
        {u: b for u, (_, b) in usage.items()}, cap_bytes)
    freed = 0
    for uid, (n, b) in usage.items():
        if n <= count_level and b <= bytes_level:
            continue
        cur = db.execute(f"SELECT seq, {_TOMB_SQL} FROM expired WHERE uid = ? ORDER BY seq",
                         (uid,))
        last = None
        for seq, cost in iter(cur.fetchone, None):
            if n <= count_level and b <= bytes_level:
                break
            last, n, b, freed = seq, n - 1, b - cost, freed + cost
        cur.close()
        if last is not None:
            db.execute("DELETE FROM expired WHERE uid = ? AND seq <= ?", (uid, last))
    return freed


def _share_bytes(db: sqlite3.Connection, per_uid: dict[int, dict[str, Any]], cap: int,
                 running: Mapping[int, int], now: float) -> list[dict[str, Any]]:
    """Finished rows expired until theirs and ``running``'s bytes fit ``cap``, max-min fair
    between uids (``per_uid``: each uid's finished count and bytes, kept up to date)."""
    gone: list[dict[str, Any]] = []
    used = {u: r["b"] for u, r in per_uid.items()}
    for uid, held in running.items():
        used[uid] = used.get(uid, 0) + held
    level = fair_level(used, cap, running)
    for uid, r in per_uid.items():
        if used[uid] > level:
            victims = _trim_bytes(db, uid, min(used[uid] - level, r["b"]), now)
            r["b"] -= sum(v["bytes"] or 0 for v in victims)
            gone += victims
    return gone


def _trim_bytes(db: sqlite3.Connection, uid: int, excess: float,
                now: float) -> list[dict[str, Any]]:
    """A uid's oldest finished tasks until at least ``excess`` bytes are freed."""
    victims: list[dict[str, Any]] = []
    cur = db.execute("SELECT seq, uid, idempotency_key, ended_at, bytes FROM tasks WHERE "
                     "uid = ? AND state = 'finished' ORDER BY ended_at, seq", (uid,))
    for values in iter(cur.fetchone, None):
        if excess <= 0:
            break
        row = row_of(cur, values)
        victims.append(row)
        excess -= row["bytes"] or 0
    cur.close()
    return _tombstone(db, victims, "bytes", now)


def _tombstone(db: sqlite3.Connection, rows: list[dict[str, Any]], why: str,
               now: float) -> list[dict[str, Any]]:
    for g in rows:
        g["why"] = why
        # (a REPLACE's delete fires no trigger: expired_usage would count it twice)
        db.execute("DELETE FROM expired WHERE seq = ? OR (uid = ? AND idempotency_key = ?)",
                   (int(g["id"]), g["uid"], g["idempotency_key"]))
        db.execute("INSERT INTO expired (seq, uid, idempotency_key, ended_at, "
                   "expired_at, why) VALUES (?, ?, ?, ?, ?, ?)",
                   (int(g["id"]), g["uid"], g["idempotency_key"], g["ended_at"], now, why))
        db.execute("DELETE FROM tasks WHERE seq = ?", (int(g["id"]),))
        env = db.execute("SELECT env FROM requests WHERE seq = ?", (int(g["id"]),)).fetchone()
        db.execute("DELETE FROM requests WHERE seq = ?", (int(g["id"]),))
        if env is not None and env[0] is not None:  # (the last request naming it: gone too)
            db.execute("DELETE FROM envs WHERE hash = ? AND NOT EXISTS (SELECT 1 FROM requests "
                       "WHERE env = ?)", (env[0], env[0]))
    return rows


def held_bytes(db: sqlite3.Connection) -> int:
    """What finished tasks hold on disk, by their records, and the tombstones of expired ones."""
    rows = db.execute("SELECT coalesce(sum(bytes), 0) FROM tasks WHERE "
                      "state = 'finished'").fetchone()[0]
    tombs = db.execute("SELECT coalesce(sum(bytes), 0) FROM expired_usage").fetchone()[0]
    return int(rows) + int(tombs)


# ---- sessions ---------------------------------------------------------------------------------

def _session_json(row: dict[str, Any]) -> dict[str, Any]:
    return dict(row, groups=json.dumps(row.get("groups") or []),
                env=None if row.get("env") is None else json.dumps(row["env"]),
                defaults=json.dumps(row.get("defaults") or {}))


def insert_session(db: sqlite3.Connection, row: dict[str, Any]) -> str:
    row = _session_json(row)
    cur = db.execute(f"INSERT INTO sessions ({', '.join(row)}) VALUES "
                     f"({', '.join('?' * len(row))})", tuple(row.values()))
    return str(cur.lastrowid)


def update_session(db: sqlite3.Connection, session_id: str, values: dict[str, Any]) -> None:
    values = {k: json.dumps(v) if k == "env" and v is not None else v
              for k, v in values.items()}
    sets = ", ".join(f"{k} = ?" for k in values)
    db.execute(f"UPDATE sessions SET {sets} WHERE seq = ?", (*values.values(), int(session_id)))


def ended_in_session(db: sqlite3.Connection, seq: int, values: dict[str, Any],
                     session_id: str, session: dict[str, Any]) -> None:
    """A session command's end row and its session's new state: one transaction."""
    update(db, seq, values)
    update_session(db, session_id, session)


def close_session(db: sqlite3.Connection, session_id: str, now: float, keep: int) -> None:
    """Closed now: its environment dropped (the one it carried and the one it was opened
    with), and of its uid's closed sessions only the latest ``keep`` kept."""
    db.execute("UPDATE sessions SET closed_at = ?, env = NULL, defaults = json_remove("
               "defaults, '$.env') WHERE seq = ?", (now, int(session_id)))
    db.execute("DELETE FROM sessions WHERE closed_at IS NOT NULL AND uid = (SELECT uid FROM "
               "sessions WHERE seq = ?) AND seq NOT IN (SELECT seq FROM sessions WHERE uid = "
               "(SELECT uid FROM sessions WHERE seq = ?) AND closed_at IS NOT NULL ORDER BY "
               "seq DESC LIMIT ?)", (int(session_id), int(session_id), keep))


def open_sessions(db: sqlite3.Connection) -> list[dict[str, Any]]:
    return select(db, "SELECT * FROM sessions WHERE closed_at IS NULL ORDER BY seq", ())


def last_foreground(db: sqlite3.Connection) -> dict[str, int]:
    """Each open session's (by id) newest command not run in the background: a command of
    it before that one, still running at that one's exec, became background work (at start-up:
    ``recover``)."""
    return {str(sid): seq for sid, seq in db.execute(
        "SELECT t.session, max(t.seq) FROM tasks t JOIN requests r ON r.seq = t.seq "
        "WHERE t.session IN (SELECT seq FROM sessions WHERE closed_at IS NULL) "
        "AND NOT coalesce(json_extract(r.spec, '$.session.background'), 0) "
        "GROUP BY t.session")}


def get_session(db: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    if not (session_id.isascii() and session_id.isdigit()):
        return None
    found = select(db, "SELECT * FROM sessions WHERE seq = ?", (int(session_id),))
    return found[0] if found else None


def list_sessions(db: sqlite3.Connection, uid: int | None,
                  limit: int) -> list[dict[str, Any]]:
    clause, args = ("WHERE uid = ?", (uid,)) if uid is not None else ("", ())
    columns = "seq, uid, gid, groups, created_at, closed_at, shell, cwd, NULL AS env, defaults"
    return select(db, f"SELECT {columns} FROM sessions {clause} ORDER BY seq DESC LIMIT ?",
                  (*args, limit))
