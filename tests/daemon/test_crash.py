"""A daemon SIGKILLed at random moments keeps its word: exactly one final record per accepted
task, nothing of an earlier run left running, queued tasks run once.

``test_sigkill_at_random_moments`` runs 10 rounds in the default run; ``pytest -m crash
tests/daemon/test_crash.py`` runs the full 100 (``CORRAL_CRASH_ROUNDS=N`` for another count).
Each round: a daemon on the same state directory (``--max-running 2``, so tasks queue),
submissions (with idempotency keys) of short and longer tasks from a thread, and a SIGKILL at a
random moment while they are queued, starting, running and finishing.  After each restart
(once it answers, its start-up recovery is done):

- every task the client saw accepted (201, or found again by its idempotency key) has
  exactly one row; no row of an earlier run is left "starting" or "running";
- no cgroup of an earlier run is left below the test's cgroup, and no process of one runs
  (each task's processes carry the run's tag in their command line);
- at the end, every accepted task has a final record; each ran at most once (each task
  appends its id to a file when it starts); every one that succeeded ran exactly once, and
  the rest are ``lost`` (a crash hit them starting or running: those that were still queued
  at a crash were started after it, and never twice).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_util import RunningDaemon, read_rows, wait_for

from supervisor.client import ApiError, Client, DaemonUnavailable

Start = Callable[..., RunningDaemon]

FULL_ROUNDS = int(os.environ.get("CORRAL_CRASH_ROUNDS", "100"))


def _task_argv(ran: Path, tag: str, n: int, secs: float) -> list[str]:
    # the tag is in sh's command line, and sleep's duration is unique to the task
    return ["sh", "-c", f'echo "$1" >> {ran}; sleep "$2"', f"{tag}-{n}", str(n),
            f"{secs:.2f}{n:06d}"]


def _live_tagged(tag: str) -> list[str]:
    """Command lines of live processes that carry ``tag`` (tasks of this test)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in cmd and "pytest" not in cmd:
            found.append(f"{pid}: {cmd}")
    return found


class Round:
    """One daemon's life: submissions from a thread until the SIGKILL."""

    def __init__(self, d: RunningDaemon, rng: random.Random, ran: Path, tag: str,
                 first: int) -> None:
        self.d, self.rng, self.ran, self.tag = d, rng, ran, tag
        self.n = first
        self.accepted: dict[int, str] = {}  # our number -> task id
        self.unanswered: list[int] = []  # submitted, no answer: maybe accepted
        self.argv: dict[int, list[str]] = {}
        self.stop = threading.Event()

    def submit_loop(self) -> None:
        """Bursts of 1 to 3 submissions, short and longer tasks, until the daemon is gone."""
        try:
            with Client(self.d.socket, timeout=10) as c:
                while not self.stop.is_set():
                    for _ in range(self.rng.randint(1, 3)):
                        if not self._submit(c):
                            return
                    time.sleep(self.rng.uniform(0, 0.3))
        except OSError:
            return

    def _submit(self, c: Client) -> bool:
        self.n += 1
        secs = self.rng.choice([0.0, 0.05, 0.2, 0.5, 1.0])
        argv = self.argv[self.n] = _task_argv(self.ran, self.tag, self.n, secs)
        try:
            t = c.submit(argv, idempotency_key=f"k{self.n}")
        except (DaemonUnavailable, ApiError, OSError):
            self.unanswered.append(self.n)
            return False
        self.accepted[self.n] = t.id
        return True


def _recover_keys(d: RunningDaemon, rnd: Round, accepted: dict[int, str]) -> None:
    """Submissions whose answer the crash cut off: asked again with their key, they get the
    task back if it was accepted (and make it now if it was not, as a client's retry
    would); either way exactly one task."""
    with d.client(timeout=30) as c:
        for n in rnd.unanswered:
            t = c.submit(rnd.argv[n], idempotency_key=f"k{n}")
            accepted[n] = t.id


