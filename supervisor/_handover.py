"""Running tasks handed from one supervisor process to the next (a daemon's restart).

``await sup.hand_over()`` stops supervising without stopping anything: each running task's
driver lets go, its pipes are taken off the reactor unread, the keeper is told to leave the
root alone.  What the next process needs comes in two parts:

- :meth:`HandOver.fds`: named file descriptors to keep alive across the restart (systemd's fd
  store holds them: ``FDSTORE=1`` with ``FDNAME=<name>``).  ``root`` is the root's directory,
  the same open file description as our flock, so the root stays locked (no other corral's
  reaper touches it) for as long as anything holds it.  Per task: ``<id>.pidfd``, its pipe
  read ends ``<id>.stdout``/``<id>.stderr``, a write end of each (``<id>.stdout.w``: PID 1 drops
  a stored fd on which it sees POLLHUP, which a pipe shows once every writer is gone, and would
  take the unread output with it), ``<id>.stdin`` and ``<id>.tty`` (with ``<id>.tty.peer``, the
  terminal's other side, for the same reason).
- :meth:`HandOver.to_json`: the rest (ids, what each task was told, its stop so far,
  deadlines on the monotonic clock, what was kept of its output).

The next process rebuilds it with :meth:`HandOver.from_json` and passes it to
``open_supervisor(adopt=...)``: the tasks go on with their limits, stops, output and records.
Output written meanwhile waits in the pipes (1 MiB each: a task that writes more during the
restart blocks until it is read again; nothing is lost).  The main processes are no longer our
children: their exit statuses come from PIDFD_INFO_EXIT (Linux >= 6.15).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMAT", "HandOver", "TaskState"]

FORMAT = 1  # the JSON's "format"; a newer one is refused


@dataclass
class TaskState:
    """One running task as it is handed over: everything but its fds (named in ``fds``)."""

    id: str
    state: dict[str, Any]  # see _task.export_task / adopt_task
    fds: dict[str, int] = field(default_factory=dict)  # kind -> fd: pidfd, stdout, ...


@dataclass
class HandOver:
    """Everything a next supervisor process needs to adopt the running tasks."""

    root_path: str
    root_fd: int
    tasks: list[TaskState] = field(default_factory=list)

    def fds(self) -> dict[str, int]:
        """Every fd to keep alive, by name (``root``, ``<id>.<kind>``)."""
        out = {"root": self.root_fd}
        for t in self.tasks:
            out.update({f"{t.id}.{kind}": fd for kind, fd in t.fds.items()})
        return out

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "root": self.root_path,
                           "tasks": [{"id": t.id, "fds": sorted(t.fds), **t.state}
                                     for t in self.tasks]})

    @classmethod
    def from_json(cls, text: str, fds: dict[str, int]) -> HandOver:
        """Rebuild from :meth:`to_json`'s text and the fds by the names :meth:`fds` gave.
        ValueError when the text is not a hand-over this corral can read, or an fd is
        missing (then nothing of it may be adopted: the caller closes what it has)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a corral hand-over this version can read (format "
                             f"{data.get('format') if isinstance(data, dict) else '?'}, "
                             f"expected {FORMAT})")
        if "root" not in fds:
            raise ValueError("the hand-over's root fd is missing")
        tasks = []
        for entry in data["tasks"]:
            kinds = entry.pop("fds")
            missing = [k for k in kinds if f"{entry['id']}.{k}" not in fds]
            if missing:
                raise ValueError(f"task {entry['id']}: fds {missing} are missing")
            task_id = entry.pop("id")
            tasks.append(TaskState(task_id, entry, {k: fds[f"{task_id}.{k}"] for k in kinds}))
        return cls(data["root"], fds["root"], tasks)

    def close(self) -> None:
        """Close every fd (once adopted, or when giving up on it)."""
        for fd in self.fds().values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.tasks.clear()
