"""A supervisor hands its running tasks to the next process, which carries them on: output
complete and in order, limits kept, stdin still writable, one record each, nothing left."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from sup_util import HANG

import cgroupfs
import supervisor

PROGRAM = pathlib.Path(__file__).parent / "programs" / "handover.py"


def test_tasks_handed_over_across_an_exec_keep_their_output_limits_and_records(
        test_cgroup: cgroupfs.Cgroup, tmp_path: pathlib.Path) -> None:
    p = subprocess.run([sys.executable, str(PROGRAM), "give", test_cgroup.path, str(tmp_path)],
                       capture_output=True, text=True, timeout=HANG)
    assert p.returncode == 0, p.stderr
    *records, tail = [json.loads(line) for line in p.stdout.splitlines()]
    by_id = {r["id"]: r for r in records}
    counter = by_id["counter"]
    assert counter["outcome"] == "succeeded" and counter["exit"]["code"] == 0
    log = (tmp_path / "counter.log").read_text().splitlines()
    assert log == [f"line-{i}" for i in range(150)]  # nothing lost across the hand-over
    assert counter["output"]["stdout"]["total_bytes"] == sum(len(x) + 1 for x in log)
    limited = by_id["limited"]
    assert limited["outcome"] == "timed_out" and limited["stop"]["reason"] == "time_limit"
    assert 1.5 <= limited["stop"]["requested_after_s"] < HANG
    reader = by_id["reader"]
    assert reader["outcome"] == "succeeded"
    assert reader["output"]["stdout"]["head"] == "got after-the-restart\n"
    assert not os.path.exists(tail["root"])  # the adopter removed the root at its end
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()


def test_a_handover_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        supervisor.HandOver.from_json('{"format": 99, "root": "/x", "tasks": []}', {"root": 0})
