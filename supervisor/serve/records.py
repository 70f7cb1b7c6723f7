"""Task records in SQLite: one row per task, written at accept, start and end.

``state.db`` in the state directory: WAL, ``synchronous=FULL`` (a transition is on disk,
fsynced, before anyone is told of it: the 201 of a submission, the spawn after "starting", a
waiter's result), schema versioned and migrated (``schema.py``).  The state directory is
locked (``lock``, flock) for the daemon's life: one daemon per state directory.

Every write runs in the records' writer thread (:class:`_Worker`), one at a time, and every
read in a reader thread of its own (its own connection), never on the trio thread: a slow disk
delays records, not the event loop.  The trio side hands a call over through a queue and waits
on an eventfd, not through ``trio.to_thread`` (its thread cache and wake-up path cost ~0.1 ms
more per call: two calls per task, accept and end, on the path from a submission to its
result).
Writes are group-committed: every write waiting at a moment goes into one transaction (one
fsync) and one thread hop, so sixteen busy clients cost about what one does; each caller still
returns only once its own write is committed.  The "running" update (pid, start time) is lazy:
it rides along with the next commit, or goes within :data:`LAZY_DELAY`; a task that ends first
never needs it (its end row has every figure).  Nothing depends on it for safety: "starting",
written before the spawn, is what makes a restart treat the task as possibly started.

A write that fails raises :class:`RecordsError` naming the file, SQLite's reason and the fix;
a transaction never half-applies (SQLite's atomic commit), so a record is never half written.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import trio

from . import keyfilter, rows
from .pendingends import PendingEnds
from .rows import Retention
from .schema import SCHEMA_VERSION, SchemaError, migrate
from .shares import take
from .statedir import StateDirError, make_private

__all__ = ["LAZY_DELAY", "SCHEMA_VERSION", "Records", "RecordsError", "Reserve", "Retention",
           "out_of_space"]

T = TypeVar("T")
log = logging.getLogger(__name__)
LAZY_DELAY = 0.25  # seconds a "running" update may wait for company
LARGE_WRITE = 64 << 10  # bytes above which a write goes in a batch of no other such write



class RecordsError(Exception):
    """The records cannot be read or written: names the file, the reason and the fix."""


RESERVE = 4 << 20  # bytes held for the records on the state filesystem (less on a small one)
_NO_ROOM = 64 << 10  # free bytes below which a filesystem counts as full
WAL_LIMIT = 4 << 20  # bytes the write-ahead log is truncated to at a checkpoint


def wal_limit(state_dir: str) -> int:
    """The bytes the write-ahead log is checkpointed at and truncated to: :data:`WAL_LIMIT`, or
    a 32nd of a smaller filesystem (at least 256 KiB)."""
    try:
        st = os.statvfs(state_dir)
    except OSError:
        return WAL_LIMIT
    return max(256 << 10, min(WAL_LIMIT, st.f_blocks * st.f_frsize // 32))


def out_of_space(directory: str) -> bool:
    """Whether the filesystem of ``directory`` is (as good as) full: SQLite says "disk I/O
    error" for some writes that fail for lack of room (the -shm file's growth)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _NO_ROOM


