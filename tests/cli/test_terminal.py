"""`corral run` at a real terminal: tmux drives it (keys with send-keys, the screen with
capture-pane), and each test has its own tmux server (``-L``) and its own scratch cgroup."""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import cgroupfs
from supervisor.cli.relay import Screen
from supervisor.cli.terminal import Act, Delivery, Keys

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
PYTHON = "/usr/bin/python3"  # the system's: a pyenv shim costs seconds per start
DEADLINE = 30.0
RACE_RUNS = 50
EARLY_RUNS = 10

SI_USER, SI_KERNEL = 0, 0x80

pytestmark = pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v tmux"],
                                               capture_output=True).returncode != 0,
                                reason="needs tmux (apt-get install tmux)")


def wait_until(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.01)


def proc_state(pid: int) -> str:
    """The one-letter state of ``pid`` ("" once it is gone)."""
    fields = stat_fields(pid)
    return fields[0] if fields else ""


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, session, tty_nr, tpgid..."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def in_foreground(pid: int) -> bool:
    """Is ``pid``'s process group the foreground group of its terminal?"""
    fields = stat_fields(pid)
    return bool(fields) and fields[2] == fields[5]


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text()
                .split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    out = children(pid)
    for child in list(out):
        out += descendants(child)
    return out


def comm_of(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def blocks_sigint(pid: int) -> bool:
    """Is ``pid`` a corral that has blocked SIGINT (corral run's first step)?  (Not the
    shell's child before its exec: bash blocks SIGINT around its fork.)"""
    try:
        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    if CORRAL.encode() not in argv:
        return False
    mask = int(re.search(r"^SigBlk:\s*([0-9a-f]+)", status, re.M).group(1), 16)  # type: ignore[union-attr]
    return bool(mask & (1 << (signal.SIGINT - 1)))


class Tmux:
    """A tmux server of our own (``-L``), one window running ``command``."""

    def __init__(self, command: str) -> None:
        self.socket = f"corral-tty-test-{uuid.uuid4().hex[:8]}"
        self.tmux("new-session", "-d", "-x", "160", "-y", "50", command)
        self.socket_path = self.tmux("display", "-p", "#{socket_path}").strip()

    def tmux(self, *args: str) -> str:
        r = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                           capture_output=True, text=True, timeout=DEADLINE)
        assert r.returncode == 0, f"tmux {args}: {r.stderr}"
        return r.stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def line(self, text: str) -> None:
        self.tmux("send-keys", "-l", text)
        self.tmux("send-keys", "Enter")

    def screen(self, *, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", *(["-e"] if escapes else []))

    def shows(self, fmt: str) -> str:
        """A format of the pane, e.g. ``#{alternate_on}``."""
        return self.tmux("display", "-p", fmt).strip()

    def wait_screen(self, pattern: str, timeout: float = DEADLINE) -> None:
        try:
            wait_until(lambda: re.search(pattern, self.screen(), re.M),
                       f"{pattern!r} on the screen", timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}; the screen:\n{self.screen()}") from None

    @property
    def pane_pid(self) -> int:
        return int(self.tmux("display", "-p", "#{pane_pid}"))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=DEADLINE)
        try:
            os.unlink(self.socket_path)  # kill-server leaves it behind
        except FileNotFoundError:
            pass


