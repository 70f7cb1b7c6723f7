"""Shared helpers for the benchmark scripts (not a benchmark itself).

Each ``bench_*.py`` imports this from its own directory (``sys.path[0]``).  What is here:
medians and ratio lines, a scratch cgroup that is always emptied and removed, a raised
RLIMIT_NOFILE, ``run_trio``, which turns SIGINT and SIGTERM into a clean cancellation, and
``compile_project`` for the start-up benchmarks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from cgroupfs import Cgroup, find_cgroup2_mount

__all__ = [
    "compile_project",
    "empty_and_remove",
    "fmt_ratio",
    "host_note",
    "median",
    "paired_ratio",
    "raise_nofile",
    "run_trio",
    "scratch_cgroup",
]


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def fmt_ratio(ours: float, base: float) -> str:
    return f"{ours / base:.2f}x" if base else "n/a"


def paired_ratio(ours: Sequence[float], base: Sequence[float]) -> float:
    """Median over rounds of ours[i] / base[i]: each round's two figures were taken moments
    apart, so a slow spell on this shared box hits both; more robust than a ratio of medians."""
    return statistics.median(o / b for o, b in zip(ours, base, strict=True))


def raise_nofile(needed: int) -> str:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit if ``needed`` exceeds it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return f"RLIMIT_NOFILE soft {soft} >= {needed} needed: left as is"
    if hard != resource.RLIM_INFINITY and hard < needed and os.geteuid() == 0:
        try:  # (root may raise the hard limit too, up to fs.nr_open)
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return f"RLIMIT_NOFILE raised {soft}:{hard} -> {needed}:{needed} (root)"
        except (ValueError, OSError):
            pass
    new = hard if hard != resource.RLIM_INFINITY else max(needed, soft)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    msg = f"RLIMIT_NOFILE soft raised {soft} -> {new} (hard {hard}) for {needed} fds"
    if new < needed:
        msg += " -- STILL TOO LOW, expect EMFILE"
    return msg


def empty_and_remove(cg: Cgroup, timeout: float = 10.0) -> None:
    """cgroup.kill every cgroup below and including ``cg`` (one we made), wait, rmdir all.

    Never raises for "already gone"; closes ``cg``.
    """
    if cg.closed:
        return
    try:
        if cg.is_populated():
            cg.kill()
            if not cg.wait_unpopulated(timeout):
                print(f"WARNING: {cg.path} still populated {timeout}s after cgroup.kill",
                      file=sys.stderr)
        cg.remove(recursive=True, busy_timeout=5.0)
    except OSError as e:
        if e.errno != errno.ENOENT:
            print(f"WARNING: removing {cg.path}: {e}", file=sys.stderr)
        cg.close()


@contextlib.contextmanager
def scratch_cgroup(tag: str) -> Iterator[Cgroup]:
    """A fresh ``corral-bench-<tag>-<pid>-<hex>`` under the cgroup2 mount, emptied and removed
    on the way out, whatever happens (exceptions, Ctrl-C)."""
    mount = find_cgroup2_mount().mount_point
    with Cgroup.open(mount) as root:
        cg = root.make_child(f"corral-bench-{tag}-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        yield cg
    finally:
        empty_and_remove(cg)


_interrupted: list[int] = []


async def _signals_cancel(scope: Any, *, task_status: Any) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for sig in signals:
            if not _interrupted:
                _interrupted.append(sig)
                print(f"\n{signal.Signals(sig).name}: stopping the benchmark; its tasks are "
                      f"stopped and its cgroups removed first", file=sys.stderr)
                scope.cancel()
            else:
                print(f"{signal.Signals(sig).name}: still cleaning up (SIGKILL would leave "
                      f"processes and cgroups behind)", file=sys.stderr)


def run_trio(fn: Callable[..., Awaitable[Any]], *args: Any) -> tuple[int, Any]:
    """``trio.run(fn, work, *args)`` with SIGINT and SIGTERM cancelling ``work``.

    ``work`` is a fresh ``trio.CancelScope`` that ``fn`` enters *inside* its
    ``open_supervisor()`` block (``async with open_supervisor() as sup: with work: ...``), so
    that an interruption stops the tasks through the supervisor's own path (graceful stop,
    leaves removed) and then closes the supervisor normally.  Two things this avoids (see the
    README's "supervisor issues"): trio's KeyboardInterrupt lands in whatever code runs, even
    inside a task's shielded cleanup, leaving its process and leaf behind; and cancelling a
    scope *around* ``open_supervisor`` kills its inotify watcher while tasks still need it.

    ``fn`` should return ``None`` when ``work.cancelled_caught``.  Returns (exit status, what
    ``fn`` returned): 128 + the signal when interrupted.
    """
    import trio

    out: list[Any] = []
    work = trio.CancelScope()

    async def wrapper() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(_signals_cancel, work)
            out.append(await fn(work, *args))
            nursery.cancel_scope.cancel()

    trio.run(wrapper)
    if _interrupted:
        return 128 + _interrupted[0], None
    return 0, out[0]


def sync_sigterm_as_interrupt() -> None:
    """For plain (non-trio) scripts: SIGTERM raises KeyboardInterrupt, so ``finally`` runs."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def host_note() -> str:
    """Commit, load average and CPU count: the conditions a figure was taken in."""
    try:
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        load = "?"
    commit = "?"
    try:
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--",
                                "../supervisor", "../cgroupfs", "../native"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if dirty:
            commit += "+dirty"
    except (OSError, subprocess.SubprocessError):
        pass
    return (f"[{time.strftime('%Y-%m-%d %H:%M:%S')}, commit {commit}, load {load}, "
            f"{os.cpu_count()} cpus, python {sys.version.split()[0]}]")


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compile_project() -> str:
    """Byte-compile corral's packages (what pip does when it installs them), so that a
    start-up measures corral, not the compiler: with PYTHONDONTWRITEBYTECODE set (as here) or
    a source newer than its .pyc, every start of a checkout recompiled the modules it imports
    (``corral run``: ~130 ms of ~370).  Returns a line to print."""
    import compileall

    import cgroupfs
    import supervisor

    dirs = [os.path.dirname(m.__file__ or "") for m in (supervisor, cgroupfs)]
    ok = all(compileall.compile_dir(d, quiet=1) for d in dirs)
    return f"byte-compiled {', '.join(dirs)} first ({'ok' if ok else 'with errors'})"
