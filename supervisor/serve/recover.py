"""Start-up: what earlier runs left unfinished becomes final, runs, or goes on.

Every accepted task ends with exactly one final record.  At start-up, before the socket
listens, the ends the last run kept because the records could not take them (a stop on a full
disk: ``pendingends``) are written (:func:`write_kept_ends`); then each row without an end
(oldest first) is settled by its state:

- ``queued`` (accepted, never dispatched): queued again, and runs in this run, with its
  request as accepted and as its submitter (uid, gid, groups from the row).
- ``starting``/``running`` handed over by ``systemctl restart`` (the core adopted it): its life
  goes on here (``dispatch.adopt``); its record comes when it ends.
- ``starting``/``running`` otherwise: its daemon died.  Its processes were killed with the
  earlier run's cgroup root: by that run's keeper at once (it watches the daemon through a
  pidfd), or, if the keeper died too, by this run's placement, which clears every root whose
  flock nobody holds (``sup.placement_notes`` say which and how many processes).  Ownership
  decides, never a pid.  The row gets a ``lost`` record saying so, with the cleanup outcome
  (``clean`` when the root is gone; ``incomplete`` with the reason otherwise).  A task that was
  "starting" is never started again: it may have run.

Then output files whose task has no row (retention interrupted between its commit and the
unlinks) are removed.  Returns a summary for the log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from cgroupfs import Cgroup, CgroupError, CgroupNotFound

from .daemontask import DaemonTask
from .dispatch import adopt, dispatch, take_result
from .peers import Peer
from .protocol import ApiError, SubmitRequest, parse_submit
from .rows import limits_bytes
from .sessions import Session

if TYPE_CHECKING:
    import supervisor

    from .. import TaskHandle
    from .records import Records
    from .state import Daemon

__all__ = ["Recovered", "recover", "root_cleanup", "write_kept_ends"]

log = logging.getLogger(__name__)

ROOT_WAIT = 10.0  # seconds an earlier run's keeper may still be clearing its root


class Recovered(NamedTuple):
    requeued: int
    adopted: int
    lost: int
    orphan_files: int


class _Cleanup(NamedTuple):
    state: str  # clean | incomplete
    detail: str


async def write_kept_ends(records: Records, adopted: Mapping[str, TaskHandle]) -> int:
    """Write the ends the last run kept in ``pending-ends`` to the rows still without one
    (not a task handed over to this run: it is alive), then clear the file; how many.
    RecordsError if they cannot be written (the start fails, saying why; the file keeps
    them)."""
    kept = records.pending.found
    if not kept:
        return 0
    written = 0
    for row in await records.unfinished():
        end = kept.get(row["id"])
        if end is not None and row["id"] not in adopted:
            await records.ended(row["id"], *end)
            written += 1
    await trio.to_thread.run_sync(records.pending.clear)
    log.info("%d end(s) kept at the last stop (the records could not take them then) "
             "written", written)
    return written


async def recover(d: Daemon, runs: dict[int, dict[str, Any]],
                  adopted: dict[str, TaskHandle]) -> Recovered:
    """Settle every unfinished row of earlier runs (see the module docstring)."""
    for row in await d.records.open_sessions():
        s = d.sessions[row["id"]] = Session.from_row(row)
        # (counted whatever the bound: kept before, it stays until the session closes)
        weight = s.weigh(s.env)  # (once, and kept for its first exec)
        d.session_env[s.uid] = d.session_env.get(s.uid, 0) + weight
        d.session_vars[s.uid] = d.session_vars.get(s.uid, 0) + len(s.env or ())
        d.room.hold(weight)
    for sid, seq in (await d.records.last_foreground()).items():
        if sid in d.sessions:
            d.sessions[sid].last_foreground = seq
    rows = await d.records.unfinished()  # (this run has accepted nothing yet)
    fates: dict[int | None, _Cleanup] = {}
    counts = {"queued": 0, "adopted": 0, "lost": 0}
    for row in rows:
        handle = adopted.pop(row["id"], None)
        if row["state"] == "queued":
            await _requeue(d, row)
            counts["queued"] += 1
        elif handle is not None:
            _adopt(d, row, handle)
            counts["adopted"] += 1
        elif row["id"] in d.sup.results:
            # handed over, but the core could not adopt it: the core's own lost record
            await _take_core_record(d, row)
            counts["lost"] += 1
        else:
            run = row["run"]
            if run not in fates:
                root = (runs.get(run) or {}).get("root")
                fates[run] = await trio.to_thread.run_sync(root_cleanup, root,
                                                           d.sup.placement_notes)
            await _record_lost(d, row, fates[run])
            counts["lost"] += 1
    for task_id, handle in adopted.items():
        log.error("the earlier run handed over task %s, which has no unfinished record: "
                  "killing it", task_id)
        handle.stop(force=True)
    dispatch(d)
    orphans = await trio.to_thread.run_sync(_remove_orphans, d.output_dir,
                                            await _known_ids(d))
    return Recovered(counts["queued"], counts["adopted"], counts["lost"], orphans)


def _task_of(d: Daemon, row: dict[str, Any]) -> DaemonTask:
    return _task_and_why(d, row)[0]


def _task_and_why(d: Daemon, row: dict[str, Any]) -> tuple[DaemonTask, ApiError | None]:
    """The daemon's task for a recorded row (its spec not made yet); a session's command is
    its session's again (running, and its current one unless in the background).  A
    request that no longer parses is read as its command alone, with why it cannot run: one
    row never stops a start."""
    request, why = _recorded_request(row)
    limits = limits_bytes(row.get("rlimits"))
    t = DaemonTask(row["id"], row["uid"], row["gid"], row["peer_pid"] or 0, request, None,
                   os.path.join(d.output_dir, row["id"]), row["created_at"],
                   tuple(row["groups"] or ()), size=len(json.dumps(row["spec"])) + limits)
    t.limits_bytes = limits  # (as an accept counts them: in its size, kept in its row)
    s = None if t.session is None else d.sessions.get(t.session)
    if s is not None:
        s.running.add(t.id)
        if (t.request.session or {}).get("background"):
            pass
        elif int(t.id) < s.last_foreground:
            # (a later command was run in the foreground while it ran: it became background
            # work, which carries nothing, and stays so; held in memory alone, a restart made
            # it foreground again: it carried its `cd` and `export` under the command the
            # session ran after it, an independent attack)
            t.demoted = True
        else:
            s.current = t.id
    return t, why


def _recorded_request(row: dict[str, Any]) -> tuple[SubmitRequest, ApiError | None]:
    """A row's request as accepted, or, if this corral's parser refuses it (a session's
    command carried a directory past what a request may say, before that was bounded: every
    start then failed on it), what of it can be read, and why it cannot be run."""
    spec = row["spec"]
    try:
        return parse_submit(spec, recorded=True), None
    except ApiError as e:
        spec = spec if isinstance(spec, dict) else {}
        argv = [a for a in spec.get("argv") or () if isinstance(a, str)] or ["?"]
        name = spec.get("name") if isinstance(spec.get("name"), str) else None
        session = spec.get("session")
        ok = isinstance(session, dict) and isinstance(session.get("id"), int | str)
        return SubmitRequest(argv=argv, name=name, session=session if ok else None), e


async def _requeue(d: Daemon, row: dict[str, Any]) -> None:
    t, unreadable = _task_and_why(d, row)
    if unreadable is not None:
        d.add(t)
        await _end_refused(d, t, unreadable)
        return
    peer = Peer(t.peer_pid, t.uid, t.gid, t.groups)
    rlimits = row.get("rlimits")
    try:
        t.spec = d.spec_for(peer, t.request, t.output, rlimits=None if rlimits is None else
                            {name: (soft, hard) for name, (soft, hard) in rlimits.items()})
    except ApiError as e:
        # accepted by an earlier run, refused by this one (its limits or controllers changed)
        d.add(t)
        await _end_refused(d, t, e)
        return
    d.add(t)
    d.scheduler.enqueue(t)


async def _end_refused(d: Daemon, t: DaemonTask, error: ApiError) -> None:
    import supervisor

    result = d.sup.record_unstarted(
        supervisor.TaskSpec(tuple(t.request.argv), name=t.request.name), reason="cancel",
        task_id=t.id, notes=[f"accepted before a restart of corral serve, and refused after "
                             f"it: {error.message}"])
    await take_result(d, t, result)


async def _take_core_record(d: Daemon, row: dict[str, Any]) -> None:
    t = _task_of(d, row)
    d.add(t)
    await take_result(d, t, d.sup.results[row["id"]])


def _adopt(d: Daemon, row: dict[str, Any], handle: TaskHandle) -> None:
    t = _task_of(d, row)
    d.add(t)
    d.scheduler.running(t.uid)
    d.hold_room(t)
    d.nursery.start_soon(adopt, d, t, handle)


async def _record_lost(d: Daemon, row: dict[str, Any], cleanup: _Cleanup) -> None:
    """The one final record of a task whose daemon died while it was starting or running:
    the core's record builder makes it (``Supervisor.record_lost``), as for any task."""
    import supervisor

    t = _task_of(d, row)
    started = row["state"] == "running"
    if started:
        what = (f"corral serve (run {row['run']}) died while this task ran (main pid "
                f"{row['pid']}); its processes were killed with that run's cgroup root")
    else:
        what = (f"corral serve (run {row['run']}) died while starting this task; whether its "
                f"process had started is not known (if it had, it was killed with that run's "
                f"cgroup root); it was not started again")
    what += "; its end is when this start recorded it"
    spec = supervisor.TaskSpec(tuple(t.request.argv), name=t.request.name)
    result = d.sup.record_lost(
        spec, task_id=t.id, why=what, started=started, created_at=row["created_at"],
        started_at=row["started_at"], cleanup=supervisor.Cleanup(cleanup.state,
                                                                 detail=cleanup.detail))
    mode = "tty" if t.request.tty is not None else "capture"
    kept = [await trio.to_thread.run_sync(_kept_output, path, d.disk.stream_cap, mode,
                                          spec.output_head, spec.output_tail)
            for path in (t.output, t.output + ".stderr")]
    result = dataclasses.replace(result, output_stdout=kept[0], output_stderr=kept[1])
    d.add(t)
    t.pid = row["pid"]
    await take_result(d, t, result)


