"""Stats: pure parsers on sample texts, and read_stats on a real cgroup."""

from __future__ import annotations

import os

import pytest

import cgroupfs
from cgroupfs import CgroupStat, CpuStat, MemoryEvents, PidsEvents
from cgroupfs._stats import read_stats

CPU_STAT = """\
usage_usec 84947312
user_usec 48396422
system_usec 36550889
nice_usec 0
nr_periods 10
nr_throttled 2
throttled_usec 5000
"""

MEMORY_EVENTS = "low 0\nhigh 3\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n"
MEMORY_EVENTS_OLD = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"  # before 5.17
CGROUP_STAT = "nr_descendants 2\nnr_dying_descendants 1\nnr_subsys_cpu 3\n"


def test_parse_flat_keyed() -> None:
    assert cgroupfs.parse_flat_keyed("a 1\n\nb_c 22\nd.e 3\n") == {"a": 1, "b_c": 22, "d.e": 3}
    assert cgroupfs.parse_flat_keyed("") == {}


@pytest.mark.parametrize("text", ["a\n", "a b\n", "a 1.5\n"])
def test_parse_flat_keyed_refuses_a_non_integer_line_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="not a 'key integer' line"):
        cgroupfs.parse_flat_keyed(text)


def test_parse_events() -> None:
    assert cgroupfs.parse_events("populated 1\nfrozen 0\n") == cgroupfs.CgroupEvents(True, False)
    assert cgroupfs.parse_events("populated 0\nfrozen 1\n") == cgroupfs.CgroupEvents(False, True)
    # Kernels < 5.2 have no freezer and no "frozen" line.
    assert cgroupfs.parse_events("populated 0\n") == cgroupfs.CgroupEvents(False, False)
    with pytest.raises(ValueError, match="no 'populated' line"):
        cgroupfs.parse_events("frozen 0\n")


def test_cpu_stat_keeps_the_main_figures_and_the_rest_in_extra() -> None:
    stat = CpuStat.parse(CPU_STAT)
    assert (stat.usage_usec, stat.user_usec, stat.system_usec) == (84947312, 48396422, 36550889)
    assert dict(stat.extra) == {
        "nice_usec": 0,
        "nr_periods": 10,
        "nr_throttled": 2,
        "throttled_usec": 5000,
    }
    assert CpuStat.parse("nr_periods 1\n").usage_usec is None


def test_memory_events_missing_keys_are_none_not_zero() -> None:
    assert MemoryEvents.parse(MEMORY_EVENTS) == MemoryEvents(0, 3, 7, 1, 1, 0)
    old = MemoryEvents.parse(MEMORY_EVENTS_OLD)
    assert old.oom_kill == 0
    assert old.oom_group_kill is None


def test_pids_events_and_cgroup_stat() -> None:
    assert PidsEvents.parse("max 4\n") == PidsEvents(max=4)
    assert PidsEvents.parse("max 0\nmax.imposed 0\n") == PidsEvents(max=0)
    assert CgroupStat.parse(CGROUP_STAT) == CgroupStat(2, 1)


def test_read_stats_gives_none_for_each_absent_file() -> None:
    files = {"cpu.stat": CPU_STAT, "memory.current": "4096\n", "cgroup.stat": CGROUP_STAT}
    stats = read_stats(files.get)
    assert stats.cpu is not None and stats.cpu.usage_usec == 84947312
    assert stats.memory_current == 4096
    assert stats.memory_peak is None
    assert stats.memory_events is None
    assert (stats.pids_current, stats.pids_peak, stats.pids_events) == (None, None, None)
    assert stats.cgroup == CgroupStat(2, 1)


def test_read_stats_skips_the_files_of_controllers_not_enabled() -> None:
    files = {"cpu.stat": CPU_STAT, "memory.current": "4096\n", "pids.current": "3\n",
             "cgroup.stat": CGROUP_STAT}
    asked: list[str] = []

    def read(name: str) -> str | None:
        asked.append(name)
        return files.get(name)

    stats = read_stats(read, controllers={"pids"})
    assert stats.memory_current is None and stats.pids_current == 3
    assert not [n for n in asked if n.startswith("memory.")]
    assert read_stats(files.get, controllers=None).memory_current == 4096


def test_read_stats_on_a_real_cgroup(test_cgroup: cgroupfs.Cgroup) -> None:
    stats = test_cgroup.read_stats()
    assert stats.cpu is not None  # cpu.stat's usage figures exist without the cpu controller
    assert stats.cpu.usage_usec is not None and stats.cpu.usage_usec >= 0
    assert stats.cgroup is not None and stats.cgroup.nr_descendants == 0
    fields = {
        "memory.current": stats.memory_current,
        "memory.peak": stats.memory_peak,
        "memory.events": stats.memory_events,
        "pids.current": stats.pids_current,
        "pids.peak": stats.pids_peak,
        "pids.events": stats.pids_events,
    }
    for filename, value in fields.items():
        present = os.path.exists(os.path.join(test_cgroup.path, filename))
        # Absent is None (never 0); on this host memory and pids are not offered.
        assert (value is not None) == present, filename
