"""What the stress suites measure and make: process-wide counts, marker scans, the task mix.

Every process a stress test starts carries a marker in its environment (``CORRAL_STRESS_MARK``
set to a token unique to the test), inherited by everything it forks: after the test no live
process may carry it.  The counts read the kernel's own view: ``/proc/self/fd`` for file
descriptors, ``/proc/self/fdinfo`` of each inotify fd for watches (one ``inotify wd:`` line per
watch the kernel holds), ``/proc/PID/status`` for RSS.
"""

from __future__ import annotations

import collections
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

import trio

import cgroupfs
import supervisor
from supervisor import StreamOutput, TaskResult, TaskSpec

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


def make_jobs(n: int, seed: int, first: int = 0) -> list[Job]:
    """``n`` jobs numbered from ``first``, kinds and fates drawn from ``seed``."""
    rng = random.Random(seed)
    jobs = []
    for i in range(first, first + n):
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


# ---- running the mix ----------------------------------------------------------------------

CONCURRENCY = 32
GRACE = "0.2s"
STOP_FATES = ("stop", "force", "stop_twice", "scope_cancel")


def spec_for(job: Job, mark: str, mount: str) -> TaskSpec:
    return TaskSpec(tuple(job.argv(mount)), env={MARK: mark}, grace=GRACE, name=job.name,
                    time_limit=job.time_limit)


async def run_job(sup: supervisor.Supervisor, job: Job, spec: TaskSpec) -> None:
    """Run one job to its record, doing to it what its fate says."""
    if job.fate == "scope_cancel":
        with trio.move_on_after(job.delay):
            await sup.run(spec)
        return
    if job.fate in ("run_out", "short_limit"):
        await sup.run(spec)
        return
    async with trio.open_nursery() as nursery:
        task: supervisor.TaskHandle = await nursery.start(sup.start, spec)
        await trio.sleep(job.delay)
        task.stop(force=job.fate == "force")
        if job.fate == "stop_twice":
            await trio.sleep(job.delay2)
            task.stop()
        await task.wait()


def check_record(job: Job, r: TaskResult) -> list[str]:
    """What one record must say, given what its task was and what was done to it."""
    problems = []
    natural = NATURAL.get(job.kind, "succeeded")
    allowed = {natural}
    if job.fate in STOP_FATES:
        allowed.add("cancelled")
    if job.fate == "short_limit":
        allowed.add("timed_out")
    if r.outcome not in allowed:
        problems.append(f"outcome {r.outcome}, expected one of {sorted(allowed)}")
    if r.cleanup != "clean":
        problems.append(f"cleanup {r.cleanup.state}: {r.cleanup.detail}")
    if r.containment.escaped:
        problems.append(f"escaped: {r.containment.escaped}")
    if r.outcome == "failed" and r.exit_code != 3:
        problems.append(f"failed with exit code {r.exit_code}")
    if r.stop is not None:
        want = "time_limit" if job.fate == "short_limit" else "cancel"
        if job.fate == "run_out" or r.stop.reason != want:
            problems.append(f"a stop record ({r.stop.reason}) for fate {job.fate}")
        if r.outcome in ("cancelled", "timed_out") and r.started and not r.stop.landed:
            problems.append(f"{r.outcome} although the stop did not land")
        if not r.started and (job.fate != "scope_cancel" or r.outcome != "cancelled"):
            problems.append(f"never started, {r.outcome}")
        if r.stop.landed and r.outcome not in ("cancelled", "timed_out"):
            problems.append(f"the stop landed but the outcome is {r.outcome}")
        if job.fate == "force" and r.stop.landed and r.stop.kill_because != "force":
            problems.append(f"a forced stop killed because {r.stop.kill_because}")
    elif r.outcome in ("cancelled", "timed_out") and r.started:
        problems.append(f"{r.outcome} without a stop record")
    if job.kind == "term_ignorer" and r.started and r.outcome == "cancelled" and \
            r.stop is not None and r.stop.reached != "killed" and not (
                r.signal == 15  # the stop came before the shell had set its trap
                or (r.exit_code == 0 and (r.stop.signalled_after_s or 0) > 0.7)):  # ran out
        problems.append(f"a TERM-ignorer ended by a stop that reached only {r.stop.reached}: "
                        f"exit {r.exit_code}, signal {r.signal}, stop {r.stop}")
    problems += [f"stdout: {p}" for p in check_output(job, r.output_stdout)]
    if r.output_stderr.total:
        problems.append(f"stderr: {r.output_stderr.data[:200]!r}")
    size = WRITE_SIZES.get(job.kind)
    if size is not None and r.outcome == "succeeded" and r.output_stdout.total != size:
        problems.append(f"wrote {size} bytes, {r.output_stdout.total} counted")
    return [f"{job.name} ({job.kind}, {job.fate}): {p}" for p in problems]


async def run_jobs(sup: supervisor.Supervisor, jobs: list[Job], mark: str,
                   mount: str) -> collections.Counter[str]:
    """Run ``jobs`` CONCURRENCY at a time, each to its record; check every record (exactly
    one per job, by name, and what it says); the outcomes counted."""
    pending = iter(jobs)

    async def worker() -> None:
        for job in pending:
            await run_job(sup, job, spec_for(job, mark, mount))

    async with trio.open_nursery() as nursery:
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker)
    by_name: dict[str | None, list[TaskResult]] = collections.defaultdict(list)
    for r in sup.results.values():
        by_name[r.name].append(r)
    problems = [f"{job.name}: {len(by_name[job.name])} records"
                for job in jobs if len(by_name[job.name]) != 1]
    for job in jobs:
        if len(by_name[job.name]) == 1:
            problems += check_record(job, by_name[job.name][0])
    assert not problems, f"{len(problems)} problems, the first 20:\n" + "\n".join(problems[:20])
    return collections.Counter(str(by_name[job.name][0].outcome) for job in jobs)


def sup_children(sup: supervisor.Supervisor) -> list[str]:
    """Cgroups left in the supervisor's root."""
    return [d for d in os.listdir(sup.cgroup_root)
            if os.path.isdir(os.path.join(sup.cgroup_root, d))]
