"""Limits: refused with field, value, rule and fix; translated to exact kernel text."""

from __future__ import annotations

import pytest

from cgroupfs import CgroupError, CpuMax, InvalidLimit, Limits


@pytest.mark.parametrize("field", ["memory_max", "memory_high", "memory_swap_max"])
@pytest.mark.parametrize("value", [-5, True, False, 1.5, "MAX", "1G", [5]])
def test_memory_fields_refuse_anything_but_bytes_or_max(field: str, value: object) -> None:
    with pytest.raises(InvalidLimit) as info:
        Limits(**{field: value})  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f'{field} must be a byte count >= 0 or "max", got {value!r}; ')
    assert '"max" for no limit' in message
    assert (info.value.field, info.value.value) == (field, value)


def test_the_documented_example_message() -> None:
    with pytest.raises(InvalidLimit) as info:
        Limits(memory_max=-5)
    assert str(info.value).startswith('memory_max must be a byte count >= 0 or "max", got -5; ')


@pytest.mark.parametrize("value", [-1, True, "unlimited", 2.0])
def test_pids_max_refuses_non_counts(value: object) -> None:
    with pytest.raises(InvalidLimit, match=r'^pids_max must be a process count >= 0 or "max"'):
        Limits(pids_max=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["cpu_weight", "io_weight"])
@pytest.mark.parametrize("value", [0, 10_001, -3, True, "100", 50.0])
def test_weights_must_be_ints_from_1_to_10000(field: str, value: object) -> None:
    with pytest.raises(InvalidLimit) as info:
        Limits(**{field: value})  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{field} must be an int between 1 and 10000, got {value!r}")
    assert "100 is the default" in str(info.value)


@pytest.mark.parametrize("quota", [999, 0, -1, True, 1500.0])
def test_cpu_quota_must_be_at_least_1000_us(quota: object) -> None:
    with pytest.raises(InvalidLimit, match=r"^cpu_max.quota_us must be an int >= 1000") as info:
        CpuMax(quota)  # type: ignore[arg-type]
    assert "half a CPU" in str(info.value)


@pytest.mark.parametrize("period", [999, 1_000_001, True, None])
def test_cpu_period_must_be_1ms_to_1s(period: object) -> None:
    with pytest.raises(InvalidLimit, match=r"^cpu_max.period_us must be an int between 1000"):
        CpuMax(50_000, period)  # type: ignore[arg-type]


def test_cpu_max_must_be_a_cpumax() -> None:
    with pytest.raises(InvalidLimit) as info:
        Limits(cpu_max=(50_000, 100_000))  # type: ignore[arg-type]
    assert str(info.value).startswith(
        "cpu_max must be a CpuMax(quota_us, period_us), got (50000, 100000); e.g. CpuMax(50_000)"
    )


def test_invalid_limit_is_a_value_error_and_a_cgroup_error() -> None:
    with pytest.raises(ValueError):
        Limits(pids_max=-1)
    assert issubclass(InvalidLimit, CgroupError)


def test_boundaries_and_max_are_accepted() -> None:
    Limits(memory_max=0, memory_high="max", memory_swap_max=0, pids_max=0)
    Limits(cpu_weight=1, io_weight=10_000)
    CpuMax(1000, 1000)
    CpuMax(None, 1_000_000)


def test_files_gives_the_exact_text_for_each_set_field_in_order() -> None:
    limits = Limits(
        memory_max=512 * 1024**2,
        memory_high="max",
        memory_swap_max=0,
        pids_max=64,
        cpu_max=CpuMax(50_000),
        cpu_weight=200,
        io_weight=50,
    )
    assert limits.files() == [
        ("memory.max", "536870912"),
        ("memory.high", "max"),
        ("memory.swap.max", "0"),
        ("pids.max", "64"),
        ("cpu.max", "50000 100000"),
        ("cpu.weight", "200"),
        ("io.weight", "default 50"),
    ]
    assert limits.controllers() == {"memory", "pids", "cpu", "io"}
    assert limits.needed_by("memory") == ("memory_max", "memory_high", "memory_swap_max")
    assert not limits.is_empty()


def test_unset_fields_are_left_alone() -> None:
    assert Limits().is_empty()
    assert Limits().files() == []
    assert Limits().controllers() == frozenset()
    limits = Limits(cpu_max=CpuMax(None, 250_000))
    assert limits.files() == [("cpu.max", "max 250000")]
    assert limits.controllers() == {"cpu"}
    assert limits.needed_by("memory") == ()


def test_limits_are_frozen_values() -> None:
    limits = Limits(pids_max=5)
    with pytest.raises(AttributeError):
        limits.pids_max = 6  # type: ignore[misc]
    assert limits == Limits(pids_max=5)
    assert hash(limits) == hash(Limits(pids_max=5))