class Reserve:
    """Room kept for the records: files of zeros in the state directory.

    The state filesystem is shared with the tasks' output files (and, on a host, with whatever
    else lives there): a flood of output can fill it before retention catches up, and then
    an end record could not be written.  When a write of the records fails for lack of room,
    the reserve (``reserve``) goes and the write is tried again at once.  A new task or
    session is accepted only while the reserve is there (:meth:`kept`), and it is made again
    as soon as the filesystem has room for it (and :data:`_NO_ROOM` more).

    A second, smaller file (``reserve.start``) is given up only by a start that cannot open
    or write the records for lack of room (the run's start, the ends the last stop kept): a
    stop on a full disk spends ``reserve`` on the running tasks' ends, and a tenant that can
    write the same filesystem (``/var/tmp`` beside ``/var/lib``) took the room freed at
    once; the next start could not open the records and the daemon stayed down for every uid
    until an operator freed space (an independent attack).  Now it starts, writes what it
    kept, answers, and refuses new work, saying the disk is full, until there is room.
    Methods run in the records' thread (or before it exists)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "reserve")
        self.start_path = os.path.join(state_dir, "reserve.start")
        self.state_dir = state_dir
        try:
            st = os.statvfs(state_dir)
            self.size = max(64 << 10, min(RESERVE, st.f_blocks * st.f_frsize // 16))
        except OSError:
            self.size = RESERVE
        self.start_size = max(64 << 10, self.size // 4)
        self.used = 0  # times it was given up
        self.unsupported = False  # the filesystem cannot hold one (no fallocate, no room check)
        # the daemon is starting (until Records.serving): a write that fails for lack of room
        # once ``reserve`` is gone may take ``reserve.start`` (the run's start, kept ends)
        self.starting = True

    def make(self, free: int | None = None) -> bool:
        """Make (or keep) the reserves where there is room for them and :data:`_NO_ROOM`
        more (the start's first); whether ``reserve`` exists.  ``free``: the filesystem's
        free bytes, if the caller has just measured them (else measured here, if a reserve
        is to be made: one ``statvfs`` for both)."""
        if os.path.exists(self.start_path) and os.path.exists(self.path):
            return True
        if free is None:
            try:
                st = os.statvfs(self.state_dir)
            except OSError:
                return False
            free = st.f_bavail * st.f_frsize
        free -= _make_zeros(self.start_path, self.start_size, free)[1]
        made, _ = _make_zeros(self.path, self.size, free)
        if made is None:
            self.unsupported = True
        return bool(made)

    def kept(self) -> bool:
        """Whether the filesystem is not full and the reserve is there (made now if there is
        room): if not, the records write only what already happened (ends, a run's start
        and end, retention), and a new task or session is refused, until there is room again.
        (A flood of submissions took the room the reserve had given back, and the ends of
        tasks already running could not be written; a start on a nearly full disk that
        accepted tasks against free room nothing held, which a tenant then filled, left
        their ends pending and a task queued: an independent attack.)"""
        try:
            st = os.statvfs(self.state_dir)
        except OSError:
            return True
        free = st.f_bavail * st.f_frsize
        if free < _NO_ROOM:
            return False  # (the new task's output would have no room either)
        if self.make(free):
            return True
        # (a filesystem that cannot hold a file of zeros: room as free space, as it was)
        return self.unsupported and free >= self.size + _NO_ROOM

    def refusal(self, path: str) -> str:
        return (f"writing the task records at {path}: the filesystem of {self.state_dir} is "
                f"full (less than {self.size} bytes free, kept for the records of what already "
                f"happened: the ends of running tasks, retention); free space there (df "
                f"{self.state_dir}) or lower --retain-bytes; nothing new is accepted until "
                f"there is room")

    def release(self) -> bool:
        """Give the room back to the filesystem (the records need it); whether there was
        any to give."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        self.used += 1
        log.error("the filesystem of %s is full: the records' reserve (%d bytes) was used so "
                  "that they can still be written; free space there (retention removes the "
                  "oldest output first: --retain-bytes)", self.state_dir, self.size)
        return True

    def release_for_start(self) -> bool:
        """A start that cannot open or write the records for lack of room: both reserves
        given back (``reserve.start`` is kept for this alone); whether there was any."""
        given = self.release()
        try:
            os.unlink(self.start_path)
        except FileNotFoundError:
            return given
        log.error("the filesystem of %s is full: the start's reserve (%d bytes) was used to "
                  "open the records; nothing new is accepted until there is room (df %s)",
                  self.state_dir, self.start_size, self.state_dir)
        return True


def _make_zeros(path: str, size: int, free: int) -> tuple[bool | None, int]:
    """``path``, ``size`` bytes allocated, unless it exists; made only if the filesystem has
    room for it and :data:`_NO_ROOM` more (``free``: its free bytes).  Whether it exists (None
    if the filesystem cannot allocate one though it has the room: no ``posix_fallocate``), and
    the bytes it took now."""
    if os.path.exists(path):
        return True, 0
    if free < size + _NO_ROOM:
        return False, 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return False, 0
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        return None if e.errno in (errno.EOPNOTSUPP, errno.EINVAL) else False, 0
    os.close(fd)
    return True, size


def explain(e: BaseException, path: str, doing: str) -> RecordsError:
    """A RecordsError for SQLite's or the OS's ``e``, with the fix for the usual causes."""
    text = str(e)
    low = text.lower()
    state_dir = os.path.dirname(path)
    if "full" in low or getattr(e, "errno", None) == errno.ENOSPC or out_of_space(state_dir):
        if "full" not in low:
            text = f"{text} (the filesystem is full)"
        fix = (f"free space on the filesystem of {state_dir} (df {state_dir}), or lower "
               f"--retain-bytes; nothing was half written")
    elif "readonly" in low or "read-only" in low or getattr(e, "errno", None) == errno.EROFS:
        fix = (f"{state_dir} is read-only: mount it read-write, or give --state-dir a "
               f"writable directory")
    elif "locked" in low or "busy" in low:
        fix = (f"another process holds a lock on {path} (fuser -v {path}); stop it, or give "
               f"--state-dir a directory of this daemon's own")
    elif "not a database" in low or "malformed" in low or "corrupt" in low:
        fix = (f"the file is damaged: move it aside (mv {path} {path}.damaged) to start with "
               f"empty records, or restore it from a backup")
    elif "unable to open" in low:
        fix = f"check that {state_dir} exists, is a directory and is writable by root"
    else:
        fix = f"check {path} and the filesystem it is on"
    return RecordsError(f"{doing} the task records at {path}: {text}; {fix}")


class Records:
    """The daemon's task records.  Open with :meth:`open`; every method is a trio coroutine
    that runs SQLite in the records' worker thread."""

    def __init__(self, path: str, db: sqlite3.Connection, lock_fd: int,
                 reserve: Reserve, pending: PendingEnds) -> None:
        self.path = path
        self._db = db
        self._lock_fd = lock_fd
        self.reserve = reserve
        self.pending = pending  # ends kept at a stop the records could not take
        self._worker = _Worker()  # writes (and the connection that makes them)
        self._reader = _Worker()  # reads, on a connection of their own
        self._rdb: sqlite3.Connection | None = None
        self._batch: list[_Write] = []
        self._lazy: dict[int, dict[str, Any]] = {}  # seq -> the "running" update
        self._flushing = False
        self.failures = 0  # writes that failed (metrics)
        self.reads = 0  # calls of the reader thread (metrics)

    @classmethod
    async def open(cls, state_dir: str, *, synchronous: str = "FULL") -> Records:
        """Lock the state directory and open (make, migrate) ``state.db``; RecordsError with
        the fix when it cannot be used (read-only, full, locked, damaged, newer).
        ``synchronous`` is SQLite's setting: the daemon's is FULL (anything less breaks the
        promise in docs/durability.md; benchmarks compare)."""
        path = os.path.join(state_dir, "state.db")
        lock_fd = await trio.to_thread.run_sync(lock_state_dir, state_dir)
        reserve = Reserve(state_dir)
        pending = PendingEnds(state_dir, reserve.size // 4)
        try:
            await trio.to_thread.run_sync(_open_pending, pending, path)
            db = await trio.to_thread.run_sync(_connect_with_room, path, state_dir, synchronous,
                                               reserve)
        except BaseException:
            pending.close()
            os.close(lock_fd)
            raise
        return cls(path, db, lock_fd, reserve, pending)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """A read: ``fn(connection, *args)`` on the readers' own connection, in their own
        thread (WAL: a read sees what is committed, and no write waits behind it: one
        tenant's large listings delay reads, never another's submission or end record)."""
        self.reads += 1
        try:
            return await self._reader.run(self._read_with, fn, args)
        except sqlite3.Error as e:
            raise explain(e, self.path, "reading") from e

    def _read_with(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """(in the readers' thread) ``fn`` on the readers' connection, opened the first time."""
        if self._rdb is None:
            rdb = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            rdb.execute("PRAGMA busy_timeout=5000")
            rdb.execute("PRAGMA query_only=1")
            self._rdb = rdb
        return fn(self._rdb, *args)

    async def _write(self, fn: Callable[..., Any] | None, *args: Any, size: int = 0) -> Any:
        """Queue a write and return once it is committed (``fn`` None: just flush the lazy
        updates).  The first writer to find no flush running flushes (every write queued at
        that moment, its own among them), then hands the turn to the oldest write queued
        meanwhile (:meth:`_hand_over`); the others wait for theirs, and return (a writer
        whose write another's flush committed handed the turn over too, and a second flush
        began beside the one running: commits of one or two writes each, ~1.5 under two
        tenants' floods, each flush waiting for the records' thread).  Shielded:
        once asked for, a write is finished or failed, never abandoned half way.
        Every write but a new task's or session's records what already happened (a task's
        start or end, a run's, retention) and may use the reserve (:class:`Reserve`) when
        the disk is full; a new task or session is refused instead.
        ``size``: the bytes it writes, if many (a large request: see :meth:`_flush_batch`)."""
        w = _Write(fn, args, size)
        self._batch.append(w)
        with trio.CancelScope(shield=True):
            if self._flushing:
                await w.wake.wait()  # committed, or it is this write's turn to flush
            if not w.done:  # (committed by another's flush: that one hands the turn over)
                self._flushing = True
                while not w.done:
                    await self._flush_batch()
                self._hand_over()
        if w.error is not None:
            self.failures += 1
            raise w.error
        return w.result

    async def _flush_batch(self) -> None:
        """Commit the writes queued now (one transaction), and wake their writers.  At most
        one large write goes in a batch (the later ones wait for the next): a small write
        waits behind the batch being written and then its own, never behind a tenant's many
        MiB."""
        batch: list[_Write] = []
        later: list[_Write] = []
        for w in self._batch:
            large = w.size > LARGE_WRITE
            (later if large and any(b.size > LARGE_WRITE for b in batch) else batch).append(w)
        self._batch = later
        lazy, self._lazy = list(self._lazy.items()), {}
        writes = [_Write(rows.update, (seq, values)) for seq, values in lazy] + batch
        try:
            await self._worker.run(_commit, self._db, writes, self.path, self.reserve)
        except Exception as e:  # (a bug of ours: every waiter still gets an answer)
            for w in batch:
                w.error = w.error or RecordsError(f"writing the task records at "
                                                  f"{self.path}: {e!r}")
        finally:
            for w in batch:
                w.done = True
                w.wake.set()

    def _hand_over(self) -> None:
        """The flusher's own write is committed: the oldest write queued meanwhile flushes
        next (its writer is woken to do it), or nobody does.  The flusher's caller returns
        now: under a steady stream of other writes it used to flush on until none was left,
        for as long as that stream lasted."""
        if self._batch:
            self._batch[0].wake.set()
        else:
            self._flushing = False

    # ---- runs -------------------------------------------------------------------------------

    def serving(self) -> None:
        """The daemon serves: the start's reserve is no longer for its writes (``Reserve``)."""
        self.reserve.starting = False

    async def begin_run(self, pid: int, now: float) -> int:
        run: int = await self._write(rows.insert_run, pid, now)
        return run

    async def set_run_root(self, run: int, root: str, room: int) -> None:
        """The supervisor's cgroup root in ``run``, and the output's room it measured."""
        await self._write(rows.execute, "UPDATE runs SET root = ?, room = ? WHERE id = ?",
                          (root, room, run))

    async def set_run_room(self, run: int, room: int) -> None:
        """The output's room ``run`` grew to (``OutputDisk.measure``)."""
        await self._write(rows.execute, "UPDATE runs SET room = ? WHERE id = ?", (room, run))

    async def end_run(self, run: int, now: float, how: str) -> None:
        await self._write(rows.execute, "UPDATE runs SET ended_at = ?, ended = ? WHERE id = ?",
                          (now, how, run))

    async def runs(self) -> dict[int, dict[str, Any]]:
        return await self._call(rows.runs)

    # ---- a task's transitions -----------------------------------------------------------------

    async def accept(self, row: dict[str, Any]) -> str:
        """Write a new task's row (``row["state"]``: queued, or starting when it is started at
        once; ``row["env"]``: its environment kept apart, see ``rows.insert``); returns its
        id."""
        spec, env = row.get("spec"), row.get("env")
        size = (len(spec) if isinstance(spec, str) else 0) + (0 if env is None else len(env[1]))
        task_id: str = await self._write(rows.insert, row, size=size)
        return task_id

    async def starting(self, task_id: str, run: int) -> None:
        """Durable before the spawn: after a crash this task is never started again."""
        await self._write(rows.update, int(task_id), {"state": "starting", "run": run})

    def started(self, task_id: str, started_at: float, pid: int | None,
                leaf: str | None) -> None:
        """The "running" update, lazily (see the module docstring): no wait, no error."""
        self._lazy[int(task_id)] = {"state": "running", "started_at": started_at, "pid": pid,
                                    "leaf": leaf}

    async def flush_lazy(self) -> None:
        """Commit pending lazy updates now (the daemon's flusher calls this)."""
        if self._lazy and not self._flushing:
            await self._write(None)

    @property
    def lazy_pending(self) -> bool:
        return bool(self._lazy)

    async def ended(self, task_id: str, values: dict[str, Any],
                    session: tuple[str, dict[str, Any]] | None = None) -> None:
        """The end row (``values``: outcome, exit_status, started_at, ended_at, pid, leaf,
        bytes, notified, and ``result``: the result JSON exactly as the core made it, as
        text); for a session's command, its session's new state (``(id, columns)``) in the
        same transaction."""
        seq = int(task_id)
        values = {**self._lazy.pop(seq, {}), **values, "state": "finished"}
        if session is None:
            await self._write(rows.update, seq, values)
        else:
            await self._write(rows.ended_in_session, seq, values, *session)

    # ---- sessions ---------------------------------------------------------------------------

    async def open_session(self, row: dict[str, Any]) -> str:
        session_id: str = await self._write(rows.insert_session, row)
        return session_id

    async def update_session(self, session_id: str, values: dict[str, Any]) -> None:
        await self._write(rows.update_session, session_id, values)

    async def close_session(self, session_id: str, now: float, keep: int) -> None:
        await self._write(rows.close_session, session_id, now, keep)

    async def open_sessions(self) -> list[dict[str, Any]]:
        return await self._call(rows.open_sessions)

    async def last_foreground(self) -> dict[str, int]:
        """``rows.last_foreground``."""
        return await self._call(rows.last_foreground)

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        return await self._call(rows.get_session, session_id)

    async def list_sessions(self, uid: int | None, limit: int) -> list[dict[str, Any]]:
        """Newest first, without their environments (``env`` None)."""
        return await self._call(rows.list_sessions, uid, limit)

    async def notified(self, task_id: str) -> None:
        await self._write(rows.execute, "UPDATE tasks SET notified = 1 WHERE seq = ?",
                          (int(task_id),))

    # ---- reading ----------------------------------------------------------------------------

    async def get(self, task_id: str) -> dict[str, Any] | None:
        return await self._call(rows.get, task_id)

    async def owner(self, task_id: str) -> dict[str, Any] | None:
        """The task's id, uid and state only (``rows.owner``)."""
        return await self._call(rows.owner, task_id)

    async def ending(self, task_id: str) -> dict[str, Any] | None:
        """The task's id, uid, state, exit status and result (``rows.ending``)."""
        return await self._call(rows.ending, task_id)

    async def list_entries(self, uid: int | None, state: str | None, limit: int,
                           session: str | None = None, before: int | None = None
                           ) -> list[tuple[int, str]]:
        """Newest first, each (id, its listing's entry as JSON text: ``rows.list_entries``);
        ``uid`` None means every uid; ``session``: its commands only; ``before``: ids below
        it only."""
        return await self._call(rows.list_entries, uid, state, limit, session, before)

    async def key_bits(self) -> bytearray:
        """Every idempotency key of the records, as :class:`KeyFilter`'s bits (a read of
        every row's and tombstone's key: at start-up)."""
        return await self._call(keyfilter.bits_of)

    async def find_key(self, uid: int, key: str) -> dict[str, Any] | None:
        """The row with this idempotency key, or ``{"id", "state": "expired", ...}`` when
        retention removed it, or None."""
        return await self._call(rows.find_key, uid, key)

    async def answer(self, task_id: str, uid: int | None, heavier: int,
                     build: Callable[[dict[str, Any]], bytes]) -> bytes | None:
        """``build(row)`` of the task's row as ``rows.answer_parts`` reads it (its request
        as SQLite's texts), in the readers' thread; None if there is no such row."""
        return await self._call(_answer_with, task_id, uid, heavier, build)

    async def keyed(self, uid: int, key: str, spec: str = "",
                    env: str | None = None) -> dict[str, Any] | None:
        """``rows.keyed``: the task made with this idempotency key, without its request."""
        return await self._call(rows.keyed, uid, key, spec, env)

    async def unfinished(self) -> list[dict[str, Any]]:
        """Rows without an end, oldest first (an earlier run's, at start-up)."""
        return await self._call(rows.select, "SELECT * FROM task_rows WHERE state != "
                                "'finished' ORDER BY seq", ())

    async def ids(self) -> set[str]:
        """Every task id that has a row."""
        found = await self._call(rows.select, "SELECT seq FROM tasks", ())
        return {r["id"] for r in found}

    async def pending_notifications(self) -> list[dict[str, Any]]:
        """The ids and uids of the tasks whose completion callback is due, in order (not the
        rows: 250 due events of 900 KB each, read whole at a start, held 460 MB: an
        independent attack)."""
        return await self._call(rows.select, "SELECT seq, uid FROM tasks WHERE notified = 0 "
                                "ORDER BY seq", ())

    async def expired(self, task_id: str) -> dict[str, Any] | None:
        """What retention left of a task: uid, ended_at, expired_at, why; or None."""
        if not (task_id.isascii() and task_id.isdigit()):
            return None
        found = await self._call(rows.select, "SELECT * FROM expired WHERE seq = ?",
                                 (int(task_id),))
        return found[0] if found else None

    # ---- retention --------------------------------------------------------------------------

    async def expire(self, policy: Retention, now: float, bytes_cap: int | None = None,
                     running: Mapping[int, int] | None = None,
                     room: tuple[int, Mapping[int, int]] | None = None,
                     tombs: int | None = None) -> rows.Expired:
        """Remove finished rows past ``policy`` (shared fairly between uids: ``rows.expire``;
        ``bytes_cap`` instead of ``policy.max_bytes``; ``running``: each uid's running tasks'
        bytes; ``room``: the disk's room and each uid's running worst cases), leaving a
        tombstone each (at most ``tombs`` bytes of them); returns them (id, uid,
        idempotency_key, bytes, why) so that their files and memory can go, and the bytes
        given back.  Committed before any file is removed."""
        done: rows.Expired = await self._write(rows.expire, policy, now, bytes_cap, running,
                                               room, tombs)
        return done

    async def give_back(self) -> None:
        """Return the pages of deleted rows to the filesystem (after retention deleted
        some): in the writer's thread, between its transactions, half a log at a time
        (others' writes go between two)."""
        pages = max(16, wal_limit(os.path.dirname(self.path)) // 4096 // 2)
        least = 2 * pages  # (a log's worth: what the disk's room for output may be off by)
        while await self._worker.run(_give_back, self._db, pages, least):
            least = 1

    async def held_bytes(self) -> int:
        """What finished tasks hold on disk (rows and output files), by their records."""
        return await self._call(rows.held_bytes)

    async def close(self) -> None:
        try:
            if self._lazy:
                await self._write(None)
        finally:
            try:
                await self._worker.run(self._db.close)
                if self._rdb is not None:
                    await self._reader.run(self._rdb.close)
            finally:
                self._worker.stop()
                self._reader.stop()
                self.pending.close()
                os.close(self._lock_fd)


def _answer_with(db: sqlite3.Connection, task_id: str, uid: int | None, heavier: int,
                 build: Callable[[dict[str, Any]], bytes]) -> bytes | None:
    row = rows.answer_parts(db, task_id, uid, heavier)
    return None if row is None else build(row)


class _Worker:
    """The records' thread: runs one call at a time, handed over through a queue; the caller
    waits on an eventfd that the thread writes once the call has returned or raised.  A call
    once handed over is waited for to its end (shielded: never abandoned half way, as
    ``abandon_on_cancel=False`` did); a cancellation then takes effect at the caller's next
    checkpoint.  The thread is started at the first call and ended by :meth:`stop`."""

    def __init__(self) -> None:
        self._lock = trio.Lock()  # one call in flight: the eventfd has one waiter
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._efd = -1
        self._thread: threading.Thread | None = None
        self._outcome: tuple[bool, Any] = (True, None)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        await take(self._lock)  # (no round of the loop spent when nobody holds it)
        try:
            if self._thread is None:
                self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                self._thread = threading.Thread(target=self._serve, name="corral-records",
                                                daemon=True)
                self._thread.start()
            self._jobs.put((fn, args))
            with trio.CancelScope(shield=True):
                await trio.lowlevel.wait_readable(self._efd)
            os.eventfd_read(self._efd)
            ok, value = self._outcome
        finally:
            self._lock.release()
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args = job
            try:
                self._outcome = (True, fn(*args))
            except BaseException as e:  # (handed to the caller, raised there)
                self._outcome = (False, e)
            os.eventfd_write(self._efd, 1)

    def stop(self) -> None:
        """End the thread (after the call in flight, if any) and close the eventfd."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread = None
        trio.lowlevel.notify_closing(self._efd)
        os.close(self._efd)


class _Write:
    __slots__ = ("args", "done", "error", "fn", "result", "size", "wake")

    def __init__(self, fn: Callable[..., Any] | None, args: tuple[Any, ...],
                 size: int = 0) -> None:
        self.fn = fn
        self.args = args
        self.size = size
        self.done = False  # committed (or failed)
        self.wake = trio.Event()  # done, or its writer's turn to flush
        self.result: Any = None
        self.error: BaseException | None = None


# writes of something that has not happened yet: refused when the reserve's room is gone
_NEW = (rows.insert, rows.insert_session)


def _apply(db: sqlite3.Connection, writes: Iterable[_Write]) -> None:
    for w in writes:
        if w.fn is not None:
            w.result = w.fn(db, *w.args)


def _commit(db: sqlite3.Connection, batch: list[_Write], path: str,
            reserve: Reserve) -> None:
    """Every write of ``batch`` in one transaction (worker thread).  A new task or session
    (``_NEW``) is refused while the reserve's room is gone (:meth:`Reserve.kept`), and when
    the batch fails for lack of room; the rest of the batch records what already happened
    (the ends of tasks, their starts, a run's start and end, retention) and is tried again
    once the reserve is released.  (Only the ends were, and a daemon starting on a full disk
    wrote its run's start from the reserve and then failed, and exited, on the next line of
    the same run's row.)  If it still fails, each write is retried alone, so that one bad
    write fails only its caller.  A reserve given up is made again once there is room."""
    if any(w.fn in _NEW for w in batch) and not reserve.kept():
        batch = _refuse_new(batch, reserve, path)
    for _ in range(2):
        try:
            _transaction(db, batch)
            reserve.make()
            return
        except Exception as e:  # (sqlite3.Error, or a value SQLite cannot take)
            if not _for_lack_of_room(e, reserve.state_dir):
                break
            batch = _refuse_new(batch, reserve, path)
            if not (batch and (reserve.release()
                               or (reserve.starting and reserve.release_for_start()))):
                break
    for w in batch:
        try:
            _transaction(db, [w])
        except Exception as e:
            w.error = explain(e, path, "writing")


def _refuse_new(batch: list[_Write], reserve: Reserve, path: str) -> list[_Write]:
    """``batch`` without its new tasks and sessions, each failed with the reason."""
    for w in batch:
        if w.fn in _NEW:
            w.error = RecordsError(reserve.refusal(path))
    return [w for w in batch if w.error is None]


def _transaction(db: sqlite3.Connection, writes: list[_Write]) -> None:
    """One transaction; rolled back whole on any error (a failed COMMIT included: SQLite may
    leave the transaction open after SQLITE_FULL or an I/O error)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        _apply(db, writes)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def lock_state_dir(state_dir: str) -> int:
    """Make the state directory private (``statedir.make_private``: 0700, ours, nothing
    planted) and lock it for this daemon's life (``lock``, flock, with our pid in it); the
    lock's fd.  RecordsError when it cannot be made or trusted, or another daemon holds it."""
    lock = os.path.join(state_dir, "lock")
    try:
        make_private(state_dir)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except StateDirError as e:
        raise RecordsError(str(e)) from None
    except OSError as e:
        raise explain(e, os.path.join(state_dir, "state.db"), "preparing") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RecordsError(f"another corral serve (pid {holder}) uses the state directory "
                           f"{state_dir}: stop it, or give this one another --state-dir") \
            from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the pid is for people reading the file; the lock is what counts
    return fd


def _for_lack_of_room(e: BaseException, state_dir: str) -> bool:
    return "full" in str(e).lower() or getattr(e, "errno", None) == errno.ENOSPC or \
        out_of_space(state_dir)


def _open_pending(pending: PendingEnds, path: str) -> None:
    try:
        pending.open()
    except OSError as e:
        raise explain(e, path, f"opening {os.path.basename(pending.path)} (ends kept at a "
                      f"stop) beside") from e


def _connect_with_room(path: str, state_dir: str, synchronous: str,
                       reserve: Reserve) -> sqlite3.Connection:
    """:func:`_connect`; on a full filesystem, again once the reserve is released (a daemon
    starts on a disk its tasks filled); the reserve made where there is room for it."""
    try:
        db = _connect(path, state_dir, synchronous)
    except RecordsError:
        if not (out_of_space(state_dir) and reserve.release_for_start()):
            raise
        db = _connect(path, state_dir, synchronous)
    reserve.make()
    return db


def _connect(path: str, state_dir: str, synchronous: str) -> sqlite3.Connection:
    db: sqlite3.Connection | None = None
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA busy_timeout=5000")
        _vacuum_incrementally(db, path)
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"cannot switch to WAL (journal mode stays {mode}): "
                                           f"read-only")
        if synchronous not in ("FULL", "NORMAL", "OFF", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL, OFF or EXTRA, got "
                             f"{synchronous!r}")
        db.execute(f"PRAGMA synchronous={synchronous}")
        # a checkpoint truncates the WAL back to this (it grew to 7 MB beside an 8 MB
        # database of large requests, on a disk the output budget had measured without it)
        # Debian builds SQLite with secure_delete on: a deleted row's pages are written again
        # as zeros, so that retention expiring a tenant's MiB-long requests wrote MiBs of log
        # (9.6 MB on a 20 MiB disk: full, and retention, which needs the log to delete
        # anything, could no longer make room).  FAST zeroes what costs no more writes (the
        # row's own b-tree page); overflow pages go to the freelist as they are, in a file
        # only root reads, and are overwritten when reused.
        db.execute("PRAGMA secure_delete=FAST")
        wal = wal_limit(state_dir)
        db.execute(f"PRAGMA journal_size_limit={wal}")
        # (and checkpointed as often: by default at 1,000 pages, 4 MiB, whatever the disk; a
        # burst of pipelined submissions grew it to 6.7 MB on a 20 MiB disk)
        page = int(db.execute("PRAGMA page_size").fetchone()[0]) or 4096
        db.execute(f"PRAGMA wal_autocheckpoint={max(16, wal // page)}")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed ({check})")
        migrate(db, path, state_dir)
        return db
    except SchemaError as e:
        _close(db)
        raise RecordsError(str(e)) from e
    except (sqlite3.Error, OSError) as e:
        _close(db)
        raise explain(e, path, "opening") from e


def _vacuum_incrementally(db: sqlite3.Connection, path: str) -> None:
    """The pages of deleted rows go back to the filesystem (``auto_vacuum=INCREMENTAL``, and
    :meth:`Records.give_back` after retention): the file never shrank, and the disk's ledger
    counted what retention deleted as room for output while the file kept it (8.8 MB of free
    pages on a 20 MiB disk: the output filled it, every tenant 503: an independent attack).
    A new database is made so; an older one is rewritten once (``VACUUM``), if the disk has
    room for that, else it stays as it was and this is tried again at the next start."""
    if int(db.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2:
        return
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    if not db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        return  # (new: the mode holds from the first table on)
    size = os.path.getsize(path)
    try:
        st = os.statvfs(os.path.dirname(path))
        if st.f_bavail * st.f_frsize < 3 * size + RESERVE:
            raise sqlite3.OperationalError("the filesystem has no room for a copy")
        db.execute("VACUUM")
    except (sqlite3.OperationalError, OSError) as e:
        log.warning("%s: not rewritten to give deleted rows' pages back (%s); retrying at "
                    "the next start", path, e)


def _give_back(db: sqlite3.Connection, pages: int, least: int) -> bool:
    """(the writer's thread, between transactions) At most ``pages`` free pages back to the
    filesystem, if there are ``least`` or more, and the log checkpointed: a page moved to
    fill a hole is written to the log first, and the whole freelist at once grew the log by
    as much as retention had deleted (a full 20 MiB disk); a few pages each pass, in a flood
    of tiny tasks, moved pages for nothing.  Whether free pages are left.
    ``executescript``: a plain ``execute`` steps the pragma once, which frees one page."""
    try:
        before = int(db.execute("PRAGMA freelist_count").fetchone()[0])
        if before < least:
            return False
        db.executescript(f"PRAGMA incremental_vacuum({pages});")
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        left = int(db.execute("PRAGMA freelist_count").fetchone()[0])
    except sqlite3.Error as e:  # (a full disk: the pages stay free in the file, reused)
        log.debug("incremental vacuum: %s", e)
        return False
    return 0 < left < before


def _close(db: sqlite3.Connection | None) -> None:
    if db is not None:
        db.close()
