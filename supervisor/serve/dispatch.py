"""A task's life in the daemon: queued -> starting -> running -> finished, one end record.

Order of a life (:func:`run_task`, one trio task per started task):

1. The dispatcher took it from the queue, or the submission found a free slot and its accept
   row already says "starting" (one fsync fewer on the common path).
2. Otherwise the "starting" row is written first (durable: after a crash from here on, a
   restart records the task ``lost`` and never starts it again).  If that write fails the
   task goes back to the head of its queue and dispatch retries in :data:`RETRY` seconds.
3. ``sup.start(spec, task_id=id, group="uid-UID", task_status=...)`` runs the core's life in
   this trio task (its leaf in its uid's group: ``uid_group``);
   the core hands the ``TaskHandle`` over once the process runs, and the "running" row is
   queued then (lazily: ``records.started``).
4. The result comes back: the end row is written (the result JSON as the core made it), and
   only then do waiters, followers and event subscribers see the task finished.  If that write
   fails, they see it finished all the same (``"record": "pending"``), the write is retried
   until it succeeds, and the task stays in memory meanwhile; a daemon that must exit first
   logs the result (never silently: see ``docs/durability.md``).
5. The completion callback, if one is configured (``hooks.py``), after the end row.

Only the library's public API is used: ``sup.start``, ``sup.record_unstarted``,
``TaskHandle.stop/wait/pid``, ``TaskResult.to_dict()``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from .daemontask import DaemonTask, kept_result, served_result, stream_path
from .protocol import ITEM_WORK
from .records import RecordsError
from .rows import in_pages, row_bytes
from .schema import output_bytes
from .sessions import (
    DEMOTED,
    MAX_STATE,
    VARS_PER_UID,
    Reported,
    carried_state,
    state_pipe,
    unenterable,
    weigh,
)
from .state import Daemon

if TYPE_CHECKING:
    from .. import TaskHandle, TaskResult

__all__ = ["RETRY", "accepted", "adopt", "dispatch", "run_task",
           "stop_queued", "take_result", "write_end"]

log = logging.getLogger(__name__)

RETRY = 1.0  # seconds before a record write that failed is tried again (doubling to 30 s)
REPORT_WAIT = 2.0  # seconds a session command's report may stay open after its end
REPORT_DRAIN = 4  # times MAX_STATE a report's pipe is read at most (the rest: not read)


def accepted(d: Daemon, t: DaemonTask, *, reserved: bool) -> None:
    """A task whose accept row is written: queue it (or, with a slot ``reserved`` at submit,
    start it now: its row says "starting" already)."""
    d.add(t)
    d.metrics.submitted.inc()
    d.publish(t, "queued")
    if reserved:
        d.nursery.start_soon(run_task, d, t, True)  # (it checks for a drain itself)
    elif d.draining:
        # accepted while the drain began (its checks passed before, its record was written
        # after): it ends unstarted, as the queued ones did, instead of holding the drain
        d.nursery.start_soon(_end_unstarted, d, t, "shutdown")
    else:
        d.scheduler.enqueue(t)
        dispatch(d)


def dispatch(d: Daemon) -> None:
    """Start queued tasks as the limits allow, round-robin between uids.  Called when a
    task is queued and when one ends (no dispatcher task: one scheduling round less)."""
    d.room.wanted = None
    while not (d.draining or d.handing_over):
        t = d.scheduler.next_ready(d.fits)
        if t is None:
            return
        d.hold_room(t)
        d.nursery.start_soon(run_task, d, t, False)


def stop_queued(d: Daemon, t: DaemonTask, reason: str = "cancel") -> bool:
    """End a queued task without starting it; False if it was not queued."""
    if not d.scheduler.remove(t):
        return False
    d.nursery.start_soon(_end_unstarted, d, t, reason)
    return True


async def _end_unstarted(d: Daemon, t: DaemonTask, reason: str) -> None:
    assert t.spec is not None
    result = d.sup.record_unstarted(t.spec, reason=reason, task_id=t.id)
    await take_result(d, t, result)


class _Started:
    """The ``task_status`` handed to ``sup.start``: the core calls ``started(handle)`` once
    the process runs, or once it is known that it never will.  ``report_w``: a session
    command's report pipe, whose write end we close then (the task has its own)."""

    def __init__(self, daemon: Daemon, task: DaemonTask, report: _Report | None) -> None:
        self.daemon = daemon
        self.task = task
        self.report = report

    def started(self, value: Any = None) -> None:
        if self.report is not None:
            self.report.close_write()
        handle: TaskHandle = value
        _running(self.daemon, self.task, handle)


