"""A task as the daemon holds it (the data; ``dispatch.py`` moves it along), and a row's JSON.

States as clients see them: ``queued -> starting -> running -> stopping -> finished``.  What
the records say at each step is in ``records.py``; what a restart does with each is in
``recover.py``.
"""

from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any

import trio

from .protocol import SubmitRequest
from .rows import (
    compact_json,
    listed_argv,
    listed_carried,
    listed_entry,
    listed_json,
    with_env,
)

if TYPE_CHECKING:
    from .. import TaskHandle, TaskResult, TaskSpec

STREAMS = ("stdout", "stderr")
_AFTER = ("signals", "queue_position", "record")  # a listing's keys after the common ones

__all__ = ["DaemonTask", "answer_text", "end_frame_text", "kept_result", "listed_argv",
           "listed_command", "listed_json", "row_json", "served_result"]


class DaemonTask:
    """One accepted task.  ``id`` is the record's (never reused) and the core's leaf name."""

    __slots__ = ("_entry", "_listed", "carried", "created_at", "demoted", "done", "ended_at",
                 "exit_status", "gid", "groups", "handed_back", "handle", "holds", "id", "kept",
                 "limits_bytes", "outcome", "output", "peer_pid", "pid", "recorded", "request",
                 "result_json", "result_weight", "size", "spec", "started", "started_at", "state",
                 "stop_force", "stop_requests", "uid")

    def __init__(self, task_id: str, uid: int, gid: int, peer_pid: int,
                 request: SubmitRequest, spec: TaskSpec | None, output: str, created_at: float,
                 groups: tuple[int, ...] = (), size: int = 0) -> None:
        self.id = task_id
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.peer_pid = peer_pid
        self.request = request
        self.size = size  # the request's bytes as sent (what a queued task holds: ~5 times)
        # of which its submitter's limits (a tenant's: ~630), kept in its row, not its request's
        self.limits_bytes = 0
        self.holds = 0  # the disk's room its output may take while it runs (room.py)
        self.spec = spec  # None: not to be started here (lost, or adopted)
        self.output = output  # stdout's file; stderr's is output + ".stderr"
        self.created_at = created_at
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.state = "queued"
        self.handle: TaskHandle | None = None
        self.pid: int | None = None
        self.outcome: str | None = None  # once finished
        # per stream once finished: (total bytes, the kept tail if the file was capped)
        self.kept: dict[str, tuple[int, bytes]] = {}
        # the result as kept (``kept_result``: output text left in the files); served
        # through ``served_result``
        self.result_json: dict[str, Any] | None = None
        self.exit_status: int | None = None
        self.started = trio.Event()  # the core handed a handle over (or never will)
        self.done = trio.Event()  # finished: the result is known (and recorded, see below)
        self.recorded = False  # the end row is on disk (False while a failed write retries)
        self.stop_requests = 0  # asked before a handle existed
        self.stop_force = False
        self.carried: dict[str, Any] | None = None  # a session's command: what it carried
        # a session's foreground command: its exec was answered while it ran (at once, or at
        # its wait bound), so the session may run another; then it became background work
        self.handed_back = False
        self.demoted = False
        self._listed: str | None = None  # listed_json of its command, made once
        self._entry: str | None = None  # its listing entry, once it can no longer change
        self.result_weight = 0  # about how many bytes its result's JSON holds, once it ended

    @property
    def weight(self) -> int:
        """About how many bytes its full answer holds (``http.json_response``'s weight): its
        request, and its result once it ended (a 34-byte exec of a tenant's was answered 5 MB,
        encoded whole on the event loop, weighed by its request alone)."""
        return self.size + self.result_weight

    @property
    def work(self) -> int:
        """What work its request makes, in bytes (``SubmitRequest.work``)."""
        return self.request.work(self.size)

    @property
    def session(self) -> str | None:
        """The id of the session this task is a command of, if any."""
        return None if self.request.session is None else str(self.request.session["id"])

    @property
    def live_state(self) -> str:
        """Its state as answered: the core's while it runs, ``stopping`` from the core's end
        until its end row is written, then ``finished``.  (The core's ``finished`` was
        answered while the daemon still kept the result, its outcome null: a listing of the
        finished tasks of an independent attack held three such, each a MiB of command whose
        result waited for the offload thread.)"""
        if self.state == "finished" or self.state == "queued":
            return self.state
        if self.outcome is not None:
            return "stopping"  # (its end row is being written)
        if self.handle is None:
            return self.state
        state = self.handle.state
        return "stopping" if state == "finished" else state

    @property
    def listed(self) -> str:
        """Its command as a listing shows it, as JSON text (:func:`listed_json`), made once."""
        if self._listed is None:
            self._listed = listed_command(self.request)
        return self._listed

    def entry(self, position: int | None) -> str:
        """Its entry in a listing, as JSON text (``rows.listed_entry``: a row's is made alike
        in the records' thread); made once when it can no longer change (finished and
        recorded)."""
        if self._entry is not None:
            return self._entry
        f = self._fields(full=False, position=position)
        session = f.get("session")
        text = listed_entry(
            f["id"], f["state"], self.listed, f["uid"], f["gid"], f["name"], f["created_at"],
            f["started_at"], f["ended_at"], f["pid"], f["outcome"], f["exit_status"], session,
            None if session is None else listed_carried(compact_json(f["carried"])),
            {k: f[k] for k in _AFTER if k in f})
        if self.outcome is not None and self.recorded:
            self._entry = text
        return text

    def to_json(self, *, full: bool, position: int | None = None) -> dict[str, Any]:
        out = self._fields(full=full, position=position)
        return {"id": out.pop("id"), "state": out.pop("state"),
                "argv": list(self.request.argv) if full else json.loads(self.listed), **out}

    def _fields(self, *, full: bool, position: int | None) -> dict[str, Any]:
        """What :meth:`to_json` says but its command."""
        out: dict[str, Any] = {
            "id": self.id, "state": self.live_state, "uid": self.uid, "gid": self.gid,
            "name": self.request.name,
            "created_at": self.created_at, "started_at": self.started_at,
            "ended_at": self.ended_at,
            "pid": self.pid,
            "outcome": self.outcome,
            "exit_status": self.exit_status,
        }
        if self.session is not None:
            out["session"] = self.session
            out["carried"] = self.carried
        if self.handle is not None and self.handle.signals:  # (its result has them all)
            out["signals"] = [x.to_dict() for x in self.handle.signals]
            if self.handle.signals_omitted:
                out["signals_omitted"] = self.handle.signals_omitted
        if position is not None:
            out["queue_position"] = position
        if self.outcome is not None and not self.recorded:
            out["record"] = "pending"  # its end row could not be written yet (retried)
        if full:
            out["spec"] = self.request.to_json()
            out["result"] = served_result(self.result_json, self.output, self.request.argv)
        return out

    def stop(self, force: bool) -> bool:
        """Ask the running task to stop (graceful; again or ``force``: kill)."""
        if self.outcome is not None:
            return False
        if self.handle is None:
            self.stop_requests += 1
            self.stop_force = self.stop_force or force
            return True
        return self.handle.stop(force=force)