class Shell(Tmux):
    """An interactive bash (job control on) in its own tmux, and helpers to run corral in it.

    A command's exit status is written by PROMPT_COMMAND, not by ``; echo $?``: after a
    Ctrl-C that ended its job with SIGINT, bash drops the rest of the command line (as for
    any command: corral ends the same way then).
    """

    # (not while the job is stopped or in the background: `jobs -p` lists it then)
    PROMPT_COMMAND = 's=$?; if [ -n "$N" ] && [ -z "$(jobs -p)" ]; then echo $s >"$D/$N.rc"; N=; fi'

    def __init__(self, tmp: pathlib.Path, root: str) -> None:
        self.tmp, self.root = tmp, root
        super().__init__(f"env PS1='$ ' HISTFILE=/dev/null D={tmp} "
                         f"PROMPT_COMMAND='{self.PROMPT_COMMAND}' bash --norc --noprofile -i")
        self.wait_screen(r"^\$ $")

    def command(self, text: str) -> None:
        """Type ``text`` at the shell's prompt, once there is one: keys typed ahead, while
        bash is still busy with the last job, may be flushed by the terminal or misread."""
        wait_until(lambda: [ln for ln in self.screen().splitlines() if ln.strip()][-1]
                   .rstrip().endswith("$"), "the shell's prompt")
        self.line(text)

    def corral(self, args: str, *, name: str = "run", err: bool = False) -> None:
        """Type ``corral run --cgroup-root ROOT ARGS``; its status goes to ``<name>.rc``, its
        stderr to ``<name>.err`` with ``err`` (else to the terminal)."""
        redirect = f" 2>{self.tmp}/{name}.err" if err else ""
        self.command(f"N={name}; {CORRAL} run --cgroup-root {self.root} --json-file "
                     f"{self.tmp}/{name}.json {args}{redirect}")

    def corral_pid(self) -> int:
        """The running corral (the shell's child), once it has blocked the signals."""
        found: list[int] = []

        def ready() -> bool:
            found[:] = [p for p in children(self.pane_pid) if blocks_sigint(p)]
            return bool(found)

        wait_until(ready, "corral to start")
        return found[0]

    def task_pid(self, corral: int, comm: str) -> int:
        """A descendant of corral's running ``comm``."""
        found: list[int] = []

        def ready() -> bool:
            found[:] = [p for p in descendants(corral) if comm_of(p) == comm]
            return bool(found)

        wait_until(ready, f"the task {comm} to run")
        return found[0]

    def status(self, name: str = "run", timeout: float = DEADLINE) -> int:
        path = self.tmp / f"{name}.rc"
        try:
            wait_until(lambda: path.exists() and path.read_text().strip(), f"{name} to end",
                       timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}; the screen:\n{self.screen()}") from None
        return int(path.read_text())

    def record(self, name: str = "run") -> dict[str, object]:
        text = (self.tmp / f"{name}.json").read_text()
        err = self.tmp / f"{name}.err"
        assert text, f"no record; stderr: {err.read_text() if err.exists() else '(on the screen)'}"
        data: dict[str, object] = json.loads(text)
        return data

    def stty(self, name: str) -> str:
        self.command(f"stty -g >{self.tmp}/{name}.stty")
        path = self.tmp / f"{name}.stty"
        wait_until(lambda: path.exists() and path.read_text().strip(), "stty -g")
        return path.read_text().strip()


@pytest.fixture
def root(test_cgroup: cgroupfs.Cgroup) -> str:
    return test_cgroup.path


@pytest.fixture
def shell(tmp_path: pathlib.Path, root: str) -> Iterator[Shell]:
    sh = Shell(tmp_path, root)
    try:
        yield sh
    finally:
        sh.close()


def assert_complete(err: str, record: dict[str, object], status: int) -> None:
    """No traceback; the summary and the JSON record are whole and agree with the status."""
    assert "Traceback" not in err and "Error" not in err, err
    assert re.search(r"^corral: task \S+ finished with result: \w+$", err, re.M), err
    assert f"  Exit status: {status}\n" in err, err
    assert record["exit_status"] == status and record["outcome"], record


# ---- the keys ----------------------------------------------------------------------------------

