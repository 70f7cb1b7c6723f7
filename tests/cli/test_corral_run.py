"""`corral run` end to end, through the installed `corral` command, on real cgroups."""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import struct
import subprocess
import sys
import time

import pytest
from cli_util import default_signals

import cgroupfs
from supervisor._spawn import inotify_add_watch, inotify_init

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
HANG = 30.0


@pytest.fixture
def root(test_cgroup: cgroupfs.Cgroup) -> str:
    return test_cgroup.path


def corral(*args: str, root: str | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    extra = ["--cgroup-root", root] if root else []
    argv = [CORRAL, args[0], *extra, *args[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=HANG, **kw)  # type: ignore[call-overload]


class Creations:
    """Every directory created under ``path`` while watched (inotify IN_CREATE): catches a
    cgroup that was made and removed again, which a before/after listing would miss."""

    IN_CREATE = 0x100

    def __init__(self, path: str) -> None:
        self.fd = inotify_init()
        inotify_add_watch(self.fd, path, self.IN_CREATE)

    def names(self) -> list[str]:
        out = []
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            buf = b""
        finally:
            os.close(self.fd)
        offset = 0
        while offset < len(buf):
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, offset)
            name = buf[offset + 16: offset + 16 + length].rstrip(b"\0").decode()
            out.append(name)
            offset += 16 + length
        return out


@pytest.mark.parametrize(("command", "status"), [
    (["true"], 0),
    (["sh", "-c", "exit 3"], 3),
    (["sh", "-c", "kill -USR1 $$"], 128 + signal.SIGUSR1),
    (["sh", "-c", "kill -KILL $$"], 137),
    (["corral-no-such-command"], 127),
    (["/etc/passwd"], 126),
])
def test_exit_status_is_the_tasks(root: str, command: list[str], status: int) -> None:
    r = corral("run", "--", *command, root=root)
    assert r.returncode == status, r.stderr


def test_time_limit_exits_124_with_a_summary(root: str) -> None:
    r = corral("run", "--time-limit", "0.3s", "--", "sleep", "60", root=root)
    assert r.returncode == 124
    assert "finished with result: timed_out" in r.stderr
    assert "Stop: time_limit" in r.stderr and "Exit status: 124" in r.stderr


def test_success_prints_no_summary_unless_asked(root: str) -> None:
    assert corral("run", "--", "true", root=root).stderr == ""
    r = corral("run", "--summary", "--", "true", root=root)
    assert "finished with result: succeeded" in r.stderr and "Cleanup: clean" in r.stderr
    r = corral("run", "--quiet", "--", "sh", "-c", "exit 2", root=root)
    assert r.returncode == 2 and r.stderr == ""


def test_summary_reports_what_the_main_process_left_behind(root: str) -> None:
    r = corral("run", "--summary", "--grace", "0.2s", "--",
               "sh", "-c", "setsid sleep 600 & echo main done", root=root)
    assert r.returncode == 0 and r.stdout == "main done\n"
    assert "1 process(es) left behind by the main process" in r.stderr
    assert "Memory peak:" in r.stderr and "CPU time consumed:" in r.stderr


def test_json_result_to_a_file_and_an_fd(root: str, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "result.json"
    r = corral("run", "--json-file", str(out), "--", "sh", "-c", "echo task-output; exit 5",
               root=root)
    assert r.stdout == "task-output\n"  # the JSON never mixes with the task's output
    data = json.loads(out.read_text())
    assert data["exit_status"] == 5 and data["outcome"] == "failed"
    assert data["exit"] == {"code": 5, "signal": None, "signal_name": None}
    assert data["cleanup"]["state"] == "clean" and data["argv"] == ["sh", "-c",
                                                                    "echo task-output; exit 5"]
    peak = data["usage"]["memory_peak_bytes"]
    assert peak is None or isinstance(peak, int)
    assert data["containment"]["cgroup"].startswith(root)
    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as reader:
        p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--json-fd",
                              str(write_end), "--", "true"], pass_fds=[write_end])
        os.close(write_end)
        text = reader.read()
        assert p.wait(HANG) == 0
    assert json.loads(text)["outcome"] == "succeeded"