def _kept_output(path: str, cap: int, mode: str, head_size: int,
                 tail_size: int) -> supervisor.StreamOutput:
    """(blocking: in a thread) A lost task's stream as its output file holds it: its daemon
    died with the bytes it had in memory, and the record said the task printed nothing while
    its output said otherwise (an independent attack).  The head and tail a task keeps, the
    file's size as the total (past the cap, ``log_truncated``: more may have come); nothing
    without a file (made at a stream's first byte: it printed nothing)."""
    import supervisor

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb", buffering=0) as f:
            size = os.fstat(fd).st_size
            head = f.read(min(size, head_size))
            at = max(len(head), size - tail_size)
            f.seek(at)
            tail = f.read(size - at)  # (what the size said: nobody writes it any more)
    except FileNotFoundError:
        return supervisor.StreamOutput(mode=mode)
    except OSError as e:  # (one file never stops a start: its stream is said to be unread)
        log.warning("reading %s for its lost task's record: %s", path, e)
        return supervisor.StreamOutput(mode=mode, log_path=path, log_truncated=True)
    return supervisor.StreamOutput(head, tail, size, size - len(head) - len(tail), path,
                                   size >= cap, mode)


def root_cleanup(root: str | None, notes: list[str]) -> _Cleanup:
    """What became of an earlier run's cgroup root (blocking: run in a thread).  By the
    placement's notes when it cleared it; gone already (its keeper's work); or cleared here
    once nobody holds its lock; else incomplete, with the reason."""
    if root is None:
        return _Cleanup("clean", "its daemon died before it made a cgroup root")
    for note in notes:
        if root in note:
            state = "clean" if note.startswith("removed") else "incomplete"
            return _Cleanup(state, f"cleared at the next start of corral serve: {note}")
    deadline = time.monotonic() + ROOT_WAIT
    while os.path.exists(root):
        try:
            with Cgroup.open(root) as cg:
                if cg.try_lock():
                    done = cg.destroy()
                    if done.error is not None:
                        return _Cleanup("incomplete", f"clearing {root}: {done.error}")
                    return _Cleanup("clean", f"{root} was killed and removed at the next "
                                    f"start of corral serve (nobody held it)")
        except CgroupNotFound:
            break
        except CgroupError as e:
            return _Cleanup("incomplete", f"clearing {root}: {e}")
        if time.monotonic() > deadline:
            return _Cleanup("incomplete", f"{root} is still held (locked) by another process "
                            f"{ROOT_WAIT:g}s after the start; its tasks may still run")
        time.sleep(0.05)
    return _Cleanup("clean", f"the daemon's keeper killed the processes in {root} and "
                    f"removed it when the daemon died")


async def _known_ids(d: Daemon) -> set[str]:
    return await d.records.ids() | set(d.tasks)


def _remove_orphans(output_dir: str, known: set[str]) -> int:
    removed = 0
    try:
        names = os.listdir(output_dir)
    except OSError:
        return 0
    for name in names:
        task_id = name.split(".", 1)[0]
        if task_id.isascii() and task_id.isdigit() and task_id not in known:
            try:
                os.unlink(os.path.join(output_dir, name))
                removed += 1
            except OSError as e:
                log.warning("removing %s: %s", name, e)
    return removed
