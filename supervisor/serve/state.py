"""What every verb works on: the configuration and the daemon's state (no I/O of its own).

``Daemon`` holds the supervisor, the records, the task table (ids -> ``DaemonTask``), the
queue, the event hub and the metrics.  ``dispatch.py`` moves tasks along, ``daemon.py`` runs
the main loop and the connections; both use this module, and it uses neither (no import
cycle).  Nothing here locks: it is changed on the trio thread only (a large submission's
spec is built in a worker thread, which only reads the configuration).
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import trio

from .daemontask import DaemonTask, answer_text, end_frame_text
from .events import EventHub
from .http import HEAVY_ANSWER, HttpLimits, Response, encode_in_turns
from .keyfilter import KeyFilter
from .metrics import Metrics
from .offload import Offload
from .peers import Peer
from .protocol import DEFAULT_SOCKET, LARGE_BODY, ApiError, SubmitRequest
from .records import Records, Retention
from .room import BLOCK, Room, worst
from .scheduler import QueueLimits, Scheduler
from .sessions import ENV_PER_UID, VARS_PER_UID, Session
from .shares import Shares
from .specs import build_spec

T = TypeVar("T")
HEAVY = LARGE_BODY  # work above this (bytes, protocol.ITEM_WORK an item) is done off the event loop

if TYPE_CHECKING:
    from .. import Supervisor, TaskSpec
    from .hooks import Hooks
    from .sdnotify import Notifier

__all__ = ["DEFAULT_STATE_DIR", "Config", "Daemon", "OutputDisk", "expired_error", "not_found",
           "refuse_while_restarting"]

DEFAULT_STATE_DIR = "/var/lib/corral"
ANSWERS_HELD = 32 << 20  # bytes of finished tasks' large answers kept encoded (Answers)
END = " end"  # after a task's id: the key of its output's last frame kept in Answers
BIG_REQUEST = 64 << 10  # a finished task whose request's work is above this is not kept


class Config(NamedTuple):
    socket: str = DEFAULT_SOCKET
    state_dir: str = DEFAULT_STATE_DIR
    cgroup_root: str | None = None
    default_time_limit: str | None = None
    max_time_limit: str | None = None
    allow_gid: int | None = None
    metrics_gid: int | None = None  # who besides root may read /metrics
    socket_mode: int = 0o666
    queue: QueueLimits = QueueLimits()
    http: HttpLimits = HttpLimits()
    output_cap: int = 64 << 20  # per stream and task, in the state directory
    max_connections: int = 4096
    max_connections_per_uid: int = 256
    body_bytes_per_uid: int = 8 << 20  # request bodies a uid's connections hold at once
    # finished tasks held in memory with their result JSON (up to ~130 KiB each with full
    # output tails); older ones are answered from the records
    keep_finished: int = 256
    retention: Retention = Retention()
    on_finish_exec: str | None = None  # a program run with each finished task's event
    on_finish_url: str | None = None  # POSTed each finished task's event ...
    on_finish_socket: str | None = None  # ... over this Unix socket
    # under systemd, `systemctl restart` hands running tasks to the next daemon
    hand_over: bool = True
    # the open-files soft limit root's tasks start with: the daemon's own before it raised it
    # for its connections (None: as the daemon has it); tenants' tasks start with their own
    task_nofile_soft: int | None = None
    # on shutdown, tasks still running this long after their stop are killed (a tenant's
    # grace of a year, or a stop signal it ignores, never holds the shutdown)
    drain_timeout: float = 60.0


MIN_STREAM_CAP = 64 << 10  # a task's output file keeps at least this much of each stream
DISK_SHARE = 0.8  # of the state filesystem's room (free + ours) the output may take
# kept aside first (at most a quarter of the room) for the records' own growth: the WAL
# (journal_size_limit: 4 MiB once checkpointed) and the rows of queued and running tasks
RECORDS_ROOM = 8 << 20


def _share(there: int) -> int:
    """The output's room of a filesystem with room for ``there`` bytes: :data:`DISK_SHARE`
    of it once the records' own is set aside."""
    return int((there - min(RECORDS_ROOM, there // 4)) * DISK_SHARE)


class OutputDisk(NamedTuple):
    """How much of the state filesystem the tasks' output may take, measured at start (and
    again by retention's passes: ``Daemon.regrow_disk``).

    ``room``: at most :data:`DISK_SHARE` of what the filesystem has room for (its free space
    and what the daemon holds already, less the records' own): a task starts only if what
    finished tasks hold and every running task's worst case fit it (``room.py``), so that a
    flood of output never fills the disk the records live on.  ``budget``: at most ``room``
    and ``--retain-bytes``: retention keeps the finished tasks and what the running ones hold
    now within it, shared fairly between uids (``retention.py``).  ``stream_cap``: the bytes
    of each stream a task's file keeps (``--output-cap``; less, down to
    :data:`MIN_STREAM_CAP`, on a filesystem too small for ``--max-running`` tasks at that cap:
    their worst cases may take at most half the room)."""

    budget: int
    stream_cap: int
    room: int = 1 << 62

    @classmethod
    def measure(cls, config: Config, held: int, earlier: int = 0) -> OutputDisk:
        """What the state filesystem has room for now, with ``held`` bytes of finished
        tasks' there already; never less than ``held``, nor than the room an ``earlier`` run
        had (as far as the filesystem's size allows): files that are not output (a tenant's,
        if it can write this filesystem) do not shrink it.  A start on a disk something else
        had filled measured a room of a few KB, and retention expired every uid's results to
        fit it, at once and for the queued tasks waiting for it (an independent attack); such
        a disk fails the tasks' writes, not their results."""
        try:
            st = os.statvfs(config.state_dir)
            size = st.f_blocks * st.f_frsize  # (what is free and held is never more)
            room = max(held, _share(min(st.f_bavail * st.f_frsize + held, size)),
                       min(earlier, _share(size)))
        except OSError:
            room = 1 << 62
        limit = config.retention.max_bytes
        budget = room if limit is None else min(limit, room)
        running = config.queue.max_running
        per_stream = min(budget // (2 * running), room // (4 * running) - 2 * BLOCK)
        return cls(budget, min(config.output_cap, max(MIN_STREAM_CAP, per_stream)), room)

    def worst(self, request: int) -> int:
        """What a task with a request of ``request`` bytes may hold at most (``room.py``)."""
        return worst(self.stream_cap, _default_tail(), request)

    def queue_within(self, limits: QueueLimits) -> QueueLimits:
        """``limits`` with the queued requests' bytes at most a quarter of the budget (each
        is in the records until it starts, and a full state filesystem refuses everyone), and
        one uid's at most half of that (on a small disk both were the same, and one tenant's
        queue took all of it: every other uid's submission was 429: an independent attack)."""
        most = max(1 << 20, self.budget // 4)
        total = min(limits.max_queued_bytes, most)
        return limits._replace(
            max_queued_bytes=total,
            max_queued_bytes_per_uid=min(limits.max_queued_bytes_per_uid, total // 2))


@functools.cache
def _default_tail() -> int:
    """The tail of each stream a task keeps (the daemon's specs leave TaskSpec's default)."""
    from .. import TaskSpec
    return TaskSpec(("true",)).output_tail


class Answers:
    """Finished tasks' large answers as sent (the JSON of ``GET /v1/tasks/ID``, which does not
    change once the task is finished and recorded), the most recently used first, at most
    :data:`ANSWERS_HELD` bytes in all."""

    def __init__(self, held: int = ANSWERS_HELD) -> None:
        self.most = held
        self.held = 0
        self._bodies: collections.OrderedDict[str, bytes] = collections.OrderedDict()

    def get(self, task_id: str) -> bytes | None:
        body = self._bodies.get(task_id)
        if body is not None:
            self._bodies.move_to_end(task_id)
        return body

    def put(self, task_id: str, body: bytes) -> None:
        if len(body) > self.most // 4:
            return
        self.pop(task_id)
        self._bodies[task_id] = body
        self.held += len(body)
        while self.held > self.most:
            self.held -= len(self._bodies.popitem(last=False)[1])

    def pop(self, task_id: str) -> None:
        body = self._bodies.pop(task_id, None)
        if body is not None:
            self.held -= len(body)


class Daemon:
    """The state the verbs work on; made by ``daemon.serve`` once the supervisor is open."""

    def __init__(self, config: Config, sup: Supervisor, records: Records,
                 nursery: trio.Nursery, notifier: Notifier, hooks: Hooks, run: int,
                 disk: OutputDisk | None = None, held: int = 0) -> None:
        self.config = config
        self.disk = disk or OutputDisk.measure(config, held)
        # the disk's room for output: who may start (retention is woken to make room)
        self.room = Room(self.disk.room, held, lambda: self.retention_due.set(),
                         lambda now: self._measure(now).room)
        self.room_recorded = self.disk.room  # (in the run's row: a later run takes no less)
        self.sup = sup
        self.records = records
        self.nursery = nursery  # task lives and record writes
        self.notifier = notifier
        self.hooks = hooks
        self.run = run  # this daemon run's id in the records
        self.output_dir = os.path.join(config.state_dir, "output")
        self.tasks: dict[str, DaemonTask] = {}
        self.sessions: dict[str, Session] = {}  # the open ones (closed: in the records only)
        self.session_env: dict[int, int] = {}  # bytes of the open sessions' env, per uid
        self.session_vars: dict[int, int] = {}  # and their variables
        self.keys: dict[tuple[int, str], str] = {}  # (uid, idempotency key) -> task id
        self.key_filter = KeyFilter()  # the keys the records may hold (keyfilter.py)
        self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.scheduler: Scheduler[DaemonTask] = Scheduler(self.disk.queue_within(config.queue))
        self.hub = EventHub()
        self.following: collections.Counter[int] = collections.Counter()  # uid -> followed
        #                                                 outputs open (verbs/output.py)
        self.shares = Shares(config.max_connections, config.max_connections_per_uid,
                             max(config.body_bytes_per_uid, config.http.max_body))
        self.draining = False
        self.handing_over = False  # systemd restarts us: no new tasks start
        self.handed_over = False  # the core handed the running tasks over
        self.live = 0  # task lives not yet ended
        self.all_ended = trio.Event()
        self.retention_due = trio.Event()  # a task finished: retention may have work
        self.expired_unsaid: tuple[float, int, str] = (-1e9, 0, "")  # retention's log line
        self.ending = 0  # end rows being written (write_end) now
        self.unrecorded: set[str] = set()  # finished, end row still being retried
        self.retrying: set[trio.CancelScope] = set()  # those retries: given up on at exit
        self.gave_up = False  # the daemon exits: an end row that fails now is not retried
        self.stdin_pipes = _stdin_pipe_supported()
        self.offload = Offload()  # large requests' work, the uids taking turns
        self.offload.charge = self.shares.loop.charge  # (its jobs: their uids' loop time)
        # (a uid's tasks' output is read at its share of the loop, and what it costs counted)
        sup.pace_output(self.shares.loop.output_over, self.shares.loop.charge_step)
        self.answers = Answers()  # finished tasks' large answers, encoded once
        self.metrics = Metrics(self._gauges)  # last: it reads the gauges above at once

    async def find(self, peer: Peer, task_id: str) -> DaemonTask | None:
        """The task if it is in memory and ``peer`` may see it; None if not in memory.
        ApiError 404 when it is someone else's, after the records are read as for an id
        never used (answered at once, another uid's recent ids were told from unused ones
        by 1.1 ms: an independent attack)."""
        t = self.tasks.get(task_id)
        if t is not None and not peer.may_see(t.uid):
            await self.find_row(peer, task_id, light=True)
            raise not_found(task_id)  # (not reached: the row is not the peer's)
        return t

    async def find_row(self, peer: Peer, task_id: str, *, light: bool = False,
                       ending: bool = False) -> dict[str, Any]:
        """A task no longer (or never) in memory, from the records; 410 if retention removed
        it (to its owner), 404 if none is ``peer``'s.  ``light``: its id, uid and state only
        (what a stop, a signal or stdin needs); ``ending``: those, its exit status and its
        result, not its request (what an output stream needs until its last frame)."""
        async with self.shares.reading(peer.uid):
            row = await (self.records.owner(task_id) if light else
                         self.records.ending(task_id) if ending else
                         self.records.get(task_id))
        if row is not None and peer.may_see(row["uid"]):
            return row
        async with self.shares.reading(peer.uid):  # (someone else's row too: the same reads)
            gone = await self.records.expired(task_id)
        if row is None and gone is not None and peer.may_see(gone["uid"]):
            raise expired_error(task_id, gone, self.config.retention)
        raise not_found(task_id)

    def spec_for(self, peer: Peer, r: SubmitRequest, log_file: str | None = None,
                 rlimits: Mapping[str, tuple[int, int]] | None = None) -> TaskSpec:
        """The core's TaskSpec for a request of ``peer``'s (ApiError 400/403), starting with
        ``rlimits`` (the submitter's, see ``specs.build_spec``)."""
        return build_spec(peer, r, controllers=self.sup.controllers, root=self.sup.cgroup_root,
                          output_cap=self.disk.stream_cap, stdin_pipes=self.stdin_pipes,
                          log_file=log_file, rlimits=rlimits,
                          nofile_soft=self.config.task_nofile_soft)

    async def off_loop(self, uid: int, work: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, whose cost grows with ``work`` (bytes of a request of ``uid``'s, and
        ``protocol.ITEM_WORK`` for each of its items: ``SubmitRequest.work``): here if it is
        small, else in the offload thread, at ``uid``'s turn (the event loop serves every
        tenant: no tenant's MiB, nor its thousands of variables, is walked on it;
        offload.py)."""
        if work <= HEAVY:
            return fn(*args)
        step = getattr(fn, "func", fn).__name__.lstrip("_")  # (a partial's: its function's)
        self.metrics.offloaded.labels(step=step).inc()
        return await self.offload.run(uid, fn, *args)

    def keep_session_env(self, uid: int, grow: int, more: int) -> str | None:
        """Count ``grow`` more bytes and ``more`` variables of ``uid``'s sessions'
        environments (negative: fewer) as kept in the records and in memory; why not (the
        command then carries nothing), or None."""
        held, variables = self.session_env.get(uid, 0), self.session_vars.get(uid, 0)
        if grow > 0 and held + grow > ENV_PER_UID:
            return (f"nothing carried over: your open sessions' environments would hold "
                    f"{held + grow} bytes, above a uid's {ENV_PER_UID}; unset what you do not "
                    f"need, or close sessions you are done with")
        if more > 0 and variables + more > VARS_PER_UID:
            return (f"nothing carried over: your open sessions' environments would hold "
                    f"{variables + more} variables, above a uid's {VARS_PER_UID}; unset what "
                    f"you do not need, or close sessions you are done with")
        if not self.room.keeps(grow):
            return ("nothing carried over: the state disk has no room for this environment "
                    "(the records keep it); unset what you do not need, or retry later")
        for counts, by in ((self.session_env, grow), (self.session_vars, more)):
            counts[uid] = counts.get(uid, 0) + by
            if counts[uid] <= 0:
                del counts[uid]
        return None

    def _measure(self, held: int) -> OutputDisk:
        """The state filesystem measured now, with ``held`` bytes held by the ledger, of
        which the sessions' environments are left out: each is in the records' pages, counted
        in the filesystem's free space already or not, and a closed session's go to SQLite's
        free list, not the filesystem, so a next one written there took no new space while the
        ledger held it again: the room, which never shrinks, grew a MB a session opened,
        carried and closed, past the filesystem's size, and output then filled the disk (an
        independent attack)."""
        return OutputDisk.measure(self.config, max(0, held - sum(self.session_env.values())))

    def regrow_disk(self) -> bool:
        """Measure the state filesystem again (retention's passes: at least once a minute):
        if it has more room than at start (a daemon started on a disk something else had
        filled, which was freed since), the output's room, budget, per-stream cap and queued
        bytes grow to what it has now; whether the cap grew, or the budget by a tenth (worth
        a line of the log).  Nothing shrinks (what ``Room.fits`` says of the room); running
        tasks keep the cap they started with."""
        now = self._measure(self.room.held)
        was = self.disk
        grown = OutputDisk(max(was.budget, now.budget), max(was.stream_cap, now.stream_cap),
                           max(was.room, now.room, self.room.room))
        if grown == was:
            return False
        self.disk = grown
        self.room.room = max(self.room.room, grown.room)
        queue = self.disk.queue_within(self.config.queue)
        lim = self.scheduler.limits
        self.scheduler.limits = lim._replace(
            max_queued_bytes=max(lim.max_queued_bytes, queue.max_queued_bytes),
            max_queued_bytes_per_uid=max(lim.max_queued_bytes_per_uid,
                                         queue.max_queued_bytes_per_uid))
        return grown.stream_cap > was.stream_cap or grown.budget > was.budget * 1.1

    def fits(self, t: DaemonTask) -> bool | None:
        """Whether queued ``t``'s output fits the disk's room now (``room.py``); None if it
        does not and its uid holds more than its fair share of the room with it (then the
        other uids' starts may go first: ``Scheduler.next_ready``)."""
        return self.room.may_start(t.uid, self.disk.worst(t.size), self.session_env)

    def hold_room(self, t: DaemonTask) -> None:
        """``t`` counts as running: its worst case holds room from now on."""
        t.holds = self.disk.worst(t.size)
        self.room.take(t.uid, t.holds)

    async def finished_answer(self, uid: int, task_id: str,
                              make: Callable[[], dict[str, Any]]) -> Response:
        """The 200 answer of a finished task's large JSON (``make()``), for ``uid``: encoded
        once, at its turn, and kept (``Answers``): a tenant asking for its MiB-long task over
        and over on many connections costs a copy each time, not an encoding."""
        return Response(200, await self._kept(uid, task_id, True, make))

    async def end_frame(self, uid: int, task_id: str, final: bool,
                        make: Callable[[], dict[str, Any]]) -> bytes:
        """The last frame of a finished task's output stream for ``uid`` (``make()``: its
        result, a MiB with a long command), encoded at its uid's turns and, once ``final``
        (its end recorded), kept with the large answers: four connections reading such a
        task's output over and over had its result encoded whole on the event loop at each
        read (another tenant's median 7 -> 32 ms, an independent attack)."""
        return await self._kept(uid, task_id + END, final, make)

    async def _kept(self, uid: int, key: str, final: bool,
                    make: Callable[[], dict[str, Any]]) -> bytes:
        body = self.answers.get(key)
        if body is None:
            body = await encode_in_turns(make(), lambda: self.shares.heavy(uid))
            if final:
                self.answers.put(key, body)
        return body

    async def recorded_answer(self, peer: Peer, task_id: str, end: bool = False,
                              ) -> bytes | None:
        """The answer of a finished task no longer in memory whose answer is large (``end``:
        its output's last frame), kept (``Answers``) or else put together from its record's
        texts in the readers' thread at ``peer``'s turn (``daemontask.answer_text``: its
        request never decoded) and kept; None if its row is not finished, its answer not
        large, or it is not ``peer``'s to see (:meth:`find_row` then says which)."""
        cached = await self.kept_answer(peer, task_id, end)
        if cached is not None:
            return cached
        make = functools.partial(end_frame_text if end else answer_text,
                                 output_dir=self.output_dir)
        async with self.shares.reading(peer.uid):
            body = await self.records.answer(task_id, None if peer.is_root else peer.uid,
                                             HEAVY_ANSWER, make)
        if body is not None:
            self.answers.put(task_id + END if end else task_id, body)
        return body

    async def kept_answer(self, peer: Peer, task_id: str, end: bool = False) -> bytes | None:
        """A task no longer in memory's large answer (``end``: its output's last frame) made
        before, once its row is found to be still there and ``peer``'s (ApiError 404 or 410
        to whoever may not see it), without reading the row's request; None if not kept."""
        key = task_id + END if end else task_id
        if self.answers.get(key) is None:
            return None
        await self.find_row(peer, task_id, light=True)
        return self.answers.get(key)

    def add(self, t: DaemonTask) -> None:
        """A task joins the table (accepted now, or found in the records at start-up)."""
        self.tasks[t.id] = t
        if t.request.idempotency_key is not None:
            self.keys[(t.uid, t.request.idempotency_key)] = t.id
        self.live += 1

    def publish(self, t: DaemonTask, state: str) -> None:
        event: dict[str, Any] = {"id": t.id, "state": state, "uid": t.uid, "at": time.time()}
        if state == "finished":
            event["outcome"] = t.outcome
            event["exit_status"] = t.exit_status
        self.hub.publish(t.uid, event)

    def task_finished(self, t: DaemonTask) -> None:
        """Once its result is known: events, metrics, and the bound on finished tasks held in
        memory (one whose end row is still being retried is held until it is written)."""
        self.metrics.finished.labels(outcome=t.outcome or "lost").inc()
        self.publish(t, "finished")
        self._finished[t.id] = None
        if t.work > BIG_REQUEST and t.recorded:
            # (answered from its record: a MiB of request held 5 MiB, and 256 session commands
            # of 3,000 variables each held 3,000 of their own, as Python objects)
            self.forget(t.id)
        self.evict()
        self.task_left()
        self.retention_due.set()

    def task_left(self) -> None:
        """A task's life in this process is over (finished, or left queued for the next run
        at a drain: ``dispatch._stays_queued``)."""
        self.live -= 1
        if self.live == 0 and (self.draining or self.handing_over):
            self.all_ended.set()

    def evict(self) -> None:
        """Drop the oldest finished tasks past ``keep_finished`` from memory (the records
        answer for them).  One whose end row is still being retried stays."""
        over = len(self._finished) - self.config.keep_finished
        if over <= 0:
            return
        for old in [i for i in itertools.islice(self._finished, over + len(self.unrecorded))
                    if i not in self.unrecorded][:over]:
            self.forget(old)

    def forget(self, task_id: str) -> None:
        """A finished task leaves memory (evicted, or expired)."""
        self._finished.pop(task_id, None)
        self.answers.pop(task_id)
        self.answers.pop(task_id + END)
        gone = self.tasks.pop(task_id, None)
        if gone is not None and gone.request.idempotency_key is not None:
            self.keys.pop((gone.uid, gone.request.idempotency_key), None)

    @property
    def connections(self) -> int:
        return self.shares.count

    def _gauges(self) -> dict[str, tuple[str, float]]:
        s = self.scheduler
        return {
            "corral_tasks_running": ("Tasks started and not ended", s.total_running),
            "corral_tasks_queued": ("Tasks waiting to start", s.total_queued),
            "corral_tasks_held": ("Tasks held in memory", len(self.tasks)),
            "corral_tasks_unrecorded": ("Finished tasks whose end record is being retried",
                                        len(self.unrecorded)),
            "corral_record_write_failures": ("Record writes that failed (each is retried or "
                                             "refused, never dropped)",
                                             self.records.failures),
            "corral_records_reads": ("Reads of the records (their reader thread's calls)",
                                     self.records.reads),
            "corral_connections": ("Open client connections", self.shares.count),
            "corral_event_subscribers": ("GET /v1/events streams", len(self.hub)),
            "corral_loop_rationed_rounds": ("Rounds of the event loop in which a uid's steps "
                                            "waited for a later round, since the start "
                                            "(its share: shares.py)", self.shares.loop.rationed),
            "corral_draining": ("1 while shutting down", int(self.draining)),
        }


def refuse_while_restarting(d: Daemon) -> None:
    """503 ``restarting`` while the running tasks are being handed over (a stop or stdin
    asked now would reach a task that is changing hands: the clients retry, and the next
    process carries it out)."""
    if d.handing_over:
        raise ApiError(503, "restarting", "the daemon is restarting (systemctl restart): "
                       "nothing was done; retry in a moment (the clients do)")


def not_found(task_id: str, kind: str = "task") -> ApiError:
    """The same answer for a task (or a session: ``kind``) that does not exist and for
    someone else's."""
    listing = ("GET /v1/sessions (corral session ls)" if kind == "session" else
               "GET /v1/tasks (corral ps)")
    shown = task_id if len(task_id) <= 40 else task_id[:37] + "..."
    return ApiError(404, "not_found", f"no {kind} {shown!r} of yours; list yours with "
                    f"{listing}", "id")


def expired_error(task_id: str, gone: dict[str, Any], policy: Retention) -> ApiError:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(gone["expired_at"]))
    rule = {"age": f"it finished more than {_age(policy.max_age)} ago (--retain-age)",
            "count": f"the daemon keeps {policy.max_count} finished tasks (--retain-count), "
                     f"shared fairly between users, and yours were above your share: your "
                     f"oldest go first",
            "bytes": f"finished tasks may hold at most {policy.max_bytes} bytes on disk "
                     f"(--retain-bytes, and at most what the state filesystem has room for), "
                     f"shared fairly between users, and yours were above your share: your "
                     f"oldest go first"}.get(gone["why"], gone["why"])
    return ApiError(410, "expired", f"task {task_id} expired: its record and output were "
                    f"removed at {when} because {rule}; fetch results sooner, or raise "
                    f"the daemon's --retain-* limits", "id")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    from ..syntax import format_duration

    return format_duration(seconds)


def _stdin_pipe_supported() -> bool:
    import supervisor

    try:
        supervisor.TaskSpec(["true"], stdin="pipe")  # type: ignore[arg-type]
    except ValueError:
        return False
    return hasattr(supervisor.TaskHandle, "write_stdin")
