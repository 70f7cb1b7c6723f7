"""Completion callbacks: a push for hosts that do not want to poll (``--on-finish-*``).

Once a task's end row is written, the daemon delivers one event::

    {"id": "7", "uid": 1000, "name": null, "state": "finished", "outcome": "succeeded",
     "exit_status": 0, "at": 1764525600.1, "result": {...}}

to each configured target:

- ``--on-finish-exec PROGRAM``: run as a task of the daemon's own supervisor (its own cgroup
  leaf, a 30 s time limit, nothing it starts survives), as the daemon's user, with the event
  on stdin and ``CORRAL_TASK_ID``, ``CORRAL_TASK_UID``, ``CORRAL_OUTCOME`` and
  ``CORRAL_EXIT_STATUS`` in its environment; delivered when it exits 0.
- ``--on-finish-url URL`` with ``--on-finish-socket PATH``: ``POST`` of the event as JSON to
  URL's path over the Unix socket PATH (as ``curl --unix-socket PATH URL``); delivered on a
  2xx answer within 10 s.

Only the daemon's operator configures targets (a client's own socket or program would run with
the daemon's privileges).  Delivery is at least once: the end row says a delivery is due
(``notified = 0``) and it is marked done only once every target took it, so a daemon that
restarts meanwhile delivers it again.  One task's event at a time: each uid's in the order
its tasks ended, the uids in turns (one queue for everyone, in end order, made another uid's
event wait behind a tenant's 8,166: 30.6 s: an independent attack); an event a target failed
is tried again with doubling waits (1 s to 60 s) behind its uid's others, never holding them
back (one tenant's event that a target refused, retried at the head of the one queue, held
every other uid's for good: an independent attack).  A target that refuses
an event for good (an HTTP 4xx other than 408 and 429: too large, say) is not asked again for
it, and the refusal is logged.  Nothing a delivery meets ends the daemon (a target closing its
end as the event was sent raised an error no handler took, and every restart died again on
the same event: an independent attack).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio

from .daemontask import served_result
from .quiet import Quiet
from .records import Records, RecordsError

if TYPE_CHECKING:
    from .. import Supervisor

__all__ = ["Hooks"]

log = logging.getLogger(__name__)

EXEC_TIME_LIMIT = "30s"
POST_TIMEOUT = 10.0
MAX_WAIT = 60.0


class Hooks:
    """The completion callbacks of one daemon; ``finished(id)`` queues a delivery."""

    def __init__(self, records: Records, *, program: str | None = None,
                 url: str | None = None, socket: str | None = None,
                 output_dir: str = "") -> None:
        self.records = records
        self.output_dir = output_dir  # (the results' head and tail are read from there)
        self.program = program
        self.url = url
        self.socket = socket
        self.sup: Supervisor | None = None
        self._due: dict[int, collections.deque[str]] = {}  # each uid's, in end order
        self._turns: collections.deque[int] = collections.deque()  # the uids with any due
        self._queued: dict[str, int] = {}  # each due event's uid
        # an event some target failed: the targets done, the next wait, when it is due again
        self._retry: dict[str, tuple[set[str], float, float]] = {}
        self._wake = trio.Event()
        self._counter = 0
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()
        self._quiet = Quiet(MAX_WAIT)  # (failures: a line a minute, the rest counted)
        self.delivered = 0

    @property
    def enabled(self) -> bool:
        return self.program is not None or self.url is not None

    def finished(self, task_id: str, uid: int) -> None:
        """``uid``'s task ``task_id`` ended (its end row written): its event is due."""
        if self.enabled and task_id not in self._queued:
            self._queued[task_id] = uid
            self._put(task_id)
            self._wake.set()

    def _put(self, task_id: str) -> None:
        uid = self._queued[task_id]
        due = self._due.get(uid)
        if due is None:
            due = self._due[uid] = collections.deque()
            self._turns.append(uid)
        due.append(task_id)

    async def run(self, sup: Supervisor) -> None:
        """Deliver due events until cancelled or :meth:`stop`; first the ones an earlier run
        left due."""
        try:
            with self._scope:
                if self.enabled:
                    self.sup = sup
                    await self._run()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        """Stop delivering (a delivery in progress is abandoned: it is due again at the next
        start) and wait until no callback runs."""
        self._scope.cancel()
        await self._stopped.wait()

    async def _run(self) -> None:
        try:
            pending = await self.records.pending_notifications()
        except RecordsError as e:
            log.error("completion callbacks due from earlier runs: %s", e)
            pending = []
        for row in pending:
            self.finished(row["id"], row["uid"])
        while True:
            task_id = await self._next()
            try:
                delivered = await self._deliver(task_id)
            except Exception:  # (a bug of ours: this event waits, the daemon goes on)
                self._log_once(f"the completion callback of task {task_id} failed; retrying")
                self._retry[task_id] = (set(), MAX_WAIT, trio.current_time() + MAX_WAIT)
                delivered = False
            if delivered:
                del self._queued[task_id]
            else:
                self._put(task_id)  # (behind its uid's others: see the module docstring)

    async def _next(self) -> str:
        """The next uid's first due event whose retry (if any) is due now (the uids in
        turns); waits for one."""
        while True:
            now = trio.current_time()
            soonest = math.inf
            for _ in range(len(self._turns)):
                uid = self._turns.popleft()
                due = self._due[uid]
                found = None
                for _ in range(len(due)):
                    task_id = due.popleft()
                    retry = self._retry.get(task_id)
                    if retry is None or retry[2] <= now:
                        found = task_id
                        break
                    due.append(task_id)
                    soonest = min(soonest, retry[2])
                if due:
                    self._turns.append(uid)  # (its next turn comes after the others)
                else:
                    del self._due[uid]
                if found is not None:
                    return found
            with trio.move_on_at(soonest):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _deliver(self, task_id: str) -> bool:
        """One try of every target not done yet; whether the event is done with (delivered,
        or refused for good, or expired meanwhile)."""
        row = await self._row(task_id)
        if row is None:
            self._retry.pop(task_id, None)
            return True  # expired meanwhile: nothing left to tell
        event = _event(row, self.output_dir)
        body = event_bytes(event)  # (once for every target: an event may be MBs)
        done, wait, _ = self._retry.pop(task_id, (set(), 1.0, 0.0))
        for target, send in (("exec", self._exec), ("url", self._post)):
            if target not in done and await self._try(send, event, body):
                done.add(target)
        if done >= self._targets():
            await self._mark(task_id)
            return True
        self._retry[task_id] = (done, min(wait * 2, MAX_WAIT), trio.current_time() + wait)
        return False

    async def _try(self, send: Any, event: dict[str, Any], body: bytes) -> bool:
        """``send(event, body)`` (``body``: the event's JSON), whatever it meets: an error no
        handler expected is logged (once a minute) and counts as a failure to retry."""
        try:
            return bool(await send(event, body))
        except Exception:
            self._log_once(f"a completion callback of task {event['id']} failed; retrying")
            return False

    def _log_once(self, message: str) -> None:
        """``message`` and the traceback being handled, at most once a minute."""
        self._quiet.say("unexpected", log.exception, "%s", message)

    def _targets(self) -> set[str]:
        return {t for t, on in (("exec", self.program), ("url", self.url)) if on}

    async def _row(self, task_id: str) -> dict[str, Any] | None:
        while True:
            try:
                return await self.records.get(task_id)
            except RecordsError as e:
                log.error("completion callback of task %s: %s; retrying", task_id, e)
                await trio.sleep(MAX_WAIT / 4)

    async def _mark(self, task_id: str) -> None:
        self.delivered += 1
        try:
            await self.records.notified(task_id)
        except RecordsError as e:
            # delivered; the next run may deliver it once more (at least once)
            log.warning("completion callback of task %s delivered, not marked: %s", task_id, e)

    async def _exec(self, event: dict[str, Any], body: bytes) -> bool:
        if self.program is None:
            return True
        assert self.sup is not None
        self._counter += 1
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "CORRAL_TASK_ID": event["id"], "CORRAL_TASK_UID": str(event["uid"]),
               "CORRAL_OUTCOME": str(event["outcome"]),
               "CORRAL_EXIT_STATUS": str(event["exit_status"])}
        try:
            r = await self.sup.run([self.program], task_id=f"hook-{event['id']}-{self._counter}",
                                   stdin=body, env=env,
                                   inherit_env=False, time_limit=EXEC_TIME_LIMIT, cwd="/")
        except Exception as e:  # refused by the core (e.g. shutting down): retried later
            self._retrying(f"--on-finish-exec for task {event['id']}: {e}")
            return False
        if r.outcome != "succeeded":
            self._retrying(f"--on-finish-exec {self.program} for task {event['id']}: "
                           f"{r.outcome} (exit {r.exit_code})")
            return False
        return True

    async def _post(self, event: dict[str, Any], body: bytes) -> bool:
        if self.url is None:
            return True
        try:
            with trio.fail_after(POST_TIMEOUT):
                status = await post_json(self.socket, self.url, body)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ValueError) as e:
            self._retrying(f"--on-finish-url {self.url} for task {event['id']}: "
                           f"{str(e) or type(e).__name__}")
            return False
        if 400 <= status < 500 and status not in (408, 429):
            log.error("--on-finish-url %s refused the event of task %s for good (HTTP %d): "
                      "not sent again", self.url, event["id"], status)
            return True
        if not 200 <= status < 300:
            self._retrying(f"--on-finish-url {self.url} for task {event['id']}: HTTP {status}")
            return False
        return True

    def _retrying(self, why: str) -> None:
        """A failed delivery, logged at most once a minute, with how many were not (a target
        failing every event made a line per event per try: 2,549 lines a minute with 1,615
        events due: an independent attack)."""
        self._quiet.say("failed", log.warning, "%s; retrying", why)


