"""`corral run -- /bin/true` wall time, against the interpreter's own start-up and systemd-run.

1. On the host: ``corral run -- /bin/true`` against ``python -c "import trio"`` with the same
   interpreter, interleaved in rounds (target: <= 1.2x: corral's own start-up, placement,
   spawn and cleanup add little over the interpreter and trio).
2. In a systemd booted in namespaces (the tests' fixture, tests/systemd_tier/systemd_sandbox.py):
   ``corral run -- /bin/true`` (which asks systemd for a delegated scope over D-Bus) against
   ``systemd-run --scope /bin/true``.  Both start the same way: ``nsenter`` into the sandbox,
   a shell that moves itself into a plain cgroup there (as a login session would be: not
   delegated), then ``exec`` of the command.

    python benchmarks/bench_cli.py [--quick] [--rounds 15] [--no-systemd]

Prints medians and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from _common import compile_project

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
HERE = Path(__file__).resolve().parent


def wall(argv: Sequence[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def compare(label: str, ours: Sequence[str], base: Sequence[str], base_label: str,
            rounds: int, target: str) -> None:
    wall(ours), wall(base)  # warm the page cache for both
    a, b = [], []
    for _ in range(rounds):
        a.append(wall(ours))
        b.append(wall(base))
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
    print(f"  {label}: corral run -- /bin/true {ma * 1e3:7.1f} ms | {base_label} "
          f"{mb * 1e3:7.1f} ms | ratio {ratio:.2f}x (target {target})")


# ``corral run -- /bin/true`` in-process after ``import trio``: the time of each part (stderr:
# ``-X importtime`` of every module imported after trio's, and one line of ours)
BREAKDOWN = """
import dataclasses, sys, time
import trio
made, spent = 0, 0.0
process_class = dataclasses._process_class
def timed(*args, **kwargs):
    global made, spent
    t = time.perf_counter()
    try:
        return process_class(*args, **kwargs)
    finally:
        made += 1
        spent += time.perf_counter() - t
dataclasses._process_class = timed
sys.argv = ["corral", "run", "--", "/bin/true"]
t0 = time.perf_counter()
from supervisor.cli import main
try:
    main()
except SystemExit:
    pass
print(f"corral-breakdown {time.perf_counter() - t0} {made} {spent}", file=sys.stderr)
"""


def breakdown(rounds: int) -> None:
    """Where ``corral run``'s time above ``import trio`` goes: corral's imports (the modules
    it imports after trio's, by ``-X importtime``; of them, making its dataclasses: each
    method of each is compiled at import by CPython 3.11's dataclasses) and the run itself
    (placement, the keeper, the spawn, the wait, the clean-up), medians of ``rounds``."""
    totals, imports, classes, made = [], [], [], 0
    for _ in range(rounds):
        r = subprocess.run([sys.executable, "-X", "importtime", "-c", BREAKDOWN],
                           capture_output=True, text=True, check=True,
                           stdin=subprocess.DEVNULL)
        after_trio, us = False, 0
        for line in r.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                self_us, _, name = line[len("import time:"):].split("|")
                if after_trio:
                    us += int(self_us)
                after_trio = after_trio or name.strip() == "trio"
            elif line.startswith("corral-breakdown "):
                total, made_s, spent = line.split()[1:]
                totals.append(float(total))
                classes.append(float(spent))
                made = int(made_s)
        imports.append(us / 1e6)
    total, imp, cls = (statistics.median(x) * 1e3 for x in (totals, imports, classes))
    print(f"  where it goes, in-process after import trio ({rounds} rounds, medians): "
          f"{total:.1f} ms = corral's imports {imp:.1f} ms (of which making {made} "
          f"dataclasses {cls:.1f} ms) + the run {total - imp:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 rounds, no systemd")
    ap.add_argument("--no-systemd", action="store_true")
    args = ap.parse_args()
    rounds = 3 if args.quick else args.rounds
    print(compile_project())
    print(f"corral run start-up, {rounds} rounds, medians")
    compare("host", [CORRAL, "run", "--", "/bin/true"],
            [sys.executable, "-c", "import trio"], 'python -c "import trio"', rounds, "<= 1.2x")
    breakdown(rounds)
    if args.quick or args.no_systemd:
        return 0
    sys.path.insert(0, str(HERE.parent / "tests" / "systemd_tier"))
    from systemd_sandbox import SandboxUnavailable, SystemdSandbox

    try:
        sb = SystemdSandbox.boot()
    except SandboxUnavailable as e:
        print(f"  systemd: skipped, cannot boot systemd in namespaces here: {e}")
        return 0
    session = sb.host_path("corral-bench-session")
    os.mkdir(session)
    enter = 'echo $$ > /sys/fs/cgroup/corral-bench-session/cgroup.procs && exec "$@"'
    try:
        compare("systemd", sb.command(["sh", "-c", enter, "sh", CORRAL, "run", "--",
                                       "/bin/true"]),
                sb.command(["sh", "-c", enter, "sh", "systemd-run", "--scope", "--quiet",
                            "/bin/true"]),
                "systemd-run --scope /bin/true", rounds, "report")
    finally:
        os.rmdir(session)
        sb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
