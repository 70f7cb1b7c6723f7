"""``python -m benchmarks report``: every benchmark at one size, one Markdown table.

Each ``bench_*.py`` runs as its own process, as documented in benchmarks/README.md, and keeps
printing its own figures (ours and a baseline measured in the same run, their ratio, the
target); this module runs them one after another, reads those printed figures back, and
writes one table: benchmark, ours, baseline, ratio, target, met?, under a header that says
what machine, kernel, commit and load the figures were taken on.  The raw output of every
script follows the table, so that a figure can be checked against what printed it.

Confinement: several benchmarks open supervisors that would place their roots at the top of
the host's cgroup2 mount.  Here each script runs in a cgroup namespace whose root is a scratch
cgroup ``corral-bench-report-<hex>`` made for it (``unshare --cgroup --mount``, with cgroup2
mounted again over the discovered mount point inside, and ``/proc/self/cgroup`` checked to read
``0::/`` before the script starts): whatever it creates lands below that scratch cgroup, which
is emptied (``cgroup.kill``) and removed afterwards.  Nothing asserts anything about time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# What each size passes to each script (no entry: the script's defaults).
SIZES: dict[str, dict[str, list[str]]] = {
    "quick": {"spawn": ["--quick"], "run": ["--quick"], "kill": ["--quick"],
              "output": ["--quick"], "memory": ["--quick"], "cli": ["--quick"],
              "keeper": ["--quick"], "isolation": ["--quick"],
              "serve": ["--rounds", "30", "--held", "100", "--clients", "4"],
              "sessions": ["--quick"], "tenants": ["--quick"]},
    "full": {"cli": ["--no-systemd"]},
}
ORDER = ("spawn", "run", "kill", "output", "memory", "cli", "keeper", "isolation", "serve",
         "sessions", "tenants")


@dataclass
class Row:
    benchmark: str
    ours: str
    baseline: str
    ratio: str
    target: str
    met: str


# ---- reading each script's figures --------------------------------------------------------

NUM = r"([0-9.]+)"


def _met(ratio: float, target: str) -> str:
    m = re.fullmatch(r"([<>]=) ?([0-9.]+)x?", target)
    if m is None:
        return "-"
    bound = float(m.group(2))
    return "yes" if (ratio <= bound if m.group(1) == "<=" else ratio >= bound) else "no"


def parse_spawn(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(rf"concurrency +(\d+): posix_spawn\+waitpid +{NUM} us/task .*?\| "
                         rf"leaf\+clone3\+pidfd wait\+rmdir +{NUM} us/task .*?\| ratio {NUM}x",
                         out):
        conc, base, ours, ratio = m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
        target = "<= 1.3x" if conc == "1" else "(report)"
        rows.append(Row(f"spawn (leaf + clone3 + wait + rmdir), concurrency {conc}",
                        f"{ours:.0f} us/task", f"posix_spawn + waitpid {base:.0f} us/task",
                        f"{ratio}x", target, _met(float(ratio), target)))
    return rows


def parse_run(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(rf"^(sequential|run_batch c=16|nursery c=16) +{NUM} us/task +{NUM}/s "
                         rf"+{NUM} us/task +{NUM}/s +{NUM}x +(.*)$", out, re.M):
        name, base_us, base_rate, ours_us, ours_rate, ratio, target = m.groups()
        target = target.strip()
        target = "(report)" if target.startswith("(none") else target
        rows.append(Row(f"sup.run(/bin/true), {name}", f"{float(ours_us):.0f} us/task "
                        f"({ours_rate}/s)", f"posix_spawn {float(base_us):.0f} us/task "
                        f"({base_rate}/s)", f"{ratio}x", target, _met(float(ratio), target)))
    return rows


def parse_kill(out: str) -> list[Row]:
    floor = re.search(rf"floor: .*? +{NUM} ms", out)
    ours = re.search(rf"ours: +task\.stop\(force=True\) .*? +{NUM} ms", out)
    ratio = re.search(rf"ratio ours/floor {NUM}x", out)
    procs = re.search(r"kill benchmark: (\d+) sleeping", out)
    if not (floor and ours and ratio and procs):
        return []
    return [Row(f"forced stop of a task holding {procs.group(1)} sleeps",
                f"{ours.group(1)} ms", f"cgroup.kill until populated 0 {floor.group(1)} ms",
                f"{ratio.group(1)}x", "<= 1.2x", _met(float(ratio.group(1)), "<= 1.2x"))]


def parse_output(out: str) -> list[Row]:
    floor = re.search(rf"floor: dd \| cat > /dev/null +{NUM} ms +{NUM} GB/s", out)
    ours = re.search(rf"ours: +sup\.run\(dd\), captured +{NUM} ms +{NUM} GB/s", out)
    ratio = re.search(rf"throughput ratio ours/floor {NUM}", out)
    size = re.search(r"output benchmark: (\d+) MiB", out)
    if not (floor and ours and ratio and size):
        return []
    return [Row(f"{size.group(1)} MiB of stdout captured", f"{ours.group(2)} GB/s",
                f"dd | cat {floor.group(2)} GB/s", ratio.group(1), ">= 0.85",
                _met(float(ratio.group(1)), ">= 0.85"))]


def parse_memory(out: str) -> list[Row]:
    floor = re.search(rf"floor \(bare trio \+ fds\) +{NUM} KiB", out)
    ours = re.search(rf"ours {NUM} KiB/task \(Rss\) .*?ratio to floor {NUM}x", out)
    held = re.search(r"memory benchmark: (\d+) sleep tasks", out)
    if not (floor and ours and held):
        return []
    kib = float(ours.group(1))
    return [Row(f"supervisor memory per held task ({held.group(1)} held)", f"{kib:.2f} KiB",
                f"bare trio holder {float(floor.group(1)):.2f} KiB", f"{ours.group(2)}x",
                "<= 9 KiB", "yes" if kib <= 9 else "no")]


def parse_cli(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(rf"(host|systemd): corral run -- /bin/true +{NUM} ms \| (.*?) +{NUM} "
                         rf"ms \| ratio {NUM}x \(target (.*?)\)", out):
        where, ours, base_name, base, ratio, target = m.groups()
        target = "(report)" if target == "report" else target
        rows.append(Row(f"`corral run -- /bin/true` start-up ({where})", f"{ours} ms",
                        f"{base_name} {base} ms", f"{ratio}x", target,
                        _met(float(ratio), target)))
    return rows


def parse_keeper(out: str) -> list[Row]:
    gone = re.findall(rf"every process gone after the SIGKILL: median +{NUM} ms, p95 +{NUM} ms, "
                      rf"max +{NUM} ms", out)
    survivors = re.search(r"survivors .*?: (\d+) \(of (\d+) processes\)", out)
    rounds = re.search(r"(\d+) rounds\n", out)
    if not gone or not survivors:
        return []
    ours = gone[0]
    base = f"bwrap --die-with-parent {gone[1][0]} ms" if len(gone) > 1 else "(bwrap missing)"
    ratio = f"{float(ours[0]) / float(gone[1][0]):.2f}x" if len(gone) > 1 else "-"
    met = "yes" if float(ours[2]) <= 1000 and survivors.group(1) == "0" else "no"
    return [Row(f"SIGKILLed supervisor: all processes gone ({rounds.group(1) if rounds else '?'}"
                f" rounds)", f"median {ours[0]} ms, max {ours[2]} ms, {survivors.group(1)} "
                f"survivors", base, ratio, "<= 1 s, 0 survivors", met)]


def parse_isolation(out: str) -> list[Row]:
    ours = re.search(rf"ours, full +{NUM} us", out)
    floor = re.search(rf"C floor, full +{NUM} us", out)
    ratio = re.search(rf"ratio ours / C floor, full +wall {NUM}x, CPU {NUM}x", out)
    if not (ours and floor and ratio):
        return []
    return [Row("spawn with isolation (netns, mounts, user)", f"{ours.group(1)} us/task",
                f"C program, same syscalls {floor.group(1)} us/task",
                f"{ratio.group(1)}x (CPU {ratio.group(2)}x)", "<= 1.15x",
                _met(float(ratio.group(1)), "<= 1.15x"))]


def parse_serve(out: str) -> list[Row]:
    rows = []
    m = re.search(rf"socket {NUM} ms, in-process sup\.run {NUM} ms: {NUM}x .*?target in-process "
                  rf"\+ 1\.5 ms = {NUM} ms: (met|NOT met)", out)
    if m:
        rows.append(Row("`corral serve` submit-to-result of /bin/true", f"{m.group(1)} ms",
                        f"in-process sup.run {m.group(2)} ms", f"{m.group(3)}x",
                        "<= in-process + 1.5 ms", "yes" if m.group(5) == "met" else "no"))
    m = re.search(rf"tasks/s at (\d+) concurrent: socket {NUM}/s, in-process {NUM}/s: {NUM}x",
                  out)
    if m:
        rows.append(Row(f"`corral serve` tasks/s, {m.group(1)} clients", f"{m.group(2)}/s",
                        f"in-process {m.group(3)}/s", f"{m.group(4)}x", ">= 0.7x",
                        _met(float(m.group(4)), ">= 0.7x")))
    for m in re.finditer(rf"corral ps start-up \((\w+)\) {NUM} ms; python -c pass {NUM} ms \+ "
                         rf"request {NUM} ms = {NUM} ms: {NUM}x", out):
        where, ours, _, _, base, ratio = m.groups()
        rows.append(Row(f"`corral ps` start-up ({where})", f"{ours} ms",
                        f"python -c pass + one request {base} ms", f"{ratio}x",
                        "<= 1.3x", _met(float(ratio), "<= 1.3x")))
    m = re.search(rf"holding (\d+) running tasks {NUM} MiB .*?target 64 MiB: (met|NOT met)", out)
    if m:
        rows.append(Row(f"`corral serve` RSS holding {m.group(1)} tasks", f"{m.group(2)} MiB",
                        "-", "-", "<= 64 MiB", "yes" if m.group(3) == "met" else "no"))
    return rows


def parse_sessions(out: str) -> list[Row]:
    rows = []
    m = re.search(rf"session echo hi \((\d+) commands\): median {NUM} ms p90 {NUM} ms; plain "
                  rf"submit median {NUM} ms: {NUM}x \(goal <= 2x: (met|NOT met)\); in-process "
                  rf"sup\.run median {NUM} ms: {NUM}x; swe-rex session(?:: skipped \((.*)\)| "
                  rf"median {NUM} ms: {NUM}x \(goal <= 0\.1x: (met|NOT met)\))", out)
    if m:
        n, med, p90, submit, r_submit, met, inproc, r_inproc, skipped, rex, r_rex, rex_met = \
            m.groups()
        ours = f"median {med} ms, p90 {p90} ms"
        what = f"session exec of `echo hi` ({n} commands)"
        rows.append(Row(f"{what} vs plain submit", ours, f"submit with wait {submit} ms",
                        f"{r_submit}x", "<= 2x", "yes" if met == "met" else "no"))
        rows.append(Row(f"{what} vs in-process", ours, f"sup.run {inproc} ms", f"{r_inproc}x",
                        "(report)", "-"))
        if skipped is None:
            rows.append(Row(f"{what} vs swe-rex", ours, f"swe-rex LocalRuntime session "
                            f"{rex} ms", f"{r_rex}x", "<= 0.1x",
                            "yes" if rex_met == "met" else "no"))
        else:
            rows.append(Row(f"{what} vs swe-rex", ours, f"swe-rex skipped: {skipped}", "-",
                            "<= 0.1x", "-"))
    m = re.search(rf"daemon RSS idle sessions: 0 -> {NUM} MiB, (\d+) -> {NUM} MiB: "
                  rf"(-?[0-9.]+) KiB per session", out)
    if m:
        rows.append(Row(f"`corral serve` RSS with {m.group(2)} idle sessions",
                        f"{m.group(4)} KiB per session ({m.group(3)} MiB)",
                        f"no session open {m.group(1)} MiB", "-", "(report)", "-"))
    return rows


def parse_tenants(out: str) -> list[Row]:
    """One row per attack: the victim's p99 under it against its p99 alone."""
    rows = []
    for m in re.finditer(rf"^(\w+): .*\n  victim alone: median {NUM} ms, p99 {NUM} ms.*\n"
                         rf"  victim under attack: median {NUM} ms, p99 {NUM} ms.*\n"
                         rf"  p99 attack/alone {NUM}x .*?: (met|NOT met)", out, re.M):
        rows.append(Row(f"a tenant's submit-to-result under attack `{m.group(1)}` (p99)",
                        f"{m.group(5)} ms", f"alone {m.group(3)} ms", f"{m.group(6)}x",
                        "<= 3x, nothing unanswered", "yes" if m.group(7) == "met" else "no"))
    return rows


