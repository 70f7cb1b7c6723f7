"""The idempotency keys' filter (supervisor/serve/keyfilter.py): never a false "no", for keys
added, loaded from the records, or both; "maybe" for everything until the records' are in."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

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
