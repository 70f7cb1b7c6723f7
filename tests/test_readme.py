"""The README's library example runs as printed, on this machine's real cgroups.

It discovers its own cgroup root, as a reader's program would; so that it never lands at the
top of the host's tree, it runs in a cgroup namespace over the test's own cgroup (with cgroup2
mounted inside), which is what a container gives it.
"""

from __future__ import annotations

import pathlib
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
    assert lines[1].startswith("timed_out time_limit signalled ")
    assert lines[2] == "cancelled SIGTERM"
    assert lines[3] == "[0, 1, 2, 3]"
    assert len(lines) == 4 + 7  # sup.results: one record per task, seven tasks
    assert test_cgroup.children() == [] and not test_cgroup.is_populated()
