"""``corral serve`` against a hostile tenant: a victim tenant's latency while another attacks.

    python benchmarks/bench_tenants.py [--quick] [--only NAME,...] [--rounds N] [--seconds S]

Two throw-away users are made for the run, ``corral-bench-<hex>-a`` (the attacker) and
``corral-bench-<hex>-v`` (the victim), and removed at the end; each tenant's code runs in a
forked child that dropped to that user's uid, gid and no supplementary groups, so the daemon
sees that uid through SO_PEERCRED.

The victim: submit-to-result of ``true`` (``Client.submit(["true"])``, then ``Client.wait``),
one request at a time, each on a fresh connection (connecting is included: several attacks are
about getting one), one started every 25 ms (at once if the previous took longer).  A request
with no answer within 30 s, an error, or an outcome other than ``succeeded`` is *unanswered*
and left out of the latencies.  Each attack gets its own daemon (defaults but for what the
attack needs), and phases alternate on it: alone, attack, alone, attack, ... (``--rounds``
pairs of ``--seconds`` each), so that a slow spell on this shared box hits both; between
phases, root force-stops whatever the attacker left unfinished.  The goal: the victim's p99
under attack within 3x of its p99 alone, and nothing unanswered.  The daemon's VmRSS is read
before the first attack phase, at the end of the last, every 0.25 s during them (peak), and
once the attacker's leftovers are stopped; an attack that takes it past 2 GiB is cut short (the
box's memory is shared) and the output says so.  Also printed, to tell where time went: how
much of the victim's latency was its submission (until the 201), the medians of its request's
phases on the daemon's clock (to created, started, ended, answered), its own process's time on
a CPU and waiting for one per request, the daemon's event-loop rounds rationed
(``corral_loop_rationed_rounds``), the daemon's CPU use alone and under attack, what the
attacker got (answers by status, its tasks by outcome).  Nothing is asserted about time.

Attacks (``--only``):
  cpu_floor        not an attack but the floor under the others: one attacker process per
                   CPU spinning, never touching the daemon (every attack's own processes take
                   CPU on this box too; what that alone costs the victim is this ratio).
  spinning_floor   not an attack: as many attacker processes spinning as spinning_tasks'
                   tasks (16), never touching the daemon; they are in the benchmark's
                   session, so in the victim client's scheduler autogroup where the kernel has
                   autogroups on, while the daemon's tasks are in the daemon's.
  property         4 connections flood submissions of root-only properties spelled with
                   padding (``{" AmbientCapabilities": "CAP_SYS_ADMIN"}``...): 403 each.
  sigstop          a C loop ``kill(-1, SIGSTOP)`` as the attacker's uid, while it keeps 16
                   tasks of ``true`` with a PATH of 300 missing directories submitted and
                   unfinished (its tasks' children are often stopped before their exec; 16
                   keep its 8 running slots busy without flooding the queue); the submitter
                   keeps root as its real and saved uid (effective: the attacker's, which is
                   what SO_PEERCRED reports), so that the loop cannot stop it.
  stream_flood     2 connections at a time open ``GET /v1/events`` or a followed output of the
                   attacker's own ``sleep``, then write 64 KiB chunks into it until the daemon
                   closes it; again.
  output_flood     4 tasks at a time of ``head -c 200M /dev/zero``, the daemon's --state-dir on
                   a 64 MiB tmpfs (in a private mount namespace a helper holds; for this attack
                   only: the others keep the records on /var/lib's disk, as deployed).
  disk_flood       the same four floods, the state on the host's disk (/var/lib): the
                   daemon's writes of the output into its files held back by the kernel.
  followers        the same four floods (state on /var/lib), each task followed by four
                   connections that never read (4 KiB receive buffers).
  connections      one process holds as many idle connections as it can (1024 tried, 300 with
                   --quick), making a new one for each the daemon closes.
  slow_headers     the same, each sending a request head one byte every 0.1 s.
  two_floods       two attacker tenants (a second user), each submitting ``true`` with a
                   ``wait`` for its result from 6 threads at once, as fast as answered.
  dribbled_heads   two attacker tenants, each 200 connections from 4 threads sending a 10 KB
                   request head (2,000 tiny headers) a byte per connection in turn, as fast as
                   they can, again and again; a closed one made again.
  terminal_floods  two attacker tenants, each 4 terminal tasks (``"tty"``) of ``yes`` for the
                   whole phase.
  terminal_resizes two attacker tenants each keep 8 terminal tasks of ``yes``, each resized
                   again and again by a thread of its own (cheap requests within its pace).
  spinning_tasks   two attacker tenants each keep 8 tasks spinning on the CPUs (each its
                   share of the 16 slots) for the whole phase: without a ``cpu`` controller
                   nothing weighs them below the victim's own task (compare spinning_floor).
  terminal_keys    8 terminal tasks of ``cat`` (the terminal as it starts: canonical,
                   echoing), each written 1 MB of keys at a time for the whole phase.
  held_slots       two attacker tenants each hold 8 long ``sleep`` tasks running (each its
                   share of the 16 slots) for the whole phase.
  retention        4 connections finish ``true`` tasks as fast as they can, --retain-count 50;
                   the victim's result made just before each attack phase must still be there
                   after it (the victim makes at most 20 requests per phase here, to stay
                   within an equal share of the 50: its latency figures are few).
  signals          4 connections send SIGWINCH to the attacker's task of 1,000 sleeping
                   processes (made before the phase), as fast as the daemon answers.
  big_submissions  4 connections send 1 MiB submissions (argv of 65,000 strings) continuously.
  keyed_resends    4 connections send again and again a submission of 65,000 arguments with
                   the idempotency key of a task it made before (--keep-finished 1: from the
                   records; 200, that task).
  big_environments  1 connection sends submissions of 65,000 environment variables (964 KB),
                   one after another.
  big_answers      4 connections each show their own finished task with a 1 MiB argv (a 2.5 MB
                   answer) as fast as the daemon answers.
  recorded_answers  4 connections each show their own 4 finished tasks of 65,000 non-ASCII
                   arguments in turn (answers of 2.9 MB: 46 MB of them, past the 32 MiB the
                   daemon keeps made), --keep-finished 1 (each read from the records).
  output_readers   4 attacker processes each read their own task's 16 MB output whole on 4
                   connections at once, again and again.
  output_ends      4 connections read the output (3 bytes) of the attacker's task of 65,000
                   arguments whole, again and again: each read ends with the task's result.
  session_env      4 sessions each carry 840 KB of environment (seven variables of 120 KB)
                   and run ``true`` as fast as each is answered.
  session_vars     4 sessions each set new values of 3,000 variables at every command (a
                   report of 33 KB, an environment of 57 KB) as fast as each is answered.
  session_hoard    two attacker tenants each keep 8 sessions whose every command exports
                   25,000 variables (a report of ~250 KB), as fast as each is answered: past
                   the first, their uid may not keep them, and none carries.
  follow_floods    two attacker tenants each run 8 tasks printing a 100-byte line every 2 ms,
                   their output followed on 64 connections (a uid's most), read as it comes.
  trickle_followers  a task printing `x` a line at a time as fast as `sh` can, its output
                   followed on 100 connections (a uid may follow 64 at once), read as fast
                   as it comes.

``--pin``: the attacker's processes and every process of its tasks are held to the last CPU,
the daemon, the victim and its tasks to the others, in the alone phases as under attack (its
tasks are moved as a thread of the benchmark finds them in the daemon's cgroup, every 5 ms):
what an attack costs the victim through the daemon, without the CPU its processes take besides
(which the ``cpu`` controller bounds where it is delegated; there is none on a hybrid host).

Each daemon gets a scratch cgroup (``--cgroup-root``) and a temporary 0755 directory in /var/lib
for its socket and state; on every way out (an error, Ctrl-C, SIGTERM) the forked children are
killed, the daemon stopped (SIGTERM), the small disk's holder ended, the cgroup and directories
removed, and the two users deleted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import os
import pwd
import re
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import host_note, median, raise_nofile, scratch_cgroup

from supervisor.client import ApiError, Client, TaskInfo

CORRAL = [sys.executable, "-c", "import sys; from supervisor.cli import main; sys.exit(main())"]
STATE_PARENT = "/var/lib"  # where the daemon's records live by default (see bench_serve.py)
ANSWER = 30.0  # seconds: a victim request not answered by then is unanswered
INTERVAL = 0.025  # seconds between the starts of two victim requests
WARM_UP = 0.5  # seconds the attack runs before the victim's phase starts
TICK = 0.25  # seconds between two RSS samples
GOAL = 3.0  # p99 under attack / p99 alone
RETAIN = 50  # --retain-count for the retention attack
FLOOD_THREADS = 6  # two_floods: threads of each attacker (an independent attack: 1-12)
HOARDERS = 8  # session_hoard: sessions of each attacker (an independent attack's)
HELD_SLOTS = 8  # held_slots: long tasks of each attacker (the per-uid share of 16 slots)
TRICKLE_FOLLOWERS = 100  # the trickle_followers attack's connections following one output
SUBSCRIBERS = 240  # the subscribers attack's unread event streams (asked for; 16 are taken)
RETENTION_REQUESTS = 20  # victim requests per phase there: fewer than RETAIN / 2
DISK = "64m"  # the output flood's state filesystem
PIN_EVERY = 0.005  # seconds between two looks for the attacker's new processes (--pin)
RSS_CAP = 2 << 20  # KiB: an attack that takes the daemon past this is cut short (the box's
#                    memory is shared); the figures say so

# `kill(-1, SIGSTOP)` until SIGTERM or the seconds given, then SIGCONT to the same processes
# (the idea of tests/conftest.py's STOPPER_C; C because a Python loop rarely hits the few
# microseconds between a child's uid change and its exec).
STOPPER_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <time.h>
static volatile sig_atomic_t done;
static void on_term(int sig) { (void)sig; done = 1; }
int main(int argc, char **argv)
{
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 10);
    signal(SIGTERM, on_term);
    while (!done && time(NULL) < end)
        kill(-1, SIGSTOP);
    kill(-1, SIGCONT);
    return 0;
}
"""


