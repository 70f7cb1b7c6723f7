"""hand_over() / open_supervisor(adopt=...) at awkward moments: a stop asked for just before the
hand-over, and one asked for right after the adoption, must still be carried out."""

from __future__ import annotations

import functools

import trio
from rt_util import wait_for

import supervisor


async def _hand_over_after(scratch: str, before: str) -> supervisor.HandOver:
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup, trio.open_nursery() as n:
        task = await n.start(functools.partial(
            sup.start, ["sh", "-c", "trap '' TERM; echo ready; exec sleep 30"],
            grace="10s", task_id="victim"))
        await wait_for(lambda: b"ready" in task.output().head, what="its trap")
        if before == "stop_then_wait":
            task.stop()
            await trio.sleep(0.3)  # the driver has sent SIGTERM
        return await sup.hand_over()


async def test_a_stop_asked_just_before_the_hand_over_is_carried_out(scratch: str) -> None:
    async with supervisor.open_supervisor(cgroup_root=scratch) as sup, trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sleep", "30"],
                                               task_id="victim"))
        task.stop()  # graceful: SIGTERM ends sleep at once
        handover = await sup.hand_over()
    async with supervisor.open_supervisor(adopt=handover) as sup:
        (task,) = sup.tasks
        with trio.move_on_after(5):
            r = await task.wait()
        still = (task.state, task.stop_level)
        task.stop(force=True)  # (a failing run ends now, not when sleep does)
        assert task.result is not None and still[0] == "finished", (
            f"5 s after adoption the task is still {still[0]!r}, its stop at {still[1]!r}: "
            f"the SIGTERM asked for never went out")
    assert r.outcome == "cancelled" and r.stop is not None and r.stop.reached == "signalled"


async def test_a_second_stop_right_after_adoption_kills_now(scratch: str) -> None:
    handover = await _hand_over_after(scratch, "stop_then_wait")
    async with supervisor.open_supervisor(adopt=handover) as sup:
        (task,) = sup.tasks
        task.stop()  # the caller's second request: kill now (the grace is 10 s)
        with trio.move_on_after(4):
            r = await task.wait()
        still = (task.state, task.stop_level)
        # (a failing run waits for the grace: even stop(force=True) is refused now, a kill
        # being due already)
        assert still[0] == "finished", (
            f"4 s after the second stop() the task is still {still[0]!r}, its stop at "
            f"{still[1]!r}: the kill waits for the 10 s grace")
    assert r.stop is not None and r.stop.kill_because == "second_request"


async def test_a_second_stop_after_the_adopted_life_runs_kills_now(scratch: str) -> None:
    """Held: once the adopted driver waits, the caller's second request kills at once."""
    handover = await _hand_over_after(scratch, "stop_then_wait")
    async with supervisor.open_supervisor(adopt=handover) as sup:
        (task,) = sup.tasks
        await trio.sleep(0.3)
        task.stop()
        with trio.fail_after(10):
            r = await task.wait()
    assert r.outcome == "cancelled" and r.stop is not None
    assert r.stop.reached == "killed" and r.stop.kill_because == "second_request"