def test_ctrl_c_race_never_loses_the_summary_or_the_record(shell: Shell) -> None:
    """The terminal's Ctrl-C reaches corral and the task at the same moment, at any point of
    corral's life after its first step: before the spawn, while it runs, during the cleanup,
    while the summary is printed (a second key soon after the first), and Ctrl-\\ too."""
    rng = random.Random(os.environ.get("CORRAL_RACE_SEED", uuid.uuid4().hex))
    outcomes: dict[str, int] = {}
    for i in range(RACE_RUNS):
        name = f"race{i}"
        shell.corral("--summary -- sleep 30", name=name, err=True)
        shell.corral_pid()
        time.sleep(rng.uniform(0, 0.3))
        key = "C-\\" if i % 10 == 9 else "C-c"
        shell.keys(key)
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0, 0.1))
            shell.keys(key)
        try:
            status = shell.status(name, timeout=5)
        except AssertionError:
            # The key came before the spawn but was read after it: the program never got
            # it and corral took it for the program's.  One more reaches the program.
            shell.keys("C-c")
            status = shell.status(name)
        err = (shell.tmp / f"{name}.err").read_text()
        record = shell.record(name)
        assert_complete(err, record, status)
        assert status in (130, 131), err
        outcomes[str(record["outcome"])] = outcomes.get(str(record["outcome"]), 0) + 1
    assert set(outcomes) <= {"signaled", "cancelled"}, outcomes


def test_ctrl_c_in_the_first_50ms_never_prints_a_traceback(shell: Shell) -> None:
    """A key right after Enter, even while Python starts: the launcher (native/corral_launch.c)
    starts it with the job signals blocked, so the key waits for corral's signalfd; the summary
    and the record are always complete."""
    rng = random.Random(os.environ.get("CORRAL_RACE_SEED", uuid.uuid4().hex))
    for i in range(EARLY_RUNS):
        name = f"early{i}"
        shell.corral("--summary -- sleep 30", name=name, err=True)
        wait_until(lambda: children(shell.pane_pid), "corral's process")
        time.sleep(rng.uniform(0, 0.05))
        shell.keys("C-c")
        try:
            status = shell.status(name, timeout=5)
        except AssertionError:
            shell.keys("C-c")  # read as the program's just before the spawn (see above)
            status = shell.status(name)
        err = (shell.tmp / f"{name}.err").read_text()
        assert "Traceback" not in err, err
        assert_complete(err, shell.record(name), status)


def interrupt_and_leave_the_repl(shell: Shell) -> None:
    """In a Python REPL run by corral: Ctrl-C a running statement, go on, Ctrl-D; corral
    exits 0."""
    shell.wait_screen(r"^>>> $")
    shell.line("import time; time.sleep(60)")
    corral = shell.corral_pid()
    wait_until(lambda: proc_state(shell.task_pid(corral, "python3")) == "S", "the sleep")
    shell.keys("C-c")
    shell.wait_screen(r"^KeyboardInterrupt$")
    shell.line("print(6 * 7)")
    shell.wait_screen(r"^42$")
    shell.keys("C-d")
    assert shell.status() == 0


def test_a_repl_owns_its_ctrl_c_and_exits_on_ctrl_d(shell: Shell) -> None:
    shell.corral(f"--summary -- {PYTHON} -q")
    interrupt_and_leave_the_repl(shell)
    screen = shell.screen()
    assert "finished with result: succeeded" in screen and "Traceback (most recent" not in \
        screen.split("KeyboardInterrupt")[1]
    assert shell.record()["outcome"] == "succeeded"


def test_ctrl_z_suspends_both_and_fg_bg_resume_both(shell: Shell) -> None:
    shell.corral("--summary -- sleep 60")
    corral = shell.corral_pid()
    task = shell.task_pid(corral, "sleep")
    shell.keys("C-z")
    shell.wait_screen(r"Stopped")
    wait_until(lambda: proc_state(corral) == "T" and proc_state(task) == "T", "both stopped")
    shell.command("bg")
    wait_until(lambda: proc_state(corral) == "S" and proc_state(task) == "S", "both running")
    shell.command("fg")
    wait_until(lambda: in_foreground(corral) and proc_state(task) == "S", "fg")
    shell.keys("C-c")
    assert shell.status() == 130
    screen = shell.screen()
    assert "Traceback" not in screen and "result: signaled" in screen
    assert shell.record()["exit"] == {"code": None, "signal": 2, "signal_name": "SIGINT"}