class User(NamedTuple):
    name: str
    uid: int
    gid: int


# ---- the run's users, programs and daemons ---------------------------------------------------

@contextlib.contextmanager
def tenants() -> Iterator[tuple[User, User, User]]:
    """(attacker, victim, second attacker): three users made with useradd, removed with
    userdel on the way out (a user some process still runs as cannot be removed: everything
    of theirs ends first)."""
    tag = secrets.token_hex(3)
    made: list[User] = []
    try:
        for role in ("a", "v", "b"):
            name = f"corral-bench-{tag}-{role}"
            subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                            "/usr/sbin/nologin", name], check=True, capture_output=True)
            pw = pwd.getpwnam(name)
            made.append(User(name, pw.pw_uid, pw.pw_gid))
        yield made[0], made[1], made[2]
    finally:
        for u in made:
            r = subprocess.run(["userdel", u.name], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"WARNING: userdel {u.name}: {r.stderr.strip()}; remove it by hand",
                      file=sys.stderr)


@contextlib.contextmanager
def stopper_program() -> Iterator[str]:
    """The SIGSTOP loop built with gcc in a 0755 directory every uid may run it from."""
    where = tempfile.mkdtemp(prefix="corral-bench-stopper-")
    try:
        os.chmod(where, 0o755)
        src = os.path.join(where, "stopper.c")
        with open(src, "w") as f:
            f.write(STOPPER_C)
        subprocess.run(["gcc", "-O2", "-o", os.path.join(where, "stopper"), src], check=True)
        yield os.path.join(where, "stopper")
    finally:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def small_disk(path: str, size: str) -> Iterator[tuple[list[str], str]]:
    """A tmpfs of ``size`` on ``path`` in a private mount namespace held by a ``sleep``
    (tests/daemon/daemon_util.py's ``small_disk``); yields (the command prefix that enters
    it, the path through which the host sees it).  The holder is killed on the way out; the
    mount goes with the namespace's last process."""
    os.mkdir(path)
    ready = path + ".ready"
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount -t tmpfs -o size={size},mode=0700 corral-bench-state "$0" && touch "$1" '
         f'&& exec sleep 3600', path, ready], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if holder.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mounting a {size} tmpfs on {path} failed (the holder's "
                                 f"status: {holder.poll()})")
            time.sleep(0.02)
        yield ["nsenter", "-t", str(holder.pid), "-m", "--"], f"/proc/{holder.pid}/root{path}"
    finally:
        holder.kill()
        holder.wait()


@dataclass
class Daemon:
    sock: str
    pid: int
    cgroup: str  # its --cgroup-root
    disk: str | None = None  # the small state filesystem, as the host sees it
    status: int | None = None  # filled in once it has exited
    log_lines: int = 0
    tracebacks: int = 0
    log_tail: str = ""


