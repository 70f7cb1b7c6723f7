"""``corral serve`` sessions: a command's latency against its peers, and idle sessions' memory.

    python benchmarks/bench_sessions.py [--quick] [--commands N] [--sessions N]
                                        [--only latency,rss] [--swerex-venv DIR | --no-swerex]

1. Per-command latency of ``echo hi`` through a session (``Session.run("echo hi", wait=10)``:
   one ``POST /v1/sessions/ID/exec`` with a wait bound), one command at a time, against, in
   the same rounds (one of each per round, so a slow spell on this shared box hits them all):

   * a plain submit of ``sh -c "echo hi"`` answered with its result: ``POST /v1/tasks`` with
     ``"wait": "10s"`` (one request, like the exec; sent by hand over the same socket, as
     ``curl`` would); the goal: a session command within
     2x of it.  For information also ``Client.submit`` + ``Client.wait`` (two requests) and
     the same one-request submit of ``bash -c`` (a session's shell is bash: its start-up is
     part of what a session command costs);
   * ``sup.run(["sh", "-c", "echo hi"])`` on an in-process supervisor (``open_supervisor``);
   * swe-rex's local runtime (``LocalRuntime``: a long-lived bash under pexpect, the runtime
     SWE-agent drives): ``create_session`` once, then ``run_in_session(BashAction("echo hi"))``
     per round; the goal: a session command at most 0.1x of it.  swe-rex is no dependency of
     corral: it is installed (``pip install swe-rex``) into a throw-away venv under /tmp made
     for the run and removed after (``--swerex-venv DIR`` uses one already made and keeps it),
     and driven by a child process of that venv's Python that times each call itself and runs
     in a scratch cgroup of its own (its bash is killed with it).  If it cannot be installed
     or started, the output says so and why, and only its figure is missing.

   Figures: medians and p90 over the rounds; each ratio is the median of the rounds' own
   ratios.
2. The daemon's VmRSS (/proc/PID/status) with no session open and with ``--sessions`` (1000)
   idle ones, each opened with ``POST /v1/sessions``; the difference per session.  The daemon
   allows a non-root uid 64 open sessions; root, which this runs as, is exempt.

Each daemon is started as bench_serve.py starts one (``daemon()``: a scratch cgroup it makes
and removes, a temporary socket and state directory in /var/lib), and stopped (SIGTERM, by
pid) at the end, Ctrl-C included.  Nothing is asserted about time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    compile_project,
    fmt_ratio,
    host_note,
    median,
    paired_ratio,
    run_trio,
    scratch_cgroup,
)
from bench_serve import daemon, rss_kib

from supervisor.client import Client

PARTS = ("latency", "rss")
WARMUP = 5  # rounds dropped at the start
ECHO = "echo hi"

# The swe-rex side, run by the venv's Python: one command per "run" line on stdin, its seconds
# (timed around run_in_session alone) and output on stdout, as JSON.
SWEREX_DRIVER = r"""
import asyncio, json, sys, time
from swerex.runtime.abstract import BashAction, CloseBashSessionRequest, CreateBashSessionRequest
from swerex.runtime.local import LocalRuntime

async def main():
    rt = LocalRuntime()
    await rt.create_session(CreateBashSessionRequest())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        obs = await rt.run_in_session(BashAction(command=sys.argv[1], check="raise"))
        took = time.perf_counter() - t0
        print(json.dumps({"took": took, "output": obs.output, "exit": obs.exit_code}),
              flush=True)
    await rt.close_session(CloseBashSessionRequest())
    await rt.close()