# What stands between a row and its target, as measured (profiles and CPU per task in
# docs/testing.md, "Where the time goes"), printed under the table for each row not met.
WHY_NOT = {
    "sup.run(/bin/true), sequential": (
        "what no task's life can skip is already 1.2-1.25x posix_spawn here: a leaf made and "
        "removed, clone3 into it and the pidfd awaited under trio (bench_run's floors line; "
        "the await alone 1.08x); 1.5x then leaves ~0.16 ms for the whole Python life (pipes, "
        "the driver, the accounting, the record), measured at ~0.66 ms: ~880 Python calls "
        "and ~3 scheduler rounds a task, no function above ~30 us of its own (cProfile), so "
        "three quarters of it would have to go"),
    "`corral serve` submit-to-result": (
        "per task the daemon's event loop parses an HTTP request and its JSON, checks the "
        "policy, waits for two durable records (accept and end: 0.4-0.5 ms each alone, an "
        "fsync in each), runs the task's life and encodes the answer: ~3x the library's CPU "
        "per task (bench_serve's CPU line: 3.8 ms against 1.2 on a fast VM, 5.2-5.9 against "
        "1.7-2.0 on a slow one), spread with no function above the native spawn's 15-24% of "
        "the loop's own (py-spy, docs/testing.md, \"Where the time goes\")"),
    "`corral serve` tasks/s": (
        "the daemon's main thread is the bottleneck: its CPU per task (bench_serve's CPU "
        "line) caps the rate at 1000 / that many tasks a second, whatever the clients; "
        "root's spawns in a worker thread, as a tenant's are, measured no faster (214 and "
        "185 tasks/s against 222 and 185)"),
    "`corral ps` start-up": (
        "the interpreter's start-up is most of it; what is left is the client's own imports "
        "(the client module and its socket, ~7 ms)"),
    "`corral run -- /bin/true` start-up": (
        "at the target, not under it in every run: since the records are made with one "
        "compiled method each (cgroupfs/_record.py), seven runs here gave 1.15-1.31x, median "
        "1.19x (five before: 1.26-1.39x, median 1.31x); what corral adds above `import trio` "
        "is its imports (~66-70 ms in-process on a slow VM, the records 10-12 of them) and "
        "the run (~21-25 ms): bench_cli's breakdown line"),
    "forced stop of a task holding 1000 sleeps": (
        "both sides wait for the kernel to empty a leaf of 1,001 processes, and the ratio "
        "moves with the machine and the run: 0.93x and 1.11x on earlier VMs; on the one that "
        "printed 1.30x in a report, run alone the same hour, 1.08x and 1.14x (met)"),
    "spawn with isolation": (
        "the floor is a C program making the same system calls; 1.14x on an earlier VM, "
        "1.19-1.26x on a slower one, where the code before and after the records' change "
        "(9945e20) measured alike back to back (1.22x, 1.19x)"),
    "session exec of `echo hi` (200 commands) vs swe-rex": (
        "swe-rex's session runs `echo` as a builtin of a bash already running, no process "
        "made; a corral session runs each command as a task of its own (a process, its "
        "cgroup, its two records), so the ratio is the machine's cost of a process: 0.040x "
        "where in-process sup.run of `sh -c \"echo hi\"` took 1.21 ms, 0.120x where it took "
        "3.38 ms (swe-rex 108.7 and 124.6 ms)"),
    "spawn (leaf + clone3": (
        "a leaf made and removed per task (mkdir, rmdir: ~0.1 ms) and the pidfd wait; the "
        "ratio moves between 1.08x and 1.34x from run to run here"),
    "a tenant's submit-to-result under attack `big_submissions`": (
        "a 1 MiB JSON body is parsed in one C call (~7 ms) that holds the GIL: the worker "
        "thread it runs in still takes the event loop's interpreter from under it"),
    "a tenant's submit-to-result under attack `big_environments`": (
        "a body of 65,000 variables is made into Python objects in one C call of json.loads "
        "(26-45 ms here; a pickle of the same dict still 14 ms) that holds the GIL whatever "
        "thread runs it; 8,192 variables: 2.8x. A helper process handing the body back in "
        "pieces would bound each call (docs/testing.md, attack 31)"),
    "a tenant's submit-to-result under attack `retention`": (
        "the attacker's submissions cost what the victim's do, and the turns are shared "
        "equally: its flood halves the victim's share of the event loop, by design"),
    "a tenant's submit-to-result under attack `keyed_flood`": (
        "the flood's task lives (~3 ms of the event loop each, ~300 a second) fill the loop; "
        "each round runs one step of the flood's and every step of the victim's "
        "(LoopShare._ration), and the records commit each flush's writes together: with the "
        "attacker's processes on a CPU of their own (--pin) the victim's median 25.8 -> 16.3 "
        "ms, p99 54.8 -> 39.4 (one round of the flood's step at each of its ~20 rounds is "
        "still more than its own)"),
    "a tenant's submit-to-result under attack `two_floods`": (
        "two tenants' 12 submissions in flight take the loop and both CPUs (the daemon ~85% "
        "of one, their clients and tasks the rest); pinned, the victim's median 71 -> 23 ms "
        "(one flush at a time in the records, 1.5 writes a commit before; the loop's rounds "
        "rationed), p99 107 -> 42: its request still waits for the floods' steps in its "
        "rounds and for their writes in its records' flushes"),
    "a tenant's submit-to-result under attack `spinning_tasks`": (
        "the CPU floor: 16 processes spinning beside the victim's task (the row "
        "spinning_floor, the same processes outside the daemon, is the floor), and the "
        "daemon's tasks share its scheduler autogroup; with the cpu controller each uid's "
        "tasks are in a group of their own and weigh as one (docs/testing.md, attack 39)"),
    "a tenant's submit-to-result under attack `session_hoard`": (
        "the 16 shells' own CPU (see spinning_tasks): since 6c1c49d a report of more "
        "variables than the uid may keep is refused on its count, before any is read; "
        "the row measured the same before and after that change"),
    "a tenant's submit-to-result under attack `slow_headers`": (
        "met on a VM twice as fast (2.84x); on a slower one 4.5-4.9x with the code before "
        "and after the records' change alike (back to back): the machine, not the change; "
        "not profiled on it further"),
    "a tenant's submit-to-result under attack `terminal_resizes`": (
        "met on a VM twice as fast (2.19x); on a slower one 4.2-5.0x before and after the "
        "records' change alike (back to back): the machine, not the change; not profiled "
        "on it further"),
    "a tenant's submit-to-result under attack `dribbled_heads`": (
        "400 connections each sending a 10 KB head in pieces (attack 34): 9.85x (74 ms) "
        "on a fast VM, 3.01x (249 ms) on a slower one, the victim's own p99 alone 7.5 and "
        "82.6 ms: at the goal, not under it"),
    "a tenant's submit-to-result under attack `subscribers`": (
        "16 unread event streams take every event of the attacker's flood of `true` "
        "(one per state change), on top of that flood's own task lives (see keyed_flood)"),
    "a tenant's submit-to-result under attack `session_env`": (
        "each command of a session carries the session's whole environment (840 KB here) in "
        "its request and its report: the records keep it once per uid since schema 9 (it was "
        "written with every command's record, ~30 MB/s) and the answer no longer sends it "
        "back, but each command's is still encoded and hashed (~2.5 ms) and its report "
        "parsed, weighed and compared, in the worker thread, whose Python shares the GIL "
        "with the loop (a run of this row alone on 1c0145d: 4.41x, p99 11.6 -> 51.3 ms)"),
    "a tenant's submit-to-result under attack `session_vars`": (
        "each of the attacker's commands runs a shell loop of 3,000 exports (~70 ms of a "
        "CPU), and with two CPUs its shells take the victim's; the daemon's part, with the "
        "shells on a CPU of their own (--pin): 2.91x (9.43x before its work by the variable "
        "left the event loop; unpinned 11.79x -> 4.57x, cpu_floor 2.43x in that run)"),
}