@contextlib.contextmanager
def daemon(extra: tuple[str, ...], disk_size: str | None) -> Iterator[Daemon]:
    """A ``corral serve`` in a scratch cgroup with a socket and state directory of its own (in
    a 0755 directory: the tenants must reach the socket); ``disk_size``: the state directory
    on a tmpfs that small.  Stopped with SIGTERM on the way out (its exit status and log
    summary are then in the yielded object), everything removed."""
    with contextlib.ExitStack() as stack:
        cg = stack.enter_context(scratch_cgroup("tenants"))
        tmp = tempfile.mkdtemp(prefix="corral-bench-tenants-", dir=STATE_PARENT)
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        os.chmod(tmp, 0o755)
        sock, state, log = (os.path.join(tmp, n) for n in ("sock", "state", "daemon.log"))
        wrap, seen = (stack.enter_context(small_disk(state, disk_size)) if disk_size
                      else ([], None))
        with open(log, "wb") as out:
            proc = subprocess.Popen([*wrap, *CORRAL, "serve", "--socket", sock, "--state-dir",
                                     state, "--cgroup-root", cg.path, "--log-level", "warning",
                                     *extra], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
        d = Daemon(sock, proc.pid, cg.path, seen)
        stack.callback(_stop_daemon, proc, d, log)
        deadline = time.monotonic() + 60
        while not _answers(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start (status {proc.poll()}): "
                                 f"{_tail(log)}")
            time.sleep(0.05)
        yield d


def _answers(sock: str) -> bool:
    try:
        with Client(sock, timeout=5) as c:
            c.limits()
        return True
    except (OSError, ApiError):
        return False


def _stop_daemon(proc: subprocess.Popen[bytes], d: Daemon, log: str) -> None:
    """SIGTERM (a second one kills every task at once), then what its log said."""
    for sig, wait in ((signal.SIGTERM, 120), (signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    d.status = proc.wait()
    with open(log, errors="replace") as f:
        text = f.read()
    d.log_lines, d.tracebacks, d.log_tail = (text.count("\n"), text.count("Traceback"),
                                             _tail(log))


def _tail(log: str, n: int = 6) -> str:
    with open(log, errors="replace") as f:
        return " | ".join(f.read().splitlines()[-n:])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of ``pid`` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid``; DaemonGone if it has exited (a zombie has none)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise DaemonGone(f"the daemon (pid {pid}) has exited")


AFFINITY: dict[int, set[int]] = {}  # --pin: uid -> the CPUs its processes are held to


@contextlib.contextmanager
def pinned(cgroup: str, uids: set[int]) -> Iterator[None]:
    """(--pin) Meanwhile, a thread on the attackers' CPUs moves every process and thread of
    ``uids`` it finds under ``cgroup`` there, every :data:`PIN_EVERY` s."""
    cpus = next((AFFINITY[u] for u in uids if u in AFFINITY), None)
    if cpus is None:
        yield
        return
    import threading
    done = threading.Event()

    def move() -> None:
        os.sched_setaffinity(0, cpus)  # (this thread's cost is the attacker's)
        moved: set[int] = set()
        while not done.wait(PIN_EVERY):
            found: set[int] = set()
            for where, _, _ in os.walk(cgroup):
                with contextlib.suppress(OSError), open(os.path.join(where, "cgroup.threads")) as f:
                    found.update(int(tid) for tid in f.read().split())
            for tid in found - moved:
                with contextlib.suppress(OSError):  # (gone meanwhile)
                    if os.stat(f"/proc/{tid}").st_uid in uids:
                        os.sched_setaffinity(tid, cpus)
            moved = found

    thread = threading.Thread(target=move, name="pin", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class DaemonGone(Exception):
    """The daemon under test exited in the middle of a run."""


# ---- forked tenants ---------------------------------------------------------------------------

class Child(NamedTuple):
    pid: int
    fd: int  # the read end of the pipe its JSON answer comes on
    what: str


class Crew:
    """The forked tenant processes of one daemon: each answers once, in JSON, on its own
    pipe (:meth:`collect`); whatever is still running when the crew closes is SIGKILLed and
    reaped (they hold sockets, nothing else)."""

    def __init__(self) -> None:
        self.live: dict[int, Child] = {}

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in list(self.live.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            self._reap(child)

    def fork_as(self, user: User, what: str, fn: Callable[..., Any], *args: Any,
                keep_root: bool = False) -> Child:
        """``fn(*args)`` in a forked child with ``user``'s uid and gid and no supplementary
        groups (``keep_root``: the effective uid only, real and saved stay root: a process
        its uid's ``kill(-1, SIGSTOP)`` cannot reach, seen as that uid by SO_PEERCRED).  The
        child never returns into the caller."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.close(r)
                if user.uid in AFFINITY:
                    os.sched_setaffinity(0, AFFINITY[user.uid])
                os.setgroups([])
                os.setresgid(user.gid, user.gid, user.gid)
                if keep_root:
                    os.setresuid(0, user.uid, 0)
                else:
                    os.setresuid(user.uid, user.uid, user.uid)
                out: dict[str, Any] = {"ok": fn(*args)}
            except BaseException as e:  # (reported to the parent, which prints it)
                out = {"error": f"{type(e).__name__}: {e}"}
            try:
                data = json.dumps(out).encode()
                while data:
                    data = data[os.write(w, data):]
            except BaseException:
                code = 1
            os._exit(code)
        os.close(w)
        child = Child(pid, r, what)
        self.live[pid] = child
        return child

    def collect(self, child: Child, timeout: float,
                tick: Callable[[], None] | None = None) -> Any:
        """What ``child`` returned, once it has (``{"error": ...}`` if it raised, or gave no
        answer within ``timeout``: then it is killed); ``tick()`` every :data:`TICK` s."""
        chunks = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([child.fd], [], [], min(left, TICK))
            if tick is not None:
                tick()
            if ready:
                if not (data := os.read(child.fd, 1 << 16)):
                    break
                chunks.append(data)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            chunks = [json.dumps({"error": f"{child.what}: no answer in {timeout:g}s"}).encode()]
        self._reap(child)
        try:
            out = json.loads(b"".join(chunks))
        except ValueError:
            out = {"error": f"{child.what} died without an answer"}
        return out["ok"] if "ok" in out else {"error": out["error"]}

    def _reap(self, child: Child) -> None:
        os.close(child.fd)
        os.waitpid(child.pid, 0)
        del self.live[child.pid]


# ---- the victim -----------------------------------------------------------------------------

def victim_requests(sock: str, seconds: float, interval: float,
                    limit: int | None = None) -> dict[str, Any]:
    """As the victim: submit-to-result of ``true`` on a fresh connection, one every
    ``interval`` s for ``seconds`` (at most ``limit``); the latencies (s) of the answered, how
    much of each was the submission (until its 201), and why the others were not answered."""
    took: list[float] = []
    submits: list[float] = []
    phases: list[list[float]] = []  # (request -> created, -> started, -> ended, -> answer)
    failed: list[str] = []
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    ran, waited = _schedstat()
    while time.monotonic() < end and (limit is None or len(took) + len(failed) < limit):
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at = time.monotonic() + interval
        t0, wall = time.perf_counter(), time.time()
        problem = None
        try:
            with Client(sock, timeout=ANSWER + 5) as c:
                task_id = c.submit(["true"]).id
                submitted = time.perf_counter() - t0
                info = c.wait(task_id, timeout=ANSWER, reconnect=0)
            if info.state != "finished":
                problem = f"not finished in {ANSWER:g}s"
            elif info.outcome != "succeeded":
                problem = f"outcome {info.outcome}"
        except ApiError as e:
            problem = f"{e.status} {e.code}"
        except OSError as e:  # (DaemonUnavailable, a socket timeout)
            problem = f"{type(e).__name__}: {e}"[:120]
        elapsed = time.perf_counter() - t0
        if problem is None and info.created_at and info.started_at and info.ended_at:
            phases.append([info.created_at - wall, info.started_at - info.created_at,
                           info.ended_at - info.started_at, wall + elapsed - info.ended_at])
        if problem is None and elapsed > ANSWER:
            problem = f"answered after {elapsed:.0f}s"
        if problem is None:
            took.append(elapsed)
            submits.append(submitted)
        else:
            failed.append(problem)
    ran_after, waited_after = _schedstat()
    return {"took": took, "submits": submits, "phases": phases, "failed": failed,
            "own_cpu": [ran_after - ran, waited_after - waited, len(took) + len(failed)]}


def _schedstat() -> tuple[float, float]:
    """This thread's seconds on a CPU and waiting for one, so far (/proc/self/schedstat)."""
    with open("/proc/thread-self/schedstat") as f:
        ran, waited, _ = f.read().split()
    return int(ran) / 1e9, int(waited) / 1e9


def victim_marker(sock: str) -> str:
    """As the victim: a finished task whose result must survive the retention attack."""
    with Client(sock, timeout=ANSWER + 5) as c:
        return c.wait(c.submit(["echo", "kept"]).id, timeout=ANSWER).id


def victim_lookup(sock: str, task_id: str) -> str:
    """As the victim: its task's outcome, or the error code (``expired``: retention took it)."""
    try:
        with Client(sock, timeout=ANSWER) as c:
            return str(c.show(task_id).outcome)
    except ApiError as e:
        return e.code


# ---- the attacks (each runs as the attacker, until ``until`` on the monotonic clock) ----------

def post(body: dict[str, Any], path: str = "/v1/tasks") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n").encode() + data


def _ask(s: socket.socket, reader: Any, request: bytes) -> tuple[int, bool]:
    """Send ``request`` on a kept-alive connection and read its answer (a Content-Length
    body, as the daemon sends for every verb that does not stream); (status, closed after)."""
    s.sendall(request)
    line = reader.readline()
    if not line:
        raise ConnectionResetError("the daemon closed the connection")
    status, length, close = int(line.split()[1]), 0, False
    while (header := reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"connection":
            close = value.strip().lower() == b"close"
    reader.read(length)
    return status, close


def request_loop(sock: str, until: float, requests: list[bytes]) -> dict[str, Any]:
    """Send ``requests`` (in turn) on one kept-alive connection as fast as the daemon answers,
    a new connection whenever it closes one; counts of answers by status and of errors."""
    counts: dict[str, Any] = {"requests": 0, "connections": 0, "status": collections.Counter(),
                              "errors": collections.Counter()}
    s: socket.socket | None = None
    reader: Any = None
    i = 0
    while time.monotonic() < until:
        try:
            if s is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect(sock)
                reader = s.makefile("rb")
                counts["connections"] += 1
            status, close = _ask(s, reader, requests[i % len(requests)])
            i += 1
            counts["requests"] += 1
            counts["status"][str(status)] += 1
        except OSError as e:
            counts["errors"][type(e).__name__] += 1
            close = True
            time.sleep(0.01)
        if close and s is not None:
            reader.close()
            s.close()
            s = None
    return counts


PROPERTY_REQUESTS = [post({"argv": ["true"], "properties": {name: value}}) for name, value in (
    (" AmbientCapabilities", "CAP_SYS_ADMIN"), ("AmbientCapabilities\t", "CAP_SETUID"),
    (" User", "root"), ("\tSupplementaryGroups ", "root"), ("Group\t", "root"))]
MISSING_PATH = ":".join([f"/nonexistent/{i}" for i in range(300)] + ["/usr/bin", "/bin"])
OUTSTANDING = 16  # the sigstop attacker's tasks submitted and unfinished at a time


def keep_stoppable_tasks(sock: str, until: float) -> dict[str, Any]:
    """Keep :data:`OUTSTANDING` tasks of ``true`` with :data:`MISSING_PATH` submitted (a new
    one as the oldest ends): 300 failed execve(2) before the real one, each a moment for a
    SIGSTOP to land in before the exec."""
    counts = collections.Counter({"submitted": 0})
    pending: collections.deque[str] = collections.deque()
    with Client(sock, timeout=ANSWER + 5) as c:
        while time.monotonic() < until:
            if len(pending) >= OUTSTANDING:
                c.wait(pending.popleft(), timeout=max(0.1, until - time.monotonic()))
                continue
            try:
                pending.append(c.submit(["true"], time_limit="2s", grace="1s",
                                        env={"PATH": MISSING_PATH}).id)
                counts["submitted"] += 1
            except ApiError as e:
                counts[f"refused {e.status} {e.code}"] += 1
                time.sleep(0.05)
    return dict(counts)


def big_request() -> bytes:
    """A submission just under the default --max-body of 1 MiB: argv of 65,001 strings."""
    return post({"argv": ["true", *(["abcdefghijkl"] * 65000)]})


def big_environment() -> bytes:
    """A submission of 65,000 environment variables (964 KB, under the default --max-body)."""
    return post({"argv": ["true"], "env": {f"V{i}": "x" for i in range(65000)}})


def stream_flood(sock: str, until: float) -> dict[str, Any]:
    """Open ``GET /v1/events`` or a followed output of our own ``sleep`` (in turn), then write
    64 KiB chunks into the connection until the daemon closes it (or stops reading)."""
    with Client(sock, timeout=10) as c:
        sleeper = c.submit(["sleep", "600"], time_limit="10min").id
    heads = [b"GET /v1/events HTTP/1.1\r\nhost: x\r\n\r\n",
             f"GET /v1/tasks/{sleeper}/output?follow=true HTTP/1.1\r\nhost: x\r\n\r\n".encode()]
    counts = collections.Counter({"connections": 0, "bytes_written": 0})
    chunk = b"x" * 65536
    while time.monotonic() < until:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            try:
                s.connect(sock)
                s.sendall(heads[counts["connections"] % 2])
                counts["connections"] += 1
                while time.monotonic() < until:
                    counts["bytes_written"] += s.send(chunk)
            except TimeoutError:
                counts["stalled"] += 1  # the daemon stopped reading but kept the connection
            except OSError:
                counts["closed"] += 1
    return dict(counts)


def output_flood(sock: str, until: float, at_once: int, size: str,
                 followers: int = 0) -> dict[str, Any]:
    """``at_once`` tasks of ``head -c SIZE /dev/zero`` at a time, again as they end, each
    followed (``?follow=true``) by ``followers`` connections that never read (a 4 KiB
    receive buffer)."""
    counts = collections.Counter[str]()
    with Client(sock, timeout=ANSWER + 5) as c:
        while time.monotonic() < until:
            try:
                ids = [c.submit(["head", "-c", size, "/dev/zero"]).id for _ in range(at_once)]
            except ApiError as e:
                counts[f"refused {e.status} {e.code}"] += 1
                time.sleep(0.1)
                continue
            held = []
            for task_id in ids:
                for _ in range(followers):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    try:
                        s.connect(sock)
                        s.sendall(f"GET /v1/tasks/{task_id}/output?follow=true HTTP/1.1\r\n"
                                  f"host: x\r\n\r\n".encode())
                        counts["followers"] += 1
                    except OSError:
                        counts["follower refused"] += 1
                    held.append(s)
            for task_id in ids:
                info = c.wait(task_id, timeout=max(0.1, until - time.monotonic()))
                counts[str(info.outcome or "unfinished")] += 1
            for s in held:
                s.close()
    return dict(counts)


TTY = {"rows": 24, "cols": 80}  # a terminal task's window


def _phase_tasks(sock: str, until: float, argv: list[str], tasks: int, *, wait: bool,
                 **options: Any) -> tuple[list[str], dict[str, Any]]:
    """``tasks`` tasks of ours running ``argv`` until the phase ends (``timeout``), their ids;
    with ``wait``, waited for: their outcomes too."""
    seconds = max(1, math.ceil(until - time.monotonic()))
    outcomes: collections.Counter[str] = collections.Counter()
    with Client(sock, timeout=ANSWER + 5) as c:
        ids = [c.submit(["timeout", str(seconds + (0 if wait else 2)), *argv], **options).id
               for _ in range(tasks)]
        if wait:
            outcomes.update(str(c.wait(i, timeout=seconds + 10).outcome) for i in ids)
    return ids, dict(outcomes)


def terminal_flood(sock: str, until: float, tasks: int) -> dict[str, Any]:
    """``tasks`` terminal tasks of ``yes``, each until the phase ends."""
    return _phase_tasks(sock, until, ["yes"], tasks, wait=True, tty=TTY)[1]


def _start_terminal_floods(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"terminals {user.name}", terminal_flood, env.sock,
                                 until, 4) for user in (env.attacker, env.second)])


def terminal_resizes(sock: str, until: float, tasks: int) -> dict[str, Any]:
    """``tasks`` terminal tasks of ``yes``, each resized again and again by a thread of its
    own (cheap requests, within the uid's pace) until the phase ends."""
    ids = _phase_tasks(sock, until, ["yes"], tasks, wait=False, tty=TTY)[0]
    resized = [0] * tasks
    turn = itertools.count()

    def resize() -> None:
        n = next(turn)
        with Client(sock, timeout=ANSWER + 5) as c, contextlib.suppress(ApiError, OSError):
            while time.monotonic() < until:
                c.resize(ids[n], 24 + resized[n] % 2, 80)
                resized[n] += 1

    _in_threads(tasks, resize)
    return {"resizes": sum(resized)}


def _start_terminal_resizes(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"resizes {user.name}", terminal_resizes, env.sock,
                                 until, 8) for user in (env.attacker, env.second)])


def spinning_tasks(sock: str, until: float, tasks: int) -> dict[str, Any]:
    """``tasks`` tasks each spinning on a CPU until the phase ends."""
    return _phase_tasks(sock, until, ["sh", "-c", "while :; do :; done"], tasks, wait=True)[1]


def _start_spinning_tasks(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"spinners {user.name}", spinning_tasks, env.sock,
                                 until, HELD_SLOTS) for user in (env.attacker, env.second)])


