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
    assert reader["containment"]["cgroup"].endswith("/@tenant/reader")  # (its group's, kept)
    # what was asked of a task before the hand-over is in its record after it: the signal
    # sent, and the signal that asked for its stop (its exit status follows from that)
    stubborn = by_id["stubborn"]
    assert [(s["signal_name"], s["by"]) for s in stubborn["signals"]] == [("SIGUSR1",
                                                                         "the test")]
    assert stubborn["outcome"] == "cancelled" and stubborn["stop"]["reached"] == "killed"
    assert stubborn["stop"]["requested_by"] == "SIGTERM"
    assert not os.path.exists(tail["root"])  # the adopter removed the root at its end
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()


def test_a_handover_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        supervisor.HandOver.from_json('{"format": 99, "root": "/x", "tasks": []}', {"root": 0})


async def test_a_stop_exports_every_field_it_has_but_its_waker() -> None:
    import signal

    from supervisor._clock import HandOverClock
    from supervisor._result import StopReason
    from supervisor._stop import StopState

    stop = StopState(signal.SIGTERM)
    stop.request(StopReason.CANCEL, by_caller=True, by_signal=signal.SIGINT)
    stop.mark("signalled", main_alive=True)
    stop.request(StopReason.CANCEL, by_caller=True)
    stop.mark("killed", main_alive=True)
    clock = HandOverClock()
    again = StopState(signal.SIGTERM)
    again.restore(json.loads(json.dumps(stop.export(clock))), clock)
    fields = [f for f in StopState.__slots__ if f != "waker"]
    assert all(getattr(again, f) is not None for f in fields)
    assert [getattr(again, f) for f in fields] == pytest.approx(
        [getattr(stop, f) for f in fields])
