"""A supervisor rooted in the test's own cgroup, and condition polling."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import cgroupfs
import supervisor


@pytest.fixture
async def sup(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[supervisor.Supervisor]:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
        yield s
    # the supervisor removed its tasks/ and every leaf; nothing may be left running
    assert not test_cgroup.is_populated()
    assert test_cgroup.children() == []
