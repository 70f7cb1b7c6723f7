"""A task that uses up its user's inotify watches: runs inside the user-mode Linux guest.

``max_user_watches`` is per user and shared by every process of it, the supervisor's own
included (it watches a leaf's cgroup.events for the leaf to empty).  Lowered here so that the
guest needs no memory for it, and put back afterwards.  corral then polls: the other task still
gets its true record.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

if TYPE_CHECKING:
    from cgroupfs import Cgroup

WATCHES = Path("/proc/sys/fs/inotify/max_user_watches")

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


@pytest.fixture
def few_watches() -> Iterator[None]:
    before = WATCHES.read_text()
    WATCHES.write_text("200\n")
    try:
        yield
    finally:
        WATCHES.write_text(before)


def test_a_task_using_up_the_watches_breaks_no_other_task(cgroup: Cgroup,
                                                          few_watches: None) -> None:
    import supervisor

    async def main() -> supervisor.TaskResult:
        async with supervisor.open_supervisor(cgroup_root=cgroup.path) as sup:
            async with trio.open_nursery() as n:
                hog = await n.start(functools.partial(sup.start, [sys.executable, "-c", HOG],
                                                      grace="0.5s"))
                while b"holding" not in hog.output().head:
                    await trio.sleep(0.05)
                # its main exits leaving a child: corral waits for the leaf to empty
                r = await sup.run(["sh", "-c", "sleep 0.5 & exit 0"], time_limit="20s")
                hog.stop()
            return r

    r = trio.run(main)
    assert r.outcome == "succeeded" and r.cleanup == "clean", (r.outcome, r.cleanup, r.error)
    assert len(r.cleanup.leftovers) == 1  # (the sleep, named sh or sleep as it was seen)