def test_ctrl_z_never_stops_an_orphaned_corral(tmp_path: pathlib.Path, root: str) -> None:
    # A pane's shell without job control: its process group (corral's) is orphaned, nobody
    # would resume a stopped corral, so, as the kernel does for its default action, corral
    # does not stop itself (and the kernel does not stop the task)
    tmux = Tmux(f"{CORRAL} run --cgroup-root {root} --json-file {tmp_path}/r.json -- "
                f"sleep 1.5; sleep 60")
    try:
        found: list[int] = []
        wait_until(lambda: found.extend(p for p in children(tmux.pane_pid) if blocks_sigint(p))
                   or found, "corral to start")
        tmux.keys("C-z")
        # (the file is made, empty, at the start, and the record written into it at the end:
        # a read meanwhile may see part of it, as CI once did, at its first 4096 bytes)
        wait_until(lambda: (tmp_path / "r.json").exists() and
                   (tmp_path / "r.json").read_text().endswith("}\n"), "the record")
        record = json.loads((tmp_path / "r.json").read_text())
        assert record["outcome"] == "succeeded" and record["exit_status"] == 0
    finally:
        tmux.close()


def test_time_limit_counts_the_time_spent_stopped(shell: Shell) -> None:
    limit = 3.0
    shell.corral(f"--time-limit {limit:g}s -- sleep 60")
    corral = shell.corral_pid()
    task = shell.task_pid(corral, "sleep")
    started = time.monotonic()
    shell.keys("C-z")
    wait_until(lambda: proc_state(corral) == "T" and proc_state(task) == "T", "both stopped")
    if time.monotonic() - started > limit - 0.5:
        pytest.skip("this machine is too loaded to stop the task well before its limit")
    time.sleep(started + limit + 0.5 - time.monotonic())
    # past the limit while stopped: nothing happens until corral resumes, then at once
    assert proc_state(corral) == "T" and proc_state(task) == "T"
    assert not (shell.tmp / "run.rc").exists()
    shell.command("fg")
    assert shell.status() == 124
    record = shell.record()
    assert record["outcome"] == "timed_out"
    usage = record["usage"]
    assert isinstance(usage, dict) and usage["wall_s"] >= limit


@pytest.mark.parametrize("pty", ["", "--pty"])
def test_three_ctrl_c_within_two_seconds_stop_a_program_that_ignores_it(shell: Shell,
                                                                        pty: str) -> None:
    # ignores SIGINT (sh and its sleep) and SIGTERM: only the way out and then a kill end it;
    # under --pty each Ctrl-C is a byte typed into the task's terminal, counted all the same
    shell.corral(f"{pty} --summary --grace 1h -- sh -c \"trap '' INT TERM; sleep 600\"")
    corral = shell.corral_pid()
    shell.task_pid(corral, "sleep")
    shell.keys("C-c")
    time.sleep(0.1)
    assert "corral: Ctrl-C went to the task" not in shell.screen()  # one press: the task's
    shell.keys("C-c")
    shell.wait_screen(r"^corral: Ctrl-C went to the task and it is still running; Ctrl-C 3 "
                      r"times within 2s stops it$")
    shell.keys("C-c")  # the third: stop signal; the task shrugs it off (grace 1h)
    time.sleep(0.5)
    assert not (shell.tmp / "run.rc").exists()
    shell.keys("C-c")  # corral is stopping it: kill now
    assert shell.status() == 130
    screen = shell.screen()
    assert "result: cancelled" in screen and "Stop: cancel, killed (asked twice)" in screen


def test_quiet_prints_no_hint(shell: Shell) -> None:
    shell.corral("-q -- sh -c \"trap '' INT; sleep 600\"")
    corral = shell.corral_pid()
    shell.task_pid(corral, "sleep")
    for _ in range(3):
        shell.keys("C-c")
    assert shell.status() == 130
    assert "corral:" not in shell.screen()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_from_another_process_stops_first_then_kills(shell: Shell, sig: int) -> None:
    shell.corral("--summary --grace 1h -- sh -c \"trap 'echo got-term' TERM; "
                 "while :; do sleep 600 & wait; done\"")
    corral = shell.corral_pid()
    shell.task_pid(corral, "sleep")  # (not sh: its trap may not be set yet)
    os.kill(corral, sig)
    shell.wait_screen(r"^got-term$")  # the first: the stop signal, gracefully
    os.kill(corral, sig)  # the second: kill now
    assert shell.status() == 128 + sig
    screen = shell.screen()
    assert "result: cancelled" in screen and "Stop: cancel, killed (asked twice)" in screen