def listed_command(request: SubmitRequest) -> str:
    """A request's command as a listing shows it (:func:`listed_json`): a session's command
    as its shell runs it, ``[shell, "-c", command]``, without the script corral wraps it in
    (~560 characters of every command's row, and all a listing showed of it; ``show`` has
    the whole argv)."""
    session = request.session
    if session is not None and isinstance(session.get("command"), str) and request.argv:
        return listed_json([request.argv[0], "-c", session["command"]])
    return listed_json(request.argv)


def stream_path(output: str, stream: str) -> str:
    """A task's output file for ``stream`` (``output`` is stdout's)."""
    return output if stream == "stdout" else output + ".stderr"


def kept_result(result: TaskResult, result_json: dict[str, Any], output: str,
                tails: dict[str, bool]) -> dict[str, Any]:
    """The result JSON as the daemon keeps it, in memory and in its row: each stream's head
    and tail text (up to 64 KiB, six bytes of JSON for a control character) left out where
    the task's output file holds those very bytes, their lengths kept instead (``"in_file":
    [head bytes, tail bytes]``, None for a part kept as text).  ``tails[stream]``: the tail
    beyond the file's cap was written beside it (``<file>.tail``).  So a task's row is a few
    KiB whatever it printed, and :func:`served_result` gives the core's JSON back exactly."""
    kept = dict(result_json)
    if "argv" in kept and (len(result.argv) > 16 or sum(map(len, result.argv)) > 128):
        # (the request has it: served_result puts it back; a session's command is its
        # script's ~560 characters, and every command of a session kept them again)
        kept["argv"] = None
    output_json = dict(kept.get("output") or {})
    for stream, out in (("stdout", result.output_stdout), ("stderr", result.output_stderr)):
        part = output_json.get(stream)
        if not part or out.log_path is None or not (out.head or out.tail):
            continue
        try:
            size = os.stat(stream_path(output, stream)).st_size
        except OSError:
            continue  # no file (it could not be made): the text stays
        head = len(out.head) if size >= len(out.head) else None
        whole = not out.log_truncated and size == out.total
        tail = len(out.tail) if whole or (out.log_truncated and tails.get(stream)) else None
        if head is None and tail is None:
            continue
        part = dict(part, in_file=[head, tail])
        if head is not None:
            part["head"] = ""
        if tail is not None:
            part["tail"] = ""
        output_json[stream] = part
    kept["output"] = output_json
    return _masks_kept(kept)


