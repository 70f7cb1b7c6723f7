"""Which idempotency keys the records may hold: a Bloom filter of every (uid, key) of a task's
row or an expired task's tombstone.

A submission with a key the daemon does not hold in memory was looked up in the records
first (a retry gets its task back, 409 or 410), a read in the records' reader thread behind
whatever read was in it: the project's clients send a new key with every submission, so each
paid a round trip, and waited behind another tenant's listings of 1,000 tasks (28 ms median
against 8: an independent attack).  A key the filter has never seen cannot be in the records:
that lookup is skipped.  The filter says "maybe" for every key it was given (no false
"no"), and for a few others (a lookup then, as before): 2 MiB, three bits a key, about one
key in 130,000 told "maybe" wrongly at the 110,000 keys of the default retention and
tombstones, one in 200 at a million.  Nothing is taken out as it goes (a key whose tombstone
went stays "maybe": a lookup that finds nothing) until the filter is made again.

Filled at start-up from the records in the reader thread (:func:`bits_of`; until then every
key is "maybe"), and on the event loop as keys are taken (:meth:`KeyFilter.add`).  Made again
from the records once :data:`REBUILD_AFTER` keys were added since it last was (what the
records hold is bounded by retention and tombstones; what was added, by nothing: a tenant
taking 300 keys a second filled it in a day, and from then on every key of every uid was a
read of the records; an independent attack): :meth:`KeyFilter.rebuilding` and
:meth:`KeyFilter.rebuilt`.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable

__all__ = ["BITS", "REBUILD_AFTER", "KeyFilter", "bits_of"]

BITS = 1 << 24  # the filter's size in bits (2 MiB)
REBUILD_AFTER = 1 << 20  # keys added since it was last made from the records (1 in 200 "maybe")
_MASK = BITS - 1


def _positions(uid: int, key: str) -> tuple[int, int, int]:
    h = int.from_bytes(hashlib.blake2b(b"%d\0%s" % (uid, key.encode("utf-8", "surrogatepass")),
                                       digest_size=9).digest(), "little")
    return h & _MASK, (h >> 24) & _MASK, (h >> 48) & _MASK


def _set(bits: bytearray, uid: int, key: str) -> None:
    for i in _positions(uid, key):
        bits[i >> 3] |= 1 << (i & 7)


def bits_of(db: sqlite3.Connection) -> bytearray:
    """(in the records' reader thread) The filter's bits for every key the records hold."""
    bits = bytearray(BITS >> 3)
    for uid, key in db.execute(
            "SELECT uid, idempotency_key FROM tasks WHERE idempotency_key IS NOT NULL "
            "UNION ALL SELECT uid, idempotency_key FROM expired "
            "WHERE idempotency_key IS NOT NULL"):
        _set(bits, uid, key)
    return bits


class KeyFilter:
    def __init__(self) -> None:
        self.bits = bytearray(BITS >> 3)
        self.ready = False  # the records' keys are in (:meth:`load`)
        self.added = 0  # keys added since the records' were read
        self._since: bytearray | None = None  # while being made again: the keys taken meanwhile

    def add(self, uid: int, key: str) -> None:
        """``key`` of ``uid``'s is taken (before its row is written)."""
        _set(self.bits, uid, key)
        if self._since is not None:
            _set(self._since, uid, key)
        self.added += 1

    def load(self, bits: bytearray) -> None:
        """The records' keys (:func:`bits_of`), besides those added meanwhile."""
        self.bits = _or(self.bits, bits)
        self.ready = True

    @property
    def due(self) -> bool:
        """Whether it is to be made again from the records (:data:`REBUILD_AFTER`)."""
        return self.ready and self._since is None and self.added >= REBUILD_AFTER

    def rebuilding(self, held: Iterable[tuple[int, str]]) -> None:
        """A rebuild begins, before the records are read: ``held`` are the keys of the tasks
        in memory and of those being accepted (their rows may be written after the read
        begins); from now on the keys taken are noted too.  A task leaves memory only once its
        rows are written, so every key is in the read, in ``held`` or taken meanwhile."""
        since = bytearray(BITS >> 3)
        for uid, key in held:
            _set(since, uid, key)
        self._since = since
        self.added = 0

    def rebuilt(self, bits: bytearray | None) -> None:
        """The records' keys read since :meth:`rebuilding` (:func:`bits_of`): the filter is
        those and the keys noted since; None if they could not be read (it stays as it is)."""
        since, self._since = self._since, None
        if bits is not None and since is not None:
            self.bits = _or(bits, since)

    def may_hold(self, uid: int, key: str) -> bool:
        """False only if no row nor tombstone of the records has ``key`` of ``uid``'s."""
        if not self.ready:
            return True
        bits = self.bits
        return all(bits[i >> 3] >> (i & 7) & 1 for i in _positions(uid, key))


def _or(a: bytearray, b: bytearray) -> bytearray:
    return bytearray((int.from_bytes(a, "little") | int.from_bytes(b, "little")).to_bytes(
        len(b), "little"))  # (one OR of 2 MiB, in C)