def test_a_signal_from_the_task_to_its_process_group_is_its_own(shell: Shell) -> None:
    # `kill 0` reaches every process of the group, corral included: not a stop request
    shell.corral("--summary -- sh -c \"trap 'exit 7' TERM; kill 0; sleep 1; exit 3\"")
    assert shell.status() == 7
    assert shell.record()["outcome"] == "failed"


@pytest.mark.parametrize("pty", ["", "--pty"])
def test_a_terminal_that_hangs_up_stops_the_task_and_keeps_the_record(shell: Shell,
                                                                      pty: str) -> None:
    # (under --pty the task's own terminal stays: corral's SIGHUP is a graceful stop, and
    # the output it can no longer write never makes that a kill)
    shell.corral(f"{pty} --summary -- sh -c \"trap '' HUP; sleep 600\"", err=True)
    corral = shell.corral_pid()
    shell.task_pid(corral, "sleep")
    shell.close()  # the terminal is gone: SIGHUP from the kernel, then from bash
    wait_until(lambda: not proc_state(corral), "corral to end")
    record = shell.record()
    assert record["outcome"] == "cancelled" and record["exit_status"] == 128 + signal.SIGHUP
    err = (shell.tmp / "run.err").read_text()
    assert_complete(err, record, 128 + signal.SIGHUP)


def test_ctrl_c_in_a_shell_loop_ends_the_loop(shell: Shell) -> None:
    # bash stops a loop only when its child died of SIGINT, not when it exited 130
    shell.command(f"for i in 1 2; do {CORRAL} run -q --cgroup-root {shell.root} -- sleep 60; "
               f"echo next-$i; done; echo loop-done")
    corral = shell.corral_pid()
    shell.task_pid(corral, "sleep")
    shell.keys("C-c")
    shell.wait_screen(r"^\$ $")
    wait_until(lambda: not children(shell.pane_pid), "the loop to end")
    assert not re.search(r"^(next-1|loop-done)$", shell.screen(), re.M)


def test_ctrl_c_before_the_spawn_means_the_task_never_starts(tmp_path: pathlib.Path,
                                                             root: str) -> None:
    # Held with SIGSTOP right after its first step, corral gets the terminal's Ctrl-C before
    # the spawn.  No job-control shell here (it would take the terminal back when corral
    # stops), and corral is not the pane's own process (tmux resumes a stopped pane).
    marker = tmp_path / "ran"
    tmux = Tmux(f"{CORRAL} run --cgroup-root {root} --json-file {tmp_path}/r.json -- "
                f"touch {marker}; sleep 60")
    try:
        found: list[int] = []
        wait_until(lambda: found.extend(p for p in children(tmux.pane_pid) if blocks_sigint(p))
                   or found, "corral to start")
        corral = found[0]
        os.kill(corral, signal.SIGSTOP)
        wait_until(lambda: proc_state(corral) == "T", "corral to stop")
        tmux.keys("C-c")
        time.sleep(0.2)
        os.kill(corral, signal.SIGCONT)
        wait_until(lambda: not proc_state(corral), "corral to end")
        record = json.loads((tmp_path / "r.json").read_text())
        assert record["exit_status"] == 130
        assert record["outcome"] == "cancelled" and record["started"] is False
        assert not marker.exists()
    finally:
        tmux.close()