def terminal_keys(sock: str, until: float, tasks: int) -> dict[str, Any]:
    """``tasks`` terminal tasks reading their keys (`cat`, the terminal as it starts: canonical,
    echoing), each written 1 MB at a time (lines of 64 bytes) until the phase ends."""
    keys = b"".join(b"%063d\n" % i for i in range(1 << 14))
    ids = _phase_tasks(sock, until, ["sh", "-c", "cat > /dev/null"], tasks, wait=False,
                       tty=TTY)[0]
    written = [0] * tasks
    turn = itertools.count()

    def write() -> None:
        n = next(turn)
        with Client(sock, timeout=ANSWER + 5) as c, contextlib.suppress(ApiError, OSError):
            while time.monotonic() < until:
                c.write_stdin(ids[n], keys)
                written[n] += len(keys)

    _in_threads(tasks, write)
    return {"written_mb": round(sum(written) / 1e6, 1)}


TRICKLE = b"x-slow: 1\r\n"  # a head's next bytes, one at a time: a line never followed by \r\n


def hold_connections(sock: str, until: float, n: int, slow: bool) -> dict[str, Any]:
    """Hold ``n`` connections, a new one for each the daemon closes: idle, or (``slow``)
    sending a request head one byte per connection every 0.1 s, never finished."""
    sel = selectors.DefaultSelector()
    counts = collections.Counter({"made": 0, "closed_by_daemon": 0, "refused": 0, "open_max": 0})

    def make() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(sock)
            if slow:
                s.sendall(b"GET /v1/limits HTTP/1.1\r\n")
        except OSError:
            counts["refused"] += 1
            s.close()
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, [0])  # (data: the next TRICKLE byte's index)
        counts["made"] += 1

    for _ in range(n):
        make()
    next_byte = time.monotonic()
    while (left := until - time.monotonic()) > 0:
        counts["open_max"] = max(counts["open_max"], len(sel.get_map()))
        for key, _ in sel.select(min(left, 0.1)):
            try:
                gone = not key.fileobj.recv(65536)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                gone = True
            if gone:
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                counts["closed_by_daemon"] += 1
                make()
        while len(sel.get_map()) < n and time.monotonic() < until:
            make()
        if slow and time.monotonic() >= next_byte:
            next_byte = time.monotonic() + 0.1
            for key in list(sel.get_map().values()):
                with contextlib.suppress(OSError):  # (a closed one is seen by select next)
                    key.fileobj.send(TRICKLE[key.data[0] % len(TRICKLE):][:1])  # type: ignore
                    key.data[0] += 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return dict(counts)


def finish_tiny_tasks(sock: str, until: float) -> dict[str, Any]:
    """``true`` tasks one after another as fast as they finish; how many, and the first id."""
    done, first = 0, None
    with Client(sock, timeout=ANSWER + 5) as c:
        while time.monotonic() < until:
            task_id = c.wait(c.submit(["true"]).id, timeout=ANSWER).id
            first = first or task_id
            done += 1
    return {"tasks": done, "first_id": first}


def unread_event_streams(sock: str, until: float, n: int) -> dict[str, Any]:
    """``n`` ``GET /v1/events`` streams opened and never read until ``until``; how many the
    daemon took (answered 200) and refused."""
    counts = collections.Counter({"opened": 0})
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(sock)
            s.sendall(b"GET /v1/events HTTP/1.1\r\nhost: x\r\n\r\n")
            status = s.recv(12)[9:12].decode() or "closed"
        except OSError as e:
            status = type(e).__name__
        counts["opened" if status == "200" else f"refused {status}"] += 1
        held.append(s)
    time.sleep(max(0.0, until - time.monotonic()))
    for s in held:
        s.close()
    return dict(counts)


def _start_subscribers(crew: Crew, env: Env, until: float) -> Started:
    a = env.attacker
    return Started([crew.fork_as(a, "subscriber", unread_event_streams, env.sock, until,
                                 SUBSCRIBERS)]
                   + [crew.fork_as(a, f"finisher {i}", finish_tiny_tasks, env.sock, until)
                      for i in range(4)])


LISTED = 1000  # the listings attack's tasks, each listed as long as a listing allows
DRIBBLERS = 200  # the dribbled_heads attack's connections, per attacker tenant


def _fill_listing(sock: str) -> None:
    """:data:`LISTED` finished tasks of ours whose commands a listing shows at its longest
    (64 arguments of 15 characters: its 1 KiB of JSON), unless they are there already."""
    with Client(sock, timeout=ANSWER + 5) as c:
        if len(c.list(limit=LISTED)) >= LISTED:
            return
        argv = ["true", *(f"{n:015d}" for n in range(63))]
        ids = [c.submit(argv).id for _ in range(LISTED)]
        for task_id in ids:
            c.wait(task_id, timeout=ANSWER)


def list_again(sock: str, until: float) -> dict[str, Any]:
    """The longest listing (``limit=1000`` of those tasks), as fast as answered."""
    _fill_listing(sock)
    return request_loop(sock, until, [f"GET /v1/tasks?limit={LISTED} HTTP/1.1\r\nhost: x"
                                      f"\r\n\r\n".encode()])


def _start_listings(crew: Crew, env: Env, until: float) -> Started:
    """The tasks made first (the first round's; nobody measures meanwhile), then the
    listers, until as long after that as the phase was to last."""
    a = env.attacker
    t0 = time.monotonic()
    crew.collect(crew.fork_as(a, "filler", _fill_listing, env.sock), ANSWER * 4)
    until += time.monotonic() - t0
    return Started([crew.fork_as(a, f"lister {i}", list_again, env.sock, until)
                    for i in range(8)])


TREE = 1000  # the signals attack's task's processes


