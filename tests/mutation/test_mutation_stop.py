"""The stop state (supervisor/_stop.py), exactly: who asked, what each request changes, what
the record says; and ``signal_tree`` on a real subtree.

Written to judge mutants (tests/mutation/run_mutation.py): every rule of ``StopState.request``,
``mark`` and ``record`` is pinned here by value, not only through a task's outcome.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

import cgroupfs
from supervisor import StopReason
from supervisor._stop import StopState, signal_tree

TL, CANCEL, SHUTDOWN = StopReason.TIME_LIMIT, StopReason.CANCEL, StopReason.SHUTDOWN


async def test_a_new_stop_state_has_nothing_to_say() -> None:
    s = StopState(15)
    assert (s.reason, s.level, s.caller_requests, s.kill_because, s.landed) == \
        (None, "none", 0, None, False)
    assert (s.requested_at, s.signalled_at, s.killed_at, s.waker) == (None, None, None, None)
    assert not s.kill_now
    assert s.signal == 15
    assert s.result(0.0) is None


async def test_the_callers_first_request_is_graceful_and_fixes_the_reason() -> None:
    s = StopState(15)
    before = trio.current_time()
    assert s.request(CANCEL, by_caller=True) is True
    assert (s.reason, s.level, s.caller_requests, s.kill_because) == (CANCEL, "requested", 1,
                                                                      None)
    assert s.requested_at is not None and before <= s.requested_at <= trio.current_time()
    assert not s.kill_now


async def test_the_callers_second_request_kills_and_a_third_changes_nothing() -> None:
    s = StopState(15)
    s.request(CANCEL, by_caller=True)
    first_at = s.requested_at
    assert s.request(SHUTDOWN, by_caller=True) is True
    assert s.kill_now and s.kill_because == "second_request"
    assert s.reason == CANCEL and s.requested_at == first_at  # the first request's, kept
    assert s.request(CANCEL, by_caller=True) is False
    assert s.request(CANCEL, by_caller=True, force=True) is False
    assert s.kill_because == "second_request"


async def test_force_kills_at_once_whoever_asks() -> None:
    s = StopState(15)
    assert s.request(TL, by_caller=False, force=True) is True
    assert s.kill_because == "force" and s.reason == TL and s.caller_requests == 0
    c = StopState(15)
    assert c.request(CANCEL, by_caller=True, force=True) is True
    assert c.kill_because == "force"  # force wins over the count


async def test_the_supervisors_own_stop_never_escalates_nor_spends_the_callers_request() -> None:
    s = StopState(15)
    assert s.request(TL, by_caller=False) is True
    assert (s.reason, s.caller_requests, s.kill_because) == (TL, 0, None)
    assert s.request(SHUTDOWN, by_caller=False) is False  # nothing harder asked for
    assert s.request(CANCEL, by_caller=True) is True  # counted: it arms the next one
    assert (s.reason, s.caller_requests, s.kill_because) == (TL, 1, None)
    assert s.request(CANCEL, by_caller=True) is True
    assert s.kill_because == "second_request"


async def test_a_request_wakes_the_waiting_task_only_when_it_changed_something() -> None:
    s = StopState(15)
    with trio.CancelScope() as waker:
        s.waker = waker
        s.request(TL, by_caller=False)
    assert waker.cancel_called
    with trio.CancelScope() as second:
        s.waker = second
        assert s.request(SHUTDOWN, by_caller=False) is False
    assert not second.cancel_called
    s.waker = None
    assert s.request(CANCEL, by_caller=True) is True  # no waker: nothing to cancel, no error


async def test_after_the_end_no_request_changes_anything() -> None:
    s = StopState(15)
    s.finish()
    assert s.level == "gone"
    for by_caller, force in ((True, False), (False, False), (True, True)):
        assert s.request(CANCEL, by_caller=by_caller, force=force) is False
    assert s.reason is None and s.caller_requests == 0 and s.kill_because is None
    assert s.result(0.0) is None


async def test_mark_keeps_the_first_times_and_whether_the_stop_landed() -> None:
    s = StopState(15)
    s.request(CANCEL, by_caller=True)
    s.mark("signalled", main_alive=True)
    first = s.signalled_at
    assert s.level == "signalled" and s.landed and first is not None
    assert s.killed_at is None and s.kill_because is None
    await trio.sleep(0.01)
    s.mark("signalled", main_alive=False)
    assert s.signalled_at == first and s.landed  # once landed, always landed
    s.mark("killed", main_alive=False)
    assert s.level == "killed" and s.killed_at is not None and s.killed_at > first
    assert s.kill_because == "grace_expired"
    killed = s.killed_at
    s.mark("killed", main_alive=True)
    assert s.killed_at == killed


async def test_mark_does_not_overwrite_why_a_kill_came_and_a_stop_after_the_exit_did_not_land(
        ) -> None:
    s = StopState(9)
    s.request(CANCEL, by_caller=True, force=True)
    s.mark("killed", main_alive=False)
    assert s.kill_because == "force" and not s.landed and s.signalled_at is None


async def test_the_record_gives_times_after_the_spawn_and_how_far_it_went() -> None:
    s = StopState(2)
    t0 = trio.current_time()
    s.request(TL, by_caller=False)
    r = s.result(t0)
    assert r is not None
    assert (r.reason, r.reached, r.signal, r.kill_because, r.landed) == (TL, "requested", 2,
                                                                         None, False)
    assert r.requested_after_s is not None and 0 <= r.requested_after_s < 1
    assert (r.signalled_after_s, r.killed_after_s) == (None, None)

    s.signalled_at = t0 + 1.2345678
    s.landed = True
    r = s.result(t0)
    assert r is not None and r.reached == "signalled" and r.signalled_after_s == 1.234568
    assert r.kill_because is None and r.landed  # no kill yet: no reason for one

    s.killed_at, s.kill_because = t0 + 2.5, "grace_expired"
    r = s.result(t0)
    assert r is not None and r.reached == "killed" and r.killed_after_s == 2.5
    assert r.kill_because == "grace_expired"

    # a request made before the spawn (queued) counts from the spawn: 0, never negative
    late = s.result(t0 + 100)
    assert late is not None and late.requested_after_s == 0.0
    # never started: no times at all
    unstarted = s.result(None)
    assert unstarted is not None and unstarted.requested_after_s is None
    assert unstarted.signalled_after_s is None and unstarted.killed_after_s is None


async def test_a_caller_request_without_a_reason_yet_records_the_callers_reason() -> None:
    s = StopState(15)
    s.request(SHUTDOWN, by_caller=True)
    r = s.result(trio.current_time())
    assert r is not None and r.reason == SHUTDOWN


# ---- signal_tree, on real processes --------------------------------------------------------


def spawn_in(cg: cgroupfs.Cgroup, argv: list[str]) -> subprocess.Popen[bytes]:
    """``argv`` started inside ``cg`` (it waits on a pipe until it has been moved)."""
    p = subprocess.Popen(["sh", "-c", 'read -r _; exec "$@"', "gate", *argv],
                         stdin=subprocess.PIPE)
    cg.add_proc(p.pid)
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    return p


def wait_listed(cg: cgroupfs.Cgroup, n: int) -> list[int]:
    deadline = time.monotonic() + 30
    while True:
        pids = [pid for listed in cg.procs_tree().values() for pid in listed]
        if len(pids) >= n:
            return pids
        assert time.monotonic() < deadline, f"only {pids} listed"
        time.sleep(0.01)


def proc_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/{name}") as f:
        text = f.read()
    return text.rsplit(")", 1)[1].split()[0] if name == "stat" else text.strip()


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_signal_tree_reaches_every_process_of_the_subtree_and_names_them(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("leaf")
    inner = leaf.make_child("inner")
    main = spawn_in(leaf, ["sleep", "60"])
    other = spawn_in(inner, ["sleep", "60"])
    try:
        pids = wait_listed(leaf, 2)
        for p in (main, other):
            wait_for(lambda p=p: proc_field(p.pid, "comm") == "sleep", "exec of sleep")
        found = signal_tree(leaf, (signal.SIGTERM,), main.pid)
        assert found.main_listed
        assert sorted(p.pid for p in found.processes) == sorted(pids)
        assert {p.comm for p in found.processes} == {"sleep"}
        assert main.wait(10) == -signal.SIGTERM and other.wait(10) == -signal.SIGTERM
        assert not signal_tree(leaf, (signal.SIGTERM,), main.pid).main_listed
        assert signal_tree(leaf, (signal.SIGTERM,)).processes == []
    finally:
        for p in (main, other):
            p.kill()
            p.wait()
        inner.remove()
        leaf.remove()


def test_signal_tree_sends_each_signal_in_order_and_remembers_only_new_pids(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("leaf")
    # stopped first, then the TERM that only a continued process acts on
    p = spawn_in(leaf, ["sh", "-c", "kill -STOP $$; sleep 60"])
    try:
        wait_listed(leaf, 1)
        wait_for(lambda: proc_field(p.pid, "stat") == "T", "the task stopped itself")
        existing = os.pidfd_open(p.pid)
        keep = {p.pid: existing}
        fds = len(os.listdir("/proc/self/fd"))
        signal_tree(leaf, (signal.SIGTERM, signal.SIGCONT), p.pid, keep)
        assert keep == {p.pid: existing}  # what it knew of that pid is left alone
        assert len(os.listdir("/proc/self/fd")) == fds
        assert p.wait(10) == -signal.SIGTERM
        os.close(existing)
    finally:
        p.kill()
        p.wait()
        leaf.remove()


def test_signal_tree_works_through_more_processes_than_it_holds_pidfds_at_once(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("leaf")
    n = 300  # more than two chunks of 128
    p = spawn_in(leaf, ["sh", "-c", f"i=0; while [ $i -lt {n} ]; do sleep 60 & i=$((i+1)); "
                                    f"done; wait"])
    try:
        pids = wait_listed(leaf, n + 1)
        fds = len(os.listdir("/proc/self/fd"))
        keep: dict[int, int] = {}
        found = signal_tree(leaf, (signal.SIGKILL,), p.pid, keep)
        assert sorted(x.pid for x in found.processes) == sorted(pids)
        assert found.main_listed
        assert sorted(keep) == sorted(pids)  # each remembered by its start time, no fd
        assert all(isinstance(start, int) and start > 0 for start in keep.values())
        assert len(os.listdir("/proc/self/fd")) == fds
        assert leaf.wait_unpopulated(30)
    finally:
        p.kill()
        p.wait()
        leaf.remove()


def test_signal_tree_of_a_removed_cgroup_finds_nothing(test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("leaf")
    os.rmdir(leaf.path)
    found = signal_tree(leaf, (signal.SIGTERM,), 1)
    assert found.processes == [] and not found.main_listed
    leaf.close()


def test_signal_tree_leaves_out_what_it_is_told_to_skip_and_our_own_process(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("leaf")
    a = spawn_in(leaf, ["sleep", "60"])
    b = spawn_in(leaf, ["sleep", "60"])
    home = cgroupfs.own_cgroup()  # our cgroup's directory, to come back to
    try:
        wait_listed(leaf, 2)
        leaf.add_proc(os.getpid())  # as a task that can write the tree could do to us
        try:
            found = signal_tree(leaf, (signal.SIGTERM,), a.pid, skip={a.pid})
        finally:
            with cgroupfs.Cgroup.open(home) as back:
                back.add_proc(os.getpid())
        assert [p.pid for p in found.processes] == [b.pid]
        assert not found.main_listed  # skipped: not listed
        assert b.wait(10) == -signal.SIGTERM
        assert a.poll() is None
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        leaf.remove()


class Relisting:
    """A cgroup whose second listing differs from its first: what a process that dies (and is
    reaped) between signal_tree's two listings looks like, made to happen every time."""

    def __init__(self, first: list[int], second: list[int],
                 meanwhile: object = None) -> None:
        self.listings = [{".": first}, {".": second}]
        self.meanwhile = meanwhile

    def procs_tree(self) -> dict[str, list[int]]:
        if len(self.listings) == 1 and self.meanwhile is not None:
            self.meanwhile()  # type: ignore[operator]
        return self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]


