"""What the stress suites measure and make: process-wide counts, marker scans, the task mix.

Every process a stress test starts carries a marker in its environment (``CORRAL_STRESS_MARK``
set to a token unique to the test), inherited by everything it forks: after the test no live
process may carry it.  The counts read the kernel's own view: ``/proc/self/fd`` for file
descriptors, ``/proc/self/fdinfo`` of each inotify fd for watches (one ``inotify wd:`` line per
watch the kernel holds), ``/proc/PID/status`` for RSS.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import cgroupfs
from supervisor import StreamOutput

MARK = "CORRAL_STRESS_MARK"
MiB = 1 << 20
CORRAL = shutil.which("corral", path=os.path.dirname(sys.executable)) or os.path.join(
    os.path.dirname(sys.executable), "corral")


def new_mark() -> str:
    return f"stress-{secrets.token_hex(6)}"


# ---- the kernel's counts ------------------------------------------------------------------

def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def inotify_watches(pid: int | str = "self") -> int:
    """Watches the kernel holds for every inotify instance of ``pid``."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                total += sum(1 for line in f if line.startswith("inotify wd:"))
        except FileNotFoundError:
            continue  # closed meanwhile
    return total


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _state(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def marked_pids(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in env.split(b"\0") and _state(pid) not in (None, "Z", "X"):
            found.append(int(pid))
    return found


def describe(pids: Iterable[int]) -> str:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/cgroup") as f:
                cg = f.read().strip()
        except OSError:
            cmd, cg = "?", "?"
        out.append(f"{pid} [{cmd}] in {cg}")
    return "; ".join(out)


def poll_until(condition: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    """Poll ``condition`` (blocking) until true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


def kill_marked(mark: str) -> list[int]:
    """Last-resort cleanup after a failed test: SIGKILL what still carries ``mark`` (through
    pidfds, so a recycled pid is never hit).  Returns what it found."""
    found = marked_pids(mark)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            fd = os.pidfd_open(pid)
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
    return found


def cgroup_tree(path: str) -> list[str]:
    """Every cgroup below ``path`` (relative names), depth-first."""
    with cgroupfs.Cgroup.open(path) as cg:
        return cg.descendants()


# ---- the task mix -------------------------------------------------------------------------

KINDS = ("true", "sleep", "escapee", "term_ignorer", "write_1m", "write_16m", "exit3",
         "subcgroup")
FATES = ("run_out", "stop", "force", "stop_twice", "scope_cancel", "short_limit")
WRITE_SIZES = {"write_1m": MiB, "write_16m": 16 * MiB}
# What each kind ends as when nobody stops it.
NATURAL = {"exit3": "failed"}


@dataclass(frozen=True)
class Job:
    """One task of a stress run: what it runs and what is done to it."""

    index: int
    kind: str
    fate: str
    delay: float  # before the (first) stop, or the scope's cancel
    delay2: float  # between the two stops of stop_twice
    time_limit: float | None  # short_limit only

    @property
    def name(self) -> str:
        return f"stress-{self.index}"

    def argv(self, cgroup_mount: str) -> list[str]:
        if self.kind == "true":
            return ["/bin/true"]
        if self.kind == "sleep":
            return ["sleep", "0.05"]
        if self.kind == "escapee":
            return ["sh", "-c", "setsid sleep 600 & exec sleep 0.03"]
        if self.kind == "term_ignorer":
            return ["sh", "-c", "trap '' TERM; sleep 1"]
        if self.kind in WRITE_SIZES:
            return ["sh", "-c", 'yes "$1" | head -c "$2"', "writer", str(self.index),
                    str(WRITE_SIZES[self.kind])]
        if self.kind == "exit3":
            return ["sh", "-c", "exit 3"]
        if self.kind == "subcgroup":
            # the task makes a cgroup inside its own leaf and moves a process into it
            return ["sh", "-c",
                    'cg="$1$(sed -n "s/^0:://p" /proc/self/cgroup)"; mkdir "$cg/made" && '
                    '{ sh -c "echo 0 > \\"$cg/made/cgroup.procs\\" && exec sleep 600" & }; '
                    "exec sleep 0.05", "subcgroup", cgroup_mount]
        raise AssertionError(self.kind)


def make_jobs(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        fate = rng.choice(FATES)
        jobs.append(Job(i, rng.choice(KINDS), fate, rng.uniform(0, 0.05), rng.uniform(0, 0.05),
                        rng.uniform(0.01, 0.1) if fate == "short_limit" else None))
    return jobs


def pattern(index: int, total: int) -> bytes:
    """What ``yes INDEX | head -c TOTAL`` writes."""
    line = f"{index}\n".encode()
    return (line * (total // len(line) + 1))[:total]


def check_output(job: Job, out: StreamOutput) -> list[str]:
    """Byte-exact checks of one stream of a writer; problems found (empty: fine)."""
    problems = []
    head, tail, total, dropped = out.head, out.tail, out.total, out.dropped
    if len(head) + len(tail) + dropped != total:
        problems.append(f"head {len(head)} + tail {len(tail)} + dropped {dropped} != total "
                        f"{total}")
    size = WRITE_SIZES.get(job.kind, 0)
    if total > size:
        problems.append(f"{total} bytes from a task that writes {size}")
    if size:
        want = pattern(job.index, total)
        if head != want[:len(head)]:
            problems.append("the head is not what the task wrote")
        if tail and tail != want[total - len(tail):]:
            problems.append("the tail is not what the task wrote")
    return problems
