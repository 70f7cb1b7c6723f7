"""Red team 3: output capture since the splice (past the head, what the tail will never hold is
spliced to /dev/null or the log file, unread).  Writers that do not play along: one that keeps
writing while its stream is removed (a process outside the leaf holding the pipe, at the drain
deadline), one that sets O_NONBLOCK on its end, shrinks or grows the pipe, writes in packets."""

from __future__ import annotations

import array
import os
import subprocess
import sys

import pytest
import trio

import supervisor
from supervisor._capture import StreamCapture
from supervisor._output import IoReactor, enlarge_pipe

HANG = 60
CYCLE = 1 << 24  # the endless writer's period (bytes)

# Writes the 8-byte indices 0, 1, 2... (mod CYCLE/8) to stdout for ever.
ENDLESS = f"""
import array, os
data = array.array("Q", range({CYCLE // 8})).tobytes()
data += data[:1 << 17]
pos = 0
while True:
    pos = (pos + os.write(1, data[pos:pos + 65536])) % {CYCLE}
"""


def endless_at(offset: int, n: int) -> bytes:
    """Bytes ``offset`` to ``offset + n`` of ENDLESS's stream."""
    data = array.array("Q", range(CYCLE // 8)).tobytes()
    start = offset % CYCLE
    return (data + data)[start:start + n]


@pytest.mark.parametrize("tail", [1000, 65536])
async def test_removal_while_a_writer_goes_on_keeps_the_tail(tail: int) -> None:
    """remove() at the drain deadline with a writer (outside the leaf) still writing: its
    rounds spliced what the pipe held past the tail and cleared the tail, and when its last
    round was such a splice the tail stayed empty (the record's tail: b"", in most runs)."""
    for _ in range(6):
        reactor = IoReactor()
        r, w = os.pipe2(os.O_CLOEXEC)
        enlarge_pipe(r)
        os.set_blocking(r, False)
        capture = StreamCapture(1000, tail)
        p = subprocess.Popen([sys.executable, "-c", ENDLESS], stdout=w, stderr=subprocess.DEVNULL)
        os.close(w)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reactor.run)
                stream = reactor.add_reader(r, capture)
                with trio.fail_after(HANG):
                    while capture.total < 4 << 20:
                        await trio.sleep(0.001)
                reactor.remove(stream)
                reactor.stop()
        finally:
            p.kill()
            p.wait()
        out = capture.result()
        assert out.head == endless_at(0, 1000)
        assert len(out.tail) == tail, (len(out.tail), out.total)
        assert out.tail == endless_at(out.total - tail, tail)
        assert out.dropped == out.total - 1000 - tail


# The task's writer changes the rules mid-stream: O_NONBLOCK on its end (retrying on EAGAIN),
# the pipe shrunk to one page, then packet mode (O_DIRECT), then the pipe grown back.
CHANGING = """
import array, fcntl, os, select, sys, time
size = int(sys.argv[1])
data = array.array("Q", range((size + 7) // 8)).tobytes()[:size]
pos = 0
def put(n):
    global pos
    end = min(pos + n, size)
    while pos < end:
        try:
            pos += os.write(1, data[pos:end])
        except BlockingIOError:
            select.select([], [1], [])
def resize(n):
    while True:
        try:
            return fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, n)
        except OSError:  # EBUSY: it holds more than that for now
            time.sleep(0.001)
fl = fcntl.fcntl(1, fcntl.F_GETFL)
put(3 << 20)
fcntl.fcntl(1, fcntl.F_SETFL, fl | os.O_NONBLOCK)
put(2 << 20)
resize(4096)
put(1 << 20)
fcntl.fcntl(1, fcntl.F_SETFL, fl | os.O_DIRECT)
put(1 << 20)
fcntl.fcntl(1, fcntl.F_SETFL, fl)
resize(1 << 20)
put(size)
"""


@pytest.mark.parametrize("log", [False, True])
async def test_a_writer_that_changes_its_pipe_mid_stream(
        sup: supervisor.Supervisor, tmp_path, log: bool) -> None:
    size = 9 << 20
    data = array.array("Q", range(size // 8)).tobytes()
    path = str(tmp_path / "out.log") if log else None
    with trio.fail_after(HANG):
        r = await sup.run([sys.executable, "-c", CHANGING, str(size)], output_head=5000,
                          output_tail=70_001, log_file=path, log_max_bytes=6_000_007)
    out = r.output_stdout
    assert r.outcome == "succeeded", r
    assert out.total == size and out.head == data[:5000] and out.tail == data[-70_001:]
    assert out.dropped == size - 75_001
    if log:
        with open(path, "rb") as f:
            assert f.read() == data[:6_000_007]
        assert out.log_truncated
