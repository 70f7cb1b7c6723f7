"""docs/deploy.md, checked: the daemon in a container (a cgroup namespace over a scratch
cgroup, cgroup2 mounted inside) with the init-leaf self-move, a read-only cgroupfs refused with
the fix, and the pod manifest validated offline against the Kubernetes schema."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from daemon_util import CORRAL

import cgroupfs

REPO = Path(__file__).resolve().parent.parent.parent
DEPLOY = REPO / "docs" / "deploy.md"
INIT_LEAF_MOVE = """
mkdir -p /sys/fs/cgroup/init /sys/fs/cgroup/corral
for pid in $(cat /sys/fs/cgroup/cgroup.procs); do
    echo "$pid" > /sys/fs/cgroup/init/cgroup.procs 2>/dev/null || :
done
sed -e 's/^/+/' -e 's/ / +/g' /sys/fs/cgroup/cgroup.controllers \\
    > /sys/fs/cgroup/cgroup.subtree_control
"""


def in_container(cg: cgroupfs.Cgroup, mount_options: str, script: str,
                 ) -> subprocess.CompletedProcess[str]:
    inner = f"mount -t cgroup2 -o {mount_options} cgroup2 /sys/fs/cgroup\n{script}"
    return subprocess.run(
        ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec unshare --cgroup --mount --pid '
                     '--fork --mount-proc --propagation private sh -ec "$2"',
         "sh", cg.path, inner],
        capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())


def test_the_pod_recipe_runs_the_daemon_in_a_writable_cgroup_namespace(
        test_cgroup: cgroupfs.Cgroup, tmp_path: Path) -> None:
    assert INIT_LEAF_MOVE.strip() in DEPLOY.read_text()  # the recipe tested is the one shown
    corral = " ".join(shlex.quote(a) for a in CORRAL)
    script = INIT_LEAF_MOVE + f"""
{corral} serve --cgroup-root /sys/fs/cgroup/corral --socket {tmp_path}/sock \\
    --state-dir {tmp_path}/state > {tmp_path}/daemon.log 2>&1 &
daemon=$!
while [ ! -S {tmp_path}/sock ]; do sleep 0.05; done
CORRAL_SOCKET={tmp_path}/sock {corral} submit --follow -- cat /proc/self/cgroup > {tmp_path}/out
CORRAL_SOCKET={tmp_path}/sock {corral} show --json 1 > {tmp_path}/show.json
kill -TERM $daemon
wait $daemon
"""
    r = in_container(test_cgroup, "rw", script)
    assert r.returncode == 0, r.stderr + (tmp_path / "daemon.log").read_text()
    leaf = next(line[3:] for line in (tmp_path / "out").read_text().splitlines()
                if line.startswith("0::"))
    # a leaf below the --cgroup-root the recipe made, inside the container's namespace
    # (the leaf is named by the daemon's task id, in its uid's group)
    assert re.fullmatch(r"/corral/corral-\d+-[0-9a-f]+/@uid-0/1", leaf), leaf
    shown = json.loads((tmp_path / "show.json").read_text())
    assert shown["result"]["outcome"] == "succeeded"
    assert test_cgroup.children() and not test_cgroup.is_populated()


def test_a_read_only_cgroupfs_is_refused_with_the_fix(test_cgroup: cgroupfs.Cgroup,
                                                      tmp_path: Path) -> None:
    corral = " ".join(shlex.quote(a) for a in CORRAL)
    r = in_container(test_cgroup, "ro", f"{corral} serve --socket {tmp_path}/sock "
                                        f"--state-dir {tmp_path}/state")
    assert r.returncode == 125, r.stderr
    assert "read-only" in r.stderr and "read-write" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "sock").exists()
    assert test_cgroup.children() == []


def _manifests() -> list[dict[str, object]]:
    yaml = pytest.importorskip("yaml")
    blocks = re.findall(r"```yaml\n(.*?)```", DEPLOY.read_text(), re.S)
    assert blocks, "docs/deploy.md has no yaml block"
    return [yaml.safe_load(b) for b in blocks]


def test_the_pod_manifest_is_valid_kubernetes() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for manifest in _manifests():
        # strict: unknown fields are errors too; no cluster, no network (bundled schemas)
        kv.validate(manifest, "1.30.0", strict=True)
        kv.validate(manifest, kv.latest_version(), strict=True)


def test_the_pod_manifest_runs_the_recipe_it_documents() -> None:
    pod = _manifests()[0]
    spec = pod["spec"]
    assert isinstance(spec, dict)
    corral = spec["containers"][0]
    script = corral["args"][0]
    assert "corral serve --cgroup-root /sys/fs/cgroup/corral" in script
    for line in INIT_LEAF_MOVE.strip().splitlines():
        assert line.strip() in script
    assert corral["securityContext"]["privileged"] is True
    agent = spec["containers"][1]
    assert {"name": "CORRAL_SOCKET", "value": "/run/corral/corral.sock"} in agent["env"]


def test_a_manifest_with_a_typo_is_caught() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    pod = _manifests()[0]
    pod["spec"]["containers"][0]["securityContexts"] = {}  # type: ignore[index]
    with pytest.raises(kv.ValidationError):
        kv.validate(pod, "1.30.0", strict=True)


