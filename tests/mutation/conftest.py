"""Fixtures for the fast tests that judge mutants of the stop state, the driver and the
outcome rules (tests/mutation/run_mutation.py); they run in every ``pytest`` too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import cgroupfs
import supervisor


@pytest.fixture
async def sup(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[supervisor.Supervisor]:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
        yield s
    assert not test_cgroup.is_populated()
    assert test_cgroup.children() == []