def served_result(kept: dict[str, Any] | None, output: str,
                  argv: list[str]) -> dict[str, Any] | None:
    """The core's result JSON from what :func:`kept_result` kept: the ``argv`` of the request
    (a long one is kept once, in the request), head and tail read back from the output files
    (a file that went missing since: the text is empty, and the stream says ``"lost_text":
    true``)."""
    if not kept:
        return kept
    if kept.get("argv", ()) is None:
        kept = {**kept, "argv": list(argv)}
    kept = _masks_served(kept)
    if not isinstance(kept.get("output"), dict):
        return kept
    streams = kept["output"]
    if not any(isinstance(p, dict) and "in_file" in p for p in streams.values()):
        return kept
    out = dict(kept)
    out["output"] = {name: _served_stream(part, stream_path(output, name))
                     if isinstance(part, dict) and "in_file" in part else part
                     for name, part in streams.items()}
    return out


# the result's capability lists (containment.isolation): every one a root task holds, named,
# was ~1.3 KiB of a row's ~3 (a list of names, lowest number first, is its mask's exactly)
_CAPABILITY_LISTS = ("capability_bounding_set", "ambient_capabilities", "capabilities")


def _masks_kept(kept: dict[str, Any]) -> dict[str, Any]:
    """``kept`` with each capability list kept as its mask (``{"mask": "0x..."}``) where
    the mask names that very list again; a list that it would not (a name corral does not
    know) stays."""
    from ..lowlevel import capability_names

    iso = _isolation_of(kept)
    if iso is None:
        return kept
    masks, numbers = {}, _capability_numbers()
    for key in _CAPABILITY_LISTS:
        names = iso.get(key)
        if not isinstance(names, list) or len(names) < 2:
            continue
        if not all(isinstance(n, str) and n in numbers for n in names):
            continue
        mask = sum(1 << numbers[n] for n in set(names))
        if list(capability_names(mask)) == names:
            masks[key] = {"mask": hex(mask)}
    if not masks:
        return kept
    return {**kept, "containment": {**kept["containment"], "isolation": {**iso, **masks}}}


def _masks_served(kept: dict[str, Any]) -> dict[str, Any]:
    """What :func:`_masks_kept` kept, with each mask its list of names again."""
    iso = _isolation_of(kept)
    if iso is None or not any(isinstance(iso.get(k), dict) for k in _CAPABILITY_LISTS):
        return kept
    from ..lowlevel import capability_names

    lists = {k: list(capability_names(int(iso[k]["mask"], 16))) for k in _CAPABILITY_LISTS
             if isinstance(iso.get(k), dict)}
    return {**kept, "containment": {**kept["containment"], "isolation": {**iso, **lists}}}


def _isolation_of(result: dict[str, Any]) -> dict[str, Any] | None:
    containment = result.get("containment")
    iso = containment.get("isolation") if isinstance(containment, dict) else None
    return iso if isinstance(iso, dict) else None


@functools.cache
def _capability_numbers() -> dict[str, int]:
    """Capability name -> number, for every number a mask may hold (64: the kernel's two
    32-bit words), as the core names them."""
    from ..lowlevel import capability_names

    return {name: n for n, name in enumerate(capability_names((1 << 64) - 1))}


def _served_stream(part: dict[str, Any], path: str) -> dict[str, Any]:
    head_len, tail_len = part["in_file"]
    served = {k: v for k, v in part.items() if k != "in_file"}
    try:
        with open(path, "rb") as f:
            if head_len is not None:
                served["head"] = f.read(head_len).decode("utf-8", "replace")
            if tail_len is not None:
                served["tail"] = _tail_bytes(f, path, part, tail_len).decode("utf-8",
                                                                              "replace")
    except OSError:
        served["lost_text"] = True
    return served


