"""What each uid holds of the daemon: its connections and the request bytes it has in flight.

The socket is shared by every tenant, and the kernel says who each connection is
(``SO_PEERCRED``) at accept.  So the limits are per uid, then global, and the uid over its
share is the one shed:

- a uid may open at most :data:`RATE` connections a second (with a burst of as many; root:
  any number): past that, a new one is closed at its accept, so that a uid connecting and
  closing in a loop cannot keep the listen backlog, which every uid shares, full (the daemon
  drains it faster than one uid fills it);
- a uid may hold at most ``per_uid`` connections: past that, its next one is refused (429);
  root (the host's operator) is bounded by the total alone;
- when the daemon holds ``total``, a newcomer whose uid holds fewer than the uid holding the
  most is admitted by shedding one of that uid's connections (an idle one first: waiting for
  a request; else its oldest), so one uid's flood of connections, idle or trickling a head,
  never locks the others out; a newcomer of that uid itself is refused (503);
- the request bodies a uid's connections are reading or being answered for may hold at most
  ``body_bytes`` at once: a request that would go past it is refused (429) before its body is
  read, so a uid's many connections cannot make the daemon hold many MiB each;
- at most :data:`TURNS` requests of one uid are answered at once (root: any number), one at
  a time while it uses the most of a busy loop others use too: one uid's many connections,
  each with a request ready, take turns among themselves;
- one piece at a time of a uid's large answers and streams is made (``heavy``: a slice of a
  large JSON answer, a chunk of output read and encoded), so that a uid reading a large
  output on sixteen connections, or asking for a MiB-long task over and over, takes one slice
  of the event loop in turn with everyone else, not sixteen;
- at most :data:`OUTPUT_PIECES` pieces of a uid's output streams are held at once, each
  from its making until it is sent (``output_piece``; root: any number): a reader that does
  not read holds its piece until the send timeout, and its uid's other readers wait, not the
  daemon's memory (250 readers of a tenant reading a byte at a time held ~290 KB each);
- one read of the records at a time per uid (``reading``): the reader thread serves the uids
  in turn, not a flood of one uid's reads first;
- while two or more uids other than root are active, each one's time on the event loop is
  counted (:class:`LoopShare`), and a uid over an equal share of a busy loop waits before its
  next request and its next piece of a large answer;
- a refused connection is answered (429 or 503) and closed; while :data:`LINGERING` are being
  answered, or after one of the same uid in the last second, it is closed at once,
  unanswered, so that a flood of connections costs the daemon little more than the accepts.

Pure bookkeeping on the trio thread.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import resource
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from ..lowlevel import WALK_FDS

__all__ = ["LINGERING", "OUTPUT_PIECES", "RATE", "TURNS", "Held", "LoopShare", "Shares", "take"]

TURNS = 4  # requests of one uid answered at once (the others wait their turn)
REQUESTS = 500.0  # requests a second one uid's connections are answered at, after a burst
BURST = 500  # of that many at once
SIGNALLED = 5000.0  # processes a second one uid's signals reach (``signalled``), after a burst
SIGNALLED_BURST = 5000  # of that many at once
LINGERING = 64  # refused connections answered at once; past that, closed without an answer
OUTPUT_PIECES = 64  # pieces of one uid's output streams held at once, made and not yet sent
# (as many as it may follow outputs: ``verbs.output.FOLLOWERS``)
RATE = 100.0  # connections a second one uid may open (a client keeps its connection: a CLI
# command opens one, a busy agent host's tool calls tens a second)


class _Turns:
    """A uid's requests being answered, and those waiting for a turn (:meth:`Shares.turn`)."""

    __slots__ = ("answering", "lot", "waiting")

    def __init__(self) -> None:
        self.answering = 0
        self.waiting = 0
        self.lot = trio.lowlevel.ParkingLot()