def test_output_is_streamed_live(root: str) -> None:
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--", "sh", "-c",
                          "echo first; sleep 60"], stdout=subprocess.PIPE)
    assert p.stdout is not None
    try:
        ready, _, _ = select.select([p.stdout], [], [], HANG)
        assert ready, "no output while the task runs"
        assert p.stdout.readline() == b"first\n"
        assert p.poll() is None  # the task is still running
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(HANG) == 130
        p.stdout.close()


def wait_ready(p: subprocess.Popen[bytes]) -> None:
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], HANG)
    assert ready and p.stdout.readline() == b"ready\n"


def test_sigint_once_stops_gracefully(root: str) -> None:
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--", "sh", "-c",
                          # "ready" once the background sleep really runs: a stop that
                          # came while it was being forked would miss it
                          "trap 'echo stopping; exit 0' TERM; sleep 60 & "
                          "until [ \"$(cat /proc/$!/comm)\" = sleep ]; do :; done; "
                          "echo ready; wait"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_ready(p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=HANG)
    assert p.returncode == 130
    assert out == b"stopping\n"  # the task got its stop signal and cleaned up itself
    assert b"result: cancelled" in err and b"Stop: cancel, SIGTERM sent" in err


def test_sigint_twice_kills_now(root: str) -> None:
    # shrugs off SIGTERM (and says so), so only a kill can end it
    script = ("trap 'echo got-term' TERM; echo ready; "
              "while :; do sleep 600 & wait; done")
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--grace", "1h", "--",
                          "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_ready(p)
    p.send_signal(signal.SIGINT)
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], HANG)
    assert ready and p.stdout.readline() == b"got-term\n"  # the first stop landed
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=HANG)
    assert p.returncode == 130
    assert b"Stop: cancel, killed (asked twice)" in err
    assert time.monotonic() - t0 < HANG


def test_sigterm_to_corral_is_a_graceful_stop(root: str) -> None:
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--", "sh", "-c",
                          "echo ready; sleep 60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_ready(p)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=HANG)
    assert p.returncode == 128 + signal.SIGTERM


