"""The README's library example runs as printed, on this machine's real cgroups.

It discovers its own cgroup root, as a reader's program would; so that it never lands at the
top of the host's tree, it runs in a cgroup namespace over the test's own cgroup (with cgroup2
mounted inside), which is what a container gives it.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import cgroupfs

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def library_example() -> str:
    section = README.read_text().split("## The library", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_library_example_runs_as_printed(test_cgroup: cgroupfs.Cgroup,
                                             tmp_path: pathlib.Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(library_example())
    inner = f"mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec {sys.executable} {script}"
    r = subprocess.run(
        ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec unshare --cgroup --mount --pid '
                     '--fork --mount-proc --propagation private sh -c "$2"',
         "sh", test_cgroup.path, inner],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("succeeded 0 b'hello\\n' clean (ProcessInfo(")
    assert lines[0].endswith("comm='sleep'),)"), lines[0]  # (named as it was when stopped)
    assert lines[1].startswith("timed_out time_limit signalled ")
    assert lines[2] == "cancelled SIGTERM"
    assert lines[3] == "[0, 1, 2, 3]"
    assert len(lines) == 4 + 7  # sup.results: one record per task, seven tasks
    # oldest first, by creation, however they ended
    ids = [line.split()[0] for line in lines[4:]]
    assert [int(i.rpartition("-")[2]) for i in ids] == list(range(1, 8)), ids
    assert [line.split()[1] for line in lines[4:]] == [
        "succeeded", "timed_out", "cancelled", "succeeded", "failed", "failed", "failed"]
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()


# ---- the shell blocks, as a new user (and .ci/run) runs them ----------------------------------

# What a fresh Debian's root has, and what block 1 leaves: corral linked into /usr/local/bin.
FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CORRAL = pathlib.Path(sys.executable).parent / "corral"

CI = README.parent / ".ci" / "run"


def ci_part(pattern: str) -> str:
    """The part of .ci/run that ``pattern`` (one group) matches (read, never run: .ci/run
    installs packages on the machine)."""
    found = re.search(pattern, CI.read_text(), re.DOTALL)
    assert found is not None, f".ci/run has no {pattern!r}"
    return found.group(1)


def stop_jobs() -> str:
    """.ci/run's rule, used as it is: a block's background jobs (the daemon) get SIGTERM when
    it ends, and must exit 0 then (an EXIT trap)."""
    return "trap '" + ci_part(r"\nstop_jobs='([^']*)'") + "' EXIT\n"


def sh_blocks() -> list[str]:
    """The README's ```sh blocks, each whole, in order (as .ci/run reads them)."""
    return [part.split("\n```\n", 1)[0] + "\n"
            for part in README.read_text().split("\n```sh\n")[1:]]


def in_a_fresh_machine(test_cgroup: cgroupfs.Cgroup, setup: str, script: pathlib.Path,
                       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``bash -euo pipefail SCRIPT`` in new cgroup, mount and pid namespaces over the test's
    cgroup, after ``setup`` there: nothing it makes (sockets, state, cgroups) reaches the host,
    and whatever it leaves running ends with it.  corral is where block 1 puts it:
    /usr/local/bin (a tmpfs there holding only that link), on a fresh root's PATH."""
    inner = (f"{setup} && mount -t tmpfs corral-test-bin /usr/local/bin && "
             f"ln -s {CORRAL} /usr/local/bin/corral && exec bash -euo pipefail {script}")
    return subprocess.run(
        ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec unshare --cgroup --mount --pid '
                     '--fork --mount-proc --propagation private sh -c "$2"',
         "sh", test_cgroup.path, inner],
        capture_output=True, text=True, timeout=timeout, cwd=script.parent,
        env={"PATH": FRESH_PATH, "HOME": "/root", "LANG": "C.UTF-8"})


def test_ci_runs_every_sh_block_whole_and_in_order() -> None:
    blocks = sh_blocks()
    assert len(blocks) == 3, blocks
    assert "pytest" in blocks[1] and blocks[2].startswith("corral serve ")
    # .ci/run's own reading of the README (its awk program, run here alone) gives each block
    # whole, and it runs each of them
    program = ci_part(r"awk '(.*?)' README\.md")
    read = subprocess.run(["awk", program, str(README)], capture_output=True, check=True,
                          text=True).stdout
    assert read.split("\0")[:-1] == blocks
    assert 'for i in "${!blocks[@]}"' in CI.read_text()


def test_the_serve_block_runs_as_printed(test_cgroup: cgroupfs.Cgroup,
                                         tmp_path: pathlib.Path) -> None:
    # as printed, right after block 1: the first client does not lose the race with the
    # daemon's start, nothing holds the terminal, and every line exits 0 (CI runs it with -e)
    block = sh_blocks()[2]
    script = tmp_path / "serve-block.sh"
    script.write_text(stop_jobs() + block)
    # /run and /var/lib its own (the socket, the state; no systemd found there to ask for a
    # scope outside the test's cgroup)
    setup = ("mount -t cgroup2 cgroup2 /sys/fs/cgroup && mount -t tmpfs corral-test-run /run "
             "&& mount -t tmpfs corral-test-lib /var/lib")
    r = in_a_fresh_machine(test_cgroup, setup, script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step 1\nstep 2\nstep 3\n" in r.stdout, r.stdout
    assert ": stopping" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not test_cgroup.is_populated()


def hybrid_example() -> str:
    """The commands of the hybrid-host example (its ``$`` lines, with their continuations)."""
    section = README.read_text().split("On a host whose cgroup v2 tree has no controllers", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    commands, going_on = [], False
    for line in block.splitlines():
        if line.startswith("$ ") or going_on:
            commands.append(line.removeprefix("$ "))
            going_on = line.endswith("\\")
    return "\n".join(commands) + "\n"


def test_the_hybrid_host_example_runs_as_printed(test_cgroup: cgroupfs.Cgroup,
                                                 tmp_path: pathlib.Path) -> None:
    # a hybrid host as such a machine has it: a tmpfs at /sys/fs/cgroup, cgroup2 at unified/
    script = tmp_path / "hybrid.sh"
    commands = hybrid_example()
    script.write_text(commands)
    setup = ("mount -t tmpfs corral-test-cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/unified "
             "&& mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified")
    r = in_a_fresh_machine(test_cgroup, setup, script)
    assert commands.count("corral run") == 1, commands  # (no stray command before it)
    assert r.returncode == 124, r.stdout + r.stderr
    assert "finished with result: timed_out" in r.stderr, r.stderr
    assert "Runtime: " in r.stderr and "(time limit 3s)" in r.stderr, r.stderr
    assert "Stop: time_limit, killed (the grace ran out)" in r.stderr, r.stderr
    assert "Cleanup: clean" in r.stderr and "Exit status: 124" in r.stderr, r.stderr
    assert test_cgroup.children() == ["demo"] and not test_cgroup.is_populated()
