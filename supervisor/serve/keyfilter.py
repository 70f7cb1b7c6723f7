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
tombstones, one in 200 at a million.  Nothing is ever taken out (a key whose tombstone went
stays "maybe": a lookup that finds nothing).

Filled at start-up from the records in the reader thread (:func:`bits_of`; until then every
key is "maybe"), and on the event loop as keys are taken (:meth:`KeyFilter.add`).
"""

from __future__ import annotations

import hashlib
import sqlite3

__all__ = ["BITS", "KeyFilter", "bits_of"]

BITS = 1 << 24  # the filter's size in bits (2 MiB)
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

    def add(self, uid: int, key: str) -> None:
        """``key`` of ``uid``'s is taken (before its row is written)."""
        _set(self.bits, uid, key)

    def load(self, bits: bytearray) -> None:
        """The records' keys (:func:`bits_of`), besides those added meanwhile."""
        self.bits = bytearray((int.from_bytes(self.bits, "little") | int.from_bytes(
            bits, "little")).to_bytes(len(bits), "little"))  # (one OR of 2 MiB, in C)
        self.ready = True

    def may_hold(self, uid: int, key: str) -> bool:
        """False only if no row nor tombstone of the records has ``key`` of ``uid``'s."""
        if not self.ready:
            return True
        bits = self.bits
        return all(bits[i >> 3] >> (i & 7) & 1 for i in _positions(uid, key))
