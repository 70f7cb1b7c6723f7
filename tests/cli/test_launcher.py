"""The ``corral`` command is a launcher (native/corral_launch.c) that execs Python with the job
signals blocked: a signal that comes while Python starts waits for corral instead of being a
KeyboardInterrupt with a traceback.  ``corral run`` reads it; every other verb gets the signals
back at once; no task inherits the mask or the launcher's marker.  When it cannot start corral's
Python (its virtualenv moved or deleted, a python3 of another environment), it says so in one
line with status 125, never a traceback: those tests build it from the source with gcc."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cgroupfs

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
               signal.SIGWINCH, signal.SIGCONT)
SOURCE = Path(__file__).resolve().parents[2] / "native" / "corral_launch.c"
FIX = ("reinstall corral in its virtualenv (python3 -m venv DIR && DIR/bin/pip install corral) "
       "or run DIR/bin/corral of the right environment")


def blocked(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line.split()[1] for line in f if line.startswith("SigBlk:")), 16)
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


def test_the_command_is_the_launcher() -> None:
    with open(CORRAL, "rb") as f:
        assert f.read(4) == b"\x7fELF", "corral is not the launcher executable"


def test_a_signal_while_python_starts_is_corrals_not_a_traceback(
        test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    p = subprocess.Popen([CORRAL, "run", "--cgroup-root", test_cgroup.path, "--json-file",
                          str(record), "--", "sleep", "30"], stdin=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    # Once the launcher has blocked them (a signal sent before its first instruction finds a
    # program that does not exist yet: the default action), Python has not even started
    deadline = time.monotonic() + 60
    while signal.SIGINT not in blocked(p.pid) and time.monotonic() < deadline:
        pass
    os.kill(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert "Traceback" not in err, err
    r = json.loads(record.read_text())
    assert r["outcome"] == "cancelled" and r["started"] is False, r
    assert p.returncode == r["exit_status"], (p.returncode, r["exit_status"])


def test_tasks_inherit_neither_the_mask_nor_the_marker(test_cgroup: cgroupfs.Cgroup) -> None:
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "-q", "--", "sh", "-c",
                        "grep SigBlk /proc/self/status; echo marker=${CORRAL_LAUNCHER:-none}"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SigBlk:", "0000000000000000", "marker=none"], r.stdout


def test_other_verbs_get_the_signals_back(test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    p = subprocess.Popen([CORRAL, "serve", "--socket", str(sock), "--state-dir",
                          str(tmp_path / "state"), "--cgroup-root", test_cgroup.path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None and sock.exists(), p.stderr.read() if p.stderr else ""
        while blocked(p.pid) & set(JOB_SIGNALS) and time.monotonic() < deadline:
            time.sleep(0.01)  # the daemon's stop signals: once its receiver is open
        assert not blocked(p.pid) & set(JOB_SIGNALS)
    finally:
        p.terminate()
        p.wait(timeout=60)
    assert p.returncode == 0


def test_serve_drains_on_a_sigterm_sent_while_it_starts(test_cgroup: cgroupfs.Cgroup,
                                                        tmp_path: Path) -> None:
    """The socket is bound before the daemon's receiver is open: a SIGTERM sent the moment it
    appears (a service manager, a test) waits for it and is a drain, not a death."""
    sock = tmp_path / "s.sock"
    p = subprocess.Popen([CORRAL, "serve", "--socket", str(sock), "--state-dir",
                          str(tmp_path / "state"), "--cgroup-root", test_cgroup.path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not sock.exists() and p.poll() is None and time.monotonic() < deadline:
        pass
    p.terminate()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "draining" in err, (p.returncode, err)


def test_the_running_command_is_named_corral(test_cgroup: cgroupfs.Cgroup) -> None:
    """ps, top and pgrep see ``corral`` (the name) and the command's path (the command line),
    as they did when the command was a Python script, not a bare python3."""
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "-q", "--", "sh", "-c",
                        "cat /proc/$PPID/comm; tr '\\0' '\\n' </proc/$PPID/cmdline"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    comm, *argv = r.stdout.splitlines()
    assert comm == "corral", r.stdout
    assert CORRAL in argv and argv[argv.index(CORRAL) + 1] == "run", argv


def build_launcher(dest: Path, python: str | Path) -> Path:
    """native/corral_launch.c built for ``python`` into ``dest/corral``, as native/build_launch.py
    builds it; skips the test without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc on PATH to build the launcher from native/corral_launch.c")
    dest.mkdir(parents=True, exist_ok=True)
    literal = '"' + str(python).replace("\\", "\\\\").replace('"', '\\"') + '"'
    r = subprocess.run([gcc, "-O2", "-Wall", "-Wextra", f"-DCORRAL_PYTHON={literal}", "-o",
                        str(dest / "corral"), str(SOURCE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dest / "corral"


@pytest.fixture
def bare_python(tmp_path: Path) -> Path:
    """A virtualenv's python3 that has no supervisor (another environment's Python)."""
    env = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python3"
    r = subprocess.run([python, "-P", "-c", "import supervisor"], capture_output=True)
    assert r.returncode != 0, f"{python} imports supervisor"
    return python


def launch(corral: Path, path: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``corral --version`` with only PATH (and env) set, in the launcher's directory."""
    return subprocess.run([str(corral), "--version"], env={"PATH": str(path), **env},
                          cwd=corral.parent, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    """The launcher's only stderr line, once its status is 125 and nothing is a traceback."""
    assert r.returncode == 125 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].endswith(FIX), r.stderr
    return lines[0]


def test_a_missing_interpreter_then_a_foreign_python3_on_path_is_one_line(
        tmp_path: Path, bare_python: Path) -> None:
    missing = tmp_path / "moved" / "bin" / "python"
    corral = build_launcher(tmp_path / "bin", missing)
    line = one_line(launch(corral, bare_python.parent))
    assert line.startswith(f"corral: cannot start its Python: {missing}: No such file or "
                           f"directory; {tmp_path}/bin/python3: No such file or directory; "
                           f"{bare_python}: cannot import supervisor.cli: No module named "
                           "'supervisor'; "), line


def test_an_interpreter_without_supervisor_is_one_line(tmp_path: Path,
                                                       bare_python: Path) -> None:
    corral = build_launcher(tmp_path / "bin", bare_python)
    line = one_line(launch(corral, bare_python.parent))
    assert line.startswith(f"corral: cannot start its Python: {bare_python}: cannot import "
                           "supervisor.cli: No module named 'supervisor'; "), line


def test_no_interpreter_anywhere_names_every_path_tried(tmp_path: Path) -> None:
    missing = tmp_path / "moved" / "bin" / "python"
    corral = build_launcher(tmp_path / "bin", missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line(launch(corral, empty))
    assert line.startswith(f"corral: cannot start its Python: {missing}: No such file or "
                           f"directory; {tmp_path}/bin/python3: No such file or directory; "
                           f"python3 on PATH ({empty}): No such file or directory; "), line


@pytest.mark.parametrize("found", ["built for", "beside", "on PATH"])
def test_each_candidate_runs_supervisor_cli_as_a_script_would(
        tmp_path: Path, bare_python: Path, found: str) -> None:
    """Whichever interpreter runs: sys.argv is the command's, /proc/PID/cmdline names it, the
    job signals are blocked and the marker set; a supervisor/ in the working directory is not
    imported (-P)."""
    lib = tmp_path / "lib" / "supervisor"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "cli.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    with open('/proc/self/cmdline', 'rb') as f:\n"
        "        cmdline = f.read().decode().split('\\0')\n"
        "    with open('/proc/self/status') as f:\n"
        "        mask = next(line.split()[1] for line in f if line.startswith('SigBlk:'))\n"
        "    print(json.dumps([sys.argv, cmdline, os.environ.get('CORRAL_LAUNCHER'), mask]))\n"
        "    return 3\n")
    bin_dir = tmp_path / "bin"
    corral = build_launcher(bin_dir, bare_python if found == "built for" else tmp_path / "gone")
    if found == "beside":
        (bin_dir / "python3").symlink_to(bare_python)
    decoy = bin_dir / "supervisor"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('imported the working directory')")
    r = launch(corral, bare_python.parent if found == "on PATH" else tmp_path / "nothing",
               PYTHONPATH=str(lib.parent))
    assert r.returncode == 3, r.stderr
    argv, cmdline, marker, mask = json.loads(r.stdout)
    assert argv == [str(corral), "--version"], argv
    assert cmdline[cmdline.index(str(corral)):] == [str(corral), "--version", ""], cmdline
    assert marker == "1"
    assert {sig for sig in range(1, 65) if int(mask, 16) >> (sig - 1) & 1} >= set(JOB_SIGNALS)

