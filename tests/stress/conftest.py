"""Stress suites: short versions run in every ``pytest``; full sizes are opt-in.

``pytest tests/stress`` runs the short (CI) sizes.  ``pytest -m stress tests/stress`` runs the
full sizes (tests marked ``stress``, skipped otherwise); ``--stress-tasks N`` and
``--stress-rounds N`` override them.  ``pytest tests/stress --soak MINUTES`` runs the soak
(marked ``soak``, skipped without the option).  docs/testing.md has the figures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from stress_util import MARK, kill_marked, marked_pids, new_mark

import cgroupfs
import supervisor


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corral stress")
    group.addoption("--stress-tasks", type=int, default=None,
                    help="tasks for the full-size random-stop suite (default 10000)")
    group.addoption("--stress-rounds", type=int, default=None,
                    help="rounds of the full-size crash suite, each SIGKILLing one `corral run` "
                         "and one library program (default 50: 100 SIGKILLs)")
    group.addoption("--soak", type=float, default=None, metavar="MINUTES",
                    help="run the soak for MINUTES, printing growth per 1000 tasks")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = config.getoption("-m") or ""
    for item in items:
        if item.get_closest_marker("stress") and "stress" not in selected:
            item.add_marker(pytest.mark.skip(
                reason="full size: run with pytest -m stress tests/stress"))
        if item.get_closest_marker("soak") and config.getoption("--soak") is None:
            item.add_marker(pytest.mark.skip(reason="soak: run with pytest tests/stress "
                                                    "--soak MINUTES"))


@pytest.fixture
def mark() -> Iterator[str]:
    """A token for this test's processes (``CORRAL_STRESS_MARK``); whatever still carries it
    after the test is killed, and fails the test."""
    token = new_mark()
    yield token
    left = kill_marked(token)
    assert not left, f"processes carrying {MARK}={token} survived the test: {left}"
    assert not marked_pids(token)


@pytest.fixture
def cgroup_mount(cgroup2_mount: str) -> str:
    return cgroup2_mount


@pytest.fixture
async def stress_sup(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[supervisor.Supervisor]:
    """A supervisor in the test's own cgroup that keeps every record (up to 20,000)."""
    async with supervisor.open_supervisor(cgroup_root=test_cgroup.path,
                                          retain_results=20_000) as s:
        yield s
    assert not test_cgroup.is_populated()
    assert test_cgroup.children() == []