def test_100_mib_through_a_pipe(root: str) -> None:
    size = 100 << 20
    r = subprocess.run(f"{CORRAL} run --cgroup-root {root} -- head -c {size} /dev/zero | wc -c",
                       shell=True, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0 and int(r.stdout) == size


def test_stdin_and_environment_pass_through(root: str, tmp_path: pathlib.Path) -> None:
    r = corral("run", "-E", "GREETING=hello", "-p", "Environment=A=1 B=two", "--chdir",
               str(tmp_path), "--", "sh", "-c", 'echo "$GREETING $A $B $(pwd) $(cat)"',
               root=root, input="from-stdin")
    assert r.stdout == f"hello 1 two {tmp_path} from-stdin\n"


@pytest.mark.parametrize(("args", "message"), [
    (["-p", "Frobnicate=1"], "unknown or unsupported property 'Frobnicate'; supported: MemoryMax"),
    (["-p", "MemoryMax=12Q"], 'MemoryMax must be a size'),
    (["--time-limit=-5s"], "time_limit must be a positive duration"),
    # a value starting with '-' reaches our validation, not argparse's "expected one argument"
    (["--time-limit", "-1s"], 'time_limit must be a positive duration like "30s"'),
    (["--grace", "-1s"], 'grace must be a duration (zero or more) like "30s"'),
    (["--time-limit", "soon"], "time_limit must be"),
    (["--grace", "1 fortnight"], "grace must be"),
    (["--stop-signal", "SIGFOO"], "stop_signal"),
    (["-p", "CPUQuota=50"], "CPUQuota"),
    (["-p", "MemoryMax"], "NAME=VALUE"),
    (["-p", "TasksMax=0"], "TasksMax"),
    (["--cgroup-root", "/proc"], "not a cgroup v2 directory"),
], ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_bad_input_exits_125_with_one_line_and_creates_nothing(
        root: str, test_cgroup: cgroupfs.Cgroup, args: list[str], message: str) -> None:
    watch = Creations(root)
    r = corral("run", *args, "--", "true", root=root)
    assert r.returncode == 125
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("corral: ")
    assert watch.names() == []


def test_missing_command_exits_125(root: str) -> None:
    for args in (["run"], ["run", "--"]):
        r = subprocess.run([CORRAL, *args], capture_output=True, text=True, timeout=HANG)
        assert r.returncode == 125 and "no command given" in r.stderr


def test_limit_the_host_cannot_apply_exits_125_naming_the_controller(
        root: str, test_cgroup: cgroupfs.Cgroup) -> None:
    if "memory" in test_cgroup.available_controllers():
        pytest.skip("this machine delegates the memory controller here: nothing to refuse")
    watch = Creations(root)
    r = corral("run", "-p", "MemoryMax=512M", "--", "true", root=root)
    assert r.returncode == 125
    assert "memory controller" in r.stderr and "not enabled" in r.stderr
    assert watch.names() == []


def test_own_root_is_removed_afterwards(root: str) -> None:
    r = corral("run", "--summary", "--", "sh", "-c", "cat /proc/self/cgroup", root=root)
    assert r.returncode == 0
    leaf = next(line[3:] for line in r.stdout.splitlines() if line.startswith("0::"))
    instance = os.path.dirname(leaf)
    assert os.path.basename(instance).startswith("corral-")
    mount = cgroupfs.find_cgroup2_mount()
    assert os.path.dirname(cgroupfs.cgroup_fs_path(mount, instance)) == root
    assert not os.path.exists(cgroupfs.cgroup_fs_path(mount, instance))


def test_a_killed_corral_leaves_nothing_for_long(root: str, tmp_path: pathlib.Path) -> None:
    # corral itself dies by SIGKILL (nothing can catch that): its keeper, a tiny process that
    # outlives it, kills the task (setsid escapee included) and removes its cgroups; no other
    # corral needs to start
    ready = tmp_path / "ready"
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--", "sh", "-c",
                          f"setsid sleep 600 & cat /proc/self/cgroup > {ready}; sleep 600"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + HANG
    while not (ready.exists() and ready.read_text().strip()):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.01)
    leaf = next(line[3:] for line in ready.read_text().splitlines() if line.startswith("0::"))
    mount = cgroupfs.find_cgroup2_mount()
    leaf_path = cgroupfs.cgroup_fs_path(mount, leaf)

    def procs() -> list[str]:
        with open(os.path.join(leaf_path, "cgroup.procs")) as f:
            return f.read().split()

    while len(procs()) < 3:  # the shell, its sleep and the escapee (forked in the background)
        assert time.monotonic() < deadline, procs()
        time.sleep(0.01)
    pidfds = [os.pidfd_open(int(x)) for x in procs()]
    p.kill()
    _, err = p.communicate(timeout=HANG)
    try:
        for pidfd in pidfds:  # a pidfd turns readable when its process has exited
            assert select.select([pidfd], [], [], HANG)[0], "a task process outlived corral"
    finally:
        for pidfd in pidfds:
            os.close(pidfd)
    deadline = time.monotonic() + HANG
    while os.path.exists(os.path.dirname(leaf_path)):
        assert time.monotonic() < deadline, "the dead corral's root was not removed"
        time.sleep(0.01)
    assert b"corral-keeper" in err  # it says what it did, on corral's stderr


def test_unwritable_json_file_is_refused_before_the_run(root: str, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    r = corral("run", "--json-file", "/nonexistent-dir/r.json", "--", "touch", str(marker),
               root=root)
    assert r.returncode == 125 and "--json-file /nonexistent-dir/r.json" in r.stderr
    assert not marker.exists()


def test_json_fd_open_read_only_is_refused_before_the_run(root: str,
                                                          tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    watch = Creations(root)
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        r = subprocess.run([CORRAL, "run", "--cgroup-root", root, "--json-fd", str(fd), "--",
                            "touch", str(marker)], pass_fds=[fd], capture_output=True,
                           text=True, timeout=HANG)
    finally:
        os.close(fd)
    assert r.returncode == 125
    assert r.stderr.startswith(f"corral: --json-fd {fd}: ") and r.stderr.count("\n") == 1
    assert "read-only" in r.stderr and f"{fd}>result.json" in r.stderr, r.stderr
    assert not marker.exists() and watch.names() == []


def unwritable_fd(kind: str) -> tuple[int, str]:
    """An fd open for writing whose writes fail, and the failure's strerror."""
    if kind == "full":
        return os.open("/dev/full", os.O_WRONLY), "No space left on device"
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end, "Broken pipe"


@pytest.mark.parametrize("kind", ["full", "closed-pipe"])
def test_json_write_failure_is_one_line_and_keeps_the_tasks_status(root: str,
                                                                   kind: str) -> None:
    fd, reason = unwritable_fd(kind)
    try:
        r = subprocess.run([CORRAL, "run", "--cgroup-root", root, "--json-fd", str(fd), "--",
                            "sh", "-c", "exit 3"], pass_fds=[fd], capture_output=True,
                           text=True, timeout=HANG)
    finally:
        os.close(fd)
    assert r.returncode == 3
    lines = [line for line in r.stderr.splitlines() if line.startswith("corral: --json-fd")]
    assert lines == [f"corral: --json-fd {fd}: writing the result failed: {reason}; the task's "
                     f"exit status is 3"], r.stderr
    assert "Traceback" not in r.stderr and "Exit status: 3" in r.stderr


def stale_root(root: str) -> subprocess.Popen[bytes]:
    """What a corral SIGKILLed with its keeper would leave: an unlocked root of its own below
    ``root``, a process still in it."""
    stale = os.path.join(root, "corral-999999-abcdef")
    os.mkdir(stale)
    p = subprocess.Popen(["sh", "-c", f"echo $$ > {stale}/cgroup.procs && exec sleep 600"])
    deadline = time.monotonic() + HANG
    while not pathlib.Path(stale, "cgroup.procs").read_text().strip():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.01)
    return p


@pytest.mark.parametrize("quiet", [False, True], ids=["default", "quiet"])
def test_library_warnings_are_one_line_each_and_silent_under_quiet(root: str,
                                                                    quiet: bool) -> None:
    left = stale_root(root)
    try:
        r = corral("run", *(["-q"] if quiet else []), "--", "true", root=root)
        assert r.returncode == 0
        assert left.wait(HANG) == -signal.SIGKILL  # the stale root was cleared
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
    if quiet:
        assert r.stderr == ""
    else:  # the placement's note, printed once (the library logs it at info only)
        assert r.stderr.startswith("corral: note: removed ") and \
            r.stderr.count("\n") == 1, r.stderr


def test_sighup_to_corral_stops_the_task_gracefully(root: str) -> None:
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", root, "--", "sh", "-c",
                          "trap '' HUP; echo ready; sleep 60"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    wait_ready(p)
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=HANG)
    assert p.returncode == 128 + signal.SIGHUP
    assert b"result: cancelled" in err


def test_a_missing_cgroup_root_is_said_to_be_missing_with_the_fix(root: str) -> None:
    missing = os.path.join(root, "demo")
    r = corral("run", "--cgroup-root", missing, "--", "true")
    assert r.returncode == 125
    assert r.stderr == (f"corral: --cgroup-root {missing} does not exist; make it first "
                        f"(mkdir -p {missing}), or give an existing cgroup\n")
    outside = corral("run", "--cgroup-root", "/corral-test-nowhere", "--", "true")
    assert outside.returncode == 125
    assert "does not exist, and is not inside the cgroup2 mount" in outside.stderr


def test_help_has_no_sentence_cut_off() -> None:
    # each entry of the key tables ends its sentence before the next entry starts
    r = corral("run", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "a job-control shell in the task: that shell's key, for its own jobs window size" \
        in text, text


def test_a_background_job_passes_its_ignored_signals_on_as_the_bare_command_would(
        root: str) -> None:
    # a non-interactive shell starts `cmd &` with SIGINT and SIGQUIT ignored (and only those:
    # the shell starts with every default, whatever this pytest inherited, e.g. under nohup)
    r = subprocess.run(["sh", "-c", f'{CORRAL} run --cgroup-root {root} -q -- '
                        f'grep SigIgn /proc/self/status & wait'],
                       capture_output=True, text=True, timeout=HANG,
                       preexec_fn=default_signals)
    assert r.stdout == "SigIgn:\t0000000000000006\n", r.stderr


# ---- --pty without a terminal (test_terminal.py drives it at one) ------------------------------

def corral_bytes(*args: str, root: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``corral run --cgroup-root ROOT ARGS``, stdout as bytes: a terminal's CR LF kept."""
    return subprocess.run([CORRAL, "run", "--cgroup-root", root, *args], input=stdin,
                          capture_output=True, timeout=HANG)


COLOUR = ("import sys; print('\\033[31mred\\033[0m' if sys.stdout.isatty() else 'plain'); "
          "sys.exit(3)")


def test_pty_gives_the_task_a_terminal_when_corral_has_none(root: str,
                                                            tmp_path: pathlib.Path) -> None:
    # stdin /dev/null, stdout and stderr pipes: the task still sees a terminal (colour), the
    # output comes through as its terminal gives it (CR LF), the record keeps it, and the
    # exit status is the task's
    r = corral_bytes("--pty", "--json-file", str(tmp_path / "r.json"), "--",
                     sys.executable, "-c", COLOUR, root=root)
    assert r.returncode == 3, r.stderr
    assert r.stdout == b"\x1b[31mred\x1b[0m\r\n"
    out = json.loads((tmp_path / "r.json").read_text())["output"]["stdout"]
    assert out["mode"] == "tty" and out["head"] == "\x1b[31mred\x1b[0m\r\n"


def test_pty_types_piped_stdin_into_the_terminal_and_ends_it_with_ctrl_d(root: str) -> None:
    # the terminal echoes what is typed, as it would keys; the end of input is one Ctrl-D
    # (after a last line without a newline, one more ends that line first)
    script = 'read a; echo "got $a"; test -t 0 && echo tty; cat; echo "<eof"'
    r = corral_bytes("--pty", "--", "sh", "-c", script, root=root,
                     stdin=b"one\ntwo-without-newline")
    assert r.returncode == 0, r.stderr
    assert b"got one\r\ntty\r\n" in r.stdout, r.stdout
    assert r.stdout.endswith(b"two-without-newline<eof\r\n"), r.stdout


def test_pty_output_to_a_closed_pipe_stops_the_task_as_sigpipe_would(root: str) -> None:
    # the reader goes away: the task is stopped (it would have died of SIGPIPE), status 141
    p = subprocess.Popen(f"{CORRAL} run --pty --cgroup-root {root} -- sh -c "
                         f"'while :; do echo y; done' | head -c 1000 >/dev/null; "
                         f"exit ${{PIPESTATUS[0]}}",
                         shell=True, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, executable="/bin/bash")
    _, err = p.communicate(timeout=HANG)
    assert p.returncode == 128 + signal.SIGPIPE, err
    assert "stdout: Broken pipe; stopping the task" in err, err
    assert "finished with result: cancelled" in err, err