PARSERS: dict[str, Callable[[str], list[Row]]] = {
    "spawn": parse_spawn, "run": parse_run, "kill": parse_kill, "output": parse_output,
    "memory": parse_memory, "cli": parse_cli, "keeper": parse_keeper,
    "isolation": parse_isolation, "serve": parse_serve, "sessions": parse_sessions,
    "tenants": parse_tenants,
}


# ---- running them ----------------------------------------------------------------------------

def cgroup2_mount() -> str:
    sys.path.insert(0, str(HERE.parent))
    from cgroupfs import find_cgroup2_mount

    return find_cgroup2_mount().mount_point


@contextlib.contextmanager
def scratch_cgroup(mount: str, prefix: str = "corral-bench-report") -> Iterator[str]:
    """A fresh ``<prefix>-<hex>`` below the cgroup2 mount; killed and removed after, with
    everything below it."""
    path = os.path.join(mount, f"{prefix}-{secrets.token_hex(4)}")
    os.mkdir(path)
    try:
        yield path
    finally:
        _destroy(path)


def _destroy(path: str) -> None:
    if not os.path.isdir(path):
        return
    fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    deadline = time.monotonic() + 30
    while "populated 1" in Path(path, "cgroup.events").read_text():
        if time.monotonic() > deadline:
            print(f"WARNING: {path} still populated 30 s after cgroup.kill", file=sys.stderr)
            return
        time.sleep(0.01)
    for root, _dirs, _files in sorted(os.walk(path), key=lambda w: -w[0].count("/")):
        for _ in range(200):
            try:
                os.rmdir(root)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


