"""The daemon's main loop.

:func:`serve` runs these steps, each a function below or in the module named:

1. ``fdstore.take``: what systemd passed (a socket unit's listener; after ``systemctl
   restart``, the fds and state the previous process parked in the fd store).
2. ``Records.open``: the state directory (locked: one daemon per directory), ``state.db``
   (migrated; a newer, damaged, locked or read-only one is refused here, with the fix), and
   this run's row.
3. ``open_supervisor``: the cgroup root (the library's own discovery, or ``--cgroup-root``),
   adopting the parked tasks if there are any; every root an earlier run left unlocked is
   cleared by the placement.  Then the fd store is emptied (``fdstore.release``).
4. ``bind_listeners`` (``server.py``): the passed or parked socket, or ``--socket`` bound here.
5. ``recover``: every unfinished row of earlier runs settled: queued ones run, adopted ones go
   on, the rest are recorded ``lost`` with their cleanup.
6. ``notify_ready``: READY=1 and a STATUS= line for systemd (Type=notify).
7. ``run_server``: accept connections (tasks start as they are queued and as others end);
   alongside: systemd told (STATUS=, WATCHDOG=1), lazy record updates flushed, retention,
   completion callbacks; until SIGTERM.
8. On SIGTERM, ``hand_over`` when systemd says it is restarting us (running tasks go on,
   parked in the fd store for the next process), else ``drain``: refuse new tasks (503), end
   queued tasks unstarted, stop running ones gracefully (reason ``shutdown``), write every
   record, close; a second SIGTERM kills every task now.
9. On the way out: this run's row ended (stopped or handed_over), the records closed, the
   socket file removed (unless parked).

Ownership: the trio thread holds ``state.Daemon`` (the task table, the queue, the records'
front; the records' SQLite threads, the spawn guard's and the worker threads never touch it);
each task's life runs in the tasks nursery, each connection and helper in the server nursery.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .. import open_supervisor
from . import fdstore
from .dispatch import stop_queued
from .hooks import Hooks
from .records import LAZY_DELAY, Records, RecordsError
from .recover import recover, write_kept_ends
from .retention import retention_loop
from .sdjob import restart_queued
from .sdnotify import Notifier, listen_fds
from .server import Bound, accept_loop, bind_listeners
from .state import Config, Daemon, OutputDisk

if TYPE_CHECKING:
    from .. import Supervisor

__all__ = ["Config", "Daemon", "serve"]

log = logging.getLogger(__name__)
T = TypeVar("T")

HANDOVER_START_WAIT = 30.0  # seconds tasks being started may take before a hand-over
UNRECORDED_WAIT = 10.0  # seconds a drain retries end records that failed
# the core's own results kept in memory until recover() has taken those of tasks a hand-over
# could not adopt; none after (the daemon records each itself, and a result holds its argv)
CORE_RESULTS = 16
SWITCH_INTERVAL = 0.001  # seconds (sys.setswitchinterval; see serve)
KEYS_CHECKED = 60.0  # seconds between looks at whether the keys' filter is due to be made again
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # drain; again: kill (HUP: ignored)


def supports_adoption() -> bool:
    """Whether this corral's core can take tasks over from another process."""
    import supervisor

    return "adopt" in inspect.signature(open_supervisor).parameters and \
        hasattr(supervisor.Supervisor, "hand_over")