def _make_tree(sock: str) -> dict[str, Any]:
    """A task of ours with :data:`TREE` sleeping processes; its id once they all run."""
    with Client(sock, timeout=ANSWER + 5) as c:
        task_id = c.submit(["sh", "-c", f"i=0; while [ $i -lt {TREE} ]; do sleep 600 & "
                                        f"i=$((i+1)); done; echo ready; wait"]).id
        deadline = time.monotonic() + ANSWER * 2
        while b"ready" not in b"".join(f.data for f in c.output(task_id)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{TREE} processes not made in {ANSWER * 2:g} s")
            time.sleep(0.1)
    return {"id": task_id}


def _start_signals(crew: Crew, env: Env, until: float) -> Started:
    """The tree made first (nobody measures meanwhile), then 4 connections sending it
    SIGWINCH (every process ignores it), until as long after that as the phase was to last."""
    a = env.attacker
    t0 = time.monotonic()
    made = crew.collect(crew.fork_as(a, "tree", _make_tree, env.sock), ANSWER * 3)
    if "error" in made:
        raise OSError(f"the signals attack's tree: {made['error']}")
    until += time.monotonic() - t0
    winch = post({"signal": "WINCH"}, f"/v1/tasks/{made['id']}/signal")
    return Started([crew.fork_as(a, f"signaller {i}", request_loop, env.sock, until, [winch])
                    for i in range(4)])


def keyed_submissions(sock: str, until: float) -> dict[str, Any]:
    """``true`` with an idempotency key of the most bytes a key may have (128) and a name of
    200, a new key each, as fast as answered: rows and tombstones that each keep the key."""
    done, refused = 0, collections.Counter[str]()
    with Client(sock, timeout=ANSWER + 5) as c:
        while time.monotonic() < until:
            key = f"{os.getpid()}-{done}-".ljust(128, "k")
            try:
                c.submit(["true"], idempotency_key=key, name="n" * 200)
                done += 1
            except ApiError as e:
                refused[e.code] += 1
    return {"tasks": done, **refused}


def keyed_resends(sock: str, until: float) -> dict[str, Any]:
    """A task of 65,000 arguments submitted with an idempotency key, then the same request
    sent again and again (each answered 200 with that task), the task no longer in memory."""
    key = f"resend-{os.getpid()}"
    argv = ["true", *(["abcdefghijkl"] * 65000)]
    with Client(sock, timeout=ANSWER + 5) as c:
        c.wait(c.submit(argv, idempotency_key=key).id)
        c.wait(c.submit(["true"]).id)  # (--keep-finished 1: the first is no longer in memory)
    return request_loop(sock, until, [post({"argv": argv, "idempotency_key": key})])


def waited_submissions(sock: str, until: float, threads: int) -> dict[str, Any]:
    """``true`` submitted with a ``wait`` for its result (one request each), as fast as
    answered, from ``threads`` threads at once (a connection each)."""
    done = collections.Counter({"tasks": 0})

    def loop() -> None:
        with Client(sock, timeout=ANSWER + 5) as c:
            while time.monotonic() < until:
                c.submit(["true"], wait=ANSWER)
                done["tasks"] += 1

    _in_threads(threads, loop)
    return dict(done)


def hold_slots(sock: str, until: float, n: int) -> dict[str, Any]:
    """``n`` long ``sleep`` tasks of ours running for the whole phase, then stopped."""
    with Client(sock, timeout=ANSWER + 5) as c:
        ids = [c.submit(["sleep", "3600"]).id for _ in range(n)]
        time.sleep(max(0.0, until - time.monotonic()))
        for task_id in ids:
            c.stop(task_id, force=True)
    return {"held": len(ids)}


def show_big_task(sock: str, until: float) -> dict[str, Any]:
    """A finished task of ours with a 1 MiB argv, then its ``GET /v1/tasks/ID`` (a 2.5 MB
    answer) as fast as the daemon answers it."""
    with Client(sock, timeout=ANSWER + 5) as c:
        task_id = c.submit(["true", *(["abcdefghijkl"] * 65000)], wait=ANSWER).id
    return request_loop(sock, until, [f"GET /v1/tasks/{task_id} HTTP/1.1\r\nhost: x\r\n"
                                      f"\r\n".encode()])


def show_recorded_tasks(sock: str, until: float, tasks: int) -> dict[str, Any]:
    """``tasks`` finished tasks of ours of 65,000 non-ASCII arguments (answers of ~2.9 MB
    each), then each one's ``GET /v1/tasks/ID`` in turn, as fast as the daemon answers."""
    with Client(sock, timeout=ANSWER + 5) as c:
        ids = [c.submit(["true", *(["\u00e9\u00e8"] * 65000)], wait=ANSWER).id
               for _ in range(tasks)]
    return request_loop(sock, until, [f"GET /v1/tasks/{i} HTTP/1.1\r\nhost: x\r\n\r\n".encode()
                                      for i in ids])


def _in_threads(n: int, loop: Callable[[], None]) -> None:
    """``loop()`` in ``n`` threads at once, until each has returned."""
    threads = [threading.Thread(target=loop) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_output_again(sock: str, until: float, size: str, readers: int,
                      padding: int = 0) -> dict[str, Any]:
    """A task of ours printing ``size`` (its command ``padding`` arguments longer), then its
    whole output read on ``readers`` connections at once, again and again."""
    with Client(sock, timeout=ANSWER + 5) as c:
        task_id = c.submit(["sh", "-c", f"head -c {size} /dev/zero",
                            *(["abcdefghijkl"] * padding)], wait=ANSWER).id
    get = (f"GET /v1/tasks/{task_id}/output HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
           f"\r\n").encode()
    counts = collections.Counter({"reads": 0, "bytes": 0})

    def loop() -> None:
        while time.monotonic() < until:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(ANSWER)
                try:
                    s.connect(sock)
                    s.sendall(get)
                    while chunk := s.recv(1 << 20):
                        counts["bytes"] += len(chunk)
                except OSError as e:
                    counts[type(e).__name__] += 1
                    time.sleep(0.01)
                    continue
            counts["reads"] += 1

    _in_threads(readers, loop)
    return dict(counts)


def follow_a_trickle(sock: str, until: float, followers: int) -> dict[str, Any]:
    """A task of ours printing `x` a line at a time, as fast as `sh` can, followed
    (``?follow=true``) on ``followers`` connections read as fast as they come, until
    ``until``; then the task is stopped."""
    with Client(sock, timeout=ANSWER + 5) as c:
        task_id = c.submit(["sh", "-c", "while :; do echo x; done"]).id
    return _followed(sock, until, [task_id], followers)


def _followed(sock: str, until: float, ids: list[str], followers: int) -> dict[str, Any]:
    """The output of the tasks ``ids`` followed (``?follow=true``) on ``followers``
    connections (in turn over the tasks), read as fast as it comes, each made again when the
    daemon closes it, until ``until``; then the tasks are stopped.  What was read, counted."""
    counts = collections.Counter({"follows": 0, "bytes": 0})
    turn = itertools.count()

    def loop() -> None:
        task_id = ids[next(turn) % len(ids)]
        get = (f"GET /v1/tasks/{task_id}/output?follow=true HTTP/1.1\r\nhost: x\r\n"
               f"connection: close\r\n\r\n").encode()
        while time.monotonic() < until:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                try:
                    s.connect(sock)
                    s.sendall(get)
                    counts["follows"] += 1
                    while time.monotonic() < until and (chunk := s.recv(1 << 16)):
                        counts["bytes"] += len(chunk)
                except OSError as e:
                    counts[type(e).__name__] += 1
                    time.sleep(0.05)

    _in_threads(followers, loop)
    with Client(sock, timeout=ANSWER + 5) as c:
        for task_id in ids:
            c.stop(task_id, force=True)
    return dict(counts)


def follow_lines(sock: str, until: float, tasks: int, followers: int) -> dict[str, Any]:
    """``tasks`` tasks of ours each printing a 100-byte line every 2 ms, their output followed
    on ``followers`` connections in all (in turn over the tasks) read as fast as they come,
    until ``until``; then the tasks are stopped."""
    seconds = max(1, math.ceil(until - time.monotonic()))
    script = (r'$| = 1; $t = time; while (time < $t + ' + str(seconds + 2) +
              r') { print "x" x 99, "\n"; select(undef, undef, undef, 0.002) }')
    with Client(sock, timeout=ANSWER + 5) as c:
        ids = [c.submit(["perl", "-e", script]).id for _ in range(tasks)]
    return _followed(sock, until, ids, followers)


def _start_follow_floods(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"followers {user.name}", follow_lines, env.sock,
                                 until, 8, 64) for user in (env.attacker, env.second)])


def session_env_loop(sock: str, until: float) -> dict[str, Any]:
    """A session of ours carrying 840 KB of environment (seven variables of 120 KB), running
    ``true`` in it as fast as each is answered (each carries the environment again)."""
    return _session_loop(sock, until, "true", first=(
        "v=$(head -c 120000 /dev/zero | tr '\\0' a); export B1=$v B2=$v B3=$v B4=$v B5=$v "
        "B6=$v B7=$v"))


def session_vars_loop(sock: str, until: float) -> dict[str, Any]:
    """A session of ours whose every command sets new values of 3,000 variables (a report of
    ~33 KB, every variable changed), as fast as each is answered: the work is per variable,
    in a report well under the size at which a request is worked on off the event loop."""
    return _session_loop(sock, until, "r=$RANDOM; i=0; while [ $i -lt 3000 ]; do "
                                      "export V$i=$r; i=$((i+1)); done")


def session_hoard_loop(sock: str, until: float) -> dict[str, Any]:
    """A session of ours whose every command exports 25,000 variables (a report of ~250 KB):
    past the first, its uid's sessions may not keep them, and none carries."""
    return _session_loop(sock, until, "for i in $(seq 25000); do export W$i=y; done")


def _start_session_hoard(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"hoarder {user.name} {i}", session_hoard_loop,
                                 env.sock, until)
                    for user in (env.attacker, env.second) for i in range(HOARDERS)])


def _session_loop(sock: str, until: float, command: str, first: str | None = None,
                  ) -> dict[str, Any]:
    """A session of ours running ``first``, then ``command`` as fast as each is answered."""
    counts = collections.Counter({"commands": 0})
    with Client(sock, timeout=ANSWER + 5) as c:
        sid = c.open_session()["id"]
        if first is not None:
            c.exec(sid, first, wait=ANSWER)
        while time.monotonic() < until:
            try:
                c.exec(sid, command, wait=ANSWER)
                counts["commands"] += 1
            except ApiError as e:
                counts[f"refused {e.status} {e.code}"] += 1
                time.sleep(0.05)
        c.close_session(sid)
    return dict(counts)


# ---- attack definitions ---------------------------------------------------------------------

@dataclass
class Env:
    sock: str
    attacker: User
    victim: User
    stopper: str
    connections: int
    second: User  # a second attacker (two_floods)
    disk: str | None = None


@dataclass
class Started:
    children: list[Child]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    start: Callable[[Crew, Env, float], Started]
    daemon_args: tuple[str, ...] = ()
    disk: str | None = None
    victim_limit: int | None = None  # victim requests per phase at most


def _many(n: int, fn: Callable[..., Any], *args: Any) -> Callable[[Crew, Env, float], Started]:
    """An attack of ``n`` attacker processes, each ``fn(sock, until, *args)``."""
    def start(crew: Crew, env: Env, until: float) -> Started:
        return Started([crew.fork_as(env.attacker, f"attacker {i}", fn, env.sock, until, *args)
                        for i in range(n)])
    return start


