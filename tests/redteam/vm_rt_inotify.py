"""Run inside the user-mode Linux guest (tests/vm/run-in-vm) by test_rt_vm.py; not collected.

One task uses up its user's inotify watches (max_user_watches is per user and shared by every
process of that user, the supervisor's included: lowered here so that the guest needs no
memory for it); another task's main process then exits leaving a child, so the supervisor
needs a watch on that leaf's cgroup.events.  Prints one JSON line: what the victim got."""

from __future__ import annotations

import functools
import json
import os
import sys

import trio

import supervisor

HOG = r"""
import ctypes, os, tempfile, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
d = tempfile.mkdtemp()
n = 0
while True:
    p = os.path.join(d, str(n)); open(p, "w").close()
    if libc.inotify_add_watch(fd, p.encode(), 2) < 0:
        break
    n += 1
print("holding", n, "watches", flush=True)
time.sleep(60)
"""


async def main(root: str) -> dict[str, object]:
    out: dict[str, object] = {}
    async with supervisor.open_supervisor(cgroup_root=root) as sup, trio.open_nursery() as n:
        hog = await n.start(functools.partial(sup.start, [sys.executable, "-c", HOG],
                                              grace="0.5s"))
        while b"holding" not in hog.output().head:
            await trio.sleep(0.1)
        try:
            r = await sup.run(["sh", "-c", "sleep 1 & exit 0"], time_limit="10s")
            out.update(outcome=str(r.outcome), cleanup=str(r.cleanup), error=r.error)
        except Exception as e:
            out.update(raised=f"{type(e).__name__}: {e}")
        hog.stop()
    return out


if __name__ == "__main__":
    with open("/sys/fs/cgroup/cgroup.subtree_control", "w") as f:
        f.write("+cpu +io +memory +pids")
    with open("/proc/sys/fs/inotify/max_user_watches", "w") as f:
        f.write("300")
    base = "/sys/fs/cgroup/rt-inotify"
    os.makedirs(base, exist_ok=True)
    print(json.dumps(trio.run(main, base)), flush=True)
