"""Several corrals on one host: whatever --cgroup-root each is given, none touches another's
tasks."""

from __future__ import annotations

import functools

import pytest
import trio

import supervisor


async def test_a_corral_inside_another_corrals_root_leaves_its_tasks_alone(
        scratch: str) -> None:
    """Fixed: a task id of a root's form (corral-<pid>-<hex>) is refused, so no live leaf can
    be taken for a stale root by a second corral given the first one's root."""
    async with supervisor.open_supervisor(cgroup_root=scratch) as first, \
            trio.open_nursery() as n:
        with pytest.raises(supervisor.SpecError, match="form of a supervisor's root"):
            first.start(["sleep", "30"], task_id="corral-1-abcdef")
        task = await n.start(functools.partial(first.start, ["sleep", "30"],
                                               task_id="corral-1-abcdeg"))
        async with supervisor.open_supervisor(cgroup_root=first.cgroup_root) as second:
            notes = second.placement_notes
        await trio.sleep(0.3)
        killed = task.result
        task.stop(force=True)
    assert killed is None and notes == [], (killed, notes)


async def test_two_corrals_on_one_root_never_reap_each_other(scratch: str) -> None:
    """Held: each has its own locked root; opening more beside them clears nothing live."""
    async with supervisor.open_supervisor(cgroup_root=scratch) as a, trio.open_nursery() as n:
        task = await n.start(a.start, ["sleep", "30"])
        for _ in range(3):
            async with supervisor.open_supervisor(cgroup_root=scratch) as b:
                assert b.placement_notes == []
                assert (await b.run(["true"])).outcome == "succeeded"
        assert task.result is None
        task.stop()
    assert task.result is not None and task.result.outcome == "cancelled"