def _tail_bytes(f: Any, path: str, part: dict[str, Any], n: int) -> bytes:
    """The stream's last ``n`` bytes: beside the file (``.tail``) past its cap, else its
    end."""
    if not n:
        return b""
    if part.get("log_truncated"):
        with open(path + ".tail", "rb") as t:
            data: bytes = t.read()
        return data[len(data) - n:]
    f.seek(int(part["total_bytes"]) - n)
    tail: bytes = f.read(n)
    return tail


def row_json(row: dict[str, Any], *, output_dir: str) -> dict[str, Any]:
    """A task the daemon no longer holds in memory, from its whole record: with its spec and
    result, whose head and tail are read from the output files in ``output_dir``."""
    r = row.get("result")
    spec = row["spec"]
    assert r is None or isinstance(r, dict)
    fields = _row_fields(row)
    out = {"id": fields.pop("id"), "state": fields.pop("state"), "argv": spec["argv"], **fields}
    if isinstance(spec.get("session"), dict):
        out["session"] = str(spec["session"]["id"])
        out["carried"] = row.get("carried")
    out["spec"] = spec
    out["result"] = served_result(r, os.path.join(output_dir, row["id"]), spec["argv"])
    return out


def answer_text(row: dict[str, Any], *, output_dir: str) -> bytes:
    """:func:`row_json`'s answer (compact, and its newline) from ``rows.answer_parts``'s row,
    its request put in as the text SQLite gave: never decoded and encoded again here (a
    tenant's finished tasks of 65,000 non-ASCII arguments, read in turn past what the daemon
    keeps made, had each 2.9 MB request decoded in one call holding the GIL: another tenant's
    p99 44-81 ms, an independent attack)."""
    argv = row["argv_text"]
    spec = row["spec_text"]
    if row.get("env_text") is not None:  # (kept apart: ``rows.insert``)
        spec = with_env(spec, row["env_text"], compact=True)
    fields = _row_fields(row)
    items = [("id", compact_json(fields.pop("id"))), ("state", compact_json(fields.pop("state"))),
             ("argv", argv), *((k, compact_json(v)) for k, v in fields.items())]
    if row.get("session_id") is not None:
        items += [("session", compact_json(str(row["session_id"]))),
                  ("carried", compact_json(row.get("carried")))]
    items += [("spec", spec), ("result", _result_text(row.get("result"), os.path.join(
        output_dir, row["id"]), argv))]
    return (_object_text(items) + "\n").encode()


def end_frame_text(row: dict[str, Any], *, output_dir: str) -> bytes:
    """A finished task's last output frame (``{"end": true, "exit_status", "result"}``) from
    ``rows.answer_parts``'s row, as :func:`answer_text` makes its answer."""
    result = _result_text(row.get("result"), os.path.join(output_dir, row["id"]),
                          row["argv_text"])
    return (_object_text([("end", "true"), ("exit_status", compact_json(row["exit_status"])),
                          ("result", result)]) + "\n").encode()


def _result_text(kept: dict[str, Any] | None, output: str, argv: str) -> str:
    """:func:`served_result`'s JSON, compact, with the command (``argv``: its JSON text) where
    the result kept it once, in the request."""
    served = served_result(kept, output, [])
    if not served:
        return compact_json(served)
    once = kept is not None and kept.get("argv", ()) is None
    return _object_text([(k, argv if once and k == "argv" else compact_json(v))
                         for k, v in served.items()])


def _object_text(items: list[tuple[str, str]]) -> str:
    """A JSON object, compact, of its keys and its values' JSON texts."""
    return "{" + ",".join(f"{compact_json(k)}:{v}" for k, v in items) + "}"


def row_weight(row: dict[str, Any]) -> int:
    """About how many bytes a row's JSON holds (``bytes``: its output files' too, so a loud
    task's counts as heavy: its answer is encoded in pieces, which costs it little)."""
    return int(row.get("bytes") or 0)


def _row_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "state": row["state"], "uid": row["uid"],
            "gid": row["gid"], "name": row["name"], "created_at": row["created_at"],
            "started_at": row["started_at"], "ended_at": row["ended_at"], "pid": row["pid"],
            "outcome": row["outcome"], "exit_status": row["exit_status"]}

