"""Ends the records could not take at a stop, kept in room of the daemon's own for the next start.

A stop on a state disk full to the byte (another program filled it after the records' reserve
was spent) cannot write the running tasks' ends to SQLite, and the next start could only
record them ``lost``: a false record of a task whose result was known.  So the daemon keeps a
file of its own in the state directory, ``pending-ends``, allocated while there is room (a
quarter of the reserve's size: 16 KiB to 1 MiB) and only ever written in place, which needs no
new room.  The ends the daemon gives up on at exit are written there when the records close,
one JSON line each, without their command lines (a tenant makes those as long as it likes:
one end of an independent attack's took the whole file), each uid's smallest first and one of
each uid's at a time (:meth:`PendingEnds.flush`), and synced; the next start writes those ends
to the records before it settles anything else (``recover``), then zeroes the file.  An end
past the file's room is logged whole, as before, and recorded lost by the next start.

The file is one of the records' files (``statedir.RECORD_FILES``): root's, 0600, never
followed, refused if someone else made it.  Its lines are applied only to rows without an end
(a queued task stopped by its user whose end never fit is ended so, not run), and only the
end's own columns are taken from them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["END_COLUMNS", "PendingEnds"]

log = logging.getLogger(__name__)

NAME = "pending-ends"
# the end row's columns (dispatch.end_values); nothing else is taken from the file
END_COLUMNS = frozenset({"outcome", "exit_status", "started_at", "ended_at", "pid", "result",
                         "bytes", "notified", "carried"})

Session = tuple[str, dict[str, Any]] | None


class _Waiting(NamedTuple):
    uid: int
    task_id: str
    line: bytes
    shown: Callable[[], str]


class PendingEnds:
    """``pending-ends`` in ``state_dir`` (see the module docstring).  :meth:`open` before use;
    ``found``: the ends the last run kept, by task id."""

    def __init__(self, state_dir: str, size: int) -> None:
        self.path = os.path.join(state_dir, NAME)
        self.size = size
        self.fd = -1
        self.used = 0  # bytes of kept lines from the start of the file
        self.found: dict[str, tuple[dict[str, Any], Session]] = {}
        self.waiting: list[_Waiting] = []  # ends given at the exit, written at flush

    def open(self) -> None:
        """Open (make) the file, read what it holds, and allocate its room if there is any
        (a full disk: it keeps the room it had).  OSError if it cannot be opened."""
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o600)
        held = os.fstat(self.fd).st_size
        data = os.pread(self.fd, held, 0) if held else b""
        self.used = len(data.split(b"\0", 1)[0])
        self.found = _parse(data[:self.used])
        try:
            os.posix_fallocate(self.fd, 0, self.size)
        except OSError as e:
            log.warning("%s: its room (%d bytes) could not be allocated: %s; an end the records "
                        "cannot take at a stop may not fit there", self.path, self.size, e)

    def add(self, uid: int, task_id: str, values: dict[str, Any], session: Session,
            shown: Callable[[], str]) -> None:
        """An end the records could not take at the exit, kept at :meth:`flush` (all of them
        known by then: the fairest order is chosen among them).  Its result without the
        command line (the row's request has it: ``served_result`` puts it back), which a
        tenant makes as long as it likes; ``shown``: the result whole, for the log if it
        does not fit."""
        result = values.get("result")
        if isinstance(result, str):
            try:
                parsed = json.loads(result)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and "argv" in parsed:
                values = {**values, "result": json.dumps({**parsed, "argv": None})}
        line = json.dumps({"id": task_id, "values": values, "session": session},
                          separators=(",", ":")).encode() + b"\n"
        self.waiting.append(_Waiting(uid, task_id, line, shown))

    def flush(self) -> None:
        """Write the ends :meth:`add` was given, fairly between uids: each uid's smallest
        first, one of each uid's at a time, so that one tenant's large ends (a long name, a
        session's environment) never take the room of another's; one sync for all.  Each is
        logged: kept, or, past the room, its result whole (the next start records it lost)."""
        ranked: dict[int, list[_Waiting]] = {}
        for w in self.waiting:
            ranked.setdefault(w.uid, []).append(w)
        order = [w for _, w in sorted(
            ((rank, w) for ends in ranked.values()
             for rank, w in enumerate(sorted(ends, key=lambda w: len(w.line)))),
            key=lambda rw: (rw[0], len(rw[1].line)))]
        self.waiting = []
        kept = {w.task_id for w in order if self._write(w.line)}
        if kept:
            try:
                os.fdatasync(self.fd)
            except OSError as e:
                log.error("%s: the ends kept there could not be synced: %s", self.path, e)
        for w in order:
            if w.task_id in kept:
                log.error("task %s: its end record could not be written before the daemon "
                          "exited: kept in %s, the next start writes it", w.task_id, self.path)
            else:
                log.error("task %s: its end record could not be written before the daemon "
                          "exited (the next start queues it again if its start was never "
                          "marked, else records it lost); its result: %s", w.task_id,
                          w.shown())

    def _write(self, line: bytes) -> bool:
        if self.fd < 0 or self.used + len(line) > self.size:
            return False
        try:
            if os.pwrite(self.fd, line, self.used) != len(line):
                return False
        except OSError as e:
            log.error("%s: an end could not be kept: %s", self.path, e)
            return False
        self.used += len(line)
        return True

    def clear(self) -> None:
        """Zero what the file holds (its ends are in the records now), in place."""
        if self.used:
            os.pwrite(self.fd, bytes(self.used), 0)
            os.fdatasync(self.fd)
        self.used = 0
        self.found = {}

    def close(self) -> None:
        if self.waiting:
            self.flush()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _parse(data: bytes) -> dict[str, tuple[dict[str, Any], Session]]:
    """The whole lines of ``data`` (a line cut short by a crash, or one that is not an end,
    is skipped), by task id; only the end's columns of each."""
    found: dict[str, tuple[dict[str, Any], Session]] = {}
    for raw in data.split(b"\n"):
        try:
            entry = json.loads(raw)
            task_id, values, session = entry["id"], entry["values"], entry["session"]
            if session is not None:
                session = (str(session[0]), dict(session[1]))
        except (ValueError, TypeError, KeyError, IndexError):
            continue
        if isinstance(task_id, str) and isinstance(values, dict):
            found[task_id] = ({k: v for k, v in values.items() if k in END_COLUMNS}, session)
    return found
