"""Red team 3: Ctrl-C in a library program (Python's own SIGINT handling, trio's KeyboardInterrupt).

trio raises KeyboardInterrupt right where unprotected code happens to run when the signal comes,
in whatever task that is; it goes to the main task only when protected code runs then.  corral's
promise (``Supervisor.run``): the first Ctrl-C stops the task gracefully and one
KeyboardInterrupt comes out of ``run`` once the record exists.  A real SIGINT is sent to the
program at a chosen point: right after the spawn, in the task's life (since run() starts lives
in the supervisor's nursery, a KeyboardInterrupt there went into that nursery: the record was
``lost``, run() returned it, the task's process ran on until the supervisor's exit); and while
the I/O reactor reads (it died: every stream was closed unread, run() raised Cancelled)."""

from __future__ import annotations

import json

from rt_util import run_program

PROGRAM = """
import json, os, signal, sys, trio, supervisor
import supervisor._life as life
import supervisor._output as output
where, root = sys.argv[1], sys.argv[2]
sent = []

def ctrl_c():
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)  # handled at once, in the frame running now

real_spawn, real_read = life.spawn, output._read_into
def spawn(*a, **k):
    s = real_spawn(*a, **k)
    if where == "life":
        ctrl_c()
    return s
def read_into(fd, capture, *a):
    if where == "reactor" and capture.total > 100_000:
        ctrl_c()
    return real_read(fd, capture, *a)
life.spawn, output._read_into = spawn, read_into

async def main():
    out = {}
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        try:
            r = await sup.run(["sh", "-c", "seq 1 300000; exec sleep 30"], grace="5s")
            out["run"] = "returned " + r.outcome
        except KeyboardInterrupt:
            out["run"] = "KeyboardInterrupt"
        except trio.Cancelled:
            out["run"] = "Cancelled"
            raise
        finally:
            out["records"] = [(v.outcome, v.stop.reason if v.stop else None)
                              for v in sup.results.values()]
            print(json.dumps(out), flush=True)
    print("closed", flush=True)

try:
    trio.run(main)
except KeyboardInterrupt:
    print("KeyboardInterrupt out of trio.run", flush=True)
"""


def _ctrl_c(where: str, scratch: str) -> tuple[dict, str]:
    ran = run_program(PROGRAM, where, scratch, timeout=40)
    assert not ran.hung, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines, ran.stderr
    return json.loads(lines[0]), ran.stdout


def test_ctrl_c_while_the_life_runs_stops_the_task_and_raises_from_run(scratch: str) -> None:
    out, text = _ctrl_c("life", scratch)
    assert out["run"] == "KeyboardInterrupt", text
    assert out["records"] == [["cancelled", "cancel"]], text
    assert "closed" in text


def test_ctrl_c_while_the_reactor_reads_stops_the_task_and_raises_from_run(
        scratch: str) -> None:
    out, text = _ctrl_c("reactor", scratch)
    assert out["run"] == "KeyboardInterrupt", text
    assert out["records"] == [["cancelled", "cancel"]], text
    assert "closed" in text
