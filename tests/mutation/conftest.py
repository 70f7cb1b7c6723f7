"""Fixtures for the fast tests that judge mutants of the stop state, the driver and the
outcome rules (tests/mutation/run_mutation.py); they run in every ``pytest`` too."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

import cgroupfs
import supervisor


@pytest.fixture
async def sup(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[supervisor.Supervisor]:
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path) as s:
        yield s
    assert not test_cgroup.is_populated()
    assert test_cgroup.children() == []


# A hang fails the test after HANG seconds (the mutation run sets CORRAL_MUTATION_HANG low, so
# that a mutant that hangs the driver is caught by a failing test, not by mutmut's timeout):
# SIGALRM's handler raises in whatever the main thread runs, trio's loop included.
HANG = float(os.environ.get("CORRAL_MUTATION_HANG", "120"))


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    def bark(signum: int, frame: object) -> None:
        raise AssertionError(f"the test hung for {HANG:g} s")

    previous = signal.signal(signal.SIGALRM, bark)
    signal.setitimer(signal.ITIMER_REAL, HANG)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
