"""Retention: finished tasks are kept by age, count and bytes, then expire (``--retain-*``).

Enforced while the daemon runs: a pass soon after tasks finish (at most one a second), and
one every minute (or every quarter of ``--retain-age``, if shorter) for age; at once, without
the gap, when a task waits to start for the disk's room (``room.py``).  A pass commits
first (each expired row becomes a tombstone in ``expired``, so that a late request is told the
task expired rather than that it never existed), then forgets the tasks held in memory and
removes their output files.  A crash between the commit and the unlinks leaves files without a
row: the next start removes them (``recover.py``).  Running and queued tasks never expire, nor
do finished ones whose end row is still being retried (their row is not "finished" yet).

The bytes are shared fairly between uids (``rows.expire``): what a uid's running tasks'
files hold now counts as its own, so that one tenant's idle tasks never take another's
finished results (a reservation of the worst case for each running task did: eight idle
sleeps of one uid erased everyone's results).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import trio

from .dispatch import dispatch
from .records import RecordsError
from .schema import output_bytes
from .state import Daemon

__all__ = ["expire_now", "retention_loop"]

log = logging.getLogger(__name__)

PERIOD = 60.0  # seconds between passes when nothing finishes (age moves on)
MIN_GAP = 1.0  # seconds between passes
RETRY = 5.0  # seconds before a failed pass is tried again while a start waits for room
TOMB_SHARE = 8  # tombstones may take at most this part of the disk's room (rows.tomb_bytes)
LOG_GAP = 60.0  # seconds between two log lines of what expired


async def retention_loop(d: Daemon) -> None:
    """Run passes until cancelled."""
    age = d.config.retention.max_age
    period = PERIOD if age is None else min(PERIOD, max(MIN_GAP, age / 4))
    failed = False
    while True:
        # (a pass that failed while a start waits for room is tried again sooner)
        with trio.move_on_after(RETRY if failed and d.room.wanted else period):
            await d.retention_due.wait()
        d.retention_due = trio.Event()
        d.room.asked = trio.Event()
        failed = await expire_now(d) is None
        with trio.move_on_after(MIN_GAP):
            await d.room.asked.wait()  # (a start waits for the disk's room: no gap)


async def expire_now(d: Daemon) -> int | None:
    """One pass; how many tasks expired (None: the records could not be written).  If a
    start waits for the disk's room (``room.py``), finished tasks also expire until it fits,
    and the queue is tried again."""
    if d.regrow_disk():
        log.info("the state filesystem has more room than at start: output may take %d "
                 "bytes of it now, %d per stream of a task", d.disk.budget, d.disk.stream_cap)
    running = await trio.to_thread.run_sync(
        _running_bytes, [(t.uid, t.output) for t in d.tasks.values() if t.state != "finished"
                         and t.state != "queued"])
    pressed = d.room.pressed()
    # (what the ledger holds that no pass may expire counts too: running worst cases, the
    # waiting start's, sessions' environments; rows.expire adds each uid's tombstones)
    room = None if pressed is None else (d.room.aim, {
        u: pressed.get(u, 0) + d.session_env.get(u, 0) for u in {*pressed, *d.session_env}})
    try:
        if d.room.room > d.room_recorded:  # (the next run takes no less: OutputDisk.measure)
            await d.records.set_run_room(d.run, d.room.room)
            d.room_recorded = d.room.room
        gone, freed, held = await d.records.expire(d.config.retention, time.time(),
                                                   d.disk.budget, running, room,
                                                   d.room.room // TOMB_SHARE)
    except RecordsError as e:
        log.error("retention: %s; retrying in %gs", e, RETRY if d.room.wanted else PERIOD)
        return None
    d.metrics.retention_passes.inc()
    d.metrics.expired.inc(len(gone))
    for g in gone:
        d.forget(g["id"])
    if gone:
        await d.records.give_back()
    if freed:
        d.room.expired(freed)
    if held is not None:
        d.room.held_by = held
    if gone:
        await trio.to_thread.run_sync(_remove_files, d.output_dir, [g["id"] for g in gone])
        _say_expired(d, gone)
        if d.room.wanted is not None:
            dispatch(d)
    return len(gone)


def _running_bytes(tasks: list[tuple[int, str]]) -> dict[int, int]:
    """What each uid's running tasks' output files hold now (a few stats a task)."""
    held: dict[int, int] = {}
    for uid, output in tasks:
        held[uid] = held.get(uid, 0) + output_bytes(output)
    return held


def _say_expired(d: Daemon, gone: list[dict[str, Any]]) -> None:
    """Log what expired, at most once per :data:`LOG_GAP` (a pass per task, when tasks wait
    for the disk's room: a tenant's flood of tasks was a line of root's log each)."""
    now = time.monotonic()
    last, count, first = d.expired_unsaid
    count, first = count + len(gone), first or gone[0]["id"]
    if now - last < LOG_GAP:
        d.expired_unsaid = (last, count, first)
        return
    d.expired_unsaid = (now, 0, "")
    log.info("retention: %d finished task(s) expired%s (the first id %s, the last %s)",
             count, f" in the last {now - last:.0f}s" if last > 0 else "", first,
             gone[-1]["id"])


def _remove_files(output_dir: str, ids: list[str]) -> None:
    for task_id in ids:
        base = os.path.join(output_dir, task_id)
        for suffix in ("", ".tail", ".stderr", ".stderr.tail"):
            try:
                os.unlink(base + suffix)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("retention: removing %s: %s", base + suffix, e)