asyncio.run(main())
"""


# ---- swe-rex: a throw-away install, a driver child ----------------------------------------

@contextlib.contextmanager
def swerex_venv(given: str | None) -> Iterator[tuple[str | None, str]]:
    """(the venv's python, a note) for swe-rex: ``given``'s, else one made now under /tmp with
    ``pip install swe-rex`` and removed on the way out; (None, why) if that failed."""
    if given:
        python = os.path.join(given, "bin", "python")
        yield (python, f"swe-rex from {given}") if os.access(python, os.X_OK) else \
            (None, f"{python} is not executable")
        return
    venv = tempfile.mkdtemp(prefix="corral-bench-swerex-", dir="/tmp")
    try:
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "venv", venv], check=True,
                           capture_output=True, text=True, timeout=300)
            python = os.path.join(venv, "bin", "python")
            subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check",
                            "-q", "swe-rex"], check=True, capture_output=True, text=True,
                           timeout=900, stdin=subprocess.DEVNULL)
            version = subprocess.run([python, "-c", "import importlib.metadata as m; "
                                      "print(m.version('swe-rex'))"], capture_output=True,
                                     text=True, timeout=60).stdout.strip()
        except subprocess.CalledProcessError as e:
            last = (e.stderr or e.stdout or "").strip().splitlines()[-3:]
            yield None, f"`{' '.join(e.cmd[-3:])}` failed (exit {e.returncode}): " \
                        f"{' | '.join(last) or 'no output'}"
            return
        except (OSError, subprocess.TimeoutExpired) as e:
            yield None, f"installing swe-rex into {venv}: {e}"
            return
        yield python, (f"swe-rex {version} installed into the throw-away venv {venv} in "
                       f"{time.monotonic() - t0:.0f} s (removed at the end)")
    finally:
        shutil.rmtree(venv, ignore_errors=True)


class SweRex:
    """The driver child (SWEREX_DRIVER) in its own scratch cgroup: ``one()`` runs ``echo hi``
    in its bash session and returns the seconds it took there."""

    def __init__(self, python: str, cgroup_procs: str) -> None:
        def enter() -> None:  # in the child, before exec: into the scratch cgroup
            fd = os.open(cgroup_procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

        self.proc = subprocess.Popen([python, "-c", SWEREX_DRIVER, ECHO], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=enter, cwd="/tmp")
        self._answer()  # {"ready": true}

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"the swe-rex driver exited ({self.proc.wait()}): "
                               f"{err.strip()[-2000:]}")
        return dict(json.loads(line))

    def one(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        got = self._answer()
        if got["exit"] != 0 or got["output"].strip() != "hi":
            raise RuntimeError(f"swe-rex ran {ECHO!r}: {got}")
        return float(got["took"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the driver closes its session and exits
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # (its bash goes with the scratch cgroup)
            self.proc.wait()


# ---- a one-request submit with a wait bound, as curl sends it ------------------------------

class RawSubmit:
    """``POST /v1/tasks {"argv": ..., "wait": "10s"}`` on one kept-alive connection: the
    answer's status and JSON (``Client.submit`` has no ``wait``)."""

    def __init__(self, sock_path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock_path)
        self.reader = self.sock.makefile("rb")

    def submit(self, argv: list[str]) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"argv": argv, "wait": "10s"}).encode()
        self.sock.sendall(b"POST /v1/tasks HTTP/1.1\r\nhost: corral\r\ncontent-type: "
                          b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        status = int(self.reader.readline().split()[1])
        headers = {}
        while (line := self.reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while size := int(self.reader.readline().split(b";")[0].strip() or b"0", 16):
                data += self.reader.read(size)
                self.reader.readline()
            while self.reader.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
        else:
            data = self.reader.read(int(headers["content-length"]))
        return status, json.loads(data)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


# ---- 1. latency ------------------------------------------------------------------------------

def _finished_ok(answer: dict[str, Any], what: str) -> None:
    """Raise unless the daemon's answer is a finished, succeeded task that printed hi."""
    stdout = (answer.get("result") or {}).get("output", {}).get("stdout", {})
    if (answer.get("state"), answer.get("outcome"), answer.get("exit_status"),
            stdout.get("head")) != ("finished", "succeeded", 0, "hi\n"):
        raise RuntimeError(f"{what}: not a finished, succeeded task that printed hi: "
                           f"{json.dumps(answer)[:2000]}")


def latency_rounds(sock: str, n: int, swerex: SweRex | None,
                   ) -> tuple[dict[str, list[float]], str]:
    """``n`` rounds (after WARMUP), each: one in-process sup.run, one session exec, one
    one-request submit of sh -c and of bash -c, one submit + wait, one swe-rex command.
    Seconds by kind, and why swe-rex's are missing if it failed on the way ("" if not)."""
    import trio

    import supervisor

    names = ["inproc", "session", "submit", "submit_bash", "submit_wait", "swerex"]
    times: dict[str, list[float]] = {k: [] for k in names}
    broken: list[str] = []  # why swe-rex's figures are missing, once it failed

    async def main(work: Any, path: str) -> dict[str, list[float]] | None:
        with Client(sock) as c, c.session(cwd="/tmp") as s:
            raw = RawSubmit(sock)
            try:

                def remote() -> dict[str, float]:
                    got = {}
                    t0 = time.perf_counter()
                    answer = s.run(ECHO, wait=10)
                    got["session"] = time.perf_counter() - t0
                    _finished_ok(answer, "session exec")
                    for key, shell in (("submit", "sh"), ("submit_bash", "bash")):
                        t0 = time.perf_counter()
                        status, answer = raw.submit([shell, "-c", ECHO])
                        got[key] = time.perf_counter() - t0
                        if status != 200:
                            raise RuntimeError(f"submit with wait: {status} {answer}")
                        _finished_ok(answer, f"submit of {shell} -c")
                    t0 = time.perf_counter()
                    info = c.wait(c.submit(["sh", "-c", ECHO]).id)
                    got["submit_wait"] = time.perf_counter() - t0
                    if info.state != "finished":
                        raise RuntimeError(f"submit + wait: {info}")
                    if swerex is not None and not broken:
                        try:
                            got["swerex"] = swerex.one()
                        except (OSError, RuntimeError, ValueError) as e:
                            broken.append(f"swe-rex failed after {len(times['swerex'])} "
                                          f"commands, its figures dropped: {e}")
                    return got

                async with supervisor.open_supervisor(path) as sup:
                    with work:
                        for i in range(n + WARMUP):
                            t0 = time.perf_counter()
                            await sup.run(["sh", "-c", ECHO])
                            local = time.perf_counter() - t0
                            got = await trio.to_thread.run_sync(remote)
                            if i >= WARMUP:
                                times["inproc"].append(local)
                                for k, v in got.items():
                                    times[k].append(v)
                    if work.cancelled_caught:
                        return None
            finally:
                raw.close()
        return times

    with scratch_cgroup("sessions-inproc") as cg:
        status, out = run_trio(main, cg.path)
    if status:
        raise SystemExit(status)
    if broken:
        out["swerex"] = []
    return dict(out), " ".join(broken)


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]


def report_latency(t: dict[str, list[float]], swerex_note: str) -> None:
    ms = 1e3
    ses = t["session"]
    r_submit = paired_ratio(ses, t["submit"])
    r_inproc = paired_ratio(ses, t["inproc"])
    line = (f"session echo hi ({len(ses)} commands): median {median(ses) * ms:.2f} ms p90 "
            f"{p90(ses) * ms:.2f} ms; plain submit median {median(t['submit']) * ms:.2f} ms: "
            f"{r_submit:.2f}x (goal <= 2x: {'met' if r_submit <= 2 else 'NOT met'}); "
            f"in-process sup.run median {median(t['inproc']) * ms:.2f} ms: {r_inproc:.2f}x; ")
    of_medians = [f"plain submit {fmt_ratio(median(ses), median(t['submit']))}",
                  f"sup.run {fmt_ratio(median(ses), median(t['inproc']))}"]
    if t["swerex"]:
        r_rex = paired_ratio(ses, t["swerex"])
        line += (f"swe-rex session median {median(t['swerex']) * ms:.2f} ms: {r_rex:.3f}x "
                 f"(goal <= 0.1x: {'met' if r_rex <= 0.1 else 'NOT met'})")
        of_medians.append(f"swe-rex {median(ses) / median(t['swerex']):.3f}x")
    else:
        line += f"swe-rex session: skipped ({swerex_note})"
    print(line)
    print(f"  ratios above: the median of the rounds' own; of the medians: "
          f"{', '.join(of_medians)}")
    print(f"  p90: plain submit {p90(t['submit']) * ms:.2f} ms, in-process sup.run "
          f"{p90(t['inproc']) * ms:.2f} ms" + (f", swe-rex session {p90(t['swerex']) * ms:.2f} "
                                               f"ms" if t["swerex"] else ""))
    print(f"  for information: plain submit of bash -c (a session's shell) median "
          f"{median(t['submit_bash']) * ms:.2f} ms (session "
          f"{paired_ratio(ses, t['submit_bash']):.2f}x of it); Client.submit + Client.wait "
          f"(two requests) median "
          f"{median(t['submit_wait']) * ms:.2f} ms (session "
          f"{paired_ratio(ses, t['submit_wait']):.2f}x of it)")
    print(f"  {swerex_note}")


# ---- 2. idle sessions' memory ----------------------------------------------------------------

def sessions_rss(count: int) -> tuple[int, int, float]:
    """(VmRSS KiB with no session open, VmRSS KiB with ``count`` idle ones, seconds per
    POST /v1/sessions), on a fresh daemon."""
    with daemon() as (sock, proc), Client(sock) as c:
        with c.session(cwd="/tmp") as s:  # warm-up: the session paths' imports and caches
            _finished_ok(s.run(ECHO, wait=10), "warm-up session exec")
        c.wait(c.submit(["true"]).id)
        time.sleep(0.5)
        idle = rss_kib(proc.pid)
        t0 = time.perf_counter()
        opened = {x["id"] for x in (c.open_session(cwd="/tmp") for _ in range(count))
                  if x.get("state") == "open"}
        per_open = (time.perf_counter() - t0) / count
        if len(opened) < count:
            raise SystemExit(f"only {len(opened)} of {count} sessions were opened")
        time.sleep(1)
        held = rss_kib(proc.pid)
        return idle, held, per_open


def report_rss(count: int) -> None:
    idle, held, per_open = sessions_rss(count)
    print(f"daemon RSS idle sessions: 0 -> {idle / 1024:.1f} MiB, {count} -> "
          f"{held / 1024:.1f} MiB: {(held - idle) / count:.1f} KiB per session")
    print(f"  (POST /v1/sessions took {per_open * 1e3:.2f} ms each, one at a time)")


# ---- main ------------------------------------------------------------------------------------

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer commands (30) and sessions "
                   "(1000 still: opening them takes seconds)")
    p.add_argument("--commands", type=int, default=None, help="rounds (default 200)")
    p.add_argument("--sessions", type=int, default=1000, help="idle sessions held")
    p.add_argument("--only", metavar="PARTS", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default all): {', '.join(PARTS)}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--swerex-venv", metavar="DIR", help="a venv with swe-rex installed "
                   "(default: make one under /tmp for the run)")
    g.add_argument("--no-swerex", action="store_true", help="leave swe-rex out")
    args = p.parse_args()
    only = set(args.only.split(","))
    if only - set(PARTS):
        p.error(f"--only: unknown parts {sorted(only - set(PARTS))}; known: {PARTS}")
    if os.geteuid() != 0:
        raise SystemExit("run this as root: it makes cgroups, and holds more sessions than "
                         "a non-root uid may open (64)")
    n = args.commands or (30 if args.quick else 200)
    print(f"sessions benchmark: {n} commands per kind, {args.sessions} idle sessions")
    print(host_note())
    print(compile_project())
    if "latency" in only:
        run_latency(sock_rounds=n, no_swerex=args.no_swerex, venv=args.swerex_venv)
    if "rss" in only:
        report_rss(args.sessions)
    print(f"  at the end: {host_note()}")


def run_latency(sock_rounds: int, no_swerex: bool, venv: str | None) -> None:
    with contextlib.ExitStack() as stack:
        swerex, note = None, "swe-rex left out (--no-swerex)"
        if not no_swerex:
            python, note = stack.enter_context(swerex_venv(venv))
            if python is not None:
                cg = stack.enter_context(scratch_cgroup("sessions-swerex"))
                try:
                    swerex = SweRex(python, os.path.join(cg.path, "cgroup.procs"))
                    stack.callback(swerex.close)
                except (OSError, RuntimeError, ValueError) as e:
                    note = f"the swe-rex driver did not start: {e}"
        sock, _ = stack.enter_context(daemon())
        times, broken = latency_rounds(sock, sock_rounds, swerex)
    report_latency(times, broken or note)


if __name__ == "__main__":
    main()
