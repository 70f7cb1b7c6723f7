"""Output benchmark: 1 GiB of stdout through the supervisor's capture, against dd | cat.

Ours: ``await sup.run(["dd", "if=/dev/zero", "bs=1M", "count=1024"])`` -- the task writes
1 GiB into its stdout pipe and the supervisor's pump drains it (keeping the default head and
tail, counting the rest); timed with perf_counter around the call, so the task's spawn, leaf
and record are in it too (a millisecond or so: noise at this size).

Floor, in the same run: ``sh -c 'dd if=/dev/zero bs=1M count=1024 | cat > /dev/null'`` run by
``subprocess.run``, timed the same way: the same writer, with a C reader on the pipe (cat's
default pipe size, not the 1 MiB the supervisor asks for).

For information, two more figures: dd -> cat through a pipe enlarged to 1 MiB (the pipe size the
supervisor asks for: the same C reader without the 64 KiB pipe's wake-up per 64 KiB); and the
same dd read by this Python process itself, blocking
``os.readv`` into one 1 MiB buffer from a pipe enlarged to 1 MiB (what the supervisor's pump
does, minus trio, the leaf and the capture): it separates "a Python reader" from "our pump".
Note: the dd | cat floor, with its 64 KiB pipe, suffers most when the other core is busy (each
64 KiB is a wake-up); read the figures with the load average printed alongside.

Reported: GB/s (10^9 bytes/s) of each, and ours/floor as a throughput ratio.  Target: >= 0.85.
The two alternate in rounds; medians.  Nothing is asserted about time.

    python benchmarks/bench_output.py [--quick] [--mib 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import time

import trio
from _common import host_note, median, paired_ratio, run_trio

import supervisor


def floor_once(mib: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", f"dd if=/dev/zero bs=1M count={mib} status=none | "
                                f"cat > /dev/null"], check=True)
    return time.perf_counter() - t0


def cat_big_pipe_once(mib: int) -> float:
    """dd -> cat through a pipe enlarged to 1 MiB, as the supervisor's pipes are."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 1 << 20)
        t0 = time.perf_counter()
        with open(os.devnull, "wb") as null, \
                subprocess.Popen(["dd", "if=/dev/zero", "bs=1M", f"count={mib}", "status=none"],
                                 stdout=w) as dd, \
                subprocess.Popen(["cat"], stdin=r, stdout=null) as cat:
            os.close(w)
            w = -1
            os.close(r)
            r = -1
        dt = time.perf_counter() - t0
        if dd.returncode or cat.returncode:
            raise RuntimeError(f"dd | cat failed: {dd.returncode}, {cat.returncode}")
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
    return dt


def python_reader_once(mib: int) -> float:
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 1 << 20)
        buf = bytearray(1 << 20)
        total = 0
        t0 = time.perf_counter()
        with subprocess.Popen(["dd", "if=/dev/zero", "bs=1M", f"count={mib}", "status=none"],
                              stdout=w):
            os.close(w)
            w = -1
            while n := os.readv(r, [buf]):
                total += n
        dt = time.perf_counter() - t0
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    if total != mib << 20:
        raise RuntimeError(f"read {total} bytes, expected {mib << 20}")
    return dt


async def ours_once(sup: supervisor.Supervisor, mib: int) -> float:
    t0 = time.perf_counter()
    r = await sup.run(["dd", "if=/dev/zero", "bs=1M", f"count={mib}", "status=none"])
    dt = time.perf_counter() - t0
    if r.outcome != "succeeded" or r.output_stdout.total != mib << 20:
        raise RuntimeError(f"dd did not deliver {mib} MiB: {r.outcome}, "
                           f"{r.output_stdout.total} bytes")
    return dt


async def amain(work: trio.CancelScope, args: argparse.Namespace) -> None:
    print(host_note())
    nbytes = args.mib << 20
    floor: list[float] = []
    pyread: list[float] = []
    bigcat: list[float] = []
    ours: list[float] = []
    async with supervisor.open_supervisor(retain_results=4) as sup:
        print(f"supervisor cgroup: {sup.cgroup_root}")
        with work:
            floor_once(16)
            await ours_once(sup, 16)  # warm-up
            for rnd in range(args.rounds):
                floor.append(floor_once(args.mib))
                pyread.append(python_reader_once(args.mib))
                bigcat.append(cat_big_pipe_once(args.mib))
                ours.append(await ours_once(sup, args.mib))
                print(f"  round {rnd + 1}/{args.rounds}: floor {nbytes / floor[-1] / 1e9:5.2f} "
                      f"GB/s, cat 1 MiB pipe {nbytes / bigcat[-1] / 1e9:5.2f} GB/s, python "
                      f"reader {nbytes / pyread[-1] / 1e9:5.2f} GB/s, ours "
                      f"{nbytes / ours[-1] / 1e9:5.2f} GB/s, ours/floor "
                      f"{floor[-1] / ours[-1]:.2f}", flush=True)
    if work.cancelled_caught:
        return

    f, o = median(floor), median(ours)
    print()
    print(f"output benchmark: {args.mib} MiB of stdout, {args.rounds} rounds, medians")
    print(f"  floor: dd | cat > /dev/null      {f * 1e3:8.1f} ms  {nbytes / f / 1e9:5.2f} GB/s")
    b = median(bigcat)
    print(f"  info:  dd -> cat, 1 MiB pipe       {b * 1e3:8.1f} ms  {nbytes / b / 1e9:5.2f} GB/s"
          f"  ({1 / paired_ratio(bigcat, floor):.2f} of the floor; ours is "
          f"{1 / paired_ratio(ours, bigcat):.2f} of it)")
    p = median(pyread)
    print(f"  info:  dd -> python readv 1 MiB   {p * 1e3:8.1f} ms  {nbytes / p / 1e9:5.2f} GB/s"
          f"  ({1 / paired_ratio(pyread, floor):.2f} of the floor)")
    print(f"  ours:  sup.run(dd), captured     {o * 1e3:8.1f} ms  {nbytes / o / 1e9:5.2f} GB/s"
          f"  ({1 / paired_ratio(ours, pyread):.2f} of the python reader)")
    print(f"  throughput ratio ours/floor {1 / paired_ratio(ours, floor):.2f} (from the median "
          f"of the rounds' time ratios)   target >= 0.85")
    print(f"  at the end: {host_note()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB x 2 rounds")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if args.quick:
        args.mib, args.rounds = 64, 2
    status, _ = run_trio(amain, args)
    return status


if __name__ == "__main__":
    sys.exit(main())