# ---- the terminal's modes ---------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("less") is None, reason="needs less (apt-get install less)")
def test_less_quit_with_q_leaves_the_terminal_as_it_was(shell: Shell) -> None:
    text = shell.tmp / "text"
    text.write_text("".join(f"corral-less-line-{i}\n" for i in range(200)))
    before = shell.stty("before")
    shell.corral(f"-- less {text}")
    shell.wait_screen(r"^corral-less-line-0$")
    shell.keys("q")
    assert shell.status() == 0
    assert shell.stty("after") == before


@pytest.mark.parametrize("command", [
    # raw mode, then shrugs off the stop signal: killed at the end of the grace
    "sh -c \"stty raw -echo; trap '' TERM; sleep 600\"",
    # an interactive shell takes the terminal for a process group of its own, then is killed
    "bash --norc --noprofile -i",
], ids=["raw-mode", "own-process-group"])
def test_modes_are_restored_after_a_kill_at_the_time_limit(shell: Shell, command: str) -> None:
    before = shell.stty("before")
    shell.corral(f"--time-limit 1s --grace 0.3s -- {command}", err=True)
    assert shell.status() == 124
    assert shell.stty("after") == before
    assert shell.record()["outcome"] == "timed_out"


@pytest.mark.parametrize("pty", ["", "--pty"])
def test_a_full_screen_program_killed_at_its_time_limit_leaves_its_screen_too(
        shell: Shell, pty: str) -> None:
    # the alternate screen, a hidden cursor and its own modes, then killed (shrugs off the
    # stop signal): the shell gets its screen, cursor and modes back
    before = shell.stty("before")
    shell.corral(f"{pty} --time-limit 2s --grace 0.3s -- sh -c \"tput smcup; tput civis; "
                 f"stty -icanon -echo; echo full-screen; trap '' TERM; sleep 600\"", err=True)
    wait_until(lambda: shell.shows("#{alternate_on}#{cursor_flag}") == "10",
               "the alternate screen, cursor hidden")
    assert shell.status() == 124
    assert shell.shows("#{alternate_on}#{cursor_flag}") == "01"
    assert shell.stty("after") == before
    assert shell.record()["exit"]["signal_name"] == "SIGKILL"  # type: ignore[index]


# ---- --pty: the task's own terminal, mirrored ----------------------------------------------------

COLOUR = "import sys; print('\\033[31mred\\033[0m' if sys.stdout.isatty() else 'plain')"


def test_pty_colours_at_the_terminal_and_the_record_keeps_it(shell: Shell) -> None:
    script = shell.tmp / "colour.py"
    script.write_text(COLOUR + "\n")
    shell.corral(f"--pty -- {PYTHON} {script}")
    assert shell.status() == 0
    assert re.search(r"^\x1b\[31mred$", shell.screen(escapes=True), re.M), \
        shell.screen(escapes=True)  # (tmux puts the reset at the start of the next line)
    out = shell.record()["output"]["stdout"]  # type: ignore[index]
    assert out["mode"] == "tty" and out["head"] == "\x1b[31mred\x1b[0m\r\n"
    # stdout to a file: with --pty the task still has a terminal (colour); without, none
    shell.corral(f"--pty -- {PYTHON} {script} >{shell.tmp}/pty.out", name="file")
    shell.corral(f"-- {PYTHON} {script} >{shell.tmp}/bare.out", name="bare")
    assert shell.status("file") == 0 and shell.status("bare") == 0
    assert (shell.tmp / "pty.out").read_bytes() == b"\x1b[31mred\x1b[0m\r\n"
    assert (shell.tmp / "bare.out").read_bytes() == b"plain\n"


def test_pty_a_repl_survives_ctrl_c_exits_on_ctrl_d_and_the_modes_come_back(shell: Shell) -> None:
    before = shell.stty("before")
    shell.corral(f"--pty -- {PYTHON} -q")
    interrupt_and_leave_the_repl(shell)
    assert shell.record()["outcome"] == "succeeded"
    assert shell.stty("after") == before