def _check_after_restart(d: RunningDaemon, accepted: dict[int, str], tags: list[str],
                         test_cgroup: str) -> None:
    rows = read_rows(d.state)
    by_id = Counter(r["seq"] for r in rows)
    missing = [i for i in accepted.values() if by_id[int(i)] != 1]
    assert not missing, f"accepted tasks without exactly one row: {missing}"
    runs = read_rows(d.state, "runs")
    current = runs[-1]["id"]
    stale = [r["seq"] for r in rows if r["state"] in ("starting", "running") and
             r["run"] != current]
    assert not stale, f"rows of earlier runs still starting or running: {stale}"
    ours = f"corral-{d.proc.pid}-"
    roots = [n for n in os.listdir(test_cgroup) if n.startswith("corral-")]
    assert all(n.startswith(ours) for n in roots), f"roots of earlier runs left: {roots}"
    for tag in tags[:-1]:
        assert not _live_tagged(tag), f"processes of an earlier run: {_live_tagged(tag)}"


def _check_final(d: RunningDaemon, accepted: dict[int, str], once: set[str],
                 ran: Path) -> dict[str, int]:
    with d.client(timeout=60) as c:
        for task_id in accepted.values():
            c.wait(task_id)
    rows = {str(r["seq"]): r for r in read_rows(d.state)}
    assert all(rows[i]["state"] == "finished" for i in accepted.values())
    started = Counter(ran.read_text().split()) if ran.exists() else Counter()
    twice = {n: k for n, k in started.items() if k > 1}
    assert not twice, f"tasks that ran more than once: {twice}"
    number = {task_id: str(n) for n, task_id in accepted.items()}
    for task_id in accepted.values():
        row = rows[task_id]
        if row["outcome"] == "succeeded":
            assert started[number[task_id]] == 1, f"task {task_id} succeeded without running"
        elif task_id in once:  # queued at a crash: it ran later, unless a later crash hit it
            assert row["outcome"] == "lost", f"queued task {task_id}: {row['outcome']}"
        else:
            assert row["outcome"] == "lost", f"task {task_id}: {row['outcome']}"
    return Counter(r["outcome"] for r in rows.values())


def _crash_rounds(start_daemon: Start, test_cgroup: Any, tmp_path: Path, rounds: int,
                  seed: int) -> None:
    rng = random.Random(seed)
    ran = tmp_path / "ran"
    accepted: dict[int, str] = {}
    once: set[str] = set()  # ids seen queued right after a crash
    tags: list[str] = []
    kills_with: Counter[str] = Counter()  # kills that found tasks queued, starting...
    d = start_daemon("--max-running", "2", "--log-level", "warning")
    n = 0
    started = time.monotonic()
    for k in range(rounds):
        tags.append(f"corral-crash-{seed}-{k}-")
        rnd = Round(d, rng, ran, tags[-1], n)
        thread = threading.Thread(target=rnd.submit_loop, daemon=True)
        thread.start()
        time.sleep(rng.uniform(0.05, 1.5))
        d.kill()  # SIGKILL, at a random moment
        rnd.stop.set()
        thread.join(30)
        n = rnd.n
        accepted.update(rnd.accepted)
        rows = read_rows(d.state)
        kills_with.update({r["state"] for r in rows if r["state"] != "finished"})
        kills_with["mid-submission"] += bool(rnd.unanswered)
        once |= {str(r["seq"]) for r in rows if r["state"] == "queued"}
        d = start_daemon("--max-running", "2", "--log-level", "warning", like=d)
        _recover_keys(d, rnd, accepted)
        _check_after_restart(d, accepted, tags, test_cgroup.path)
    outcomes = _check_final(d, accepted, once, ran)
    print(f"\ncrash figures: {rounds} SIGKILLs in {time.monotonic() - started:.0f}s, "
          f"{len(accepted)} tasks accepted, {len(accepted)} final records (one each), "
          f"0 survivors; kills that found tasks {dict(kills_with)}; "
          f"outcomes {dict(outcomes)}; none ran twice ({len(once)} were queued at a crash "
          f"and started after it)")


def test_sigkill_at_random_moments(start_daemon: Start, test_cgroup: Any,
                                   tmp_path: Path) -> None:
    _crash_rounds(start_daemon, test_cgroup, tmp_path, 10, seed=11)