async def serve(config: Config, *,
                task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the daemon until SIGTERM (or the caller's cancellation) and its drain or
    hand-over."""
    # a thread that wants the GIL asks for it after this long (Python's default: 5 ms): the
    # records thread's commit and the event loop's next request wait no longer behind a busy
    # other thread (a tenant's large answer being encoded, a submission parsed off the loop)
    sys.setswitchinterval(SWITCH_INTERVAL)
    notifier = Notifier()
    passed = fdstore.take(listen_fds())
    records = await _unless_abandoned(notifier, passed, Records.open(config.state_dir))
    run: int | None = None
    ended = "stopped"
    try:
        run = await _unless_abandoned(notifier, passed,
                                      records.begin_run(os.getpid(), time.time()))
        runs = await records.runs()
        async with _supervisor(config, notifier, passed) as sup:
            held = await records.held_bytes()
            disk = OutputDisk.measure(config, held, earlier=max(
                (r["room"] or 0 for r in runs.values()), default=0))
            await records.set_run_root(run, sup.cgroup_root, disk.room)
            adopted = {h.id: h for h in sup.tasks}  # (nothing else has started yet)
            hooks = Hooks(records, program=config.on_finish_exec, url=config.on_finish_url,
                          socket=config.on_finish_socket,
                          output_dir=os.path.join(config.state_dir, "output"))
            with bind_listeners(config, passed.listeners, passed.own) as bound:
                async with trio.open_nursery() as tasks_nursery:
                    if await write_kept_ends(records, adopted):
                        held = await records.held_bytes()  # (with the ends' rows)
                    d = Daemon(config, sup, records, tasks_nursery, notifier, hooks, run, disk,
                               held)
                    summary = await recover(d, runs, adopted)
                    sup.retain_results = 0  # (the records keep every result from now on)
                    records.serving()
                    log.info("started (run %d, cgroup root %s): from earlier runs %d task(s) "
                             "queued again, %d adopted, %d recorded lost; %d orphan output "
                             "file(s) removed; output may take %d bytes of the state "
                             "filesystem, %d per stream of a task", run, sup.cgroup_root,
                             *summary, disk.budget, disk.stream_cap)
                    try:
                        ended = await run_server(d, bound, task_status)
                    finally:
                        d.shares.loop.off()
                    bound.keep = ended == "handed_over"
    finally:
        with trio.CancelScope(shield=True):
            await _close_records(records, run, ended)


async def _unless_abandoned(notifier: Notifier, passed: fdstore.Passed,
                            step: Awaitable[T]) -> T:
    """``await step``; if it fails, a parked hand-over is abandoned (its tasks killed)."""
    try:
        return await step
    except BaseException:
        await trio.to_thread.run_sync(fdstore.abandon, notifier, passed)
        raise


@asynccontextmanager
async def _supervisor(config: Config, notifier: Notifier,
                      passed: fdstore.Passed) -> AsyncIterator[Supervisor]:
    """``open_supervisor``, adopting a parked hand-over if there is a usable one; the fd
    store emptied (before the placement when nothing is adopted: the old root's lock must be
    free for it to be cleared; after it otherwise)."""
    handover = fdstore.adopt_from(passed, supports_adoption())
    if handover is None:
        await trio.to_thread.run_sync(fdstore.release, notifier, passed)
    adopt: dict[str, Any] = {} if handover is None else {"adopt": handover}
    opened = False
    try:
        async with open_supervisor(config.cgroup_root, config.default_time_limit,
                                   config.max_time_limit, retain_results=CORE_RESULTS,
                                   **adopt) as sup:
            opened = True
            if handover is not None:
                await trio.to_thread.run_sync(fdstore.release, notifier, passed)
            yield sup
    except BaseException:
        if not opened and handover is not None:
            await trio.to_thread.run_sync(fdstore.abandon, notifier, passed)
        raise


async def _close_records(records: Records, run: int | None, ended: str) -> None:
    try:
        if run is not None:
            await records.end_run(run, time.time(), ended)
    except RecordsError as e:
        log.error("recording the end of this run: %s", e)
    finally:
        await records.close()


def notify_ready(d: Daemon) -> None:
    d.notifier.notify(READY="1", STATUS=f"serving: cgroup root {d.sup.cgroup_root}")


async def run_server(d: Daemon, bound: Bound,
                     task_status: trio.TaskStatus[Daemon]) -> str:
    """Serve until a drain or a hand-over ends it; which ("stopped", "handed_over")."""
    async with trio.open_nursery() as server:
        accepting = trio.CancelScope()
        server.start_soon(_accept, d, bound, server, accepting)
        server.start_soon(_watch_signals, d, server.cancel_scope, accepting, bound)
        server.start_soon(_flush_lazy, d)
        server.start_soon(_load_keys, d)
        server.start_soon(retention_loop, d)
        server.start_soon(d.hooks.run, d.sup)
        notify_ready(d)
        if d.notifier.enabled:
            server.start_soon(_tell_systemd, d)
        task_status.started(d)
    return "handed_over" if d.handed_over else "stopped"


async def _accept(d: Daemon, bound: Bound, server: trio.Nursery,
                  accepting: trio.CancelScope) -> None:
    with accepting:
        async with trio.open_nursery() as loops:
            for listener in bound.listeners:
                loops.start_soon(accept_loop, d, listener, server, loops)


async def _watch_signals(d: Daemon, server: trio.CancelScope, accepting: trio.CancelScope,
                         bound: Bound) -> None:
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        # `corral serve` keeps them blocked while it starts (one sent then waited here)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    continue  # no configuration to reload; never a reason to die
                if d.handing_over:
                    log.info("signal %s while handing over: ignored", signum)
                elif not d.draining:
                    nursery.start_soon(_stop, d, signum, server, accepting, bound)
                else:
                    log.info("signal %s again: killing every task now", signum)
                    kill_all(d, signum)


async def _stop(d: Daemon, signum: int, server: trio.CancelScope,
                accepting: trio.CancelScope, bound: Bound) -> None:
    """SIGTERM: hand over when systemd restarts us, else drain."""
    if signum == signal.SIGTERM and d.notifier.enabled and d.config.hand_over and \
            supports_adoption():
        restart = await trio.to_thread.run_sync(restart_queued)
        log.info("SIGTERM: %s", restart.why)
        if restart.queued and await _hand_over_or_not(d, accepting, bound, restart.store_max):
            server.cancel()
            return
    log.info("signal %s: draining", signum)
    await drain(d, server, signum)


async def _load_keys(d: Daemon) -> None:
    """The records' idempotency keys into ``d.key_filter`` (until then, and if they cannot be
    read, a submission with a key not in memory is looked up in the records, as always); then
    the filter made again from them whenever it is due (``KeyFilter.due``)."""
    try:
        d.key_filter.load(await d.records.key_bits())
    except RecordsError as e:
        log.warning("the records' idempotency keys could not be read (%s): every key not "
                    "in memory is looked up", e)
        return
    while True:
        await trio.sleep(KEYS_CHECKED)
        if d.key_filter.due:
            d.key_filter.rebuilding(d.keys)
            bits = None
            try:
                bits = await d.records.key_bits()
            except RecordsError as e:
                log.warning("the records' idempotency keys could not be read again (%s)", e)
            finally:
                d.key_filter.rebuilt(bits)


async def _flush_lazy(d: Daemon) -> None:
    while True:
        await trio.sleep(LAZY_DELAY)
        if d.records.lazy_pending:
            try:
                await d.records.flush_lazy()
            except RecordsError as e:
                log.warning("a task's \"running\" record: %s", e)


async def _tell_systemd(d: Daemon) -> None:
    """WATCHDOG=1 (when systemd asked for it) and a STATUS= line when the counts change."""
    interval = min(d.notifier.watchdog_interval or 5.0, 5.0)
    last = ""
    while True:
        s = d.scheduler
        status = (f"serving: {s.total_running} running, {s.total_queued} queued, "
                  f"{d.connections} connections")
        if d.unrecorded:
            status += f"; {len(d.unrecorded)} end record(s) failing (see the log)"
        fields = {"WATCHDOG": "1"} if d.notifier.watchdog_interval else {}
        if status != last and not (d.draining or d.handing_over):
            fields["STATUS"] = last = status
        if fields:
            d.notifier.notify(**fields)
        await trio.sleep(interval)


# ---- stopping ------------------------------------------------------------------------------

async def drain(d: Daemon, server: trio.CancelScope, signum: int | None = None) -> None:
    """Stop accepting tasks (503; the other verbs still answer, so that clients can wait
    for their results); running tasks stop (reason shutdown), killed if still running
    ``--drain-timeout`` after; then the queued tasks end unstarted; once every record is
    written, close the listeners and the connections.

    The running tasks' ends are written first: on a disk that fills (another program's, the
    records' reserve spent), the room left goes to them, whose unwritten end the next start
    can only record ``lost``, and not to the queue's, whose unwritten ends leave the tasks
    queued for the next start (``dispatch._stays_queued``).  (The queue's ends went first:
    an independent attack's queue of 226 tasks spent the reserve, and the other tenant's 8
    running tasks were recorded lost.)"""
    d.draining = True
    d.notifier.notify(STOPPING="1", STATUS=f"draining: {d.scheduler.total_running} "
                      f"running, {d.scheduler.total_queued} queued")
    d.sup.stop_all(reason=_shutdown_reason(), by_signal=signum)
    with trio.move_on_after(d.config.drain_timeout):
        await _lives_ended(d)
    if _running_lives(d):
        log.warning("drain: %d task(s) still running %gs after their stop (a longer "
                    "grace, or a stop signal ignored): killing them (--drain-timeout)",
                    _running_lives(d), d.config.drain_timeout)
        kill_all(d, signum)
        await _lives_ended(d)
    for t in list(d.tasks.values()):
        stop_queued(d, t, "shutdown")
    if d.live:
        await d.all_ended.wait()
    await _await_unrecorded(d)
    # let answers already made (waits, the end frames of followed streams) go out
    with trio.move_on_after(1.0):
        while d.connections:
            await trio.sleep(0.01)
    server.cancel()


def _running_lives(d: Daemon) -> int:
    """Tasks out of the queue whose life has not ended (its end written or given up on):
    starting, running, stopping, or being recorded."""
    return d.live - d.scheduler.total_queued


async def _lives_ended(d: Daemon) -> None:
    while _running_lives(d):
        await trio.sleep(0.01)


async def _await_unrecorded(d: Daemon) -> None:
    """End records being written or retried get a last chance (every one, those of the
    queued tasks the drain ended included); then the daemon gives up on the rest, whose
    results are logged whole (never dropped silently: ``dispatch._retry_end``)."""
    with trio.move_on_after(UNRECORDED_WAIT):
        while d.ending or d.unrecorded:
            await trio.sleep(0.1)
    d.gave_up = True
    for scope in d.retrying:
        scope.cancel()


def kill_all(d: Daemon, signum: int | None = None) -> None:
    d.sup.stop_all(force=True, reason=_shutdown_reason(), by_signal=signum)


def _shutdown_reason() -> Any:
    import supervisor

    return supervisor.StopReason.SHUTDOWN


async def _hand_over_or_not(d: Daemon, accepting: trio.CancelScope, bound: Bound,
                            store_max: int | None) -> bool:
    """:func:`hand_over`; False (drain instead) if it did not happen.  A failure before the
    core let go of the tasks leaves them ours: they are drained as for a stop."""
    try:
        return await hand_over(d, accepting, bound, store_max)
    except Exception:
        if d.handed_over:
            raise  # (the tasks are gone from us: nothing to drain)
        log.exception("handing the tasks over failed: stopping them instead")
        d.handing_over = False
        return False


async def hand_over(d: Daemon, accepting: trio.CancelScope, bound: Bound,
                    store_max: int | None) -> bool:
    """Hand the running tasks to the next daemon process through the fd store (see
    ``fdstore.py``); False (nothing changed: drain instead) if they would not fit."""
    running = [t for t in d.tasks.values() if t.outcome is None and t.state != "queued"]
    need = 2 + 8 * len(running)  # root, state, and at most 8 per task (core's names)
    why = fdstore.store_room(need, store_max)
    if why is not None:
        log.warning("not handing %d task(s) over: %s", len(running), why)
        return False
    d.handing_over = True
    accepting.cancel()  # new connections wait in the socket's backlog for the next process
    d.notifier.notify(STOPPING="1", STATUS=f"restarting: handing {len(running)} running "
                      f"task(s) over")
    await _wait_started(d)
    await d.hooks.stop()  # a callback being delivered is a task too: delivered again later
    with trio.move_on_after(1.0):  # answers already made go out
        while d.connections:
            await trio.sleep(0.01)
    handover = await d.sup.hand_over()
    d.handed_over = True
    await d.records.flush_lazy()
    await _await_unrecorded(d)
    state = {"run": d.run, "socket": d.config.socket, "root": handover.root_path,
             "handover": handover.to_json()}
    try:
        await trio.to_thread.run_sync(fdstore.park, d.notifier, handover.fds(), state,
                                      bound.own)
    except OSError as e:
        log.error("parking the hand-over in systemd's fd store failed: %s; its %d task(s) "
                  "will be recorded lost by the next start", e, len(handover.tasks))
    else:
        log.info("handed %d task(s) over to the next daemon process", len(handover.tasks))
    return True


async def _wait_started(d: Daemon) -> None:
    """Tasks between their "starting" row and their spawn finish starting (or fail)."""
    with trio.move_on_after(HANDOVER_START_WAIT):
        while any(t.state == "starting" for t in d.tasks.values()):
            await trio.sleep(0.01)
