"""Hands its running tasks over, then exec's itself as the process that adopts them.

    python handover.py give ROOT WORKDIR      (the first process)
    python handover.py take WORKDIR FDS       (after exec: FDS is name=fd,name=fd...)

The first starts four tasks (a counter that prints a line every 10 ms, one with a time limit
that falls after the hand-over, one reading stdin, one that has been sent SIGUSR1 and asked to
stop by a SIGTERM, which it ignores: its grace runs on after the hand-over), waits until the
counter has printed a little, hands over, writes the hand-over's JSON to
WORKDIR/handover.json, marks its fds inheritable and exec's ``take``.  The second adopts them,
writes to the reader's stdin, waits for every record and prints them as JSON lines.  Same pid
throughout: the tasks stay its children, as across an exec.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys

import trio

import supervisor

COUNTER = "i=0; while [ $i -lt 150 ]; do echo line-$i; i=$((i+1)); sleep 0.01; done"
TRAPS = "trap 'echo usr1' USR1; trap '' TERM; echo ready; while :; do sleep 0.05; done"


async def give(root: str, workdir: str) -> None:
    async with supervisor.open_supervisor(cgroup_root=root) as sup, trio.open_nursery() as n:
        counter = await n.start(functools.partial(
            sup.start, ["sh", "-c", COUNTER], task_id="counter",
            log_file=os.path.join(workdir, "counter.log")))
        await n.start(functools.partial(sup.start, ["sleep", "600"], task_id="limited",
                                        time_limit="1.5s", grace="1s"))
        await n.start(functools.partial(sup.start, ["sh", "-c", "read x; echo got $x"],
                                        task_id="reader", stdin="pipe", group="tenant"))
        stubborn = await n.start(functools.partial(
            sup.start, ["sh", "-c", TRAPS], task_id="stubborn", grace="2s"))
        while counter.output().total < 200 or b"ready" not in stubborn.output().head:
            await trio.sleep(0.01)
        stubborn.signal("USR1", by="the test")
        while b"usr1" not in stubborn.output().head:
            await trio.sleep(0.01)
        stubborn.stop(by_signal=signal.SIGTERM)
        handover = await sup.hand_over()
    fds = handover.fds()
    with open(os.path.join(workdir, "handover.json"), "w") as f:
        f.write(handover.to_json())
    for fd in fds.values():
        os.set_inheritable(fd, True)
    mapping = ",".join(f"{name}={fd}" for name, fd in fds.items())
    os.execv(sys.executable, [sys.executable, __file__, "take", workdir, mapping])


async def take(workdir: str, mapping: str) -> None:
    fds = {name: int(fd) for name, fd in (item.split("=") for item in mapping.split(","))}
    with open(os.path.join(workdir, "handover.json")) as f:
        handover = supervisor.HandOver.from_json(f.read(), fds)
    async with supervisor.open_supervisor(adopt=handover) as sup:
        tasks = {t.id: t for t in sup.tasks}
        await tasks["reader"].write_stdin(b"after-the-restart\n")
        for task_id in ("counter", "limited", "reader", "stubborn"):
            r = await tasks[task_id].wait()
            print(json.dumps({"id": r.id, **r.to_dict()}), flush=True)
        print(json.dumps({"root": sup.cgroup_root}), flush=True)


if __name__ == "__main__":
    verb, *rest = sys.argv[1:]
    trio.run(give if verb == "give" else take, *rest)