# In the new namespaces: refuse to start unless our cgroup is the namespace's root, then
# mount cgroup2 again over the mount point (the old mount shows the host's tree; a new one
# shows the namespace's: what the script finds through /proc/self/mountinfo).
CONFINE = ('grep -qx "0::/" /proc/self/cgroup || { echo "not confined: $(grep ^0:: '
           '/proc/self/cgroup)" >&2; exit 125; }; umount -l "$1" && '
           'mount -t cgroup2 cgroup2 "$1" && shift && exec "$@"')


def run_confined(scratch: str, mount: str, command: list[str],
                 **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run(``command``) in the cgroup ``scratch`` (entered before exec), inside a
    cgroup namespace over it with cgroup2 mounted again at ``mount`` (:data:`CONFINE`):
    whatever it makes lands in the scratch cgroup, never at the top of the host's tree."""
    procs = os.path.join(scratch, "cgroup.procs")

    def enter() -> None:  # in the child, before exec: into the scratch cgroup
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    argv = ["unshare", "--cgroup", "--mount", "--propagation", "private", "--", "sh", "-c",
            CONFINE, "confine", mount, *command]
    return subprocess.run(argv, preexec_fn=enter, **kwargs)


def run_one(name: str, size: str, mount: str, timeout: float) -> tuple[int, str, float]:
    """Run bench_NAME.py confined to a scratch cgroup; (status, output, seconds)."""
    script = HERE / f"bench_{name}.py"
    args = SIZES[size].get(name, [])
    with scratch_cgroup(mount) as scratch:
        t0 = time.monotonic()
        try:
            r = run_confined(scratch, mount, [sys.executable, str(script), *args],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=timeout, cwd=HERE.parent)
            status, out = r.returncode, r.stdout + (f"\n[stderr]\n{r.stderr}" if r.stderr else "")
        except subprocess.TimeoutExpired as e:
            status = 124
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or "")
            out += f"\n[timed out after {timeout:.0f} s]"
        return status, out, time.monotonic() - t0