class _Report:
    """A session command's report of what it left (``sessions.py``): a pipe, the task's fd 3,
    read as it comes, so that a large environment never blocks the shell's exit.  At most
    ``MAX_STATE`` bytes are kept, and at most :data:`REPORT_DRAIN` times that read: past it
    (a process of the task pumping fd 3) the read end is closed, and once the command's record
    is due the pipe is let go whoever still holds it (fd 3 handed to a process elsewhere):
    the daemon holds neither the fd nor its reader past the command's end."""

    def __init__(self) -> None:
        self.r, self.w = state_pipe()
        self.data = bytearray()
        self.truncated = False
        self.ended = trio.Event()
        self.scope = trio.CancelScope()

    def close_write(self) -> None:
        if self.w >= 0:
            os.close(self.w)
            self.w = -1

    async def read(self) -> None:
        stream = trio.lowlevel.FdStream(self.r)
        taken = 0
        try:
            with self.scope:
                while chunk := await stream.receive_some(65536):
                    taken += len(chunk)
                    room = MAX_STATE - len(self.data)
                    self.data += chunk[:room]
                    self.truncated = self.truncated or len(chunk) > room
                    if taken > REPORT_DRAIN * MAX_STATE:
                        break
        except (OSError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()
            self.ended.set()

    async def state(self, d: Daemon, t: DaemonTask) -> Reported | str:
        """What the shell reported, once every writer is gone (the task's processes have all
        ended when its record exists; an escaped one holding the pipe is waited for briefly,
        then the pipe is let go); read, weighed and compared with the environment the
        command started with off the event loop if large (a MiB of it held the loop for
        everyone 100-600 ms: an independent attack)."""
        self.close_write()
        with trio.move_on_after(REPORT_WAIT):
            await self.ended.wait()
        if not self.ended.is_set():
            self.scope.cancel()
            return (f"its report was still held open {REPORT_WAIT:g}s after the command "
                    f"ended (fd 3 handed to a process outside its cgroup?)")
        s = d.sessions.get(t.session or "")
        before = (t.spec.env if t.spec is not None and t.spec.env is not None
                  else None if s is None else s.env) or {}
        # (the variables its session may carry as its uid's sessions' ledger stands now: a
        # report of more is refused before any is made, as keep_session_env would after)
        most = None if s is None else \
            VARS_PER_UID - d.session_vars.get(t.uid, 0) + len(s.env or ())
        work = len(self.data) + ITEM_WORK * self.data.count(b"\0")  # (a variable each)
        return await d.off_loop(t.uid, work, weigh, bytes(self.data), self.truncated, before,
                                most)


def _running(d: Daemon, t: DaemonTask, handle: TaskHandle) -> None:
    t.handle = handle
    t.started.set()
    if handle.state != "running":
        return  # it never ran (stopped first, or the spawn failed): the end record says so
    t.pid = handle.pid
    t.state = "running"
    t.started_at = time.time()
    handle.own_output(t.uid)  # (read at its uid's share of the loop: Shares.loop)
    for i in range(t.stop_requests):  # asked while it was being started
        handle.stop(force=t.stop_force and i == t.stop_requests - 1)
    d.publish(t, "running")
    d.records.started(t.id, t.started_at, handle.pid, handle.id)


async def run_task(d: Daemon, t: DaemonTask, marked: bool) -> None:
    """The task's whole life in the daemon (see the module docstring).  ``marked``: its row
    says "starting" already.  Its steps on the event loop are its uid's (``LoopShare``)."""
    d.shares.loop.enter(t.uid)
    try:
        await _run(d, t, marked)
    finally:
        d.shares.loop.leave(t.uid)


async def _run(d: Daemon, t: DaemonTask, marked: bool) -> None:
    assert t.spec is not None
    t.state = "starting"
    result: TaskResult | None
    reported: Reported | str | None = None
    try:
        if not marked and not await _mark_starting(d, t):
            return
        if t.stop_requests or d.draining:
            reason = "cancel" if t.stop_requests else "shutdown"
            result = d.sup.record_unstarted(t.spec, reason=reason, task_id=t.id)
        elif t.session is None:
            result = await d.sup.start(t.spec, task_id=t.id, group=uid_group(t.uid),
                                       task_status=_Started(d, t, None))
            if result is None:
                return  # handed over to the next daemon process, which records its end
        else:
            report = _Report()
            try:
                d.nursery.start_soon(report.read)
                spec = await d.off_loop(t.uid, t.work, functools.partial(
                    dataclasses.replace, t.spec, pass_fds=(report.w,)))
                result = await d.sup.start(spec, task_id=t.id, group=uid_group(t.uid),
                                           task_status=_Started(d, t, report))
                if result is None:
                    return
                reported = await report.state(d, t)
            finally:
                report.close_write()
                report.scope.cancel()  # (read already, or never to be)
    except Exception as e:
        # the core refused or failed (a bug, or a state nobody planned for): this task ends
        # with a record that says so; the daemon and the other tasks go on
        log.exception("task %s: the supervisor failed it", t.id)
        await _record_failure(d, t, e)
        return
    finally:
        if t.state != "queued":  # (put back in the queue: not running)
            d.scheduler.finished(t.uid)
            dispatch(d)
    try:
        await take_result(d, t, result, reported)
    except Exception as e:  # (a bug of ours with this result: this task alone pays)
        log.exception("task %s: keeping its result failed", t.id)
        await _record_failure(d, t, e)


def uid_group(uid: int) -> str:
    """The group of a uid's tasks in the supervisor's root (``Supervisor.start(group=)``):
    where the ``cpu`` controller is enabled, one tenant's tasks, however many, weigh as one
    against another's (as systemd's user slices do), not each as much as the victim's one."""
    return f"uid-{uid}"


async def _mark_starting(d: Daemon, t: DaemonTask) -> bool:
    """The durable "starting" row; False (the task back at the head of its queue, a retry of
    dispatch armed) if it cannot be written.  True while the daemon drains, written or not:
    the caller ends the task unstarted (put back in a queue the drain has already emptied,
    it was never ended, and the drain waited for it for ever)."""
    try:
        await d.records.starting(t.id, d.run)
        return True
    except RecordsError as e:
        if d.draining:
            log.error("task %s: its start could not be marked (%s); the daemon drains: it "
                      "ends unstarted", t.id, e)
            return True
        log.error("task %s stays queued: %s (retrying in %gs)", t.id, e, RETRY)
        t.state = "queued"
        d.scheduler.requeue(t)
        d.room.give(t.uid, t.holds)
        t.holds = 0
        d.nursery.start_soon(_dispatch_later, d)
        return False


async def _dispatch_later(d: Daemon) -> None:
    await trio.sleep(RETRY)
    dispatch(d)


async def adopt(d: Daemon, t: DaemonTask, handle: TaskHandle) -> None:
    """The life of a task a previous daemon process handed over: it runs already (its
    "running" row is there); wait for its result and record it."""
    import supervisor

    _running(d, t, handle)
    try:
        result = await handle.wait()
    except supervisor.HandedOver:
        return  # handed over once more: the next daemon process records its end
    finally:
        d.scheduler.finished(t.uid)
        dispatch(d)
    await take_result(d, t, result)


async def take_result(d: Daemon, t: DaemonTask, result: TaskResult,
                      reported: Reported | str | None = None) -> None:
    """Keep ``result`` as the task's and write its end record; ``reported``: a session
    command's report of what it left (None: there is none, e.g. the task crossed a
    restart)."""
    t.started.set()
    with trio.CancelScope(shield=True):  # (a large command's JSON is made off the loop)
        kept, t.result_json = await d.off_loop(t.uid, t.work, _keep, t.output, result)
    t.kept.update(kept)
    t.outcome = str(result.outcome)
    t.exit_status = result.exit_status
    t.ended_at = result.ended_at
    t.started_at = result.started_at
    await write_end(d, t, _carry(d, t, reported))


def _keep(output: str, result: TaskResult) -> tuple[dict[str, tuple[int, bytes]],
                                                     dict[str, Any]]:
    """What the daemon keeps of a result: per stream, its total bytes and the tail beyond
    the file's cap (written beside the file); the result's JSON as kept (``kept_result``)."""
    kept, tails = {}, {}
    for name, out in (("stdout", result.output_stdout), ("stderr", result.output_stderr)):
        tail = out.tail if out.log_truncated else b""
        kept[name] = (out.total, tail)
        if tail:
            tails[name] = _write_tail(stream_path(output, name), tail)
    return kept, kept_result(result, result.to_dict(), output, tails)


def _carry(d: Daemon, t: DaemonTask,
           reported: Reported | str | None) -> tuple[str, dict[str, Any]] | None:
    """A session command's end: what it carries over to its session (``t.carried``), and the
    session's new columns, written with the end row; None for a task of no open session."""
    if t.session is None:
        return None
    s = d.sessions.get(t.session)
    if s is None:
        t.carried = {"nothing": f"its session {t.session} was closed"}
        return None
    s.running.discard(t.id)
    if s.current == t.id:
        s.current = None
    background = bool((t.request.session or {}).get("background"))
    env_before, cwd_before = s.env, s.cwd
    t.carried = {"nothing": DEMOTED} if t.demoted else carried_state(
        s, str(t.outcome), background, reported)
    t.carried = unenterable(s, t.request.cwd, (t.result_json or {}).get("error")) \
        or t.carried
    # (the environment only if it changed: a session carrying a MiB of it rewrote that MiB
    # with every command's end, and every other uid's commit waited for it)
    if env_before is not None and (s.env is env_before or s.env == env_before):
        s.env = env_before  # (the same: its weight, kept, is not walked again at the next exec)
        return s.id, {"cwd": s.cwd}
    was = s.weigh(env_before)  # (kept from the command before: one environment is kept)
    if isinstance(reported, Reported) and s.env is reported.env:
        s.weighed = (s.env, reported.weight)  # (weighed where it was read)
    refused = d.keep_session_env(s.uid, s.weigh(s.env) - was,
                                 len(s.env or ()) - len(env_before or ()))
    if refused is not None:
        s.env, s.cwd = env_before, cwd_before
        s.weighed = None if env_before is None else (env_before, was)
        t.carried = {"nothing": refused}
        return None
    return s.id, {"cwd": s.cwd, "env": s.env}


SERVED_TEXT = 64 << 10  # bytes of a stream's head and tail a result has (TaskSpec's default)


async def write_end(d: Daemon, t: DaemonTask,
                    session: tuple[str, dict[str, Any]] | None = None) -> None:
    """The end record (shielded: it is written whatever else happens), with the new state of
    its session (``session``) if it is a session's command; then the task is finished for
    waiters, followers and subscribers; a failed write is retried in the background (the
    task stays in memory, ``"record": "pending"``)."""
    assert t.result_json is not None and t.ended_at is not None
    values = end_values(t, notify=d.hooks.enabled)
    # (its answer: the result, what it carried; each stream's head and tail come back from
    # its file, six bytes of JSON a byte at most, an escape's)
    text = SERVED_TEXT if t.spec is None else t.spec.output_head + t.spec.output_tail
    t.result_weight = len(values["result"]) + len(values["carried"] or "") + 6 * sum(
        min(total, text) for total, _ in t.kept.values())
    d.room.settle(t.uid, t.holds, values["bytes"])  # (its worst case: now what it took)
    if t.holds and d.scheduler.total_queued:
        # (a start may wait for what it held: the disk's room, or its uid's half of it
        # (``Room.capped``, which asks retention for nothing); only a start waiting for the
        # room was tried again, and a uid's next task after a large one waited for good)
        dispatch(d)
    t.holds = 0
    with trio.CancelScope(shield=True):
        d.ending += 1
        try:
            await d.records.ended(t.id, values, session)
            t.recorded = True
        except RecordsError as e:
            if t.state == "queued" and _ended_by_the_stop(t):
                _stays_queued(d, t, e)
                return
            log.error("task %s: its end record could not be written: %s; retrying, and "
                      "answering from memory meanwhile", t.id, e)
            d.unrecorded.add(t.id)
            d.nursery.start_soon(_retry_end, d, t, values, session)
        finally:
            d.ending -= 1
    t.state = "finished"
    t.handle = None  # the core's handle is done with: let it go
    t.spec = None  # (so is the spec: a finished task held in memory holds its request only)
    t.done.set()
    d.task_finished(t)
    if t.recorded:
        d.hooks.finished(t.id, t.uid)


def _ended_by_the_stop(t: DaemonTask) -> bool:
    """Whether the daemon's stop ended ``t`` (not its user: a user's stop of a queued task is
    answered "cancelled" at once, and may be written after the stop began)."""
    stop = (t.result_json or {}).get("stop") or {}
    return bool(stop.get("reason") == "shutdown")


def _stays_queued(d: Daemon, t: DaemonTask, error: RecordsError) -> None:
    """A queued task the drain ends unstarted whose end cannot be written: nothing is said
    of it (no waiter, follower or subscriber is told it ended), and its row, still queued,
    is queued again by the next start, which runs it.  (Answered "cancelled" from memory, it
    ran all the same after the restart: an independent attack, on a full state disk.)"""
    log.error("task %s: its end (never started, the daemon stopping) cannot be written: %s; "
              "it stays queued, and the next start runs it", t.id, error)
    t.result_json = t.outcome = t.exit_status = t.ended_at = None
    d.task_left()


def end_values(t: DaemonTask, *, notify: bool) -> dict[str, Any]:
    """The end row's columns for a finished task."""
    assert t.result_json is not None
    result = json.dumps(t.result_json)  # (once: the row stores this text)
    carried = None if t.carried is None else json.dumps(t.carried)
    printed = tuple(stream for stream, (total, _) in t.kept.items() if total)
    request = (t.size or len(json.dumps(t.request.to_json()))) - t.limits_bytes
    # (each row in its share of its table's pages: a tenant's `true`, counted by what the rows
    # keep, was 3.2 KB, and took 4.4; an independent attack)
    kept = len(result) + len(t.listed) + len(carried or "") + t.limits_bytes
    size = output_bytes(t.output, printed) + in_pages(max(0, request)) + row_bytes(
        kept, t.request.idempotency_key, t.request.name)
    return {"outcome": t.outcome, "exit_status": t.exit_status, "started_at": t.started_at,
            "ended_at": t.ended_at, "pid": t.pid, "result": result, "bytes": size,
            "notified": 0 if notify else None, "carried": carried}


async def _retry_end(d: Daemon, t: DaemonTask, values: dict[str, Any],
                     session: tuple[str, dict[str, Any]] | None) -> None:
    """Retry an end row until it is written (doubling waits up to 30 s), or the daemon gives
    up on it at exit (``d.gave_up``, its scope in ``d.retrying`` cancelled): then it is kept
    for the next start in room of the daemon's own when the records close (``pendingends``),
    or, if it does not fit there, its result is logged whole, never dropped silently.  (A
    retry that began after the exit's last chance, of an end written late in the drain, used
    to go on for ever: the daemon never exited.)"""
    with trio.CancelScope() as scope:
        d.retrying.add(scope)
        try:
            if not d.gave_up:
                await _retry_end_loop(d, t, values, session)
        finally:
            d.retrying.discard(scope)
    if not t.recorded:
        d.records.pending.add(t.uid, t.id, values, session, lambda: json.dumps(
            served_result(t.result_json, t.output, t.request.argv)))


async def _retry_end_loop(d: Daemon, t: DaemonTask, values: dict[str, Any],
                          session: tuple[str, dict[str, Any]] | None) -> None:
    wait = RETRY
    while True:
        await trio.sleep(wait)
        try:
            await d.records.ended(t.id, values, session)
        except RecordsError as e:
            log.error("task %s: its end record still cannot be written: %s", t.id, e)
            wait = min(wait * 2, 30.0)
            continue
        log.info("task %s: its end record is written now", t.id)
        t.recorded = True
        d.unrecorded.discard(t.id)
        d.evict()
        d.hooks.finished(t.id, t.uid)
        return


async def _record_failure(d: Daemon, t: DaemonTask, error: Exception) -> None:
    """The core's record if it made one before failing and it can be kept; else one of
    ``lost`` the core's record builder makes (``Supervisor.record_lost``): a complete record
    of the result format that says what happened."""
    core = None if t.handle is None else t.handle.result
    if core is not None and t.result_json is None:
        try:
            await take_result(d, t, core)
            return
        except Exception:
            log.exception("task %s: keeping the core's record failed too", t.id)
    why = (f"corral serve could not run this task to its end (a bug; the daemon's log has "
           f"it): {error!r}")
    # (without the id: the core may hold it, for the record it made and we failed to keep)
    result = dataclasses.replace(d.sup.record_lost(
        tuple(t.request.argv), name=t.request.name, why=why, started=t.started_at is not None),
        id=t.id)
    t.result_json = None
    await take_result(d, t, result)


def _write_tail(path: str, tail: bytes) -> bool:
    """The kept tail of a stream whose file hit the cap, beside it (``<file>.tail``), so that
    the last bytes outlive the task's place in memory.  At most the tail size (48 KiB).
    Whether it was written."""
    try:
        fd = os.open(path + ".tail", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(tail)
        return True
    except OSError as e:
        log.warning("keeping the output tail at %s.tail: %s", path, e)
        return False