def _start_sigstop(crew: Crew, env: Env, until: float) -> Started:
    a = env.attacker
    loop = subprocess.Popen([env.stopper, str(math.ceil(until - time.monotonic()) + 5)],
                            user=a.uid, group=a.gid, extra_groups=[], start_new_session=True)
    return Started([crew.fork_as(a, "submitter", keep_stoppable_tasks, env.sock, until,
                                 keep_root=True)], [loop])


def _start_two_floods(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"attacker {user.name}", waited_submissions, env.sock,
                                 until, FLOOD_THREADS) for user in (env.attacker, env.second)])


def _start_held_slots(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"holder {user.name}", hold_slots, env.sock, until,
                                 HELD_SLOTS) for user in (env.attacker, env.second)])


DRIBBLED = b"GET /v1/limits HTTP/1.1\r\nhost: x\r\n" + b"a:b\r\n" * 2000 + b"\r\n"


def dribble_heads(sock: str, until: float, connections: int) -> dict[str, Any]:
    """``connections`` connections over 4 threads, each thread sending one byte of a 10 KB
    request head (``DRIBBLED``, again and again) to each of its connections in turn, as fast
    as it can (non-blocking: a full one is passed over); a closed one is made again."""
    sent = collections.Counter({"bytes": 0, "made": 0})
    own = f"{sock}.uid/{os.getuid()}"  # (the uid's own socket, as the project's clients use)
    path = own if os.path.exists(own) else sock

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.setblocking(False)
        sent["made"] += 1
        return s

    def loop() -> None:
        conns = [[connect(), 0] for _ in range(connections // 4)]
        while time.monotonic() < until:
            for c in conns:
                try:
                    c[0].send(DRIBBLED[c[1]:c[1] + 1])
                    c[1] = (c[1] + 1) % len(DRIBBLED)
                    sent["bytes"] += 1
                except BlockingIOError:
                    pass
                except OSError:
                    c[0].close()
                    with contextlib.suppress(OSError):
                        c[0], c[1] = connect(), 0
        for c in conns:
            c[0].close()

    _in_threads(4, loop)
    return dict(sent)


def _start_dribbles(crew: Crew, env: Env, until: float) -> Started:
    return Started([crew.fork_as(user, f"dribbler {user.name}", dribble_heads, env.sock, until,
                                 DRIBBLERS) for user in (env.attacker, env.second)])


def _start_connections(slow: bool) -> Callable[[Crew, Env, float], Started]:
    def start(crew: Crew, env: Env, until: float) -> Started:
        return Started([crew.fork_as(env.attacker, "holder", hold_connections, env.sock, until,
                                     env.connections, slow)])
    return start


def spin(sock: str, until: float) -> dict[str, Any]:
    """Burn a CPU until ``until``, never touching the daemon."""
    del sock
    n = 0
    while time.monotonic() < until:
        for _ in range(10_000):
            n += 1
    return {"spins": n}


ATTACKS = [
    Attack("cpu_floor", f"the floor, not an attack: {os.cpu_count()} attacker processes "
           f"spinning on the CPUs, the daemon untouched (what any CPU use costs the victim "
           f"on this box)", _many(os.cpu_count() or 1, spin)),
    Attack("spinning_floor", f"not an attack: {2 * HELD_SLOTS} attacker processes spinning in "
           f"the victim client's session, the daemon untouched", _many(2 * HELD_SLOTS, spin)),
    Attack("property", "4 connections: padded root-only properties (403), as fast as answered",
           _many(4, request_loop, PROPERTY_REQUESTS)),
    Attack("sigstop", f"kill(-1, SIGSTOP) loop as the attacker + {OUTSTANDING} `true` at a "
           f"time, PATH of 300 missing dirs", _start_sigstop),
    Attack("stream_flood", "2 connections: events / followed output, then 64 KiB writes",
           _many(2, stream_flood)),
    Attack("output_flood", f"4 x `head -c 200M /dev/zero` at a time, state on a {DISK} tmpfs",
           _many(1, output_flood, 4, "200M"), disk=DISK),
    Attack("followers", "4 x `head -c 200M /dev/zero` at a time, each followed by 4 "
           "connections that never read", _many(1, output_flood, 4, "200M", 4)),
    Attack("disk_flood", "4 x `head -c 200M /dev/zero` at a time, state on the host's disk",
           _many(1, output_flood, 4, "200M")),
    Attack("connections", "idle connections held, each closed one made again",
           _start_connections(False)),
    Attack("slow_headers", "connections held, a head byte every 0.1 s, closed ones made again",
           _start_connections(True)),
    Attack("retention", f"4 connections finishing `true` tasks, --retain-count {RETAIN}",
           _many(4, finish_tiny_tasks), daemon_args=("--retain-count", str(RETAIN)),
           victim_limit=RETENTION_REQUESTS),
    Attack("keyed_flood", f"4 connections: `true` with 128-byte idempotency keys and "
           f"200-character names, --retain-count {RETAIN}, state on a {DISK} tmpfs",
           _many(4, keyed_submissions), daemon_args=("--retain-count", str(RETAIN)),
           disk=DISK),
    Attack("two_floods", f"two attacker tenants, each submitting `true` with a wait for its "
           f"result from {FLOOD_THREADS} threads at once, as fast as answered",
           _start_two_floods),
    Attack("dribbled_heads", f"two attacker tenants, each {DRIBBLERS} connections sending "
           f"request heads a byte at a time from 4 busy threads", _start_dribbles),
    Attack("terminal_floods", "two attacker tenants, each 4 terminal tasks of `yes`",
           _start_terminal_floods),
    Attack("terminal_resizes", "two attacker tenants, each 8 terminal tasks of `yes`, each "
           "resized again and again", _start_terminal_resizes),
    Attack("spinning_tasks", f"two attacker tenants, each {HELD_SLOTS} tasks spinning on the "
           f"CPUs (its share of the 16 slots)", _start_spinning_tasks),
    Attack("terminal_keys", "8 terminal tasks of `cat`, each written 1 MB of keys at a time",
           _many(1, terminal_keys, 8)),
    Attack("held_slots", f"two attacker tenants, each holding {HELD_SLOTS} long `sleep` tasks "
           f"running (its share of the 16 slots)", _start_held_slots),
    Attack("subscribers", f"{SUBSCRIBERS} event streams opened and never read, and 4 "
           f"connections finishing `true` tasks (each event of theirs for every stream)",
           _start_subscribers),
    Attack("listings", f"8 connections: a listing of {LISTED} of the attacker's tasks, each "
           f"command listed at its longest, as fast as answered", _start_listings),
    Attack("signals", f"4 connections: SIGWINCH to the attacker's task of {TREE} sleeping "
           f"processes, as fast as answered", _start_signals),
    Attack("big_submissions", "4 connections: 1 MiB submissions (argv of 65,000 strings)",
           _many(4, request_loop, [big_request()])),
    Attack("keyed_resends", "4 connections: a task of 65,000 arguments, no longer in memory, "
           "asked for again and again by its request sent with its idempotency key",
           _many(4, keyed_resends), daemon_args=("--keep-finished", "1")),
    Attack("big_environments", "1 connection: submissions of 65,000 environment variables "
           "(964 KB), one after another", _many(1, request_loop, [big_environment()])),
    Attack("big_answers", "4 connections: each its own finished task with a 1 MiB argv shown "
           "(a 2.5 MB answer), as fast as answered", _many(4, show_big_task)),
    Attack("recorded_answers", "4 connections: each shows its own 4 finished tasks of 65,000 "
           "non-ASCII arguments in turn (answers of 2.9 MB, more than the daemon keeps made), "
           "--keep-finished 1", _many(4, show_recorded_tasks, 4),
           daemon_args=("--keep-finished", "1")),
    Attack("output_readers", "16 connections: 4 tasks' 16 MB outputs read whole, again and "
           "again", _many(4, read_output_again, "16M", 4)),
    Attack("output_ends", "4 connections: the output (3 bytes) of a task of 65,000 arguments "
           "read whole, again and again (each read ends with its result: 1 MiB of command)",
           _many(1, read_output_again, "3", 4, 65000)),
    Attack("session_env", "4 sessions carrying 840 KB of environment, each running `true` as "
           "fast as answered", _many(4, session_env_loop)),
    Attack("session_hoard", f"two attacker tenants, each {HOARDERS} sessions exporting 25,000 "
           f"variables at every command (past the uid's 32,768: none carries)",
           _start_session_hoard),
    Attack("session_vars", "4 sessions each setting new values of 3,000 variables at every "
           "command (a 33 KB report), as fast as answered", _many(4, session_vars_loop)),
    Attack("follow_floods", "two attacker tenants, each 8 tasks printing a line every 2 ms, "
           "followed on 64 connections (the most a uid may)", _start_follow_floods),
    Attack("trickle_followers", f"a task printing `x` a line at a time, followed on "
           f"{TRICKLE_FOLLOWERS} connections (64 are taken)", _many(1, follow_a_trickle,
                                                                 TRICKLE_FOLLOWERS)),
]
NAMES = [a.name for a in ATTACKS]


# ---- one attack: phases on its own daemon ------------------------------------------------------

@dataclass
class Outcome:
    attack: Attack
    alone: list[list[float]] = field(default_factory=list)  # latencies per round
    under: list[list[float]] = field(default_factory=list)
    failed_alone: list[str] = field(default_factory=list)
    failed_under: list[str] = field(default_factory=list)
    submits: dict[str, list[float]] = field(default_factory=lambda: {"alone": [], "under": []})
    phases: dict[str, list[list[float]]] = field(
        default_factory=lambda: {"alone": [], "under": []})
    # the victim's process: seconds on a CPU, waiting for one, requests
    own_cpu: dict[str, list[float]] = field(
        default_factory=lambda: {"alone": [0.0, 0.0, 0], "under": [0.0, 0.0, 0]})
    rss_before: int = 0
    rss_end: int = 0
    rss_peak: int = 0
    rss_after: int = 0  # once the last phase's leftovers were stopped
    capped: bool = False  # an attack phase was cut short at RSS_CAP
    held: list[str] = field(default_factory=list)  # the daemon's running/queued at each end
    attacker: dict[str, Any] = field(default_factory=dict)  # counts, summed
    attacker_errors: list[str] = field(default_factory=list)
    stopped_after: int = 0  # attacker tasks force-stopped between phases
    rationed: int = 0  # the daemon's rounds that kept a uid's steps for a later one
    kept: list[str] = field(default_factory=list)  # retention: the victim's marker, per round
    disk_used: int = 0  # output_flood: bytes in use on the state tmpfs, at most
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    seen: set[str] = field(default_factory=set)  # the attacker's finished tasks counted
    cpu: collections.Counter[str] = field(default_factory=collections.Counter)  # daemon's
    daemon: Daemon | None = None


def run_attack(out: Outcome, base: Env, rounds: int, seconds: float) -> None:
    """``rounds`` of (alone, attack) on a daemon of the attack's own; figures into ``out``."""
    attack = out.attack
    with (daemon(attack.daemon_args, attack.disk) as d, Crew() as crew,
          pinned(d.cgroup, {base.attacker.uid, base.second.uid})):
        out.daemon = d
        env = Env(d.sock, base.attacker, base.victim, base.stopper, base.connections,
                  base.second, d.disk)
        warm = crew.fork_as(env.victim, "victim warm-up", victim_requests, d.sock, 0.3, 0.0)
        crew.collect(warm, ANSWER * 2)
        interval = seconds / attack.victim_limit if attack.victim_limit else INTERVAL
        for r in range(rounds):
            got = victim_phase(out, "alone", crew, env, seconds, interval)
            out.alone.append(got["took"])
            out.failed_alone += got["failed"]
            attack_phase(out, crew, env, d, seconds, interval, first=r == 0)
        time.sleep(1.0)
        out.rss_after = rss_kib(d.pid)


def victim_phase(out: Outcome, key: str, crew: Crew, env: Env, seconds: float,
                 interval: float, tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """The victim's requests for one phase; the daemon's CPU time meanwhile is added to
    ``out.cpu[key]`` (and the phase's length to ``key + "_wall"``)."""
    pid = out.daemon.pid if out.daemon else 0
    cpu, wall = cpu_seconds(pid), time.monotonic()
    child = crew.fork_as(env.victim, "victim", victim_requests, env.sock, seconds, interval,
                         out.attack.victim_limit)
    got = crew.collect(child, seconds + ANSWER * 3, tick)
    out.cpu[key] += cpu_seconds(pid) - cpu
    out.cpu[key + "_wall"] += time.monotonic() - wall
    if "error" in got:
        return {"took": [], "failed": [f"the victim's process: {got['error']}"]}
    out.submits[key] += got["submits"]
    out.phases[key] += got["phases"]
    out.own_cpu[key] = [a + b for a, b in zip(out.own_cpu[key], got["own_cpu"], strict=True)]
    return got  # type: ignore[no-any-return]


def attack_phase(out: Outcome, crew: Crew, env: Env, d: Daemon, seconds: float,
                 interval: float, first: bool) -> None:
    """One phase under attack: the attack starts, runs :data:`WARM_UP` s alone, then the
    victim's phase; then the attack's processes end, its tasks are stopped, and (retention)
    the victim's marker is looked up."""
    marker = (crew.collect(crew.fork_as(env.victim, "marker", victim_marker, env.sock), ANSWER)
              if out.attack.name == "retention" else None)
    rss = rss_kib(d.pid)
    out.rss_before = rss if first else out.rss_before
    out.rss_peak = max(out.rss_peak, rss)
    until = time.monotonic() + WARM_UP + seconds + 0.2
    started = out.attack.start(crew, env, until)
    try:
        time.sleep(WARM_UP)

        def sample() -> None:
            out.rss_peak = max(out.rss_peak, rss_kib(d.pid))
            if out.rss_peak > RSS_CAP and not out.capped:
                out.capped = True
                for c in started.children:  # (their counts for this phase are lost)
                    os.kill(c.pid, signal.SIGKILL)

        got = victim_phase(out, "under", crew, env, seconds, interval, sample)
        out.rss_end = rss_kib(d.pid)
        out.rss_peak = max(out.rss_peak, out.rss_end)
        out.under.append(got["took"])
        out.failed_under += got["failed"]
        answers = [crew.collect(c, max(0.0, until - time.monotonic()) + 20)
                   for c in started.children]
    finally:
        for proc in started.procs:
            _end_stopper(proc, env)
    _after_attack(out, crew, env, answers, marker)


def _after_attack(out: Outcome, crew: Crew, env: Env, answers: list[Any],
                  marker: Any) -> None:
    """What the attack left: the attacker's counts, the state disk, the daemon's queue and
    the attacker's outcomes; its unfinished tasks stopped; (retention) the victim's marker."""
    for answer in answers:
        if "error" in answer:
            out.attacker_errors.append(answer["error"])
        _add(out.attacker, answer)
    if env.disk is not None:
        st = os.statvfs(env.disk)
        out.disk_used = max(out.disk_used, (st.f_blocks - st.f_bfree) * st.f_frsize)
    with Client(env.sock, timeout=ANSWER) as root:
        held = root.limits()["daemon"]
        rationed = re.search(r"^corral_loop_rationed_rounds (\S+)", root.metrics(), re.M)
    out.held.append(f"{held['running']}/{held['queued']}")
    out.rationed = int(float(rationed.group(1))) if rationed else 0
    count_outcomes(out, env)
    out.stopped_after += sum(stop_leftovers(env.sock, u) for u in {env.attacker.uid,
                                                                   env.second.uid})
    if marker is not None:
        out.kept.append(_look_up_marker(crew, env, marker, answers))


def _end_stopper(proc: subprocess.Popen[bytes], env: Env) -> None:
    """SIGTERM: the loop ends and sends SIGCONT to what it stopped; killed if it does not."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        a = env.attacker
        subprocess.run([env.stopper, "0"], user=a.uid, group=a.gid, extra_groups=[],
                       check=False)  # (0 seconds: only the SIGCONT)


def _add(total: dict[str, Any], more: dict[str, Any]) -> None:
    """Sum ``more``'s counts (ints and dicts of ints) into ``total``; other values are left."""
    for k, v in more.items():
        if isinstance(v, dict):
            _add(total.setdefault(k, {}), v)
        elif isinstance(v, int) and not isinstance(v, bool):
            total[k] = (max if k.endswith("_max") else int.__add__)(total.get(k, 0), v)


def every_task(c: Client, state: str) -> Iterator[TaskInfo]:
    """Every task in ``state`` the daemon keeps, a page of 1000 at a time."""
    before = None
    while True:
        page = c.list(state, limit=1000, before=before)
        yield from page
        if len(page) < 1000:
            return
        before = page[-1].id


def count_outcomes(out: Outcome, env: Env) -> None:
    """As root: the attacker's tasks that finished (and are still kept), by outcome."""
    with Client(env.sock, timeout=ANSWER) as c:
        for t in every_task(c, "finished"):
            if t.uid == env.attacker.uid and t.id not in out.seen:
                out.seen.add(t.id)
                out.outcomes[str(t.outcome)] += 1


def stop_leftovers(sock: str, uid: int, timeout: float = 60) -> int:
    """As root: force-stop every unfinished task of ``uid`` and wait until none is left; how
    many were stopped."""
    stopped: set[str] = set()
    deadline = time.monotonic() + timeout
    with Client(sock, timeout=ANSWER) as c:
        while True:
            left = [t.id for state in ("queued", "starting", "running", "stopping")
                    for t in every_task(c, state) if t.uid == uid]
            if not left:
                return len(stopped)
            if time.monotonic() > deadline:
                print(f"WARNING: {len(left)} attacker tasks still unfinished {timeout:g}s after "
                      f"their stop", file=sys.stderr)
                return len(stopped)
            for task_id in set(left) - stopped:
                with contextlib.suppress(ApiError):  # (ended meanwhile)
                    c.stop(task_id, force=True)
                stopped.add(task_id)
            time.sleep(0.05)


def _look_up_marker(crew: Crew, env: Env, marker: Any, answers: list[Any]) -> str:
    """The victim's marker after the retention attack, once retention has run (the
    attacker's first task of the phase expired), or why it cannot be told."""
    if not isinstance(marker, str):
        return f"no marker ({marker})"
    firsts = [a["first_id"] for a in answers if a.get("first_id")]
    ran = False
    deadline = time.monotonic() + 15
    with Client(env.sock, timeout=ANSWER) as root:
        while firsts and not ran and time.monotonic() < deadline:
            try:
                root.show(min(firsts, key=int))
                time.sleep(0.1)
            except ApiError as e:
                ran = e.code == "expired"
    found = crew.collect(crew.fork_as(env.victim, "lookup", victim_lookup, env.sock, marker),
                         ANSWER)
    return f"{found}{'' if ran else ' (retention had not run)'}"


# ---- the report -------------------------------------------------------------------------------

def p99(xs: list[float]) -> float:
    """The 99th percentile, nearest rank (with few samples: close to the maximum)."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)] if s else math.nan


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if not math.isnan(x) else "-"


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def _counts(c: dict[str, Any]) -> str:
    parts = []
    for k, v in c.items():
        if isinstance(v, dict):
            if v:
                parts.append(f"{k} {{{', '.join(f'{a}: {b}' for a, b in sorted(v.items()))}}}")
        else:
            parts.append(f"{k} {v}")
    return ", ".join(parts)


def _share(cpu: collections.Counter[str], key: str) -> str:
    return f"{cpu[key] / cpu[key + '_wall']:.0%}" if cpu[key + "_wall"] else "-"


def goal_met(o: Outcome) -> tuple[float, bool]:
    alone = [x for r in o.alone for x in r]
    under = [x for r in o.under for x in r]
    ratio = p99(under) / p99(alone) if alone and under else math.nan
    return ratio, ratio <= GOAL and not o.failed_under and bool(under)


def report(o: Outcome) -> None:
    alone = [x for r in o.alone for x in r]
    under = [x for r in o.under for x in r]
    ratio, met = goal_met(o)
    rounds = ", ".join(f"{p99(u) / p99(a):.2f}x" if a and u else "-"
                       for a, u in zip(o.alone, o.under, strict=True))
    print(f"{o.attack.name}: {o.attack.what}")
    print(f"  victim alone: median {ms(median(alone) if alone else math.nan)} ms, p99 "
          f"{ms(p99(alone))} ms, n={len(alone)}, unanswered {len(o.failed_alone)}")
    print(f"  victim under attack: median {ms(median(under) if under else math.nan)} ms, p99 "
          f"{ms(p99(under))} ms, n={len(under)}, unanswered {len(o.failed_under)}")
    print(f"  p99 attack/alone {ratio:.2f}x (rounds: {rounds}); goal within {GOAL:g}x and "
          f"never unanswered: {'met' if met else 'NOT met'}")
    for label, failed in (("alone", o.failed_alone), ("under attack", o.failed_under)):
        if failed:
            top = collections.Counter(failed).most_common(3)
            print(f"  unanswered {label}: " + "; ".join(f"{n} x {why}" for why, n in top))
    sub = {k: ms(median(v)) if v else "-" for k, v in o.submits.items()}
    print(f"  of which the submission (until its 201): median {sub['alone']} ms alone, "
          f"{sub['under']} ms under attack")
    steps = {k: " / ".join(ms(median([p[i] for p in v])) for i in range(4)) if v else "-"
             for k, v in o.phases.items()}
    print(f"  its request -> created / -> started / -> ended / -> answered (the daemon's "
          f"clock), medians ms: alone {steps['alone']}; under attack {steps['under']}")
    own = {k: f"{ms(r / max(1, n))} / {ms(w / max(1, n))}" for k, (r, w, n) in o.own_cpu.items()}
    print(f"  the victim's own process per request, ms on a CPU / waiting for one: alone "
          f"{own['alone']}, under attack {own['under']}")
    print(f"  daemon RSS: before {mib(o.rss_before)} MiB, at the end {mib(o.rss_end)} MiB, "
          f"peak {mib(o.rss_peak)} MiB; {mib(o.rss_after)} MiB 1 s after the last phase's "
          f"leftovers were stopped")
    print(f"  daemon's event-loop rounds rationed (a uid's steps kept for a later round), "
          f"since its start: {o.rationed}")
    print(f"  daemon running/queued tasks (all uids) at each attack phase's end: "
          f"{', '.join(o.held)}")
    print(f"  daemon CPU: {_share(o.cpu, 'alone')} of a core alone, {_share(o.cpu, 'under')} "
          f"under attack")
    print(f"  attacker: {_counts(o.attacker) or '-'}")
    if o.outcomes or o.stopped_after:
        print(f"  attacker's tasks: finished {_counts(dict(o.outcomes)) or 'none'}; unfinished "
              f"at a phase's end, force-stopped: {o.stopped_after}")
    if o.capped:
        print(f"  ATTACK CUT SHORT: the daemon's RSS passed {mib(RSS_CAP)} MiB; its processes "
              f"were killed (their counts for that phase are missing)")
    for err in o.attacker_errors[:3]:
        print(f"  attacker process error: {err}")
    if o.kept:
        print(f"  victim's earlier result after each attack phase: {', '.join(o.kept)}")
    if o.attack.disk:
        print(f"  state tmpfs ({o.attack.disk}): at most {o.disk_used / 2**20:.1f} MiB in use "
              f"after a phase")
    d = o.daemon
    if d is not None and (d.status != 0 or d.tracebacks):
        print(f"  daemon: exit status {d.status}, {d.tracebacks} tracebacks in its log; last "
              f"lines: {d.log_tail}")
    elif d is not None:
        print(f"  daemon: exit status 0, {d.log_lines} log lines at warning level, no traceback")


def summary(outcomes: list[Outcome]) -> None:
    floor = next((goal_met(o)[0] for o in outcomes if o.attack.name == "cpu_floor"), None)
    print(f"\n{'attack':<16} {'alone med/p99 ms':>17} {'attack med/p99 ms':>18} "
          f"{'p99 ratio':>9} {'unanswered':>10} {'RSS before->end MiB':>20}  goal")
    for o in outcomes:
        alone = [x for r in o.alone for x in r]
        under = [x for r in o.under for x in r]
        ratio, met = goal_met(o)
        a = f"{ms(median(alone) if alone else math.nan)} / {ms(p99(alone))}"
        u = f"{ms(median(under) if under else math.nan)} / {ms(p99(under))}"
        lost = f"{len(o.failed_under)}/{len(under) + len(o.failed_under)}"
        rss = f"{mib(o.rss_before)} -> {mib(o.rss_end)}"
        print(f"{o.attack.name:<16} {a:>17} {u:>18} {ratio:>8.2f}x {lost:>10} {rss:>20}  "
              f"{'met' if met else 'NOT met'}")
    if floor is not None:
        print(f"(cpu_floor: the victim's p99 while every CPU is busy with something else is "
              f"{floor:.2f}x its p99 alone; an attack's ratio over that is the daemon's part)")


# ---- main ---------------------------------------------------------------------------------

_interrupted: list[int] = []


def _interrupt(sig: int, _frame: Any) -> None:
    """The first SIGINT or SIGTERM raises KeyboardInterrupt; later ones only say that the
    clean-up is under way (cutting it short would leave users, cgroups and mounts behind)."""
    if _interrupted:
        print(f"{signal.Signals(sig).name}: still cleaning up", file=sys.stderr)
        return
    _interrupted.append(sig)
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 round of 1.5 s phases, 300 connections: a smoke test")
    ap.add_argument("--only", metavar="NAME,...", default=",".join(NAMES),
                    help=f"attacks to run (default all): {', '.join(NAMES)}")
    ap.add_argument("--rounds", type=int, default=3, help="alone/attack pairs per attack")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds per phase")
    ap.add_argument("--pin", action="store_true",
                    help="the attacker's processes and tasks on the last CPU, the rest on the "
                         "others: the daemon's part of each attack, without the CPU contention")
    args = ap.parse_args()
    connections = 1024
    if args.quick:
        args.rounds, args.seconds, connections = 1, 1.5, 300
    only = args.only.split(",")
    if set(only) - set(NAMES):
        ap.error(f"--only: unknown {sorted(set(only) - set(NAMES))}; known: {', '.join(NAMES)}")
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        ap.error(f"--pin needs 2 CPUs or more; this process may use {len(cpus)}")
    if os.geteuid() != 0:
        print("bench_tenants needs root (users, cgroups, a mount namespace)", file=sys.stderr)
        return 2
    for tool in ("gcc", "useradd", "userdel", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            print(f"bench_tenants needs {tool}", file=sys.stderr)
            return 2
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    print(host_note())
    print(raise_nofile(connections + 4096 + 1000))
    print(f"tenants benchmark: {args.rounds} rounds x (alone {args.seconds:g} s, attack "
          f"{args.seconds:g} s) per attack; victim: submit-to-result of `true`, a fresh "
          f"connection each, one started every {INTERVAL * 1e3:.0f} ms; unanswered: no answer "
          f"within {ANSWER:g} s, an error, or not succeeded")
    outcomes: list[Outcome] = []
    failed: list[str] = []
    with tenants() as (attacker, victim, second), stopper_program() as stopper:
        print(f"attacker {attacker.name} (uid {attacker.uid}), victim {victim.name} "
              f"(uid {victim.uid})\n")
        if args.pin:
            AFFINITY[attacker.uid] = AFFINITY[second.uid] = {cpus[-1]}
            os.sched_setaffinity(0, cpus[:-1])  # (the daemons and the victim inherit it)
            print(f"pinned: the attacker's processes and tasks on CPU {cpus[-1]}; the daemon, "
                  f"the victim and its tasks on CPU {','.join(map(str, cpus[:-1]))}\n")
        base = Env("", attacker, victim, stopper, connections, second)
        for attack in (a for a in ATTACKS if a.name in only):
            out = Outcome(attack)
            try:
                run_attack(out, base, args.rounds, args.seconds)
                outcomes.append(out)
                report(out)
            except (OSError, ApiError, DaemonGone) as e:  # the next attack still runs
                failed.append(attack.name)
                d = out.daemon
                print(f"{attack.name}: the run failed: {type(e).__name__}: {e}" + (
                      f"; the daemon's exit status {d.status}, its last lines: {d.log_tail}"
                      if d is not None else ""))
            sys.stdout.flush()
    summary(outcomes)
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    print(f"  at the end: {host_note()}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; the users, daemons, cgroups and mounts were removed",
              file=sys.stderr)
        sys.exit(128 + (_interrupted[0] if _interrupted else signal.SIGINT))