def test_a_process_gone_between_the_listings_does_not_stop_the_pass() -> None:
    a = subprocess.Popen(["sleep", "60"])
    b = subprocess.Popen(["sleep", "60"])
    try:
        found = signal_tree(Relisting([a.pid, b.pid], [b.pid]),  # type: ignore[arg-type]
                            (signal.SIGTERM,))
        assert [p.pid for p in found.processes] == [b.pid]
        assert b.wait(10) == -signal.SIGTERM and a.poll() is None
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_a_process_that_dies_after_its_pidfd_was_opened_does_not_stop_the_pass() -> None:
    a = subprocess.Popen(["sleep", "60"])
    b = subprocess.Popen(["sleep", "60"])

    def reap_a() -> None:  # between the pidfds' opening and the sends
        a.kill()
        a.wait()

    try:
        keep: dict[int, int] = {a.pid: 1, b.pid: 1}  # known already: no start time read
        found = signal_tree(Relisting([a.pid, b.pid], [a.pid, b.pid], reap_a),  # type: ignore[arg-type]
                            (signal.SIGTERM, signal.SIGCONT), keep=keep)
        assert b.wait(10) == -signal.SIGTERM
        assert b.pid in [p.pid for p in found.processes]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_out_of_fds_a_process_is_signalled_by_pid_checked_by_its_start_time(
        test_cgroup: cgroupfs.Cgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import supervisor._stop as stop_module

    leaf = test_cgroup.make_child("leaf")
    a = spawn_in(leaf, ["sleep", "60"])
    b = spawn_in(leaf, ["sleep", "60"])
    try:
        wait_listed(leaf, 2)

        def no_fds(pid: int) -> int:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(stop_module.os, "pidfd_open", no_fds)  # type: ignore[attr-defined]
        keep: dict[int, int] = {}
        found = signal_tree(leaf, (signal.SIGTERM,), a.pid, keep)
        monkeypatch.undo()
        assert sorted(p.pid for p in found.processes) == sorted([a.pid, b.pid])
        assert found.main_listed
        assert a.wait(10) == -signal.SIGTERM and b.wait(10) == -signal.SIGTERM
        assert set(keep) == {a.pid, b.pid} and all(v > 0 for v in keep.values())
    finally:
        monkeypatch.undo()
        for p in (a, b):
            p.kill()
            p.wait()
        leaf.remove()


# ---- third round (issue 12): out of fds for real, a pidfd at fd 0, a gone pid first ------


def alone(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child, the only thread there: no other thread of the test process
    (a trio worker, a guard left by an earlier test) may open or close an fd while ``fn``
    counts them.  Its JSON-able return value, or its exception re-raised as an
    AssertionError."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = {"ok": fn()}
            except BaseException as e:
                out = {"error": f"{type(e).__name__}: {e}"}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    answer = json.loads(data or b'{"error": "the child said nothing"}')
    if "error" in answer:
        raise AssertionError(answer["error"])
    return answer["ok"]


@contextlib.contextmanager
def only_free_fds(k: int) -> Iterator[None]:
    """RLIMIT_NOFILE lowered so that exactly ``k`` more fds can be opened (the kernel's own
    EMFILE, not a stand-in), then put back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue  # (the listing's own fd, closed by now)
        used.add(int(name))
    limit, free = 0, 0
    while free < k:
        free += limit not in used
        limit += 1
    while limit in used:
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# (2: what the listing itself needs; a pass then holds one pidfd, then none: by pid)
@pytest.mark.parametrize(("free", "remember"), [(2, False), (2, True), (3, True), (4, False),
                                                (6, True), (9, False), (12, True), (20, False),
                                                (40, True)])
def test_a_pass_with_few_fds_left_signals_every_process_once(
        test_cgroup: cgroupfs.Cgroup, free: int, remember: bool) -> None:
    # The pidfds of a chunk can take the last fds the pass needs for its second listing (and
    # its /proc reads): the pass gives some back, signals what it holds, goes on; with one
    # left it signals that one by pid.  Every process is reached, once, and no fd stays open.
    leaf = test_cgroup.make_child("leaf")
    n = 30
    p = spawn_in(leaf, ["sh", "-c", f"i=0; while [ $i -lt {n} ]; do sleep 60 & i=$((i+1)); "
                                    f"done; wait"])
    try:
        pids = wait_listed(leaf, n + 1)

        def pass_with_few_fds() -> Any:
            fds = len(os.listdir("/proc/self/fd"))
            keep: dict[int, int] | None = {} if remember else None
            with only_free_fds(free):
                found = signal_tree(leaf, (signal.SIGKILL,), p.pid, keep)
            return {"fds": [fds, len(os.listdir("/proc/self/fd"))], "main": found.main_listed,
                    "signalled": [x.pid for x in found.processes],
                    "keep": None if keep is None else list(keep.items())}

        out = alone(pass_with_few_fds)
        assert out["fds"][0] == out["fds"][1]
        assert sorted(out["signalled"]) == sorted(pids)  # each once
        assert out["main"]
        if remember:
            assert sorted(k for k, _ in out["keep"]) == sorted(pids)
            assert all(v > 0 for _, v in out["keep"])
        assert leaf.wait_unpopulated(30)
    finally:
        p.kill()
        p.wait()
        leaf.remove()


def test_with_no_fd_left_at_all_the_pass_fails_and_leaks_nothing(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("leaf")
    p = spawn_in(leaf, ["sleep", "60"])
    try:
        wait_listed(leaf, 1)

        def pass_with_no_fd() -> Any:
            fds = len(os.listdir("/proc/self/fd"))
            try:
                with only_free_fds(0):
                    signal_tree(leaf, (signal.SIGTERM,), p.pid)
            except OSError as e:
                return [e.errno, fds, len(os.listdir("/proc/self/fd"))]
            return None

        out = alone(pass_with_no_fd)
        assert out is not None and out[0] == errno.EMFILE
        assert out[1] == out[2]
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
        leaf.remove()


def test_a_pidfd_that_is_fd_0_is_used_and_closed(test_cgroup: cgroupfs.Cgroup) -> None:
    # (a supervisor started with its stdin closed: the first fd it opens is 0)
    leaf = test_cgroup.make_child("leaf")
    p = spawn_in(leaf, ["sleep", "60"])
    saved = os.dup(0)
    try:
        wait_listed(leaf, 1)
        os.close(0)
        try:
            found = signal_tree(leaf, (signal.SIGTERM,), p.pid, {p.pid: 1})
            with pytest.raises(OSError):
                os.fstat(0)  # closed again
        finally:
            os.dup2(saved, 0)
        assert [x.pid for x in found.processes] == [p.pid]
        assert p.wait(10) == -signal.SIGTERM
    finally:
        os.close(saved)
        p.kill()
        p.wait()
        leaf.remove()


def test_a_gone_pid_ahead_of_the_others_does_not_end_the_chunk() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process now
    b = subprocess.Popen(["sleep", "60"])
    try:
        found = signal_tree(Relisting([dead.pid, b.pid], [b.pid]),  # type: ignore[arg-type]
                            (signal.SIGTERM,))
        assert [p.pid for p in found.processes] == [b.pid]
        assert b.wait(10) == -signal.SIGTERM
    finally:
        b.kill()
        b.wait()


async def test_a_kill_made_due_but_not_yet_sent_is_not_in_the_record() -> None:
    s = StopState(15)
    t0 = trio.current_time()
    s.request(CANCEL, by_caller=True, force=True)
    r = s.result(t0)
    assert r is not None and r.reached == "requested" and r.kill_because is None
    s.mark("killed", main_alive=True)
    r = s.result(t0)
    assert r is not None and r.reached == "killed" and r.kill_because == "force"
