"""The daemon's client verbs (`corral submit`, `logs`, `wait`, `show`) end to end, through the
installed `corral` command, against a real `corral serve` (start_daemon: tests/daemon)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis
import pytest
from cli_util import default_signals
from daemon_util import RunningDaemon, stop_reached, wait_for
from hypothesis import strategies as st

from supervisor.cli.clientutil import START_WAIT

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
HANG = 30.0


def client(d: RunningDaemon | str, *args: str) -> subprocess.Popen[bytes]:
    """``corral ARGS`` against ``d`` (a daemon, or a socket path), in a session of its own (its
    own process group: a Ctrl-C at its terminal is a SIGINT to that group), every signal at
    its default as a login shell starts it."""
    sock = d if isinstance(d, str) else d.socket
    return subprocess.Popen([CORRAL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=dict(os.environ, CORRAL_SOCKET=sock),
                            start_new_session=True, preexec_fn=default_signals)


@pytest.fixture
def sockdir() -> Iterator[str]:
    """A directory for a socket of the test's own (removed after the daemon has stopped: ask
    for it before start_daemon)."""
    where = tempfile.mkdtemp(prefix="corral-test-sock-")
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def clients() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``client(...)``, each killed (by its pid) and reaped at teardown if still running."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: Any) -> subprocess.Popen[bytes]:
        p = client(*args)
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.communicate()


def read_until(stream: Any, text: bytes, timeout: float = HANG) -> bytes:
    """What ``stream`` (a pipe) gives until ``text`` has come (AssertionError if it never
    does within ``timeout``)."""
    got = b""
    deadline = time.monotonic() + timeout
    while text not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {text!r}; got {got!r}"
        if select.select([stream], [], [], left)[0]:
            chunk = os.read(stream.fileno(), 65536)
            assert chunk, f"the stream ended before {text!r}; got {got!r}"
            got += chunk
    return got


def ctrl_c(p: subprocess.Popen[bytes]) -> None:
    """What a Ctrl-C at its terminal does: SIGINT to its process group."""
    os.killpg(p.pid, signal.SIGINT)


READY = "echo ready; exec sleep 600"


# ---- a client started with the daemon: it waits for the socket ------------------------------

def test_a_client_started_before_its_daemon_waits_for_it(
        sockdir: str, start_daemon: Callable[..., RunningDaemon], clients: Any) -> None:
    # `corral serve ... & corral submit ...`: the socket appears a few hundred ms later
    sock = os.path.join(sockdir, "corral.sock")
    p = clients(sock, "submit", "--wait", "--", "sh", "-c", "echo hello")
    start_daemon(socket=sock)
    _, err = p.communicate(timeout=HANG)
    assert p.returncode == 0, err.decode()
    assert b"cannot reach" not in err, err.decode()


def test_a_client_without_a_daemon_gives_up_after_its_wait_and_says_so(
        tmp_path: Any, clients: Any) -> None:
    began = time.monotonic()
    p = clients(str(tmp_path / "nobody-here.sock"), "ps")
    _, err = p.communicate(timeout=HANG)
    took = time.monotonic() - began
    assert p.returncode == 125
    assert f"No such file or directory (waited {START_WAIT:g}s for it to start)" in \
        err.decode(), err.decode()
    assert START_WAIT <= took < START_WAIT + 5


# ---- Ctrl-C: a follow that only watches detaches; one that "exits like run" stops the task ----

def test_ctrl_c_on_logs_follow_detaches_without_a_traceback(
        start_daemon: Callable[..., RunningDaemon], clients: Any) -> None:
    d = start_daemon()
    task_id = d.corral("submit", "--", "sh", "-c", READY, check=True).stdout.decode().strip()
    p = clients(d, "logs", "-f", task_id)
    read_until(p.stdout, b"ready\n")
    ctrl_c(p)
    _, err = p.communicate(timeout=HANG)
    # ended by the SIGINT, as `tail -f` is (a shell says 130), and the task goes on
    assert p.returncode == -signal.SIGINT, err.decode()
    assert b"Traceback" not in err and err == b"", err.decode()
    with d.client() as c:
        assert c.show(task_id).state == "running"
        c.stop(task_id, force=True)
        c.wait(task_id)


@pytest.mark.parametrize("how", ["--follow", "--wait"])
def test_ctrl_c_on_submit_stops_the_task_and_exits_with_its_record(
        start_daemon: Callable[..., RunningDaemon], clients: Any, how: str) -> None:
    d = start_daemon()
    p = clients(d, "submit", how, "--", "sh", "-c", READY)
    err = read_until(p.stderr, b"\n")  # "corral: task ID"
    task_id = err.decode().split()[-1]
    with d.client() as c:
        wait_for(lambda: c.show(task_id).state == "running", "the task to run")
    if how == "--follow":
        read_until(p.stdout, b"ready\n")
    ctrl_c(p)
    _, rest = p.communicate(timeout=HANG)
    err += rest
    with d.client() as c:
        record = c.show(task_id)
    assert b"Traceback" not in err, err.decode()
    assert f"stopping task {task_id}".encode() in err, err.decode()
    # stopped through the daemon, gracefully (its stop signal: the sleep ends on it), and the
    # command exits as the record says, as `corral run` does
    assert record.result["outcome"] == "cancelled", record.result
    assert stop_reached(record.result) == "signalled", record.result["stop"]
    assert p.returncode == record.exit_status, err.decode()


def test_a_second_ctrl_c_on_submit_follow_kills_the_task_now(
        start_daemon: Callable[..., RunningDaemon], clients: Any) -> None:
    d = start_daemon()
    # the task ignores its stop signal, and has a minute of grace: only the kill ends it
    p = clients(d, "submit", "--follow", "--grace", "60s", "--", "sh", "-c",
                "trap '' TERM; echo ready; sleep 600 & wait")
    task_id = read_until(p.stderr, b"\n").decode().split()[-1]
    read_until(p.stdout, b"ready\n")
    began = time.monotonic()
    ctrl_c(p)
    read_until(p.stderr, f"stopping task {task_id}".encode())
    ctrl_c(p)
    _, err = p.communicate(timeout=HANG)
    assert time.monotonic() - began < 20  # (not the 60 s grace)
    with d.client() as c:
        record = c.show(task_id)
    assert b"Traceback" not in err, err.decode()
    assert f"killing task {task_id}".encode() in err, err.decode()
    assert stop_reached(record.result) == "killed", record.result["stop"]
    assert p.returncode == record.exit_status, err.decode()


# ---- what a task that never ran says ---------------------------------------------------------

def test_a_task_that_fails_to_start_says_why(
        start_daemon: Callable[..., RunningDaemon]) -> None:
    d = start_daemon()
    r = d.corral("submit", "--wait", "--", "corral-no-such-command")
    assert r.returncode == 127
    err = r.stderr.decode()
    assert "spawn_failed: cannot run 'corral-no-such-command'" in err, err
    assert "No such file or directory (step: exec); exit status 127" in err, err
    task_id = err.split()[2]  # "corral: task ID"
    r = d.corral("wait", task_id)
    assert r.returncode == 127 and "cannot run 'corral-no-such-command'" in r.stderr.decode()
    shown = d.corral("show", task_id, check=True).stdout.decode()
    assert "Outcome: spawn_failed  exit status 127  (cannot run" in shown, shown
    assert "Wall: n/a  CPU: n/a" in shown and "None" not in shown, shown


def test_show_gives_the_figures_of_a_task_that_ran(
        start_daemon: Callable[..., RunningDaemon]) -> None:
    d = start_daemon()
    task_id = d.corral("submit", "--", "sh", "-c", "exit 3", check=True).stdout.decode().strip()
    r = d.corral("wait", task_id)
    assert r.returncode == 3
    assert f"task {task_id} failed: exited with code 3; exit status 3" in r.stderr.decode()
    shown = d.corral("show", task_id, check=True).stdout.decode()
    wall = next(line for line in shown.splitlines() if line.startswith("Wall: "))
    assert wall.startswith("Wall: 0.") and "n/a" not in wall.split("CPU")[0], wall


def test_a_wait_bound_on_the_command_line_exits_75_and_the_task_goes_on(
        start_daemon: Callable[..., RunningDaemon]) -> None:
    d = start_daemon()
    r = d.corral("submit", "--wait", "10s", "--", "sh", "-c", "exit 4")
    assert r.returncode == 4  # ended within the bound: its own status
    r = d.corral("submit", "--wait", "0.5s", "--", "sh", "-c", "sleep 30")
    err = r.stderr.decode()
    assert r.returncode == 75 and "still running after the 0.5s wait bound" in err, err
    task_id = err.split()[2]
    assert d.corral("show", task_id, check=True).stdout.decode().count("running") >= 1
    assert d.corral("stop", "--force", task_id).returncode == 0
    r = d.corral("submit", "--wait", "soon", "--", "true")
    assert r.returncode == 125 and "--wait" in r.stderr.decode()
    session = d.corral("session", "open", check=True).stdout.decode().split()[0]
    r = d.corral("session", "exec", "--wait", "0.3s", session, "--", "echo hi; sleep 30")
    err = r.stderr.decode()
    assert r.returncode == 75 and r.stdout == b"hi\n" and "wait bound" in err, (r, err)
    d.corral("session", "close", session, check=True)


# ---- start-up: the client verbs read their plain options without argparse -------------------

_WORDS = {
    "ps": ["--json", "--state", "running", "--state=finished", "--state=bogus", "-n", "5", "-n7",
           "--limit", "12", "--limit=0", "--limit=x", "--socket", "/s", "--socket=/t", "--sock",
           "-h", "--", "extra", "-5", "--json=1", "-n-1"],
    "show": ["12", "7", "--json", "--socket", "/s", "--socket=/t", "--js", "-h", "--", "-3",
             "--json=1", "abc"],
    "wait": ["12", "-q", "--quiet", "--qu", "--socket=/t", "--socket", "-x", "--", "5"],
    "stop": ["12", "--force", "--forc", "--socket", "/s", "-f", "--", "9", "--force=yes"],
}
_PLAIN = {"--json", "--state=running", "-n7", "--limit=0", "--socket=/t", "-q", "--quiet",
          "--force"}


@hypothesis.given(st.data())
@pytest.mark.parametrize("verb", sorted(_WORDS))
def test_a_client_verb_read_without_argparse_is_what_argparse_reads(
        verb: str, data: st.DataObject) -> None:
    """The client verbs read their options in their plain forms without argparse (which
    brings re and enum: ~10 ms of their start-up); whatever they read so, argparse reads the
    same, and anything else (help, an abbreviation, an error) is left to argparse."""
    import contextlib
    import importlib
    import io

    from supervisor.cli.parsing import parser

    words = data.draw(st.lists(st.sampled_from(_WORDS[verb]), max_size=6))
    fast = importlib.import_module(f"supervisor.cli.{verb}").fast_args(words)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            slow = vars(parser(verb).parse_args([verb, *words]))
    except SystemExit:
        assert fast is None, (words, vars(fast))
        return
    slow.pop("verb")
    if fast is not None:
        assert vars(fast) == slow, words
    operands = [w for w in words if w.isdigit()]
    # (a valued option given twice is argparse's: it checks each value, the last one counts)
    valued = [_OPTION_OF[w] for w in words if w in _OPTION_OF]
    plain = all(w in _PLAIN or w.isdigit() for w in words) and \
        len(operands) == (0 if verb == "ps" else 1) and len(valued) == len(set(valued))
    assert fast is not None or not plain, words


_OPTION_OF = {"-n7": "limit", "--limit=0": "limit", "--state=running": "state",
              "--socket=/t": "socket"}


def test_ps_starts_without_argparse_or_json(start_daemon: Callable[..., RunningDaemon]) -> None:
    """What ``corral ps`` imports beyond the interpreter's own start-up (run without site,
    the checkout on the path: an editable install's import hook brings collections itself):
    not argparse, json, signal, collections (a namedtuple's ~2 ms) or typing."""
    import supervisor

    d = start_daemon()
    code = ("import sys; before = set(sys.modules); from supervisor.cli import main; "
            "status = main(['ps', '-n', '3']); "
            "print(status, [m for m in ('argparse', 'json', 'signal', 'collections', 'typing') "
            "if m in sys.modules and m not in before])")
    checkout = os.path.dirname(os.path.dirname(supervisor.__file__))
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, CORRAL_SOCKET=d.socket, PYTHONPATH=checkout),
                         timeout=HANG, check=True)
    assert out.stdout.splitlines()[-1] == "0 []", out.stdout + out.stderr
    assert out.stdout.startswith("      ID  STATE"), out.stdout


