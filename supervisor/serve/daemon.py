"""The daemon's main loop, and the state every verb works on.

:func:`serve` runs these steps, each a function below:

1. ``open_state``: the state directory, its output directory, the SQLite records.
2. ``open_supervisor``: the cgroup root (the library's own discovery, or ``--cgroup-root``).
3. ``bind_listeners``: the sockets systemd passed (LISTEN_FDS), or ``--socket`` bound here.
4. ``notify_ready``: READY=1 and a STATUS= line for systemd (Type=notify).
5. ``run_server``: accept connections (tasks start as they are queued and as others end),
   keep systemd told (STATUS=, WATCHDOG=1), until SIGTERM.
6. ``drain`` (on SIGTERM): refuse new tasks (503), end queued tasks unstarted, stop running
   ones gracefully (reason ``shutdown``), write every record, then close; a second SIGTERM
   kills every task now.
7. on the way out: the records closed, the socket file removed (``bind_listeners``).

Ownership: one trio thread.  ``Daemon`` owns the task table, the queue and the records; each
task's life runs in the tasks nursery, each connection in the server nursery.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from .. import open_supervisor
from .events import EventHub
from .http import HttpLimits, serve_connection
from .metrics import Metrics
from .peers import Peer, allowed, peer_of
from .protocol import DEFAULT_SOCKET, ApiError
from .queue import QueueLimits, Scheduler
from .records import Records
from .routes import make_router
from .sdnotify import Notifier, listen_fds
from .tasks import DaemonTask, run_task

if TYPE_CHECKING:
    from .. import Supervisor

__all__ = ["Config", "Daemon", "serve"]

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/var/lib/corral"


class Config(NamedTuple):
    socket: str = DEFAULT_SOCKET
    state_dir: str = DEFAULT_STATE_DIR
    cgroup_root: str | None = None
    default_time_limit: str | None = None
    max_time_limit: str | None = None
    allow_gid: int | None = None
    socket_mode: int = 0o666
    queue: QueueLimits = QueueLimits()
    http: HttpLimits = HttpLimits()
    output_cap: int = 64 << 20  # per stream and task, in the state directory
    max_connections: int = 4096
    # finished tasks held in memory with their result JSON (up to ~130 KiB each with full
    # output tails); older ones are answered from the records
    keep_finished: int = 256


class Daemon:
    """What the verbs work on: the supervisor, the task table, the queue, the records."""

    def __init__(self, config: Config, sup: Supervisor, records: Records,
                 nursery: trio.Nursery, notifier: Notifier) -> None:
        self.config = config
        self.sup = sup
        self.records = records
        self.nursery = nursery  # task lives and record writes
        self.notifier = notifier
        self.output_dir = os.path.join(config.state_dir, "output")
        self.tasks: dict[str, DaemonTask] = {}
        self.keys: dict[tuple[int, str], str] = {}  # (uid, idempotency key) -> task id
        self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.scheduler: Scheduler[DaemonTask] = Scheduler(config.queue)
        self.hub = EventHub()
        self.connections = 0
        self.draining = False
        self.live = 0  # task lives not yet ended
        self._all_ended = trio.Event()
        self.stdin_pipes = _stdin_pipe_supported()
        self.metrics = Metrics(self._gauges)  # last: it reads the gauges above at once

    # ---- the task table -------------------------------------------------------------------

    def find(self, peer: Peer, task_id: str) -> DaemonTask | None:
        """The task if it is in memory and ``peer`` may see it; None if not in memory.
        ApiError 404 when it is someone else's."""
        t = self.tasks.get(task_id)
        if t is not None and not peer.may_see(t.uid):
            raise not_found(task_id)
        return t

    async def find_row(self, peer: Peer, task_id: str) -> dict[str, Any]:
        """A task no longer (or never) in memory, from the records; 404 if none is ``peer``'s."""
        row = await self.records.get(task_id)
        if row is None or not peer.may_see(row["uid"]):
            raise not_found(task_id)
        return row

    def add(self, t: DaemonTask) -> None:
        self.tasks[t.id] = t
        if t.request.idempotency_key is not None:
            self.keys[(t.uid, t.request.idempotency_key)] = t.id
        self.scheduler.enqueue(t)
        self.live += 1
        self.metrics.submitted.inc()
        self.publish(t, "queued")
        self.dispatch()

    def publish(self, t: DaemonTask, state: str) -> None:
        event: dict[str, Any] = {"id": t.id, "state": state, "uid": t.uid, "at": time.time()}
        if state == "finished":
            event["outcome"] = t.outcome
            event["exit_status"] = t.exit_status
        self.hub.publish(t.uid, event)

    def task_finished(self, t: DaemonTask) -> None:
        self.metrics.finished.labels(outcome=t.outcome or "lost").inc()
        self.publish(t, "finished")
        self._finished[t.id] = None
        while len(self._finished) > self.config.keep_finished:
            old, _ = self._finished.popitem(last=False)
            gone = self.tasks.pop(old)
            if gone.request.idempotency_key is not None:
                self.keys.pop((gone.uid, gone.request.idempotency_key), None)
        self.live -= 1
        if self.live == 0 and self.draining:
            self._all_ended.set()

    def stop_queued(self, t: DaemonTask) -> bool:
        """End a queued task without starting it; False if it was not queued."""
        if not self.scheduler.remove(t):
            return False
        self.nursery.start_soon(_never_start, self, t)
        return True

    # ---- dispatch -------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Start queued tasks as the limits allow, round-robin between uids.  Called when a
        task is queued and when one ends (no dispatcher task: one scheduling round less)."""
        while not self.draining:
            t = self.scheduler.next_ready()
            if t is None:
                return
            self.nursery.start_soon(run_task, self, t)

    def _gauges(self) -> dict[str, tuple[str, float]]:
        s = self.scheduler
        return {
            "corral_tasks_running": ("Tasks started and not ended", s.total_running),
            "corral_tasks_queued": ("Tasks waiting to start", s.total_queued),
            "corral_tasks_held": ("Tasks held in memory", len(self.tasks)),
            "corral_connections": ("Open client connections", self.connections),
            "corral_event_subscribers": ("GET /v1/events streams", len(self.hub)),
            "corral_draining": ("1 while shutting down", int(self.draining)),
        }

    # ---- connections ------------------------------------------------------------------------

    async def accept_loop(self, listener: trio.socket.SocketType, server: trio.Nursery) -> None:
        router = make_router(self)
        while True:
            try:
                sock, _ = await listener.accept()
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.metrics.shed.labels(reason="no_fds").inc()
                    await trio.sleep(0.1)  # out of descriptors: let some connections end
                    continue
                raise
            server.start_soon(self._connection, sock, router)

    async def _connection(self, sock: trio.socket.SocketType, router: Any) -> None:
        with sock:
            try:
                peer = peer_of(sock)  # type: ignore[arg-type]
            except OSError:
                return
            if self.connections >= self.config.max_connections:
                self.metrics.shed.labels(reason="max_connections").inc()
                await _refuse_raw(sock, _BUSY)
                return
            if not allowed(peer, self.config.allow_gid):
                self.metrics.shed.labels(reason="not_allowed").inc()
                await _refuse_raw(sock, _FORBIDDEN)
                return
            self.connections += 1
            try:
                shed = await serve_connection(trio.SocketStream(sock), peer,
                                              self.config.http, router, self._answered)
                if shed is not None:
                    self.metrics.shed.labels(reason=shed).inc()
            except Exception:
                # a bug of ours on one connection: it ends, the daemon goes on
                log.exception("connection of uid %d", peer.uid)
            finally:
                self.connections -= 1

    def _answered(self, verb: str, status: int) -> None:
        self.metrics.requests.labels(verb=verb, status=str(status)).inc()

    # ---- shutdown ---------------------------------------------------------------------------

    async def drain(self, server: trio.CancelScope) -> None:
        """Stop accepting tasks (503; the other verbs still answer, so that clients can wait
        for their results); queued tasks end unstarted, running ones stop (reason shutdown);
        once every record is written, close the listeners and the connections."""
        self.draining = True
        self.notifier.notify(STOPPING="1", STATUS=f"draining: {self.scheduler.total_running} "
                             f"running, {self.scheduler.total_queued} queued")
        for t in list(self.tasks.values()):
            self.stop_queued(t)
        self.sup.stop_all(reason=_shutdown_reason())
        if self.live:
            await self._all_ended.wait()
        # let answers already made (waits, the end frames of followed streams) go out
        with trio.move_on_after(1.0):
            while self.connections:
                await trio.sleep(0.01)
        server.cancel()

    def kill_all(self) -> None:
        self.sup.stop_all(force=True, reason=_shutdown_reason())


def not_found(task_id: str) -> ApiError:
    # the same answer for a task that does not exist and for someone else's
    return ApiError(404, "not_found", f"no task {task_id!r} of yours; list yours with GET "
                    f"/v1/tasks (corral ps)", "id")


def _shutdown_reason() -> Any:
    import supervisor

    return supervisor.StopReason.SHUTDOWN


async def _never_start(d: Daemon, t: DaemonTask) -> None:
    await run_task(d, t, never_start=True)


def _stdin_pipe_supported() -> bool:
    import supervisor

    try:
        supervisor.TaskSpec(["true"], stdin="pipe")  # type: ignore[arg-type]
    except ValueError:
        return False
    return hasattr(supervisor.TaskHandle, "write_stdin")


async def _refuse_raw(sock: trio.socket.SocketType, response: bytes) -> None:
    """Send a whole refusal, then read what the client sent for a moment before closing:
    closing with unread bytes would reset the connection and lose the answer."""
    with suppress(OSError), trio.move_on_after(1.0):
        await sock.send(response)
        sock.shutdown(socket.SHUT_WR)
        while await sock.recv(65536):
            pass


def _raw_error(status: str, code: str, message: str) -> bytes:
    """A whole HTTP response for refusing a connection before h11 is involved."""
    body = json.dumps({"error": {"code": code, "message": message, "field": None}}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body) + 1}\r\n\r\n").encode() + body + b"\n"


_BUSY = _raw_error("503 Service Unavailable", "busy", "the daemon holds its maximum of "
                   "connections (--max-connections); retry later")
_FORBIDDEN = _raw_error("403 Forbidden", "forbidden", "your uid is not in the group that "
                        "--allow-group admits; ask the host's administrator to add you to it")


# ---- the steps of serve() ----------------------------------------------------------------

async def open_state(config: Config) -> Records:
    """The state directory and the records.  Rows an earlier run left without an end are
    reported, and left as they are: adopting or recovering them is the restart work's seam
    (``Records.unfinished``)."""
    for path in (config.state_dir, os.path.join(config.state_dir, "output")):
        os.makedirs(path, mode=0o700, exist_ok=True)
    records = await Records.open(config.state_dir)
    earlier = await records.unfinished()
    if earlier:
        log.warning("%d task(s) of an earlier run have no end record (ids %s...); they are "
                    "left as recorded", len(earlier), ", ".join(r["id"] for r in earlier[:5]))
    return records


@contextmanager
def bind_listeners(config: Config) -> Iterator[list[trio.socket.SocketType]]:
    """The passed sockets (socket activation), or ``config.socket`` bound now (a stale file
    from a dead daemon is replaced; a live daemon's is refused)."""
    passed = listen_fds()
    if passed:
        yield [trio.socket.from_stdlib_socket(s) for s in passed]
        return
    path = config.socket
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.bind(path)
    if config.allow_gid is not None:
        os.chown(path, -1, config.allow_gid)
    os.chmod(path, config.socket_mode)
    sock.listen(4096)
    try:
        yield [trio.socket.from_stdlib_socket(sock)]
    finally:
        sock.close()
        with suppress(FileNotFoundError):
            os.unlink(path)


def _remove_stale_socket(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; remove it or give "
                      f"another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a dead daemon's
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another daemon already listens on {path}; stop it or "
                  f"give another --socket")


def notify_ready(d: Daemon) -> None:
    d.notifier.notify(READY="1", STATUS=f"serving: cgroup root {d.sup.cgroup_root}")


async def run_server(d: Daemon, listeners: list[trio.socket.SocketType],
                     task_status: trio.TaskStatus[Daemon]) -> None:
    async with trio.open_nursery() as server:
        for listener in listeners:
            server.start_soon(d.accept_loop, listener, server)
        server.start_soon(_watch_signals, d, server.cancel_scope)
        notify_ready(d)
        if d.notifier.enabled:
            server.start_soon(_tell_systemd, d)
        task_status.started(d)


async def _watch_signals(d: Daemon, server: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    continue  # no configuration to reload; never a reason to die
                if not d.draining:
                    log.info("signal %s: draining", signum)
                    nursery.start_soon(d.drain, server)
                else:
                    log.info("signal %s again: killing every task now", signum)
                    d.kill_all()


async def _tell_systemd(d: Daemon) -> None:
    """WATCHDOG=1 (when systemd asked for it) and a STATUS= line when the counts change."""
    interval = min(d.notifier.watchdog_interval or 5.0, 5.0)
    last = ""
    while True:
        s = d.scheduler
        status = (f"serving: {s.total_running} running, {s.total_queued} queued, "
                  f"{d.connections} connections")
        fields = {"WATCHDOG": "1"} if d.notifier.watchdog_interval else {}
        if status != last and not d.draining:
            fields["STATUS"] = last = status
        if fields:
            d.notifier.notify(**fields)
        await trio.sleep(interval)


async def serve(config: Config, *,
                task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the daemon until SIGTERM (or the caller's cancellation) and its drain."""
    notifier = Notifier()
    records = await open_state(config)
    try:
        async with open_supervisor(config.cgroup_root, config.default_time_limit,
                                   config.max_time_limit) as sup:
            with bind_listeners(config) as listeners:
                async with trio.open_nursery() as tasks_nursery:
                    d = Daemon(config, sup, records, tasks_nursery, notifier)
                    await run_server(d, listeners, task_status)
                    # the drain ended the server; only record writes may still run
    finally:
        with trio.CancelScope(shield=True):
            await records.close()
