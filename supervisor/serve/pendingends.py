"""Ends the records could not take at a stop, kept in room of the daemon's own for the next start.

A stop on a state disk full to the byte (another program filled it after the records' reserve
was spent) cannot write the running tasks' ends to SQLite, and the next start could only
record them ``lost``: a false record of a task whose result was known.  So the daemon keeps a
file of its own in the state directory, ``pending-ends``, allocated while there is room (a
quarter of the reserve's size: 16 KiB to 1 MiB) and only ever written in place, which needs no
new room.  When the daemon gives up on an end at exit, the end is appended there as one JSON
line and synced (:meth:`PendingEnds.keep`); the next start writes those ends to the records
before it settles anything else (``recover``), then zeroes the file.  An end that does not fit
is logged whole, as before, and recorded lost by the next start.

The file is one of the records' files (``statedir.RECORD_FILES``): root's, 0600, never
followed, refused if someone else made it.  Its lines are applied only to rows without an end
(a queued task stopped by its user whose end never fit is ended so, not run), and only the
end's own columns are taken from them.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

__all__ = ["END_COLUMNS", "PendingEnds"]

log = logging.getLogger(__name__)

NAME = "pending-ends"
# the end row's columns (dispatch.end_values); nothing else is taken from the file
END_COLUMNS = frozenset({"outcome", "exit_status", "started_at", "ended_at", "pid", "result",
                         "bytes", "notified", "carried"})

Session = tuple[str, dict[str, Any]] | None


class PendingEnds:
    """``pending-ends`` in ``state_dir`` (see the module docstring).  :meth:`open` before use;
    ``found``: the ends the last run kept, by task id."""

    def __init__(self, state_dir: str, size: int) -> None:
        self.path = os.path.join(state_dir, NAME)
        self.size = size
        self.fd = -1
        self.used = 0  # bytes of kept lines from the start of the file
        self.found: dict[str, tuple[dict[str, Any], Session]] = {}

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

    def keep(self, task_id: str, values: dict[str, Any], session: Session) -> bool:
        """Append one end and sync it; whether it is kept (False: no room left in the file,
        or it could not be written)."""
        line = json.dumps({"id": task_id, "values": values, "session": session},
                          separators=(",", ":")).encode() + b"\n"
        if self.fd < 0 or self.used + len(line) > self.size:
            return False
        try:
            if os.pwrite(self.fd, line, self.used) != len(line):
                return False
            os.fdatasync(self.fd)
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