def test_pty_window_size_follows_the_terminal(shell: Shell) -> None:
    # (the trap set before the first size is shown: set after it, a resize that came between
    # the two, on a loaded machine, was ignored, as sh ignores SIGWINCH by default)
    shell.corral("--pty -- sh -c 'trap \"stty size\" WINCH; stty size; "
                 "while :; do sleep 0.05; done'")
    shell.wait_screen(r"^50 160$")  # the tmux window's, given at the start
    shell.tmux("resize-window", "-x", "100", "-y", "30")
    shell.wait_screen(r"^30 100$")  # SIGWINCH: passed on
    shell.keys("C-c")
    assert shell.status() == 130


@pytest.mark.skipif(shutil.which("less") is None, reason="needs less (apt-get install less)")
def test_pty_less_quit_with_q_leaves_the_terminal_as_it_was(shell: Shell) -> None:
    text = shell.tmp / "text"
    text.write_text("".join(f"corral-less-line-{i}\n" for i in range(200)))
    before = shell.stty("before")
    shell.corral(f"--pty -- less {text}")
    shell.wait_screen(r"^corral-less-line-0$")
    assert shell.shows("#{alternate_on}") == "1"
    shell.keys("q")
    assert shell.status() == 0
    assert shell.stty("after") == before
    assert shell.shows("#{alternate_on}#{cursor_flag}") == "01"


def test_pty_ctrl_z_suspends_both_modes_back_then_raw_again_after_fg(shell: Shell) -> None:
    before = shell.stty("before")
    shell.corral(f"--pty -- {PYTHON} -q")
    shell.wait_screen(r"^>>> $")
    corral = shell.corral_pid()
    shell.task_pid(corral, "python3")
    shell.keys("C-z")
    shell.wait_screen(r"Stopped")
    wait_until(lambda: proc_state(corral) == "T", "corral stopped")
    events = [p for p in pathlib.Path(shell.root).glob("*/*/cgroup.events")]
    assert len(events) == 1 and "frozen 1" in events[0].read_text()  # the task: frozen
    assert shell.stty("stopped") == before  # the shell got its modes back, not raw ones
    shell.command("fg")
    wait_until(lambda: "frozen 0" in events[0].read_text(), "the task thawed")
    shell.line("print('after' + '-fg')")
    shell.wait_screen(r"^after-fg$")
    # raw mode again: typed once, echoed once (by the task's terminal); cooked, ours would too
    assert shell.screen().count("print('after' + '-fg')") == 1, shell.screen()
    shell.keys("C-d")
    assert shell.status() == 0
    assert shell.stty("after") == before


def test_pty_with_stdin_elsewhere_the_terminals_ctrl_c_is_still_the_tasks(shell: Shell) -> None:
    # stdin is not the terminal: no raw mode, so the terminal's Ctrl-C is a signal to corral
    # alone (the task is on a terminal of its own); corral types it into the task's terminal
    shell.corral("--pty -- sleep 60 </dev/null")
    corral = shell.corral_pid()
    shell.task_pid(corral, "sleep")
    shell.keys("C-c")
    assert shell.status() == 130
    assert shell.record()["exit"]["signal_name"] == "SIGINT"  # type: ignore[index]


def test_pty_in_the_background_mirrors_output_and_fg_brings_the_keys(shell: Shell) -> None:
    # started with &: the output comes through and corral is not stopped (it leaves the
    # terminal's input alone until it is in the foreground); fg: keys reach the task
    shell.corral("--pty -- sh -c 'echo started; read x; echo \"got $x\"' &")
    corral = shell.corral_pid()
    shell.wait_screen(r"started$")  # (maybe after the prompt bash printed meanwhile)
    shell.line("jobs")  # (the prompt line ends with the task's output: no waiting for it)
    shell.wait_screen(r"^\[1\]\+ +Running")
    assert proc_state(corral) != "T"
    shell.command("fg")
    wait_until(lambda: in_foreground(corral), "corral in the foreground")
    shell.line("hello")
    shell.wait_screen(r"^got hello$")
    assert shell.status() == 0


