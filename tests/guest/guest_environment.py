"""The guest is what the resource-limit tests assume (checked without the code under test)."""

from __future__ import annotations

import os
from pathlib import Path

from guestutil import CONTROLLERS, read


def test_cgroup2_is_pure_v2_at_sys_fs_cgroup_with_every_controller() -> None:
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    cgroup_mounts = [m for m in mounts if m[m.index("-") + 1].startswith("cgroup")]
    assert [(m[4], m[m.index("-") + 1]) for m in cgroup_mounts] == [("/sys/fs/cgroup", "cgroup2")]
    assert set(read("/sys/fs/cgroup", "cgroup.controllers").split()) >= CONTROLLERS


def test_runs_as_root_in_the_root_cgroup() -> None:
    assert os.geteuid() == 0
    assert Path("/proc/self/cgroup").read_text() == "0::/\n"


def test_repo_is_writable_root_is_read_only_tmp_is_private(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    first = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0])
    assert (first / "supervisor" / "__init__.py").is_file()  # where the host found corral
    assert os.access(repo, os.W_OK)
    assert os.environ.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert str(tmp_path).startswith("/tmp/")
    assert not os.access("/usr", os.W_OK)  # the host's / is the guest's read-only root
