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
