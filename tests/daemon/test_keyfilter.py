"""The idempotency keys' filter (supervisor/serve/keyfilter.py): never a false "no", for keys
added, loaded from the records, or both; "maybe" for everything until the records' are in."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.serve import keyfilter
from supervisor.serve.keyfilter import KeyFilter, bits_of

keys = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.text(min_size=1, max_size=128)),
                max_size=50)


@settings(max_examples=200, deadline=None)
@given(added=keys, loaded=keys, others=keys)
def test_no_key_given_is_ever_told_no(added: list[tuple[int, str]],
                                      loaded: list[tuple[int, str]],
                                      others: list[tuple[int, str]]) -> None:
    f = KeyFilter()
    for uid, key in added:
        f.add(uid, key)
    assert all(f.may_hold(uid, key) for uid, key in others)  # (not loaded yet: "maybe")
    from_records = KeyFilter()
    for uid, key in loaded:
        from_records.add(uid, key)
    f.load(from_records.bits)
    assert f.ready
    assert all(f.may_hold(uid, key) for uid, key in added + loaded)


def test_the_records_keys_are_rows_and_tombstones_and_a_key_is_its_uids(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "k.db")
    db.execute("CREATE TABLE tasks (uid INTEGER, idempotency_key TEXT)")
    db.execute("CREATE TABLE expired (uid INTEGER, idempotency_key TEXT)")
    db.executemany("INSERT INTO tasks VALUES (?, ?)", [(1000, "a"), (1000, None), (0, "b")])
    db.execute("INSERT INTO expired VALUES (1001, 'c')")
    f = KeyFilter()
    f.load(bits_of(db))
    assert f.may_hold(1000, "a") and f.may_hold(0, "b") and f.may_hold(1001, "c")
    told_no = [f.may_hold(uid, key) for uid, key in ((1001, "a"), (1000, "c"), (1000, "z"))]
    assert told_no == [False, False, False]  # (3 bits in 16 million set per key: no collision)


@settings(max_examples=200, deadline=None)
@given(held=keys, recorded=keys, meanwhile=keys, forgotten=keys)
def test_made_again_it_holds_every_key_in_memory_recorded_or_taken_meanwhile(
        held: list[tuple[int, str]], recorded: list[tuple[int, str]],
        meanwhile: list[tuple[int, str]], forgotten: list[tuple[int, str]]) -> None:
    """Found by an independent attack: nothing ever left the filter, and a tenant taking 300
    keys a second would have filled it in a day (every key of every uid a read of the
    records from then on).  Made again from the records, it keeps what they hold, the keys
    in memory (their rows may be written after the read began) and those taken while it was
    read, and drops the rest: a key only in the old filter is told "no" again."""
    f = KeyFilter()
    for uid, key in held + recorded + forgotten:
        f.add(uid, key)
    f.load(bytearray(len(f.bits)))
    f.rebuilding(held)
    for uid, key in meanwhile:
        f.add(uid, key)
    from_records = KeyFilter()
    for uid, key in recorded:
        from_records.add(uid, key)
    f.rebuilt(from_records.bits)
    kept = held + recorded + meanwhile
    assert all(f.may_hold(uid, key) for uid, key in kept)
    gone = [k for k in forgotten if k not in kept]
    assert sum(f.may_hold(uid, key) for uid, key in gone) <= len(gone) // 20  # (collisions)


def test_it_is_due_to_be_made_again_after_so_many_keys_and_not_while_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyfilter, "REBUILD_AFTER", 10)
    f = KeyFilter()
    for n in range(10):
        f.add(1000, str(n))
    assert not f.due  # (not loaded yet: the start-up read comes first)
    f.load(bytearray(len(f.bits)))
    assert f.due
    f.rebuilding([])
    assert not f.due
    f.rebuilt(None)  # (the records could not be read: it stays as it was)
    assert all(f.may_hold(1000, str(n)) for n in range(10)) and not f.due
    for n in range(10):
        f.add(1001, str(n))
    assert f.due
