"""Retention: finished tasks are kept by age, count and bytes, then expire (``--retain-*``).

Enforced while the daemon runs: a pass soon after tasks finish (at most one a second), and
one every minute (or every quarter of ``--retain-age``, if shorter) for age.  A pass commits
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

import trio

from .records import RecordsError
from .schema import output_bytes
from .state import Daemon

__all__ = ["expire_now", "retention_loop"]

log = logging.getLogger(__name__)

PERIOD = 60.0  # seconds between passes when nothing finishes (age moves on)
MIN_GAP = 1.0  # seconds between passes


async def retention_loop(d: Daemon) -> None:
    """Run passes until cancelled."""
    age = d.config.retention.max_age
    period = PERIOD if age is None else min(PERIOD, max(MIN_GAP, age / 4))
    while True:
        with trio.move_on_after(period):
            await d.retention_due.wait()
        d.retention_due = trio.Event()
        await expire_now(d)
        await trio.sleep(MIN_GAP)


async def expire_now(d: Daemon) -> int:
    """One pass; how many tasks expired."""
    running = await trio.to_thread.run_sync(
        _running_bytes, [(t.uid, t.output) for t in d.tasks.values() if t.state != "finished"
                         and t.state != "queued"])
    try:
        gone = await d.records.expire(d.config.retention, time.time(), d.disk.budget, running)
    except RecordsError as e:
        log.error("retention: %s; retrying in %gs", e, PERIOD)
        return 0
    for g in gone:
        d.forget(g["id"])
    if gone:
        await trio.to_thread.run_sync(_remove_files, d.output_dir, [g["id"] for g in gone])
        log.info("retention: %d finished task(s) expired (ids %s...)", len(gone),
                 ", ".join(g["id"] for g in gone[:5]))
    return len(gone)


def _running_bytes(tasks: list[tuple[int, str]]) -> dict[int, int]:
    """What each uid's running tasks' output files hold now (a few stats a task)."""
    held: dict[int, int] = {}
    for uid, output in tasks:
        held[uid] = held.get(uid, 0) + output_bytes(output)
    return held


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