@pytest.mark.crash
def test_sigkill_at_random_moments_full(start_daemon: Start, test_cgroup: Any,
                                        tmp_path: Path) -> None:
    _crash_rounds(start_daemon, test_cgroup, tmp_path, FULL_ROUNDS, seed=1100)


def test_a_sigkilled_daemons_tasks_die_at_once_and_are_recorded_lost(
        start_daemon: Start, test_cgroup: Any) -> None:
    d = start_daemon()
    tag = f"corral-crash-escapee-{os.getpid()}"
    with d.client() as c:
        ids = [c.submit(["sh", "-c", f"setsid sleep 600 & exec sleep 601 # {tag}"]).id
               for _ in range(3)]
        wait_for(lambda: all(c.show(i).state == "running" for i in ids), "tasks to run")
        # the "running" row is written lazily (within 0.25 s): before it, a crash leaves
        # "starting", and the record then says it is not known whether the task had started
        wait_for(lambda: all(r["state"] == "running" for r in d.rows()), "running rows")
        old_root = next(r for r in os.listdir(test_cgroup.path) if r.startswith("corral-"))
    killed = time.monotonic()
    d.kill()
    wait_for(lambda: not os.path.exists(os.path.join(test_cgroup.path, old_root)),
             "the keeper to remove the old root", timeout=5)
    took = time.monotonic() - killed
    d2 = start_daemon(like=d)
    with d2.client() as c:
        for i in ids:
            t = c.show(i)
            assert t.state == "finished" and t.outcome == "lost" and t.exit_status == 125
            r = t.result
            assert r is not None and r["started"] is True and r["cleanup"]["state"] == "clean"
            assert "died while this task ran" in r["error"]["message"]
            assert r["error"]["step"] == "daemon"
    print(f"\nSIGKILLed daemon: its root was gone {took * 1000:.0f} ms later")


def test_a_lost_tasks_record_says_what_its_output_files_hold(start_daemon: Start) -> None:
    """Found by an independent attack: a task whose daemon died was recorded ``lost`` with 0
    bytes of stdout, while its output said ``vstart``: the daemon had died with the bytes it
    kept in memory.  The record is made from the task's output files now (head, tail and
    total as they hold them), for both streams; and it says its end is when the next start
    recorded it."""
    d = start_daemon()
    with d.client() as c:
        t = c.submit(["sh", "-c", "echo vstart; seq 1 20000 >&2; sleep 600"])
        wait_for(lambda: any(b"vstart" in f.data for f in c.output(t.id)), "its output")
        wait_for(lambda: b"\n20000\n" in b"".join(
            f.data for f in c.output(t.id, stream="stderr", tail=16)), "its errors in its file")
        wait_for(lambda: c.show(t.id).state == "running", "it to run")
    d.kill()
    d2 = start_daemon(like=d)
    with d2.client() as c:
        shown = c.show(t.id)
        r = shown.result
        assert shown.outcome == "lost" and r is not None
        served = b"".join(f.data for f in c.output(t.id) if f.kind == "data")
        errors = b"".join(f.data for f in c.output(t.id, stream="stderr") if f.kind == "data")
    out, err = r["output"]["stdout"], r["output"]["stderr"]
    assert served == b"vstart\n" and out["total_bytes"] == len(served), out
    expected = b"".join(b"%d\n" % i for i in range(1, 20001))
    assert errors == expected and err["total_bytes"] == len(expected), err
    assert "when this start recorded it" in r["error"]["message"]


def test_a_task_caught_starting_is_never_started_again(start_daemon: Start,
                                                        tmp_path: Path) -> None:
    """A crash between the durable "starting" row and the spawn (made here by hand: the row
    as that crash leaves it) is recorded lost, and the task is not run."""
    d = start_daemon("--max-running", "1")
    with d.client() as c:
        blocker = c.submit(["sleep", "600"])
        wait_for(lambda: c.show(blocker.id).state == "running", "the first task to run")
        t = c.submit(["sh", "-c", f"touch {tmp_path}/ran"], idempotency_key="once")
    d.kill()
    import sqlite3

    db = sqlite3.connect(f"{d.state}/state.db")
    with db:
        run = db.execute("SELECT max(id) FROM runs").fetchone()[0]
        db.execute("UPDATE tasks SET state = 'starting', run = ? WHERE seq = ?", (run, t.id))
    db.close()
    d2 = start_daemon(like=d)
    with d2.client() as c:
        shown = c.show(t.id)
        assert shown.outcome == "lost" and shown.result is not None
        assert shown.result["started"] is False
        assert "not started again" in shown.result["error"]["message"]
        again = c.submit(["sh", "-c", f"touch {tmp_path}/ran"], idempotency_key="once")
        assert again.id == t.id and again.state == "finished"
    time.sleep(0.5)
    assert not (tmp_path / "ran").exists()