class Held:
    """One connection, as its uid's share sees it."""

    __slots__ = ("idle", "order", "scope", "uid")

    _order = itertools.count()

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.scope = trio.CancelScope()  # cancelled to shed it
        self.idle = True  # waiting for a request's first byte (the first to be shed)
        self.order = next(Held._order)


class Shares:
    def __init__(self, total: int, per_uid: int, body_bytes: int) -> None:
        self.total = total
        self.per_uid = per_uid
        self.body_bytes = body_bytes
        self.held: dict[int, dict[int, Held]] = {}  # uid -> connections (by order)
        self.count = 0
        self.bodies: collections.Counter[int] = collections.Counter()  # uid -> bytes
        self.shed = 0  # connections shed to make room for another uid's
        self._turns: dict[int, _Turns] = {}
        self._heavy: dict[int, trio.Lock] = {}
        self._reading: dict[int, trio.Lock] = {}
        self._pieces: dict[int, list[Any]] = {}  # uid -> [its Semaphore, holders and waiters]
        self.refusing = 0  # refused connections being answered (each lingers a moment)
        self._answered: dict[int, float] = {}  # uid -> when a refusal of its was answered
        self._rate: dict[int, tuple[float, float]] = {}  # uid -> (connections left, when)
        self._paced: dict[int, float] = {}  # uid -> when its next request may be answered
        self._signalled: dict[int, float] = {}  # uid -> when its signals' reach is paid for
        self._walking: dict[int, trio.Lock] = {}  # uid -> held while a signal of its walks
        self._walks = trio.Semaphore(walks_for(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        self.loop = LoopShare()  # each uid's time on the event loop

    def open(self, conn: Held) -> str | None:
        """Admit ``conn`` (then :meth:`close` it), or say why not: ``"per_uid"`` (429) or
        ``"total"`` (503).  (The connection rate is checked before: :meth:`over_rate`.)"""
        mine = self.held.get(conn.uid, {})
        if len(mine) >= self.per_uid and conn.uid != 0:  # (root: the total alone)
            return "per_uid"
        if self.count >= self.total and not self._shed_for(conn.uid, len(mine)):
            return "total"
        self.held.setdefault(conn.uid, {})[conn.order] = conn
        self.count += 1
        return None

    def over_rate(self, uid: int) -> bool:
        """Whether ``uid`` has opened more than :data:`RATE` connections in the last second
        (a token bucket, :data:`RATE` at once); counts this one."""
        now = trio.current_time()
        left, then = self._rate.get(uid, (RATE, now))
        left = min(RATE, left + (now - then) * RATE)
        over = left < 1.0
        self._rate[uid] = (left if over else left - 1.0, now)
        if len(self._rate) > 4096:  # (the full ones say nothing: forget them)
            self._rate = {u: (n, t) for u, (n, t) in self._rate.items()
                          if n + (now - t) * RATE < RATE}
        return over

    def rate_wait(self, uid: int) -> float:
        """Seconds until ``uid`` may open a connection within :data:`RATE` (0: now); counts
        nothing (:meth:`over_rate` does, at the accept)."""
        left, then = self._rate.get(uid, (RATE, 0.0))
        left += (trio.current_time() - then) * RATE
        return 0.0 if left >= 1.0 else (1.0 - left) / RATE

    def _shed_for(self, uid: int, holds: int) -> bool:
        """Shed one connection of the uid that holds the most, if it holds more than
        ``uid`` does (``holds``); whether one was."""
        top = max(self.held, key=lambda u: len(self.held[u]), default=None)
        if top is None or top == uid or len(self.held[top]) <= holds:
            return False
        conns = self.held[top]
        victim = next((c for c in conns.values() if c.idle), None) or \
            conns[min(conns)]
        self.close(victim)  # (its connection ends once its scope is cancelled)
        victim.scope.cancel()
        self.shed += 1
        return True

    def close(self, conn: Held) -> None:
        mine = self.held.get(conn.uid)
        if mine is None or mine.pop(conn.order, None) is None:
            return
        self.count -= 1
        if not mine:
            del self.held[conn.uid]

    @contextlib.asynccontextmanager
    async def turn(self, uid: int) -> AsyncIterator[None]:
        """Held while a request of ``uid`` is answered (not a long poll or a stream): at most
        :data:`TURNS` at once per uid (root: any number), so that one uid's many connections,
        each with a request ready, wait for each other and not for everyone else; and one at
        a time while ``uid`` uses the most of a busy loop others use too
        (:meth:`LoopShare.busiest`).  Every step of the event loop's rounds is someone's, and
        each of another uid's steps waits for a round: a flood's four requests at once made
        the rounds four of its steps long.  (Four connections of one tenant submitting `true`
        as fast as answered took another's median from 8 to 31-34 ms and its p99 from 13 to
        55-67 (two runs); taking turns one at a time so, to 22 and 47.5 ms, and the flood's
        tasks no fewer: benchmarks/bench_tenants.py --pin.)"""
        if uid == 0:
            yield
            return
        turns = self._turns.get(uid)
        if turns is None:
            turns = self._turns[uid] = _Turns()
        turns.waiting += 1
        try:
            while turns.answering >= (most := 1 if self.loop.busiest(uid) else TURNS):
                await turns.lot.park()
        finally:
            turns.waiting -= 1
        turns.answering += 1
        if turns.answering < most:
            turns.lot.unpark()  # (room for the next waiting too: the loop is quiet again)
        try:
            yield
        finally:
            turns.answering -= 1
            turns.lot.unpark()
            if not turns.answering and not turns.waiting:
                del self._turns[uid]

    def pace(self, uid: int) -> float:
        """Seconds ``uid``'s request (counted now) waits before it is answered: one uid's
        requests are answered at :data:`REQUESTS` a second after a burst of :data:`BURST`
        (root: no wait).  Requests on connections already open were not bounded: one
        tenant's 3,500 cheap requests a second took another's median from 4 to 64 ms (an
        independent attack)."""
        if uid == 0:
            return 0.0
        now = trio.current_time()
        start = max(self._paced.get(uid, -math.inf), now - BURST / REQUESTS)
        self._paced[uid] = start + 1.0 / REQUESTS
        if len(self._paced) > 4096:  # (those with nothing owed say nothing: forget them)
            self._paced = {u: t for u, t in self._paced.items() if t > now}
        return max(0.0, start - now)

    async def signalled(self, uid: int, reached: int) -> None:
        """``uid``'s signal reached ``reached`` more processes of its task's tree (a pause of
        the walk, ``TaskHandle.deliver_signal``): it waits while its signals have reached
        more than :data:`SIGNALLED` processes a second after a burst of
        :data:`SIGNALLED_BURST` (root: never), and for its share of the event loop.  Two
        tenants signalling trees of 1,500 processes on 32 connections each, each signal
        walked in paced steps, still took another's median from 10 to 132 ms (an
        independent attack): the request rate bounds signals, not the processes each
        reaches."""
        wait = 0.0
        if uid != 0 and reached:
            now = trio.current_time()
            start = max(self._signalled.get(uid, -math.inf), now - SIGNALLED_BURST / SIGNALLED)
            self._signalled[uid] = start + reached / SIGNALLED
            wait = self._signalled[uid] - now
            if len(self._signalled) > 4096:
                self._signalled = {u: t for u, t in self._signalled.items() if t > now}
        await trio.sleep(max(0.0, wait))
        await self.loop.wait(uid)

    @contextlib.asynccontextmanager
    async def walking(self, uid: int) -> AsyncIterator[None]:
        """Held while one of ``uid``'s signals walks its task's tree: one walk of a uid at a
        time, and of all uids together as many as a quarter of the daemon's open files
        allow (:func:`walks_for`; root's: any).  Each walk holds up to :data:`WALK_FDS`
        pidfds across its pauses: two tenants' signals to trees of 1,500 processes from 4
        connections each took the daemon from 31 open files to 6,546 (an independent
        attack), and enough uids at once would have left none for connections, pipes and
        the records."""
        if uid == 0:
            yield
            return
        async with _one_at_a_time(self._walking, uid), self._walks:
            yield

    def heavy(self, uid: int) -> AbstractAsyncContextManager[None]:
        """Held while one piece of ``uid``'s large answers or streams is made (root's too:
        it is fairness between root's own connections, and costs the others nothing).  Each
        is a schedule point, free or not: the pieces of a large answer are steps of their
        own, everyone else's between them (:func:`take`'s way, without one, made a 2.5 MB
        answer one step)."""
        return _one_at_a_time(self._heavy, uid, self.loop, a_round=True)

    @contextlib.asynccontextmanager
    async def output_piece(self, uid: int) -> AsyncIterator[None]:
        """Held from the making of a piece of one of ``uid``'s output streams (a chunk read
        and encoded, a stream's last frame with its result) until it is sent: at most
        :data:`OUTPUT_PIECES` of a uid's at once (root: any)."""
        if uid == 0:
            yield
            return
        held = self._pieces.get(uid)
        if held is None:
            held = self._pieces[uid] = [trio.Semaphore(OUTPUT_PIECES), 0]
        held[1] += 1
        try:
            async with held[0]:
                yield
        finally:
            held[1] -= 1
            if not held[1]:
                del self._pieces[uid]

    def reading(self, uid: int) -> AbstractAsyncContextManager[None]:
        """Held while a read of the records is made for ``uid``: the records' reader thread
        is everyone's, first come first served, so each uid has one read in it at a time
        (250 connections of one tenant, each making it decode a MiB-long record, made
        another's submission wait a second and a half)."""
        return _one_at_a_time(self._reading, uid)

    def may_answer(self, uid: int) -> bool:
        """Whether a refused connection of ``uid`` gets an answer: one a second per uid
        (the rest are closed at once: a client re-making connections as fast as it can
        learns nothing more from a thousand 429s than from one)."""
        now = trio.current_time()
        if now - self._answered.get(uid, -1.0) < 1.0:
            return False
        self._answered[uid] = now
        if len(self._answered) > 4096:
            self._answered = {u: t for u, t in self._answered.items() if now - t < 1.0}
        return True

    def connections_of(self, uid: int) -> int:
        return len(self.held.get(uid, ()))

    def take_body(self, uid: int, size: int) -> bool:
        """Count ``size`` bytes of a request body against ``uid``'s share; False (nothing
        counted) if that would go past it.  :meth:`give_body` back once answered."""
        if self.bodies[uid] and self.bodies[uid] + size > self.body_bytes:
            return False
        self.bodies[uid] += size
        return True

    def give_body(self, uid: int, size: int) -> None:
        self.bodies[uid] -= size
        if self.bodies[uid] <= 0:
            del self.bodies[uid]


def walks_for(open_files: int) -> int:
    """Tenants' signal walks at once for a daemon allowed ``open_files`` (its soft limit, as
    raised at start): their pidfds at most a quarter of it."""
    return max(1, open_files // 4 // WALK_FDS)


@contextlib.asynccontextmanager
async def _one_at_a_time(locks: dict[int, trio.Lock], uid: int, loop: LoopShare | None = None,
                         a_round: bool = False) -> AsyncIterator[None]:
    if loop is not None:
        await loop.wait(uid)
    lock = locks.setdefault(uid, trio.Lock())
    try:
        if a_round:
            await lock.acquire()  # (a piece of a large answer: a round of its own)
        else:
            await take(lock)  # (a read of the records: their answer is the next round)
        try:
            yield
        finally:
            lock.release()
    finally:
        if not lock.locked() and not lock.statistics().tasks_waiting:
            locks.pop(uid, None)


async def take(lock: trio.Lock) -> None:
    """``lock.acquire()`` without its schedule point when the lock is free (a cancellation is
    still raised first).  Each schedule point of a request waits for a whole round of the event
    loop, every other ready task's step: under a tenant's flood the rounds are long, and a
    request's submit-to-result was ~22 of them, three of them locks nobody held (the uid's
    read of the records, and the records' one call in flight).  Only where a schedule point
    follows at once (the records' answer); never between the pieces of one large piece of
    work (``Shares.heavy``)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()


WINDOW = 0.1  # seconds over which a uid's use of the event loop is counted (decaying)
CONTENDED = 0.6  # the loop busier than this: each uid active on it gets an equal share
LONGEST = 0.05  # seconds a uid over its share waits at most at once
LIGHT = 0.5  # of an equal share: a uid using less than this is never kept back
ROUND_STEPS = 1  # steps a round of the uids over their share of a busy loop (``_ration``)
LIGHT_STEPS = 4  # steps a round of each other uid's (but root's) while the loop is rationed
OUTPUT_SHARE = 0.5  # of an equal share: a uid's tasks' output read at most, others waiting


class LoopShare(trio.abc.Instrument):
    """Each uid's time on the event loop (every step of a task tagged with it: a
    connection's, a task life's, and those they start), decaying over :data:`WINDOW`.
    While the loop is busier than :data:`CONTENDED`, a uid using more than an equal share
    of it among the uids using it waits (:meth:`wait`: before a request is answered, before
    each piece of a large answer) until its use decays to that share; and each round of the
    loop runs at most :data:`ROUND_STEPS` steps of the uids over half an equal share, which
    take turns (:meth:`_ration`).

    Counting costs every step of every task a call (the daemon's CPU per task at 16 clients
    5.61 ms counted, 5.19 not, three runs each), so it is on only while two uids other than
    root are active (hold a connection or a running task: :meth:`enter`, :meth:`leave`); one
    tenant alone, or root, pays nothing.  How busy the loop is, and whose the tasks a task
    starts are, is known while any uid other than root is active (:class:`_Rounds`: two
    calls a round and one a task started, not one a step), and when a second uid comes, the
    loop's use so far is counted as the first's: a uid arriving beside a flood is rationed
    from its first round, not once a tenth of a second of the flood's use is counted."""

    def __init__(self) -> None:
        self.owner: weakref.WeakKeyDictionary[trio.lowlevel.Task, int] = \
            weakref.WeakKeyDictionary()
        self.used: dict[int, list[float]] = {}  # uid -> [decayed seconds, when]
        self.busy = [0.0, 0.0]  # the loop's: its rounds' time, with the offload's (charge)
        self.active: collections.Counter[int] = collections.Counter()  # uid -> holds
        self.on = False  # counting each step's time as its uid's
        self._last = 0.0  # when the last step (or the wait for I/O) ended
        # a step's cost is the loop thread's CPU time, not the clock's: a step waiting for the
        # GIL (held by the offload's or the records' thread) costs its uid nothing it did not
        # use; uses decay with the clock
        self._cpu = time.thread_time
        self._clock = time.monotonic
        # the steps of this round that wait for a later one (:meth:`_ration`), oldest first;
        # the pump keeps the loop turning while there are
        self.deferred: collections.deque[trio.lowlevel.Task] = collections.deque()
        self.rationed = 0  # rounds that kept a step for a later one
        self._heavy_turn = 0  # the uid over its share whose steps the last rationed round ran
        self._rounds = _Rounds(self)
        self._runq: collections.deque[trio.lowlevel.Task] | None = None
        self._pump_lot = trio.lowlevel.ParkingLot()
        self._pumping: object = None  # the run the pump was started in

    def enter(self, uid: int) -> None:
        """The current task is ``uid``'s (its steps, and those of the tasks it starts, are
        counted as its); :meth:`leave` when it ends."""
        self.owner[trio.lowlevel.current_task()] = uid
        if uid == 0:
            return
        self.active[uid] += 1
        if not self._rounds.on:
            self._rounds.on = True
            self._start_pump()
            self._rounds.round_began = self._clock()
            trio.lowlevel.add_instrument(self._rounds)
        if not self.on and len(self.active) >= 2:
            self.on = True
            self._last = self._cpu()
            trio.lowlevel.add_instrument(self)
            if len(self.active) == 2:  # (the loop's use so far was the other uid's: it was
                other = next(u for u in self.active if u != uid)  # the one active)
                self.used[other] = list(self.busy)

    def leave(self, uid: int) -> None:
        if uid == 0:
            return
        self.active[uid] -= 1
        if self.active[uid] <= 0:
            del self.active[uid]
        if self.on and len(self.active) < 2:
            self._stop_counting()
        if not self.active:
            self.off()

    def _stop_counting(self) -> None:
        self.on = False
        with contextlib.suppress(KeyError):
            trio.lowlevel.remove_instrument(self)
        self._flush()  # (nobody is rationed with one uid active)

    def off(self) -> None:
        """Stop counting and rationing (idempotent: trio removes an instrument of its own
        accord if one of its calls raises)."""
        self._stop_counting()
        self._rounds.on = False
        with contextlib.suppress(KeyError):
            trio.lowlevel.remove_instrument(self._rounds)

    def _start_pump(self) -> None:
        """The round's queue, and the task that keeps the loop turning while steps wait in
        :attr:`deferred` (their tasks are runnable, but not in the queue: without it, a
        round whose every task then waits for I/O would wait in the kernel for as long as
        nothing comes, the deferred steps with it): once per run."""
        run = trio.lowlevel.current_trio_token()
        if self._pumping is run:
            return
        self._pumping = run
        self._runq = _run_queue()
        if self._runq is not None:
            trio.lowlevel.spawn_system_task(self._pump, name="corral loop share pump")

    async def _pump(self) -> None:
        try:
            while True:
                await self._pump_lot.park()
                while self.deferred:
                    await trio.lowlevel.checkpoint()
        finally:  # (the run ends: nothing is kept back any more)
            self._runq = None
            self._flush()

    def _flush(self) -> None:
        """Every deferred step back into the round's queue."""
        if self.deferred:
            runq = self._runq if self._runq is not None else _run_queue()
            if runq is not None:
                runq.extend(self.deferred)
            self.deferred = collections.deque()

    def _round(self) -> None:
        """A round begins (after the loop's wait for I/O): ration it while the loop is
        contended and two or more uids active."""
        runq = self._runq
        if runq is None:
            return
        if len(self.active) >= 2 and _share(self.busy, self._clock()) >= CONTENDED:
            try:
                self._ration(runq)
            except BaseException:  # (never: but trio drops an instrument that raises, and
                self._runq = None  # the steps it kept back would wait for ever)
                self._flush()
                raise
        elif self.deferred:
            self._flush()

    def _ration(self, runq: collections.deque[trio.lowlevel.Task]) -> None:
        """At most :data:`ROUND_STEPS` steps in this round of the uids other than root using more
        than :data:`LIGHT` of an equal share, oldest first; the rest wait for a later round, in
        order.  Trio runs every runnable task once a round, so every step of a request waits for the
        whole of a round: a flood's many requests and tasks in flight made each round many of its
        steps long, and another uid's request, ~20 rounds from its first byte to its answer, waited
        for all of them in each (two tenants' floods of `true`: another's median 7 -> 53-148 ms, an
        independent attack).  Rationed, a round holds one step of each uid above half an equal share
        and every step of the others: a uid with a request or two in flight goes through the rounds
        at nearly its own pace, and the floods share the rest of the loop by turns, the loop never
        idle while they wait.  The uids over the share take turns by rounds, too: a round runs
        :data:`ROUND_STEPS` of one of them (the next by uid after the last served), so a light
        uid's step waits behind one flood's step, not one of each (two tenants' floods: a
        round held a step of each, and the light uid's ~17 rounds each waited for both).  And
        no uid but root has more than :data:`LIGHT_STEPS` steps in a round, over its share or
        not: a uid's hundreds of cheap steps (its connections' bytes, one at a time) made each
        round of the others' as long as all of them, its share of the loop's time still small."""
        now = self._clock()
        fair = 1.0 / max(2, len(self.active))
        owner = self.owner
        tasks = list(itertools.chain(self.deferred, runq))
        heavy: set[int] = set()  # the uids over the share with a step waiting
        light: set[int] = set()
        for task in tasks:
            uid = owner.get(task)
            if uid and uid not in heavy and uid not in light:
                used = self.used.get(uid)
                share = _share(used, now) if used is not None else 0.0
                (light if share <= fair * LIGHT else heavy).add(uid)
        # the heavy uid whose turn this round is: the next after the last one served
        turn = min((u for u in heavy if u > self._heavy_turn), default=min(heavy, default=0))
        self._heavy_turn = turn
        steps = 0
        taken: dict[int, int] = {}
        keep: list[trio.lowlevel.Task] = []
        later: collections.deque[trio.lowlevel.Task] = collections.deque()
        for task in tasks:
            uid = owner.get(task)
            if uid in heavy:  # (root's and the daemon's own: never kept back)
                if uid != turn or steps >= ROUND_STEPS:
                    later.append(task)
                    continue
                steps += 1
            elif uid:
                n = taken.get(uid, 0)
                if n >= LIGHT_STEPS:
                    later.append(task)
                    continue
                taken[uid] = n + 1
            keep.append(task)
        runq.clear()
        runq.extend(keep)
        self.deferred = later
        if later:
            self.rationed += 1
            self._pump_lot.unpark()  # (no-op while it turns already)

    def charge(self, uid: int, seconds: float) -> None:
        """``seconds`` of work off the loop that held the GIL (the loop waited for it) count
        as ``uid``'s time on the loop (``Offload``'s jobs), and the loop's."""
        if uid == 0:
            return
        now = self._clock()
        _add(self.busy, seconds, now)
        if self.on:
            self._use(uid, seconds, now)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        # (a step's time: since the previous step, or the wait for I/O, ended; one call per
        # step, not two)
        cpu = self._cpu()
        took = cpu - self._last
        self._last = cpu
        uid = self.owner.get(task)
        if uid is not None:
            self._use(uid, took, self._clock())

    def charge_step(self, uid: int, seconds: float) -> None:
        """``seconds`` of a step of the loop that is no task's (the I/O reactor's reads of
        ``uid``'s tasks' pipes) count as ``uid``'s (the loop's counted them already)."""
        if self.on and uid != 0:
            self._use(uid, seconds, self._clock())

    def _use(self, uid: int, seconds: float, now: float) -> None:
        used = self.used.get(uid)
        if used is None:
            self.used[uid] = [seconds, now]
        else:
            _add(used, seconds, now)

    def busiest(self, uid: int) -> bool:
        """Whether ``uid`` is the uid using the most of a loop busier than :data:`CONTENDED`
        that others use too (within its share or not: :meth:`Shares.turn`)."""
        if not self.on or uid == 0:
            return False
        now = self._clock()
        if _share(self.busy, now) < CONTENDED:
            return False
        mine, using, top = self._standing(uid, now)
        return using >= 2 and mine >= top

    def output_over(self, uid: int) -> bool:
        """Whether ``uid``'s tasks' output rests now, unread (``Supervisor.pace_output``):
        while other uids use the loop too, it is the uid using the most, and above
        :data:`OUTPUT_SHARE` of an equal share.  Reading output is bulk work that a rest only
        delays (the writers block on their full pipes, and use no CPU meanwhile), while a
        request is waited for: so a uid's output gets at most half an equal share once others
        need the loop, not the whole of it, and none of this when they do not.  (Four tasks of
        one tenant writing 200 MB each took 38% of the loop, under an equal share, and the
        CPUs with their writers: another tenant's median went from 7 to 28-30 ms, its p99 to
        62-66; with their output paced so, 20-21 ms and 43-51, the flood's tasks 10% fewer:
        benchmarks/bench_tenants.py, two pairs of runs alternated.)"""
        if not self.on or uid == 0:
            return False
        mine, using, top = self._standing(uid, self._clock())
        return using >= 2 and mine > OUTPUT_SHARE / using and mine >= top

    async def wait(self, uid: int) -> None:
        """If ``uid`` is over its share (:meth:`_over_by`): as long as its use takes to decay
        to that share.  (Waiting instead until the loop had nothing else to run, at most as
        long, gave the uid over its share every idle moment, and the others' medians were
        higher: 24.5-34.3 -> 33.0-42.8 ms in four attacks of bench_tenants.)"""
        wait = self._over_by(uid)
        if wait > 0:
            await trio.sleep(wait)

    def _over_by(self, uid: int) -> float:
        """How long ``uid`` waits now: 0 unless the loop is contended and it is the uid using
        the most, above an equal share."""
        if not self.on or uid == 0:
            return 0.0
        now = self._clock()
        if _share(self.busy, now) < CONTENDED:
            return 0.0
        mine, active, top = self._standing(uid, now)
        fair = 1.0 / max(1, active)
        if active < 2 or mine <= fair or mine < top:
            return 0.0  # (only the uid using the most waits)
        return min(LONGEST, WINDOW * math.log(mine / fair))

    def _standing(self, uid: int, now: float) -> tuple[float, int, float]:
        """``uid``'s share of the loop now, how many uids use it (above 2%), and the largest
        share."""
        shares = {u: _share(v, now) for u, v in self.used.items()}
        if len(shares) > 4096:  # (forget the uids that have not used it for a while)
            self.used = {u: v for u, v in self.used.items() if shares[u] > 1e-4}
        using = sum(1 for v in shares.values() if v > 0.02)
        return shares.get(uid, 0.0), using, max(shares.values(), default=0.0)


class _Rounds(trio.abc.Instrument):
    """The loop's rounds, while any uid other than root is active (:class:`LoopShare`): how
    busy it is (the clock's time from each wait for I/O to the next: what a request waits
    for, whether the loop's thread ran meanwhile or waited for a CPU or the GIL), whose the
    tasks its uids' tasks start are, and each round rationed.  (Its thread's CPU time said a
    loop whose CPU other processes took half of was not contended: two tenants' connections
    sending a byte at a time made rounds of 200 ms, none rationed, and another tenant's
    request waited for one at each of its steps: 2.6-3.3 s, an independent attack.)"""

    def __init__(self, share: LoopShare) -> None:
        self.share = share
        self.on = False
        self.round_began = 0.0

    def before_io_wait(self, timeout: float) -> None:
        share = self.share
        now = share._clock()
        _add(share.busy, now - self.round_began, now)

    def after_io_wait(self, timeout: float) -> None:
        share = self.share
        self.round_began = share._clock()
        share._last = share._cpu()
        share._round()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        try:
            uid = self.share.owner.get(trio.lowlevel.current_task())
        except RuntimeError:  # (spawned outside any task's step)
            return
        if uid is not None:
            self.share.owner[task] = uid


def _run_queue() -> collections.deque[trio.lowlevel.Task] | None:
    """Trio's queue of the tasks to run in the next round (its run loop takes the queue
    whole, after its wait for I/O and the instruments' ``after_io_wait``), or None where a
    version of trio keeps it otherwise (then nothing is rationed: ``LoopShare._ration``).
    Trio has no public way to order its rounds: its run loop's own comment expects "some
    variant of fair queueing" one day."""
    runner = getattr(getattr(trio._core._run, "GLOBAL_RUN_CONTEXT", None), "runner", None)
    runq = getattr(runner, "runq", None)
    return runq if isinstance(runq, collections.deque) else None


def _add(acc: list[float], took: float, now: float) -> None:
    acc[0] = acc[0] * math.exp((acc[1] - now) / WINDOW) + took
    acc[1] = now


def _share(acc: list[float], now: float) -> float:
    return acc[0] * math.exp((acc[1] - now) / WINDOW) / WINDOW