def _event(row: dict[str, Any], output_dir: str) -> dict[str, Any]:
    return {"id": row["id"], "uid": row["uid"], "name": row["name"], "state": "finished",
            "outcome": row["outcome"], "exit_status": row["exit_status"],
            "at": row["ended_at"] or time.time(),
            "result": served_result(row["result"], os.path.join(output_dir, row["id"]),
                                    row["spec"]["argv"])}


def event_bytes(obj: Any) -> bytes:
    """``obj`` as compact JSON in UTF-8, not ASCII: an event repeats its command's arguments,
    and a command of ``é`` made an event of three times the request (``\u00e9``, six bytes for
    two) that a target's body limit refused.  A text that is not Unicode (a lone surrogate, as
    JSON may carry one) keeps its escapes."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


async def post_json(socket_path: str | None, url: str, body: bytes) -> int:
    """POST ``body`` (JSON) to ``url``'s path over the Unix socket; the answer's status.
    ValueError for a URL that is not http://; OSError when the socket cannot be reached."""
    parts = urlsplit(url)
    if parts.scheme != "http" or socket_path is None:
        raise ValueError(f"--on-finish-url must be http://HOST/PATH, sent over "
                         f"--on-finish-socket, got {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (f"POST {path} HTTP/1.1\r\nhost: {parts.netloc or 'localhost'}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\nuser-agent: corral\r\n\r\n").encode()
    stream = await trio.open_unix_socket(os.fspath(socket_path))
    async with stream:
        answer = b""
        try:
            await stream.send_all(head + body)
        except trio.BrokenResourceError:
            pass  # (the server closed its end early: its answer may say why, 413 say)
        while b"\r\n" not in answer:
            try:
                chunk = await stream.receive_some(4096)
            except trio.BrokenResourceError as e:
                raise OSError(f"the server closed the connection: {e.__cause__ or e}") from e
            if not chunk:
                raise OSError(f"the server closed the connection after {len(answer)} bytes")
            answer += chunk
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise OSError(f"not an HTTP answer: {answer[:80]!r}") from None