def test_launched_client_verbs_exit_at_once_with_every_byte_and_status_of_a_full_exit(
        start_daemon: Callable[..., RunningDaemon]) -> None:
    """A client verb started by the launcher ends with ``os._exit`` once its output is
    flushed (the interpreter's teardown was ~4 ms of ``corral ps``): what it writes through
    a pipe and the status it exits with are those of the same verb run in-process, which
    exits as Python does; a reader that goes away early is status 141, not a traceback."""
    d = start_daemon()
    with d.client() as c:
        task = c.submit(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo; exit 3"])
        c.wait(task.id, timeout=HANG)
    for verb in (["logs", task.id], ["ps", "-n", "5"], ["show", task.id], ["wait", task.id],
                 ["stop", task.id], ["signal", task.id, "TERM"], ["show", "424242"]):
        launched = client(d, *verb)
        out, err = launched.communicate(timeout=HANG)
        inproc = d.corral(*verb)
        assert (launched.returncode, out, err) == (inproc.returncode, inproc.stdout,
                                                   inproc.stderr), verb
    assert len(out) == 0 and launched.returncode != 0  # (the unused id: an error)
    early = client(d, "logs", task.id)
    assert early.stdout is not None and early.stdout.read(10) == b"x" * 10
    early.stdout.close()
    assert early.wait(HANG) == 141
    assert early.stderr is not None and b"Traceback" not in early.stderr.read()
