"""The queue: global and per-uid limits (429 naming the limit), round-robin between uids,
queued tasks that are stopped never start; SIGTERM drains with reason shutdown."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from daemon_util import RunningDaemon, User, as_user, post, raw, stop_reached, wait_for

from supervisor.client import ApiError, Client

Start = Callable[..., RunningDaemon]
GATE = "while [ ! -e {gate} ]; do sleep 0.02; done"


def test_per_uid_queue_limit_is_a_429_naming_it(start_daemon: Start) -> None:
    d = start_daemon("--max-running", "1", "--max-queued-per-uid", "2")
    with d.client() as c:
        ids = [c.submit(["sleep", "30"]).id for _ in range(3)]  # one runs, two wait
        wait_for(lambda: c.show(ids[0]).state == "running", "the first task to run")
        with pytest.raises(ApiError) as caught:
            c.submit(["true"])
        e = caught.value
        assert e.status == 429 and e.code == "queue_full"
        assert "max_queued_per_uid=2" in e.message
        quotas = c.limits()["quotas"]
        assert {k: quotas[k] for k in ("max_running", "max_queued", "running", "queued")} == {
            "max_running": 1, "max_queued": 2, "running": 1, "queued": 2}
        for i in ids:
            c.stop(i, force=True)


def test_a_stopped_queued_task_never_starts(start_daemon: Start, tmp_path: Any) -> None:
    d = start_daemon("--max-running", "1")
    marker = tmp_path / "ran"
    with d.client() as c:
        first = c.submit(["sleep", "30"])
        queued = c.submit(["touch", str(marker)])
        assert c.show(queued.id).queue_position == 0
        assert c.stop(queued.id) is True
        info = c.wait(queued.id)
        assert info.outcome == "cancelled"
        assert info.result is not None and info.result["started"] is False
        c.stop(first.id, force=True)
        c.wait(first.id)
        # the slot is free again, and the stopped task still never ran
        c.wait(c.submit(["true"]).id)
    assert not marker.exists()


def test_round_robin_between_uids(start_daemon: Start, users: list[User],
                                  tmp_path: Any) -> None:
    """uid A queues 6 tasks first, then uid B queues 2: with one slot, B's run second and
    fourth, not after all of A's."""
    d = start_daemon("--max-running", "1")
    gate = tmp_path / "gate"
    tmp_path.chmod(0o755)
    a, b = users[0], users[1]
    with d.client() as root:
        blocker = root.submit(["sh", "-c", GATE.format(gate=gate)])

        def submit(n: int) -> Callable[[], Any]:
            def go() -> Any:
                with Client(d.socket) as c:
                    return [c.submit(["true"]).id for _ in range(n)]
            return go

        a_ids = as_user(a, submit(6))
        b_ids = as_user(b, submit(2))
        gate.touch()
        for i in [*a_ids, *b_ids]:
            root.wait(i)
        order = sorted([*a_ids, *b_ids], key=lambda i: root.show(i).started_at or 0)
        root.wait(blocker.id)
    owner = {i: "A" for i in a_ids} | {i: "B" for i in b_ids}
    assert "".join(owner[i] for i in order) == "ABABAAAA"


def test_global_concurrency_limit(start_daemon: Start, tmp_path: Any) -> None:
    d = start_daemon("--max-running", "2", "--max-running-per-uid", "2")
    gate = tmp_path / "gate"
    with d.client() as c:
        ids = [c.submit(["sh", "-c", GATE.format(gate=gate)]).id for _ in range(5)]
        wait_for(lambda: sum(c.show(i).state == "running" for i in ids) == 2, "two running")
        assert [c.show(i).state for i in ids[2:]] == ["queued"] * 3
        gate.touch()
        assert {c.wait(i).outcome for i in ids} == {"succeeded"}


def test_sigterm_drains_and_a_second_kills(start_daemon: Start) -> None:
    d = start_daemon("--max-running", "1")
    with d.client() as c:
        stubborn = c.submit(["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.05; "
                                         "done"], grace="60s")
        queued = c.submit(["true"])
        wait_for(lambda: any(f.kind == "data" for f in c.output(stubborn.id)), "it to run")
    d.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: _state(d, stubborn.id) == "stopping" or "draining" in d.log_text(),
             "the drain to begin")
    with pytest.raises(ApiError) as caught, d.client() as c:
        c.submit(["true"])
    assert caught.value.status in (503,) or caught.value.code == "shutting_down"
    d.proc.send_signal(signal.SIGTERM)  # the grace is 60s: the second one kills now
    assert d.proc.wait(30) == 0
    rows = {r["seq"]: r for r in d.rows()}
    first = json.loads(rows[int(stubborn.id)]["result"])
    assert first["outcome"] == "cancelled" and first["stop"]["reason"] == "shutdown"
    assert stop_reached(first) == "killed"
    second = json.loads(rows[int(queued.id)]["result"])
    assert second["outcome"] == "cancelled" and second["started"] is False
    assert all(r["state"] == "finished" for r in rows.values())


def test_a_grace_of_a_year_never_holds_the_shutdown(start_daemon: Start) -> None:
    """A tenant's grace is its own business until the daemon stops: then --drain-timeout
    bounds it (a grace of 99 years on a task that ignores SIGTERM held the drain for good,
    and every other tenant's submissions got 503 meanwhile)."""
    d = start_daemon("--drain-timeout", "1s")
    with d.client() as c:
        stubborn = c.submit(["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.05; "
                                         "done"], grace="99y")
        wait_for(lambda: any(f.kind == "data" for f in c.output(stubborn.id)), "it to run")
    began = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert time.monotonic() - began < 20
    first = json.loads({r["seq"]: r for r in d.rows()}[int(stubborn.id)]["result"])
    assert first["outcome"] == "cancelled" and first["stop"]["reason"] == "shutdown"
    assert stop_reached(first) == "killed" and first["cleanup"]["state"] == "clean"
    assert "--drain-timeout" in d.log_text()


