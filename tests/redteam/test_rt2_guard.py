"""The spawn guard against a freeze from above the base (a busy host's `systemctl freeze` of
the slice corral was given a cgroup in): held, with its price."""

from __future__ import annotations

import os
import time

import trio

import supervisor


async def test_a_freeze_above_the_base_fails_each_spawn_within_the_bound(scratch: str) -> None:
    """Held: each spawn into a cgroup frozen from above fails (spawn_failed, step frozen, a
    note) after GIVE_UP (2 s) instead of hanging.  The price: the event loop is held for those
    2 s per spawn (here 5 spawns: ~10 s in which no other task's time limit, stop or output
    is served); nothing remembers that the base is frozen from above."""
    mid = os.path.join(scratch, "mid")
    base = os.path.join(mid, "base")
    os.makedirs(base)
    worst = 0.0

    async def beat() -> None:
        nonlocal worst
        while True:
            t = time.monotonic()
            await trio.sleep(0.01)
            worst = max(worst, time.monotonic() - t)

    async with supervisor.open_supervisor(cgroup_root=base) as sup:
        with open(os.path.join(mid, "cgroup.freeze"), "w") as f:
            f.write("1")
        try:
            async with trio.open_nursery() as n:
                n.start_soon(beat)
                with trio.fail_after(30):
                    rs = await sup.run_batch([supervisor.TaskSpec(["true"]) for _ in range(3)],
                                             max_concurrency=3)
                n.cancel_scope.cancel()
        finally:
            with open(os.path.join(mid, "cgroup.freeze"), "w") as f:
                f.write("0")
    assert [r.outcome for r in rs] == ["spawn_failed"] * 3
    assert [r.error_step for r in rs] == ["frozen"] * 3
    # each record holds its own note (the guard's thread adds it before the kill that lets
    # the spawn return: it once came after, and landed in the next record in one run of five)
    assert [sum("frozen from above" in n for n in r.notes) for r in rs] == [1] * 3
    assert 1.9 < worst < 3.0, worst  # the loop is held for GIVE_UP, and no longer
