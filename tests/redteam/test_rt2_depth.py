"""Sub-cgroup trees walked and removed by fd (cgroupfs/_fileio.py walk, remove_subtree): the
walk holds one directory fd per level, so a tree deeper than the supervisor's free fds is a
new limit where PATH_MAX was the old one.

A root task without isolation (the case test_rt_hostile_cgroups.py covers) nests a chain of
one-letter sub-cgroups.  The supervisor here runs with RLIMIT_NOFILE 256 and the chain is 400
deep, to stay quick; with the usual soft limit of 1024 a chain of ~1020 (under a second of
mkdir) does the same, fewer on a busy supervisor (three fds per task it holds)."""

from __future__ import annotations

import os

from rt_util import alive, leaf_path_script, run_program

DEPTH = 400
NOFILE = 256
SLEEPER = "sleep 64.5"


def deep_chain_task() -> str:
    return (leaf_path_script() + f"; for i in $(seq {DEPTH}); do mkdir d && cd d || exit 9; "
            f"done; sh -c 'echo $$ > cgroup.procs; exec {SLEEPER}' </dev/null >/dev/null 2>&1 &"
            " sleep 0.3")


RUN = """
import sys, trio, supervisor
async def main(root, script):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        try:
            r = await sup.run(["bash", "-c", script], grace="1s", time_limit="20s")
            print("record", r.outcome, r.cleanup.state, flush=True)
        except Exception as e:
            print("raised", type(e).__name__, e, flush=True)
    print("closed", flush=True)
trio.run(main, sys.argv[1], sys.argv[2])
"""


def sleepers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == SLEEPER.encode().replace(b" ", b"\0") + b"\0":
                        found.append(int(pid))
            except OSError:
                pass
    return found


def test_a_sub_cgroup_chain_deeper_than_the_free_fds(scratch: str) -> None:
    ran = run_program(RUN, scratch, deep_chain_task(), timeout=40, rlimit_nofile=NOFILE)
    survivors = [p for p in sleepers() if alive(p)]
    for pid in survivors:
        os.kill(pid, 9)
    assert "record" in ran.stdout, (f"no record: {ran.stdout!r} "
                                    f"{ran.stderr.strip().splitlines()[-1:]}")
    assert "closed" in ran.stdout and ran.rc == 0, ran.stderr[-600:]
    assert survivors == [], f"{SLEEPER} outlived its supervisor"


START = """
import sys, trio, supervisor
async def main(root):
    async with supervisor.open_supervisor(cgroup_root=root) as sup:
        r = await sup.run(["true"])
        print("ran", r.outcome, sup.placement_notes, flush=True)
trio.run(main, sys.argv[1])
"""


def test_the_next_corral_starts_beside_a_stale_root_deeper_than_the_free_fds(
        scratch: str) -> None:
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    name = "corral-1-abcdef"
    for _ in range(DEPTH):
        os.mkdir(name, dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, name = nfd, "d"
    os.close(fd)
    ran = run_program(START, scratch, timeout=40, rlimit_nofile=NOFILE)
    assert "ran succeeded" in ran.stdout, ran.stderr.strip().splitlines()[-1:]
