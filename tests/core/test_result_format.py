"""The result format (docs/result.md): real records of every kind validate against
docs/result.schema.json, and the fields mean what the document says."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys

import jsonschema
import pytest
import trio
from sup_util import HANG

import cgroupfs
import supervisor
from supervisor import TaskSpec

SCHEMA = json.loads((pathlib.Path(__file__).parents[2] / "docs" / "result.schema.json")
                    .read_text())


def check(record: dict[str, object]) -> dict[str, object]:
    jsonschema.validate(record, SCHEMA)
    return record


async def test_records_of_every_kind_follow_the_schema(sup: supervisor.Supervisor) -> None:
    kinds = [
        await sup.run(["sh", "-c", "echo out; echo err >&2"]),
        await sup.run(["sh", "-c", "exit 3"]),
        await sup.run(["sh", "-c", "kill -USR1 $$"]),
        await sup.run(["sleep", "60"], time_limit="0.2s", grace="0.1s"),
        await sup.run(["sh", "-c", "trap '' TERM; sleep 60"], time_limit="0.2s", grace="0.1s"),
        await sup.run(["corral-no-such-command"]),
        await sup.run(["sh", "-c", "setsid sleep 600 & exit 0"], grace="0.2s"),
        await sup.run(["sh", "-c", "test -t 1 && echo on-a-terminal"], tty=True),
        await sup.run(["cat"], stdin=b"fed", name="with a name"),
    ]
    with trio.CancelScope() as scope:
        scope.cancel()
        await sup.run(["true"])
    kinds.append(next(reversed(sup.results.values())))
    for r in kinds:
        check(r.to_dict())
    outcomes = [r.outcome for r in kinds]
    assert outcomes == ["succeeded", "failed", "signaled", "timed_out", "timed_out",
                        "spawn_failed", "succeeded", "succeeded", "succeeded", "cancelled"]


async def test_the_fields_say_what_the_document_says(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "trap '' TERM; echo hi; sleep 60"], time_limit="0.2s",
                      grace="0.2s")
    d = check(r.to_dict())
    assert d["exit"] == {"code": None, "signal": 9, "signal_name": "SIGKILL"}
    stop = d["stop"]
    assert isinstance(stop, dict)
    assert stop["reason"] == "time_limit" and stop["reached"] == "killed"
    assert stop["signal_name"] == "SIGTERM" and stop["kill_because"] == "grace_expired"
    assert stop["landed"] is True
    assert 0.2 <= stop["requested_after_s"] <= stop["signalled_after_s"] <= stop["killed_after_s"]
    assert stop["killed_after_s"] - stop["signalled_after_s"] >= 0.2 - 0.01
    for key in ("created_at", "started_at", "ended_at"):
        value = d[key]
        assert isinstance(value, str) and value.endswith("Z")
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert d["output"]["stdout"]["head"] == "hi\n"  # type: ignore[index]
    usage = d["usage"]
    assert isinstance(usage, dict) and usage["wall_s"] >= 0.4 - 0.01
    # absent, never 0: no memory controller means null
    if "memory" not in sup.controllers:
        assert usage["memory_peak_bytes"] is None


async def test_text_that_is_not_utf8_becomes_replacement_characters(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "printf '\\377ok'; true"],
                      env={"NOT_UTF8": os.fsdecode(b"\xff")})
    d = check(r.to_dict())
    assert d["output"]["stdout"]["head"] == "\ufffdok"  # type: ignore[index]
    bad = os.fsdecode(b"arg-\xfe")  # a surrogate-escaped argument, as os.fsdecode gives it
    r = await sup.run(["echo", bad])
    d = check(r.to_dict())
    assert d["argv"] == ["echo", "arg-\ufffd"]
    json.dumps(d, ensure_ascii=False).encode("utf-8")  # strict UTF-8 all the way


def test_corral_run_writes_the_same_format_with_its_exit_status(
        test_cgroup: cgroupfs.Cgroup, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "r.json"
    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    p = subprocess.run([corral, "run", "--cgroup-root", test_cgroup.path, "-q",
                        "--json-file", str(out), "--time-limit", "0.2s", "--", "sleep", "60"],
                       capture_output=True, timeout=HANG)
    assert p.returncode == 124
    d = check(json.loads(out.read_text()))
    assert d["exit_status"] == 124 and d["outcome"] == "timed_out"
    assert d["exit"] == {"code": None, "signal": signal.SIGTERM, "signal_name": "SIGTERM"}


def test_the_example_in_the_document_follows_the_schema() -> None:
    text = (pathlib.Path(__file__).parents[2] / "docs" / "result.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    check(json.loads(example))


@pytest.mark.parametrize("spec", [TaskSpec(["true"]), TaskSpec(["true"], tty=True)])
async def test_stream_modes_are_documented(sup: supervisor.Supervisor, spec: TaskSpec) -> None:
    r = await sup.run(spec)
    modes = {r.output_stdout.mode, r.output_stderr.mode}
    assert modes <= {"capture", "inherit", "tty"}
