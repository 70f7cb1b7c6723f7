"""Output capture is byte-exact whichever way the reactor takes the bytes: read and copied, or
(past the head, when nothing else wants them) spliced unread because the tail will never hold
them.  Streams of distinct bytes, cut in odd chunks, with pauses that let the pipe run dry."""

from __future__ import annotations

import array
import collections
import fcntl
import functools
import os
import pathlib
import resource
import signal
import sys
import threading
import time

import pytest
import trio
from sup_util import HANG

import supervisor
from supervisor._capture import StreamCapture
from supervisor._output import IoReactor, enlarge_pipe


def pattern(size: int) -> bytes:
    """``size`` bytes where every 8 are their own index: any shift or gap shows."""
    return array.array("Q", range((size + 7) // 8)).tobytes()[:size]


# Writes pattern(SIZE) to stdout in odd chunks, with a pause now and then (a dry pipe).
WRITER = """
import array, os, sys, time
size = int(sys.argv[1])
data = array.array("Q", range((size + 7) // 8)).tobytes()[:size]
cuts = (7919, 1 << 20, 3, 65536 + 13, 400000, 1, 2 << 20)
pos = i = 0
while pos < size:
    n = cuts[i % len(cuts)]
    view = memoryview(data)[pos:pos + n]
    while view:
        view = view[os.write(1, view):]
    pos += n
    i += 1
    if i % 5 == 0:
        time.sleep(0.01)
"""


def writer(size: int) -> list[str]:
    return [sys.executable, "-c", WRITER, str(size)]


@pytest.mark.parametrize(("head", "tail"), [(16 * 1024, 48 * 1024), (0, 0), (0, 100_003),
                                            (1 << 20, 1), (5, 3 << 20)])
async def test_head_tail_and_counts_are_exact(sup: supervisor.Supervisor, head: int,
                                              tail: int) -> None:
    size = 9 << 20
    with trio.fail_after(HANG):
        r = await sup.run(writer(size), output_head=head, output_tail=tail)
    data, out = pattern(size), r.output_stdout
    assert r.outcome == "succeeded" and out.total == size
    assert out.head == data[:head]
    assert out.tail == (data[head:][-tail:] if tail else b"")
    assert out.dropped == size - len(out.head) - len(out.tail)


async def test_a_log_file_and_a_subscriber_still_get_every_byte(
        sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    size = 6 << 20
    log = tmp_path / "out.log"
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, writer(size), log_file=str(log)))
        stream = task.subscribe("stdout")
        got = bytearray()
        with trio.fail_after(HANG):
            async for chunk in stream:
                got += chunk
            r = await task.wait()
    data = pattern(size)
    assert r.output_stdout.total == size and log.read_bytes() == data
    assert r.output_stdout.tail == data[-48 * 1024:]
    assert bytes(got[:16 * 1024]) == data[:16 * 1024]
    # (a subscriber may miss chunks when it lags: what it got is the stream's start and end)
    assert bytes(got[-48 * 1024:]) == data[-48 * 1024:]


async def test_removing_a_stream_a_writer_still_holds_takes_exactly_what_is_buffered() -> None:
    """As at the drain deadline with a grandchild holding the pipe: the writer's end stays
    open, the pipe is full; remove() takes what is buffered, byte-exact, and lets go."""
    capture = StreamCapture(1000, 70_000)
    data = pattern(3 << 20)
    sent = await _capture_a_full_pipe(capture, data)
    out = capture.result()
    assert out.total == sent and out.head == data[:1000]
    assert out.tail == data[:sent][-70_000:] and out.dropped == sent - 71_000


async def test_a_log_file_alone_gets_every_byte_and_its_cap_holds(
        sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    size = 7 << 20
    data = pattern(size)
    for cap in (None, 3_000_017):
        log = tmp_path / f"out-{cap}.log"
        with trio.fail_after(HANG):
            r = await sup.run(writer(size), log_file=str(log), log_max_bytes=cap)
        out = r.output_stdout
        assert out.total == size and out.tail == data[-48 * 1024:]
        assert log.read_bytes() == data[:cap] and out.log_truncated == (cap is not None)



async def test_a_lazy_log_file_is_made_at_its_streams_first_byte_and_a_silent_one_never(
        sup: supervisor.Supervisor, tmp_path: pathlib.Path) -> None:
    """``log_lazy`` (the daemon's: a task that prints nothing costs no files): stdout's file
    holds every byte, spliced or copied, and stderr, silent, has none; the result still names
    both paths, as an eager log would."""
    size = 5 << 20
    log = tmp_path / "out.log"
    with trio.fail_after(HANG):
        r = await sup.run(writer(size), log_file=str(log), log_lazy=True)
    assert r.outcome == "succeeded" and log.read_bytes() == pattern(size)
    assert not (tmp_path / "out.log.stderr").exists()
    assert r.output_stderr.log_path == f"{log}.stderr" and not r.output_stderr.log_truncated
    quiet = tmp_path / "quiet.log"
    with trio.fail_after(HANG):
        r = await sup.run(["sh", "-c", "sleep 0.2; echo late >&2"], log_file=str(quiet),
                          log_lazy=True)
    assert not quiet.exists() and (tmp_path / "quiet.log.stderr").read_bytes() == b"late\n"
    with pytest.raises(supervisor.SpecError, match="log_lazy must be True or False"):
        supervisor.TaskSpec(["true"], log_file=str(log), log_lazy=1)  # type: ignore[arg-type]


async def test_a_lazy_log_file_that_cannot_be_made_leaves_the_capture_whole(
        tmp_path: pathlib.Path) -> None:
    """The directory is gone by the first byte: a warning, ``log_truncated``, and every byte
    still in the head and tail; a hand-over of a stream not begun makes its file, for the
    next process to append to."""
    data = pattern(3 << 20)
    capture = StreamCapture(1000, 70_000, log_path=str(tmp_path / "gone" / "out.log"),
                            log_pending=True)
    sent = await _capture_a_full_pipe(capture, data)
    out = capture.result()
    assert out.log_truncated and capture.log_fd is None and not capture.log_pending
    assert out.total == sent and out.head == data[:1000]
    assert out.tail == data[:sent][-70_000:]
    begun = StreamCapture(1000, 70_000, log_path=str(tmp_path / "later.log"), log_pending=True)
    state = begun.export()
    assert (tmp_path / "later.log").read_bytes() == b""
    restored = StreamCapture.restore(state)
    assert restored.log_fd is not None
    restored.close()
    begun.close()

def _fill(w: int, data: bytes, sent: int) -> int:
    """Write ``data`` from ``sent`` on until the pipe is full; the new ``sent``."""
    try:
        while sent < len(data):
            sent += os.write(w, data[sent:sent + 300_001])
    except BlockingIOError:
        pass
    return sent


async def _capture_a_full_pipe(capture: StreamCapture, data: bytes) -> int:
    """Feed ``capture`` 5000 bytes through a reactor, then fill the pipe and remove() it
    with the writer's end still open; how many bytes were written."""
    reactor = IoReactor()
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    enlarge_pipe(r)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        stream = reactor.add_reader(r, capture)
        os.write(w, data[:5000])
        with trio.fail_after(HANG):
            while capture.total < 5000:
                await trio.sleep(0.001)
        sent = _fill(w, data, 5000)  # no checkpoint from here to remove()
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) < sent
        reactor.remove(stream)
        assert stream.done.is_set()
        reactor.stop()
    os.close(w)
    return sent


async def test_a_log_reopened_to_append_after_a_hand_over_gets_every_byte(
        tmp_path: pathlib.Path) -> None:
    data = pattern(3 << 20)
    log = tmp_path / "out.log"
    log.write_bytes(b"before")
    state = StreamCapture(1000, 70_000).export() | {"log_path": str(log), "log_written": 6}
    capture = StreamCapture.restore(state)  # (O_APPEND: the kernel will not splice to it)
    sent = await _capture_a_full_pipe(capture, data)
    assert log.read_bytes() == b"before" + data[:sent]
    assert capture.result().tail == data[:sent][-70_000:]


async def test_a_failing_log_file_stops_but_the_capture_goes_on(
        tmp_path: pathlib.Path) -> None:
    data = pattern(3 << 20)
    capture = StreamCapture(1000, 70_000, log_path=str(tmp_path / "out.log"))
    capture.log_fd = os.open(capture.log_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, limit[1]))  # then EFBIG
    try:
        sent = await _capture_a_full_pipe(capture, data)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    out = capture.result()
    assert out.log_truncated and capture.log_fd is None
    assert (tmp_path / "out.log").read_bytes() == data[:200_000]
    assert out.total == sent and out.tail == data[:sent][-70_000:]


