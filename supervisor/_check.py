"""``corral check``: placeholder until the full report lands."""

from __future__ import annotations


def run_check(*, json_output: bool, cgroup_root: str | None) -> int:
    raise NotImplementedError