def test_a_submission_accepted_as_the_drain_begins_never_holds_it(start_daemon: Start) -> None:
    """A submission whose checks passed before SIGTERM and whose record was written after
    (a large body's spec is built in a worker thread meanwhile) was queued behind the drain,
    and nothing ever ended it: the daemon never exited (3 of 3; a second SIGTERM did not
    help).  Now it ends unstarted, as the queued ones do."""
    d = start_daemon("--max-running-per-uid", "1", "--drain-timeout", "2s",
                     "--max-queued-per-uid", "1000")
    # (a large body: its spec is built in a worker thread)
    heavy = post(json.dumps({"argv": ["true"], "env": {f"V{i}": "y" for i in range(30000)}})
                 .encode())
    with d.client() as c:
        stubborn = c.submit(["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.05; "
                                         "done"], grace="1s")
        wait_for(lambda: any(f.kind == "data" for f in c.output(stubborn.id)), "it to run")
    stop = threading.Event()
    accepted: list[str] = []

    def submit() -> None:
        while not stop.is_set():
            try:
                status, answer = raw(d, heavy)
            except (OSError, ValueError, IndexError):  # (refused, or closed unanswered)
                status = 0
            if status == 201:
                accepted.append(answer["id"])
            else:
                time.sleep(0.001)

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: len(accepted) >= 6, "submissions to flow")
    d.proc.send_signal(signal.SIGTERM)
    began = time.monotonic()
    try:
        status = d.proc.wait(60)
        took = time.monotonic() - began
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert status == 0, d.log_text()[-2000:]
    assert took < 20  # (the 2 s drain timeout, the kill, the records)
    rows = d.rows()
    assert {r["state"] for r in rows} == {"finished"}, [r for r in rows
                                                         if r["state"] != "finished"][:3]
    assert {r["outcome"] for r in rows if r["seq"] != int(stubborn.id)} <= {"cancelled",
                                                                             "succeeded"}


def _state(d: RunningDaemon, task_id: str) -> str | None:
    try:
        with d.client(timeout=5) as c:
            return c.show(task_id).state
    except (ApiError, ConnectionError):
        return None


def test_one_uid_holds_half_the_running_slots_by_default(start_daemon: Start,
                                                          tmp_path: Any) -> None:
    """The per-uid running limit defaults to half the global one: one tenant's sixteen
    sleeps used to take every slot, and another tenant waited for one of them to end."""
    d = start_daemon("--max-running", "4")
    gate = tmp_path / "gate"
    with d.client() as c:
        ids = [c.submit(["sh", "-c", GATE.format(gate=gate)]).id for _ in range(4)]
        wait_for(lambda: sum(c.show(i).state == "running" for i in ids) == 2, "two running")
        assert [c.show(i).state for i in ids[2:]] == ["queued"] * 2
        assert c.limits()["quotas"]["max_running"] == 2
        gate.touch()
        assert {c.wait(i).outcome for i in ids} == {"succeeded"}


def test_two_tenants_at_their_share_never_hold_the_slot_of_anothers_first_task(
        start_daemon: Start, users: list[User]) -> None:
    """Attack 29: two tenants each running eight long tasks (their share: half of sixteen)
    held every slot, and a third tenant's `true` was still queued after its 10 s wait.  The
    last free slots (a quarter by default) are kept for uids running nothing: the second
    tenant's ninth to twelfth tasks run, its last four wait, and the third's starts at once."""
    d = start_daemon()
    a, b, c = users[0], users[1], users[2]

    def sleeps() -> Any:
        with Client(d.socket) as cl:
            return [cl.submit(["sleep", "60"]).id for _ in range(8)]

    a_ids = as_user(a, sleeps)
    b_ids = as_user(b, sleeps)
    with d.client() as root:
        wait_for(lambda: sum(root.show(i).state == "running" for i in a_ids + b_ids) == 12,
                 "twelve of the sixteen running")
        assert [root.show(i).state for i in b_ids[4:]] == ["queued"] * 4
        assert root.limits()["daemon"]["first_task_slots"] == 4

        def first_task() -> Any:
            with Client(d.socket) as cl:
                done = cl.submit(["true"], wait=30)
                return done.outcome, done.state

        assert as_user(c, first_task) == ["succeeded", "finished"]
        mine = root.submit(["sleep", "60"])  # (root is a uid like any other: its first runs)
        wait_for(lambda: root.show(mine.id).state == "running", "root's first task to run")
        second = root.submit(["true"])  # (its second waits with the others' for a slot)
        assert root.show(second.id).state == "queued"
        for task_id in [*a_ids, *b_ids, mine.id, second.id]:
            root.stop(task_id, force=True)
        for task_id in [*a_ids, *b_ids, mine.id, second.id]:
            root.wait(task_id)


@pytest.mark.parametrize("kept", ["-1", "4"])
def test_first_task_slots_outside_the_slots_is_refused_naming_the_range(
        start_daemon: Start, kept: str) -> None:
    d = start_daemon("--max-running", "4", "--first-task-slots", kept, expect_exit=True)
    assert d.proc.returncode == 125
    assert (f"--first-task-slots must be from 0 to one less than --max-running (3), got "
            f"{kept}") in d.log_text()
