"""Fixtures for the fast tests that judge mutants of the stop state, the driver and the
outcome rules (tests/mutation/run_mutation.py); they run in every ``pytest`` too."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import trio

import cgroupfs
import supervisor


@pytest.fixture
async def sup(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[supervisor.Supervisor]:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
        yield s
    assert not test_cgroup.is_populated()
    assert test_cgroup.children() == []


# A hang fails the test after HANG seconds (the mutation run sets CORRAL_MUTATION_HANG low, so
# that a mutant that hangs the driver is caught by a failing test, not by mutmut's timeout).
HANG = float(os.environ.get("CORRAL_MUTATION_HANG", "60"))


@pytest.fixture
async def watchdog(nursery: trio.Nursery) -> None:
    async def bark() -> None:
        await trio.sleep(HANG)
        raise AssertionError(f"the test hung for {HANG:g} s")

    nursery.start_soon(bark)