def machine_header(size: str) -> str:
    sys.path.insert(0, str(HERE))
    from _common import host_note  # type: ignore[import-not-found]

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    controllers = "?"
    with contextlib.suppress(OSError):
        controllers = Path(cgroup2_mount(), "cgroup.controllers").read_text().strip() or "none"
    return (f"Machine: {platform.node()}, {os.cpu_count()} x {cpu}, {mem} RAM; kernel "
            f"{platform.release()}; cgroup2 at {cgroup2_mount()} (controllers: {controllers})."
            f"  \nRun: {host_note()}; size `{size}`.")


def render(size: str, header: str, rows: list[Row], runs: dict[str, tuple[int, str, float]],
           ) -> str:
    lines = [f"# corral benchmark report ({size})", "", header, "",
             "Ours and the baseline are measured in the same run, alternating in rounds; the "
             "ratio is what to read (this box is shared: absolute figures move by +-30%).", "",
             "| benchmark | ours | baseline | ratio | target | met? |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.benchmark} | {r.ours} | {r.baseline} | {r.ratio} | {r.target} | "
                     f"{r.met} |")
    unmet = [r for r in rows if r.met == "no"]
    if unmet:
        lines += ["", "Not met, and the measured reason (docs/testing.md, \"Where the time "
                  "goes\", has the profiles):", ""]
        for r in unmet:
            why = next((text for prefix, text in WHY_NOT.items()
                        if r.benchmark.startswith(prefix)), "no reason measured yet")
            lines.append(f"- {r.benchmark} ({r.ratio}): {why}")
    failed = [f"bench_{n}.py (exit {s})" for n, (s, _, _) in runs.items() if s != 0]
    unread = [f"bench_{n}.py" for n, (s, out, _) in runs.items()
              if s == 0 and not PARSERS[n](out)]
    lines.append("")
    if failed or unread:
        lines.append(f"Not in the table: {', '.join(failed + unread)} (output below).")
        lines.append("")
    lines.append("Seconds per script: " + ", ".join(f"{n} {t:.0f}"
                                                     for n, (_, _, t) in runs.items()) + ".")
    lines += ["", "## Raw output", ""]
    for n, (s, out, _) in runs.items():
        lines += [f"### bench_{n}.py (exit {s})", "", "```", out.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks report",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="full",
                    help="quick: each script's smoke size (a few minutes in all); full: the "
                         "scripts' own defaults (the figures to quote; ~15-30 min here)")
    ap.add_argument("--only", nargs="+", choices=ORDER, metavar="NAME",
                    help=f"run only these ({', '.join(ORDER)})")
    ap.add_argument("--out", metavar="FILE", help="write the report here (default: stdout)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per script")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("the benchmarks need root (cgroups, namespaces)", file=sys.stderr)
        return 2
    mount = cgroup2_mount()
    runs: dict[str, tuple[int, str, float]] = {}
    rows: list[Row] = []
    header = machine_header(args.size)
    for name in args.only or ORDER:
        print(f"bench_{name}.py ...", file=sys.stderr, flush=True)
        runs[name] = run_one(name, args.size, mount, args.timeout)
        got = PARSERS[name](runs[name][1]) if runs[name][0] == 0 else []
        rows += got
        for r in got:
            print(f"  {r.benchmark}: {r.ours} | {r.baseline} | {r.ratio} | {r.target} | {r.met}",
                  file=sys.stderr, flush=True)
    report = render(args.size, header, rows, runs)
    if args.out:
        Path(args.out).write_text(report + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(report)
    return 0 if all(s == 0 for s, _, _ in runs.values()) else 1
