"""Every record the daemon can give, its own included, is a complete record of docs/result.md:
each validates against docs/result.schema.json, as served (``GET /v1/tasks/ID``) and as kept
in its row.  The daemon's own ends are covered: a task lost when its daemon was SIGKILLed, one
accepted before a restart and refused after it, and one whose result the daemon failed to keep
(a bug of ours, injected into a real daemon process by a ``sitecustomize`` module)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from daemon_util import RunningDaemon, wait_for

Start = Callable[..., RunningDaemon]

SCHEMA = json.loads((pathlib.Path(__file__).parents[2] / "docs" / "result.schema.json")
                    .read_text())


def valid(d: RunningDaemon, task_id: str) -> dict[str, Any]:
    """The task's served record and its row's, both checked against the schema; the served
    one."""
    with d.client() as c:
        served = c.wait(task_id).result
    assert served is not None, f"task {task_id} has no result"
    jsonschema.validate(served, SCHEMA)
    (row,) = [r for r in d.rows() if str(r["seq"]) == task_id]
    assert row["state"] == "finished" and row["outcome"] == served["outcome"]
    kept = json.loads(row["result"])
    # (the row keeps a stream's text in the output file: in_file says where)
    assert set(kept) == set(served), "the row and the served record name different fields"
    return served


def test_every_record_of_a_running_daemon_follows_the_schema(start_daemon: Start) -> None:
    d = start_daemon("--max-running-per-uid", "1")
    with d.client() as c:
        ids = {"succeeded": c.submit(["sh", "-c", "echo out; echo err >&2"]).id}
        for kind, argv, options in [
                ("failed", ["false"], {}),
                ("spawn_failed", ["corral-no-such-command"], {}),
                ("timed_out", ["sleep", "60"], {"time_limit": "0.3s", "grace": "0.1s"})]:
            c.wait(ids[next(reversed(ids))])  # (one at a time: the next queues otherwise)
            ids[kind] = c.submit(argv, **options).id
        c.wait(ids["timed_out"])
        running = c.submit(["sleep", "60"]).id
        queued = c.submit(["true"]).id
        wait_for(lambda: c.show(running).state == "running", "the task to run")
        c.stop(queued)
        c.stop(running)
    outcomes = {kind: valid(d, task_id)["outcome"] for kind, task_id in ids.items()}
    assert outcomes == {k: k for k in ids}
    stopped, cancelled = valid(d, running), valid(d, queued)
    assert stopped["outcome"] == "cancelled" and stopped["started_at"] is not None
    assert cancelled["outcome"] == "cancelled" and cancelled["started_at"] is None
    spawn = valid(d, ids["spawn_failed"])
    assert "corral-no-such-command" in json.dumps(spawn)


def test_the_records_of_a_restart_follow_the_schema(start_daemon: Start) -> None:
    """A task running when its daemon was SIGKILLed ends ``lost``; one queued then, whose
    LimitNOFILE the restarted daemon's own hard limit no longer allows, ends refused: both
    complete."""
    d = start_daemon("--max-running-per-uid", "1")
    with d.client() as c:
        running = c.submit(["sleep", "60"]).id
        queued = c.submit(["true"], properties={"LimitNOFILE": "4096"}).id
        wait_for(lambda: c.show(running).state == "running", "the task to run")
    d.kill()
    again = start_daemon("--max-running-per-uid", "1", like=d,
                         wrap=["prlimit", "--nofile=1024:1024", "--"])
    lost = valid(again, running)
    assert lost["outcome"] == "lost" and lost["id"] == running
    refused = valid(again, queued)
    assert refused["outcome"] == "cancelled" and refused["started_at"] is None
    assert "refused after it" in json.dumps(refused)


FAULT = '''
import supervisor.serve.dispatch as life
_kept = life.kept_result

def kept_result(result, *args, **kwargs):
    if "corral-test-keep-fails" in result.argv and str(result.outcome) != "lost":
        raise RuntimeError("corral-test: keeping this result fails")
    return _kept(result, *args, **kwargs)

life.kept_result = kept_result
'''


def test_a_result_the_daemon_fails_to_keep_ends_in_a_complete_record(
        start_daemon: Start, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAULT)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    d = start_daemon(env=dict(os.environ, PYTHONPATH=path))
    with d.client() as c:
        failing = c.submit(["echo", "corral-test-keep-fails"]).id
        fine = c.submit(["echo", "fine"]).id
    record = valid(d, failing)
    assert record["outcome"] == "lost" and record["id"] == failing
    assert "keeping this result fails" in json.dumps(record)
    assert valid(d, fine)["outcome"] == "succeeded"  # the daemon and its other tasks go on
    assert "keeping its result failed" in d.log_text()
    d.stop()
    d.killed = True  # (it logged the injected fault's traceback, as it should: checked above)
