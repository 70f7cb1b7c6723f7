"""Output kept for reattach: offsets are absolute, a reconnecting follower loses nothing, and
bytes past the cap are named in a gap frame, never skipped silently."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from daemon_util import RunningDaemon, raw, stream_total

Start = Callable[..., RunningDaemon]

# 3000 numbered lines (~40 KB) over about 1.5 s: long enough to reattach several times
WRITER = ("i=0; while [ $i -lt 3000 ]; do echo \"line $i of the stream\"; i=$((i+1)); "
          "[ $((i % 100)) -eq 0 ] && sleep 0.05; done")
EXPECTED = b"".join(f"line {i} of the stream\n".encode() for i in range(3000))


def test_reattach_mid_stream_with_offsets_loses_nothing(start_daemon: Start) -> None:
    d = start_daemon()
    with d.client() as c:
        task = c.submit(["sh", "-c", WRITER])
    got = b""
    reconnects = 0
    finished = False
    while not finished:
        # a fresh connection each time, dropped after a few frames mid-stream
        with d.client() as c:
            frames = c.output(task.id, offset=len(got), follow=True)
            for frame in itertools.islice(frames, 3):
                if frame.kind == "data":
                    assert frame.offset == len(got), (frame.offset, len(got))
                    got += frame.data
                elif frame.kind == "end":
                    assert frame.finished and frame.result is not None
                    assert frame.result["outcome"] == "succeeded"
                    finished = True
                else:
                    raise AssertionError(f"unexpected frame {frame}")
        reconnects += 1
    assert got == EXPECTED
    assert reconnects > 3


def test_bytes_past_the_cap_are_a_gap_then_the_kept_tail(start_daemon: Start) -> None:
    d = start_daemon("--output-cap", "1K")
    size = 200_000
    with d.client() as c:
        task = c.submit(["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' x; printf END"])
        result = c.wait(task.id).result
        assert result is not None
        assert stream_total(result) == (size + 3, True)
        frames = list(c.output(task.id))
    data = [f for f in frames if f.kind == "data"]
    gaps = [f for f in frames if f.kind == "gap"]
    assert data[0].offset == 0 and len(data[0].data) == 1024
    assert len(gaps) == 1
    tail_start = gaps[0].end
    assert gaps[0].offset == 1024 and tail_start > 1024
    tail = b"".join(f.data for f in data[1:])
    assert data[1].offset == tail_start and tail_start + len(tail) == size + 3
    assert tail.endswith(b"xxxEND") and set(tail[:-3]) == {ord("x")}
    assert frames[-1].kind == "end" and frames[-1].finished


def test_tail_counts_from_the_streams_end_past_the_cap_too(start_daemon: Start) -> None:
    """``tail=N`` reads from the stream's last N bytes, of a task in memory and of one read
    from its records alike; it counted from the capped file's end (found by an independent
    attack: ``tail=0`` of a finished task sent the 48 KiB of its kept tail, and ``tail=10``
    the last 10 bytes of the file's head and then that tail).  Given with ``offset``: 400,
    naming both (``tail`` overrode it, silently)."""
    d = start_daemon("--output-cap", "1K", "--keep-finished", "1")
    size = 200_000
    total = size + 3
    with d.client() as c:
        capped = c.submit(["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' x; printf END"])
        assert stream_total(c.wait(capped.id).result or {}) == (total, True)

        def read(tail: int) -> list[tuple[str, int, int, bytes]]:
            return [(f.kind, f.offset, f.end if f.kind == "gap" else 0, f.data)
                    for f in c.output(capped.id, tail=tail)]

        in_memory = [read(n) for n in (0, 10, 100_000, 10**9)]
        c.wait(c.submit(["true"]).id)  # (the first evicted from memory: its records)
        assert c.show(capped.id).result
        recorded = [read(n) for n in (0, 10, 100_000, 10**9)]
        for frames in (in_memory, recorded):
            none, ten, middle, whole = frames
            assert [k for k, *_ in none] == ["end"], none[:2]
            assert ten[:-1] == [("data", total - 10, 0, b"xxxxxxxEND")] and ten[-1][0] == "end"
            gap = middle[0]
            assert gap[:2] == ("gap", total - 100_000) and gap[2] > 1024, gap[:3]
            assert middle[1][:2] == ("data", gap[2])
            assert b"".join(f[3] for f in middle[1:-1]) == b"x" * (size - gap[2]) + b"END"
            assert whole[0][:2] == ("data", 0) and len(whole[0][3]) == 1024
            assert whole[1][:2] == ("gap", 1024)
        assert in_memory == recorded
        with pytest.raises(ValueError, match="both given"):
            list(c.output(capped.id, offset=5, tail=10))
    status, answer = raw(d, f"GET /v1/tasks/{capped.id}/output?offset=5&tail=10 HTTP/1.1\r\n"
                            f"host: x\r\n\r\n".encode())
    assert status == 400 and answer["error"]["field"] == "tail", answer
    assert "offset=5" in answer["error"]["message"] and "tail=10" in answer["error"]["message"]


def test_a_task_not_yet_started_is_followed_from_its_first_byte(start_daemon: Start,
                                                                tmp_path: object) -> None:
    d = start_daemon("--max-running", "1")
    with d.client() as c:
        first = c.submit(["sleep", "0.5"])
        second = c.submit(["echo", "after the queue"])
        assert c.show(second.id).state == "queued"
        data = b"".join(f.data for f in c.output(second.id, follow=True) if f.kind == "data")
        assert data == b"after the queue\n"
        c.wait(first.id)


def test_a_task_no_longer_in_memory_is_answered_from_its_records(start_daemon: Start) -> None:
    """--keep-finished 1: the first task is evicted by the second; its output (file, gap,
    kept tail), its show and its wait still answer, from the records and the files."""
    d = start_daemon("--output-cap", "1K", "--keep-finished", "1")
    size = 100_000
    with d.client() as c:
        first = c.submit(["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' y; printf END"])
        c.wait(first.id)
        c.wait(c.submit(["true"]).id)  # evicts the first from memory
        frames = list(c.output(first.id))
        shown = c.show(first.id)
        waited = c.wait(first.id)
    data = [f for f in frames if f.kind == "data"]
    gaps = [f for f in frames if f.kind == "gap"]
    assert data[0].offset == 0 and len(data[0].data) == 1024
    assert len(gaps) == 1 and gaps[0].offset == 1024
    tail = b"".join(f.data for f in data[1:])
    assert data[1].offset == gaps[0].end and gaps[0].end + len(tail) == size + 3
    assert tail.endswith(b"yyEND")
    assert frames[-1].kind == "end" and frames[-1].finished and frames[-1].exit_status == 0
    assert shown.outcome == "succeeded" and shown.exit_status == 0 and shown.result
    assert waited.state == "finished" and waited.result == shown.result
    assert frames[-1].result == shown.result  # (its row read again for the last frame)


def test_a_task_that_prints_nothing_makes_no_output_file_and_reads_as_empty(
        start_daemon: Start) -> None:
    """Output files are made at a stream's first byte (two file creations were a tenth of a
    ``true`` submission's time on the event loop): a silent task leaves none, and its output,
    show, wait and a follower say what an empty file said; a follower that came before the
    first byte gets it once the file is made."""
    d = start_daemon("--keep-finished", "1")
    output = d.state / "output"
    with d.client() as c:
        quiet = c.submit(["true"])
        assert c.wait(quiet.id).outcome == "succeeded"
        assert not list(output.glob(f"{quiet.id}*"))
        frames = list(c.output(quiet.id, follow=True))
        assert [f.kind for f in frames] == ["end"] and frames[0].exit_status == 0
        late = c.submit(["sh", "-c", "sleep 0.3; echo late >&2"])
        followed = c.output(late.id, stream="stderr", follow=True)
        got = b"".join(f.data for f in followed if f.kind == "data")
        assert got == b"late\n"
        assert sorted(p.name for p in output.glob(f"{late.id}*")) == [f"{late.id}.stderr"]
        assert c.wait(late.id).outcome == "succeeded"
        shown = c.show(quiet.id)  # (evicted from memory by the second: from the records)
        assert shown.outcome == "succeeded" and shown.result is not None
        assert [f.kind for f in c.output(quiet.id)] == ["end"]