async def test_serve_now_ends_a_pipe_at_eof_and_only_reads_a_live_one() -> None:
    # What a task's end does before it waits for the reactor: a pipe whose writers are all
    # gone ends at once (all of it read); one still held elsewhere is read, not ended.
    reactor = IoReactor()
    ended, live = StreamCapture(100, 100), StreamCapture(100, 100)
    r1, w1 = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    r2, w2 = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        s1, s2 = reactor.add_reader(r1, ended), reactor.add_reader(r2, live)
        os.write(w1, b"all of it")
        os.close(w1)
        os.write(w2, b"so far")
        reactor.serve_now(s1)  # (no checkpoint since the writes: the reactor has not run)
        reactor.serve_now(s2)
        assert s1.done.is_set() and ended.result().head == b"all of it"
        assert not s2.done.is_set() and live.total == len(b"so far")
        reactor.serve_now(s1)  # let go of already: nothing happens
        reactor.remove(s2)
        assert s2.done.is_set()
        reactor.stop()
    os.close(w2)


async def test_a_paced_owners_pipes_rest_unread_and_what_their_reads_cost_is_charged() -> None:
    """The daemon reads a tenant's output at its share of the event loop (a tenant's output
    flood was read in steps that were no one's, and another tenant's requests waited behind
    them): while ``pace(owner)`` says so, the owner's pipes rest unread (a writer blocks once
    the pipe is full), another owner's are read, each read is charged to its owner, and a
    pipe whose writer is gone is not asked about in a spin while it rests."""
    reactor = IoReactor()
    paced = {1}
    asked: collections.Counter[int] = collections.Counter()
    charged: collections.Counter[int] = collections.Counter()

    def pace(owner: int) -> bool:
        asked[owner] += 1
        return owner in paced

    reactor.pace = pace
    reactor.charge = lambda owner, seconds: charged.update({owner: 1})
    pipes = [os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) for _ in range(2)]
    captures = [StreamCapture(100, 100) for _ in pipes]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        streams = [reactor.add_reader(r, c) for (r, _), c in zip(pipes, captures, strict=True)]
        for owner, stream in enumerate(streams, 1):
            reactor.own([stream], owner)
        for _, w in pipes:
            os.write(w, b"x" * 5000)
        os.close(pipes[0][1])  # (the paced one's writer is gone: a hang-up while it rests)
        with trio.fail_after(HANG):
            while captures[1].total < 5000:
                await trio.sleep(0.001)
        await trio.sleep(10 * reactor.REST)
        assert captures[0].total == 0 and charged[1] == 0 and charged[2] >= 1
        assert asked[1] <= 12, asked  # (about once a rest, not in a spin)
        paced.clear()
        with trio.fail_after(HANG):
            await streams[0].done.wait()  # (read whole, and its end seen)
        assert captures[0].total == 5000 and charged[1] >= 1
        reactor.remove(streams[1])
        reactor.stop()
    os.close(pipes[1][1])


