"""Containment faults: escapees, emptiness seen through inotify, pipes held outside the leaf."""

from __future__ import annotations

import os
import pathlib
import socket
import sys

import pytest
import trio
from sup_util import HANG, alive, wait_for

import cgroupfs
import supervisor
from supervisor._capture import SUBSCRIBER_BUFFER
from supervisor._spawn import spawn
from supervisor._watch import CgroupWatcher

ESCAPING_TREE = (
    # a child that forks, a setsid'd grandchild, and a double-forked orphan
    "sleep 600 & "
    "setsid sh -c 'sleep 600 & sleep 600' & "
    "sh -c 'sh -c \"sleep 600\" &' & "
    "echo started; wait"
)


async def test_one_kill_ends_an_escaping_tree_and_inotify_sees_it_empty(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("tree")
    r, w = os.pipe2(os.O_CLOEXEC)
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    sp = spawn(["sh", "-c", ESCAPING_TREE], cgroup_fd=leaf.fd, stdin=devnull, stdout=w,
               stderr=devnull)
    os.close(w)
    os.close(devnull)
    assert os.read(r, 100) == b"started\n"
    os.close(r)
    def sessions() -> set[int]:
        out = set()
        for p in leaf.procs():
            try:
                stat = pathlib.Path(f"/proc/{p}/stat").read_text()
            except FileNotFoundError:
                continue
            out.add(int(stat.rsplit(")", 1)[1].split()[3]))
        return out

    # someone really escaped our session (setsid may run after the count is reached)
    await wait_for(lambda: len(leaf.procs()) >= 6 and len(sessions()) >= 2,
                   what="the whole tree running, one of it in its own session")
    pids = leaf.procs()

    watcher = CgroupWatcher()
    async with trio.open_nursery() as n:
        n.start_soon(watcher.run)
        with trio.fail_after(HANG):
            assert leaf.kill() == "cgroup.kill"
            await watcher.wait_empty(leaf)
        watcher.stop()
    assert not leaf.is_populated()
    os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
    os.close(sp.pidfd)
    assert not any(alive(p) for p in pids)
    leaf.remove()


async def test_a_frozen_leaf_empties_on_cgroup_kill_without_a_thaw(
        test_cgroup: cgroupfs.Cgroup) -> None:
    # What the kill after a snapshot relies on (the kernel's doing): SIGKILL takes frozen
    # processes out of the freezer; the leaf empties and is removed still asked to freeze.
    leaf = test_cgroup.make_child("frozen")
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    sp = spawn(["sh", "-c", "sleep 600 & sleep 600 & wait"], cgroup_fd=leaf.fd, stdin=devnull,
               stdout=devnull, stderr=devnull)
    os.close(devnull)
    await wait_for(lambda: len(leaf.procs()) == 3, what="three processes")
    pids = leaf.procs()
    leaf.freeze()
    await wait_for(lambda: leaf.read_events().frozen, what="frozen")
    watcher = CgroupWatcher()
    async with trio.open_nursery() as n:
        n.start_soon(watcher.run)
        with trio.fail_after(HANG):
            assert leaf.kill() == "cgroup.kill"
            watcher.expect_late(leaf)
            await watcher.wait_empty(leaf)
        watcher.stop()
    assert not leaf.is_populated() and leaf.read_events().frozen
    os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
    os.close(sp.pidfd)
    await wait_for(lambda: not any(alive(p) for p in pids), what="every process gone")
    leaf.remove()


async def test_after_expect_late_a_waiter_reads_again_for_a_while_only(
        test_cgroup: cgroupfs.Cgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    # A notification the kernel holds back is not waited for: the waiter reads the file again
    # now and then, for LATE_FOR after expect_late(), and after that only on a notification.
    import supervisor._watch as watch

    monkeypatch.setattr(watch, "LATE_FOR", 0.2)
    leaf = test_cgroup.make_child("late")
    reads = [0]

    def never(_ev: cgroupfs.CgroupEvents) -> bool:
        reads[0] += 1
        return False

    watcher = CgroupWatcher()
    async with trio.open_nursery() as n:
        n.start_soon(watcher.run)
        watcher.expect_late(leaf)
        with trio.move_on_after(0.5):
            await watcher.wait_until(leaf, never)
        polled, reads[0] = reads[0], 0
        with trio.move_on_after(0.3):
            await watcher.wait_until(leaf, never)
        watcher.stop()
    assert 5 <= polled <= 60, polled  # ~1 ms apart at first, then an eighth of the time since
    assert reads[0] == 1  # past the window: read once, then only when notified
    leaf.remove()


async def test_wait_empty_returns_at_once_for_an_empty_or_removed_leaf(
        test_cgroup: cgroupfs.Cgroup) -> None:
    leaf = test_cgroup.make_child("empty")
    watcher = CgroupWatcher()
    async with trio.open_nursery() as n:
        n.start_soon(watcher.run)
        with trio.fail_after(HANG):
            await watcher.wait_empty(leaf)
            leaf.remove()
            await watcher.wait_empty(leaf)
        watcher.stop()


SEND_STDOUT_AWAY = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
socket.send_fds(s, [b"x"], [1])
s.recv(1)
print("gave my stdout away", flush=True)
"""


async def test_a_pipe_held_outside_the_leaf_does_not_hold_the_result(
        sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    # The task hands its stdout to us (a process outside its leaf) and exits: EOF never comes
    # while we hold it, and only the drain deadline after the leaf emptied ends the output.
    path = str(tmp_path / "sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)
    held: list[int] = []

    async def take_fd() -> None:
        await trio.lowlevel.wait_readable(listener)
        conn, _ = listener.accept()
        with conn:
            _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            held.extend(fds)
            conn.send(b"k")

    try:
        async with trio.open_nursery() as n:
            n.start_soon(take_fd)
            with trio.fail_after(HANG):
                r = await sup.run([sys.executable, "-c", SEND_STDOUT_AWAY, path])
        assert held, "the task did not pass its stdout"
        assert r.outcome == "succeeded" and r.stdout == b"gave my stdout away\n"
        # we still hold the write end, so no EOF ever came: the supervisor closed its read end
        # at the drain deadline instead
        with pytest.raises(BrokenPipeError):
            os.write(held[0], b"late\n")
    finally:
        listener.close()
        for fd in held:
            os.close(fd)


async def test_a_slow_subscriber_never_grows_memory(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        # twice what the subscriber's buffer can hold even in the largest chunks
        size = 2 * SUBSCRIBER_BUFFER << 20
        task = await n.start(sup.start, ["head", "-c", str(size), "/dev/zero"])
        stream = task.subscribe("stdout")  # never read until the end
        r = await task.wait()
        buffered = 0
        async for chunk in stream:
            buffered += len(chunk)
    assert r.output_stdout.total == size
    assert buffered <= SUBSCRIBER_BUFFER << 20  # at most that many chunks of <= 1 MiB
    capture = task._t.stdout  # the capture itself: what the subscriber missed
    assert capture is not None
    subs = capture.subscribers
    assert subs is not None
    sub = subs[0]
    assert sub.missed + buffered == size and sub.missed > 0