def test_followers_reconnect_across_a_crash_and_get_the_final_record(
        start_daemon: Start) -> None:
    """``Client.follow``, ``AsyncClient.follow`` and ``corral logs -f`` keep every byte they
    read before the crash, reconnect to the next daemon, and end with the lost record."""
    import trio

    from supervisor.client import AsyncClient

    d = start_daemon()
    with d.client() as c:
        t = c.submit(["sh", "-c", "echo first; sleep 600"])
        wait_for(lambda: c.show(t.id).state == "running", "the task to run")
    got: dict[str, Any] = {}

    def sync_follow() -> None:
        with Client(d.socket, timeout=60) as c:
            got["sync"] = list(c.follow(t.id))

    async def async_follow() -> None:
        async with AsyncClient(d.socket) as c:
            got["async"] = [f async for f in c.follow(t.id)]

    logs = d.corral  # (run below, in a thread: it blocks until the end frame)
    threads = [threading.Thread(target=sync_follow),
               threading.Thread(target=lambda: trio.run(async_follow)),
               threading.Thread(target=lambda: got.__setitem__("cli", logs("logs", "-f",
                                                                           t.id)))]
    for th in threads:
        th.start()
    wait_for(lambda: d.rows()[0]["state"] == "running", "the running row")
    time.sleep(0.5)  # the followers have read "first"
    d.kill()
    time.sleep(0.5)
    start_daemon(like=d)
    for th in threads:
        th.join(60)
    for kind in ("sync", "async"):
        frames = got[kind]
        assert [f.data for f in frames if f.kind == "data"] == [b"first\n"], frames
        assert frames[-1].kind == "end" and frames[-1].result["outcome"] == "lost"
    cli = got["cli"]
    assert cli.stdout == b"first\n" and cli.returncode == 125, cli


def test_a_queued_request_this_corral_cannot_read_is_ended_and_the_start_goes_on(
        start_daemon: Start) -> None:
    """A queued session command whose recorded request said a directory past what a request
    may (a command's forged report carried it, before that was bounded) made every start of
    the daemon fail on it, for every tenant.  One row never stops a start: it is ended,
    unstarted, saying why, and the rest of the queue runs."""
    d = start_daemon("--max-running", "1")
    with d.client() as c:
        sid = c.open_session(cwd="/tmp")["id"]
        blocker = c.submit(["sleep", "600"])
        wait_for(lambda: c.show(blocker.id).state == "running", "the first task to run")
        bad = c.exec(sid, "true", background=True)["id"]
        good = c.submit(["true"]).id
    d.kill()
    import sqlite3

    db = sqlite3.connect(f"{d.state}/state.db")
    with db:  # (the row as the unbounded carry left it)
        spec = json.loads(db.execute("SELECT spec FROM requests WHERE seq = ?",
                                     (bad,)).fetchone()[0])
        spec["cwd"] = "/" + "a" * 5000
        db.execute("UPDATE requests SET spec = ? WHERE seq = ?", (json.dumps(spec), bad))
    db.close()
    d2 = start_daemon(like=d)
    with d2.client() as c:
        shown = c.wait(bad, timeout=30)
        assert shown.outcome == "cancelled" and shown.result is not None
        assert shown.result["started"] is False
        note = " ".join(shown.result["notes"])
        assert "refused after it" in note and "cwd must be at most 4096" in note
        assert c.wait(good, timeout=30).outcome == "succeeded"
        assert c.exec(sid, "pwd", wait="20s")["outcome"] == "succeeded"