async def test_a_read_is_charged_the_time_it_held_the_loop_not_only_its_cpu() -> None:
    """Found measuring a tenant's output flood onto the state disk: the daemon's write of the
    output into its file is made in the event loop's thread, and the kernel holds a writer
    that dirties pages faster than the disk takes them (``balance_dirty_pages``): the loop
    slept there, on the CPU for none of it, and a read charged by its CPU time cost its
    owner nothing (another tenant's p99 8.6-9x; 2.1-3.1x charged by the clock).  Here the
    output's file is a pipe emptied 50 ms late: its write waits in the kernel as long."""
    reactor = IoReactor()
    charged: collections.Counter[int] = collections.Counter()
    reactor.pace = lambda owner: False
    reactor.charge = lambda owner, seconds: charged.update({owner: seconds})
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    late_r, late_w = os.pipe2(os.O_CLOEXEC)  # (the "file": a blocking write end)
    capture = StreamCapture(1 << 20, 1 << 20)  # (a head of a MiB: read, not spliced)
    capture.log_fd = late_w
    emptied = []

    def empty_late() -> None:
        time.sleep(0.05)
        while data := os.read(late_r, 1 << 16):
            emptied.append(len(data))

    drain = threading.Thread(target=empty_late)
    drain.start()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        stream = reactor.add_reader(r, capture)
        reactor.own([stream], 1)
        enlarge_pipe(w)
        os.write(w, b"x" * 2 * 65536)  # (more than the late pipe holds)
        os.close(w)
        with trio.fail_after(HANG):
            await stream.done.wait()
        reactor.stop()
    drain.join()  # (the capture closed its "file" at the stream's end: the drain's EOF)
    os.close(late_r)
    assert sum(emptied) == 2 * 65536
    assert charged[1] >= 0.04, charged  # (its CPU time: a millisecond or two)
