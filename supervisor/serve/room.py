"""The state filesystem's room for output: a task starts only if its worst case fits.

Retention (``retention.py``) keeps finished results within ``--retain-bytes`` by what the
files hold, after the fact, at most once a second: it cannot stop a flood.  Sixteen running
tasks of one tenant, each filling its files at once and ending in a tenth of a second, wrote
faster than any pass could remove them, filled a 20 MiB state filesystem past its records'
reserve and left every tenant's submissions refused.  So the daemon also keeps a ledger, here,
of the disk's room for output (``OutputDisk.room``: 80% of what the filesystem had):

- a finished task holds what its row says (``bytes``: its files, its result, its request,
  its name and key, each row in its share of its table's pages: ``rows.row_bytes``); an
  expired one's tombstone, its key twice and a few columns (``rows.tomb_bytes``) until it is
  trimmed (to an eighth of the room, per uid fairly);
  a session, the environment it keeps;
- a running task holds its worst case (:func:`worst`: both streams at the cap with their kept
  tails, its request and result), from the moment it is counted running until its end row
  says what it took (:meth:`Room.settle`);
- a task starts only if what is held and its worst case fit the room (:meth:`Room.fits`); if
  not, it waits at the head of its uid's queue and retention is asked at once, without its
  one-second gap, to expire finished tasks, fairly between uids with everything else the
  ledger holds of a uid (running worst cases, tombstones, sessions' environments) counted as
  its own (``rows.expire``): the uid whose tasks write most loses its own, down to a margin
  below the room (:attr:`Room.aim`), so that the next starts need no pass.  A start whose own
  uid would hold more than its fair share of the room with it waits for its own, and the
  other uids' starts go first (:meth:`Room.over_share`); everyone else's wait for it.  One
  uid's running tasks reserve at most half the room (:meth:`Room.capped`): retention can
  expire results, never a running task's reservation.

So the output on the state filesystem never exceeds the room, whatever the tasks write and
however fast they end.  Pure bookkeeping on the trio thread.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping

import trio

from .rows import fair_level

__all__ = ["BLOCK", "RESULT_ROOM", "UID_SHARE", "Room", "worst"]

BLOCK = 64 << 10  # a file takes whole blocks: its bytes are rounded up to this
RESULT_ROOM = 64 << 10  # a result's JSON beyond its request's argv, env and names
UID_SHARE = 0.5  # of the room, what one uid's running tasks may reserve (Room.capped)
MARGIN = 16  # a pass made for a waiting start leaves this part of the room free beyond it


def worst(stream_cap: int, tail: int, request: int) -> int:
    """What a task may come to hold at most: each stream's file at ``stream_cap`` and its kept
    ``tail`` beside it, in whole blocks, and its row (the request of ``request`` bytes, and the
    result, which repeats the request's argv and environment)."""
    files = 2 * (_blocks(stream_cap) + _blocks(tail))
    return files + 2 * request + RESULT_ROOM


def _blocks(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


class Room:
    """The ledger (see the module docstring).  ``room``: the bytes output may take."""

    def __init__(self, room: int, held: int = 0, wake: Callable[[], None] | None = None,
                 measure: Callable[[int], int] | None = None) -> None:
        self.room = room
        self.held = held  # finished tasks' bytes, by their rows
        self.held_by: dict[int, int] = {}  # each uid's rows and tombstones, at the last pass
        self.reserved = 0  # running tasks' worst cases
        self.reserved_by: collections.Counter[int] = collections.Counter()
        self.wanted: tuple[int, int] | None = None  # (uid, bytes) of a start that waits
        self.asked = trio.Event()  # set when a start waits for room: retention runs now
        self._wake = wake  # (retention's)
        self._measure = measure  # the room now, given what finished tasks hold
        self._moved = True  # the ledger changed since a pass last took a waiting start in

    def capped(self, uid: int, cost: int) -> bool:
        """Whether ``uid``'s running tasks, with this start's ``cost``, would reserve more
        than :data:`UID_SHARE` of the room (its first running task never is: one task runs
        whatever its size).  Such a start waits for its uid's own tasks to end; nothing
        else could make room for it.  (Five sleeping tasks of one tenant with MiB-long
        requests reserved a 20 MiB disk's room, and no other uid's task started until they
        ended: retention expires finished results, never a running task's reservation.)"""
        mine = self.reserved_by.get(uid, 0)
        return mine > 0 and mine + cost > self.room * UID_SHARE

    def fits(self, uid: int, cost: int) -> bool:
        """Whether a task of ``uid`` holding ``cost`` at most may start now.  If not, that
        start is remembered as waiting and retention is asked to make room (until a pass
        takes it into account, then once for each change of the ledger: a pass that found
        nothing to expire is not run again for every submission).  A task always fits a
        ledger that holds nothing (a filesystem too small for even one worst case still runs
        its tasks one at a time).

        Before a start waits, the room is measured again, and grows if the filesystem has
        more room than it had (a daemon started on a disk something else had filled); it never
        shrinks: a tenant filling the filesystem with files of its own would otherwise have
        retention expire everyone's results (what is not output's, the records' reserve and
        the fifth of the disk left over, covers the records meanwhile).  A start
        :meth:`capped` for its uid does not fit, and asks retention for nothing."""
        if self.capped(uid, cost):
            return False
        if self._fits(cost):
            return True
        if self._measure is not None:
            self.room = max(self.room, self._measure(self.held))
            if self._fits(cost):
                return True
        self.wanted = (uid, cost)
        if self._moved:  # (until a pass takes this start into account: :meth:`pressed`)
            self.asked.set()
            if self._wake is not None:
                self._wake()
        return False

    def _fits(self, cost: int) -> bool:
        return self._room_for(cost) or (self.reserved == 0 and self.held <= 0)

    def _room_for(self, cost: int) -> bool:
        return self.held + self.reserved + cost <= self.room

    def take(self, uid: int, cost: int) -> None:
        """A task of ``uid`` counted as running holds ``cost`` from now on."""
        self.reserved += cost
        self.reserved_by[uid] += cost
        self._moved = True

    def give(self, uid: int, cost: int) -> None:
        """A task's worst case is given back without anything held (it did not start)."""
        self.reserved -= cost
        self.reserved_by[uid] -= cost
        if self.reserved_by[uid] <= 0:
            del self.reserved_by[uid]
        self._moved = True

    def settle(self, uid: int, cost: int, took: int) -> None:
        """A task that held ``cost`` (0: it never ran) ended, its row saying it ``took``."""
        if cost:
            self.give(uid, cost)
        self.hold(took)

    def keeps(self, grow: int) -> bool:
        """Whether the records may keep ``grow`` more bytes that are not a task's (a session's
        environment) beside what is held and what running tasks may still write; if so, they
        are held from now on (a negative ``grow`` gives room back)."""
        if grow > 0 and not self._room_for(grow):
            return False
        self.hold(grow)
        return True

    def hold(self, grow: int) -> None:
        """The records keep ``grow`` more bytes (negative: fewer), whatever the room (what
        an earlier run kept stays until it goes)."""
        self.held = max(0, self.held + grow)
        self._moved = True

    def expired(self, freed: int) -> None:
        """Retention removed finished tasks whose rows said ``freed`` bytes (less their
        tombstones', and plus the tombstones it trimmed: ``rows.Expired``)."""
        self.hold(-freed)

    def over_share(self, uid: int, cost: int, kept: Mapping[int, int]) -> bool:
        """Whether ``uid``, holding ``cost`` more, would hold more than its max-min fair
        share of the room: its rows and tombstones (at the last retention pass), its running
        worst cases, what ``kept`` says it keeps (sessions' environments).  Such a start
        waits for its own uid's room, and the other uids' starts go before it (one uid's
        start that did not fit held every uid's queue: an independent attack)."""
        use = collections.Counter(self.held_by)
        use.update(self.reserved_by)
        use.update(kept)
        use[uid] += cost
        return use[uid] > fair_level(use, self.room)

    def may_start(self, uid: int, cost: int, kept: Mapping[int, int]) -> bool | None:
        """:meth:`fits`; if not, None when the start waits for its own uid's room
        (:meth:`capped`, :meth:`over_share`: the other uids' starts may go first), False
        when everyone's wait for it (``Scheduler.next_ready``)."""
        if self.fits(uid, cost):
            return True
        return None if self.capped(uid, cost) or self.over_share(uid, cost, kept) else False

    @property
    def aim(self) -> int:
        """What a pass made for a waiting start expires finished tasks down to, with what
        :meth:`pressed` says: the room less a :data:`MARGIN`th of it, so that the next starts
        fit without a pass of their own.  (A pass that made just the room the start needed
        left the next one short by the row the last had added: one tenant's idle task kept
        the room tight, and every start of its flood ran a pass, 5 ms at 10,000 finished rows
        and more with tombstones, while others' requests waited behind it: an independent
        attack.)  The margin is taken, as the rest, from the uids above their fair share."""
        return self.room - self.room // MARGIN

    def pressed(self) -> dict[int, int] | None:
        """What each uid holds running, with the waiting start's worst case counted as its
        uid's, if a start waits (else None): retention expires finished tasks until the
        finished and these fit the room."""
        if self.wanted is None:
            return None
        # (the start's ask is answered: another only once the ledger changes.  Reset at the
        # ask, it was lost when the pass found no start waiting, the queue's next dispatch
        # having cleared ``wanted``, and the start waited for the next minute's pass)
        self._moved = False
        uid, cost = self.wanted
        by_uid = dict(self.reserved_by)
        by_uid[uid] = by_uid.get(uid, 0) + cost
        return by_uid