def test_pty_large_output_arrives_complete_and_in_order(shell: Shell) -> None:
    # to the terminal (non-blocking writes as tmux reads), to a file, and to a pipe whose
    # reader starts late (the task is held meanwhile); several MiB each
    lines = 400_000
    expected = b"".join(b"%d\r\n" % i for i in range(1, lines + 1))
    shell.corral(f"--pty --summary -- seq {lines}")
    assert shell.status() == 0
    # all of it on the screen before the summary (the tap is read to its end first)
    assert re.search(rf"^{lines - 1}\n{lines}\ncorral: task \S+ finished", shell.screen(), re.M)
    out = shell.record()["output"]["stdout"]  # type: ignore[index]
    assert out["total_bytes"] == len(expected) and out["tail"].endswith(f"{lines}\r\n")
    shell.corral(f"--pty -- seq {lines} >{shell.tmp}/file", name="file")
    assert shell.status("file") == 0
    assert (shell.tmp / "file").read_bytes() == expected
    shell.corral(f"--pty -- seq {lines} | (sleep 1; cat) >{shell.tmp}/pipe", name="pipe")
    assert shell.status("pipe") == 0
    assert (shell.tmp / "pipe").read_bytes() == expected


# ---- the way-out rule, without a terminal ------------------------------------------------------

def terminal_key(signo: int) -> Delivery:
    return Delivery(signo, SI_KERNEL, 0)


def test_keys_presses_outside_the_window_do_not_add_up() -> None:
    keys = Keys()
    ctrl_c = terminal_key(signal.SIGINT)
    assert [keys.decide(ctrl_c, t, started=True) for t in (0.0, 1.0, 2.5, 4.0)] == [
        Act.NOTHING, Act.HINT, Act.HINT, Act.HINT]
    assert keys.decide(ctrl_c, 4.5, started=True) is Act.STOP


def test_keys_by_origin() -> None:
    keys = Keys()
    assert keys.decide(terminal_key(signal.SIGINT), 0, started=False) is Act.STOP
    assert keys.decide(terminal_key(signal.SIGQUIT), 0, started=True) is Act.NOTHING
    assert keys.decide(terminal_key(signal.SIGHUP), 0, started=True) is Act.STOP
    assert keys.decide(terminal_key(signal.SIGTSTP), 0, started=True) is Act.SUSPEND
    kill = Delivery(signal.SIGTERM, SI_USER, 4242)
    assert keys.decide(kill, 0, started=True) is Act.STOP
    assert keys.decide(kill, 0, started=True, from_task=True) is Act.NOTHING
    assert keys.decide(Delivery(signal.SIGTSTP, SI_USER, 4242), 0, started=True,
                       from_task=True) is Act.SUSPEND
    keys.stopping = True
    assert keys.decide(terminal_key(signal.SIGINT), 0, started=True) is Act.STOP


def test_keys_window_and_continue_are_never_a_stop() -> None:
    keys = Keys()
    for code, pid in ((SI_KERNEL, 0), (SI_USER, 4242)):
        assert keys.decide(Delivery(signal.SIGWINCH, code, pid), 0, started=True) is Act.RESIZE
        assert keys.decide(Delivery(signal.SIGCONT, code, pid), 0, started=True) is Act.RESUMED


def test_screen_sees_modes_cut_between_chunks() -> None:
    screen = Screen()
    for chunk in (b"text\x1b[?10", b"49h\x1b[?25", b"l more", b"x" * 100):
        screen.feed(chunk)
    assert screen.alternate and screen.cursor_hidden
    screen.feed(b"\x1b[?1049l\x1b[?12;25h")
    assert not screen.alternate and not screen.cursor_hidden


def test_help_documents_keys_and_exit_statuses() -> None:
    r = subprocess.run([CORRAL, "run", "--help"], capture_output=True, text=True,
                       timeout=DEADLINE)
    text = " ".join(r.stdout.split())
    for needle in ("Ctrl-C 3 times within 2s", "Ctrl-Z suspends corral and the task",
                   "143 by SIGTERM", "129 by SIGHUP", "124 stopped at its time limit",
                   "counts the time spent stopped", "with --pty", "window size follows",
                   "stdin not a terminal"):
        assert needle in text, needle
