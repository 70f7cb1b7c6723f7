"""corral serve as an unprivileged submitter (an agent host's model, a CI user) sees it: what it
asks for is honoured or refused, never silently dropped."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from rt_util import CORRAL, poll

from supervisor.serve.peers import Peer
from supervisor.serve.protocol import SubmitRequest
from supervisor.serve.specs import build_spec

NOBODY = Peer(pid=1, uid=65534, gid=65534, groups=())
ROOT = Peer(pid=1, uid=0, gid=0, groups=())


def spec_for(peer: Peer, properties: dict[str, str]):  # type: ignore[no-untyped-def]
    r = SubmitRequest(argv=["curl", "https://pypi.org/simple/"], properties=properties)
    return build_spec(peer, r, controllers=frozenset(), root="/sys/fs/cgroup/x",
                      output_cap=1 << 20, stdin_pipes=True)


ASKED = {"PrivateNetwork": "yes", "PrivateTmp": "yes", "ProtectControlGroups": "yes",
         "NoNewPrivileges": "yes", "LimitNPROC": "64"}


def test_root_gets_the_isolation_it_asks_for() -> None:
    """Held: a root submitter's isolation properties reach the task's spec."""
    iso = spec_for(ROOT, ASKED).isolation
    assert iso.private_network and iso.private_tmp and iso.protect_control_groups
    assert iso.no_new_privileges and "NPROC" in iso.rlimits


def test_an_unprivileged_submitter_gets_the_isolation_it_asks_for() -> None:
    """Held since 9637464 (was: every isolation property of a non-root submitter accepted
    and silently replaced by Isolation(user=uid))."""
    iso = spec_for(NOBODY, ASKED).isolation
    assert iso.user == 65534  # run as its submitter, as promised
    assert iso.private_network, "PrivateNetwork=yes was accepted and dropped"
    assert iso.private_tmp and iso.protect_control_groups and iso.no_new_privileges
    assert "NPROC" in iso.rlimits


def test_an_unprivileged_submitter_cannot_pick_its_user() -> None:
    """Held: User=, Group= are root's to set (403)."""
    from supervisor.serve.protocol import ApiError
    with pytest.raises(ApiError) as e:
        spec_for(NOBODY, {"User": "root"})
    assert e.value.status == 403


def test_an_unprivileged_submitter_cannot_ask_for_capabilities() -> None:
    from supervisor.serve.protocol import ApiError
    try:
        iso = spec_for(NOBODY, {"AmbientCapabilities": "CAP_SETUID CAP_SYS_ADMIN"}).isolation
    except ApiError as e:
        assert e.status == 403
        return
    assert iso.ambient_capabilities == (), (
        f"uid 65534's task would run holding {iso.ambient_capabilities}")


def spec_with_controllers(peer: Peer, properties: dict[str, str]):  # type: ignore[no-untyped-def]
    r = SubmitRequest(argv=["true"], properties=properties)
    return build_spec(peer, r, controllers=frozenset({"cpu", "io", "memory", "pids"}),
                      root="/sys/fs/cgroup/x", output_cap=1 << 20, stdin_pipes=True)


@pytest.mark.parametrize("properties", [
    {"LimitRTPRIO": "99"},  # real-time scheduling for a user
    {"LimitNICE": "-20"},
    {"CPUWeight": "10000"},  # 100x everyone else's share
    {"IOWeight": "1000"}])
def test_an_unprivileged_submitter_cannot_raise_limits_or_shares(
        properties: dict[str, str]) -> None:
    from supervisor.serve.protocol import ApiError
    try:
        spec_with_controllers(ROOT, properties)  # root's to give, where corral can
    except ApiError as e:
        root_refused: ApiError | None = e  # (no CAP_SYS_RESOURCE here: nobody may)
    else:
        root_refused = None
    with pytest.raises(ApiError) as e:
        spec_with_controllers(NOBODY, properties)
    if root_refused is None:
        assert e.value.status == 403 and e.value.field == f"properties.{next(iter(properties))}"
    lower = {"LimitNOFILE": "64", "CPUWeight": "50", "IOWeight": "10"}
    assert spec_with_controllers(NOBODY, lower).limits.cpu_weight == 50  # lowering is anyone's


ESCALATE = ('import os; print("uid", os.getuid()); os.setuid(0); '
            'print("after setuid(0)", os.getuid()); '
            'print(open("/etc/shadow").readline().split(":")[0], "read /etc/shadow")')


@pytest.fixture
def throwaway_user() -> Iterator[str]:
    name = f"rt{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def test_a_local_user_cannot_become_root_through_corral_serve(
        scratch: str, throwaway_user: str) -> None:
    if shutil.which("curl") is None:
        pytest.skip("needs curl")
    home = tempfile.mkdtemp(prefix="rt-serve-")
    os.chmod(home, 0o755)
    sock = os.path.join(home, "s.sock")
    daemon = subprocess.Popen([CORRAL, "serve", "--socket", sock, "--state-dir",
                               os.path.join(home, "state"), "--cgroup-root", scratch,
                               "--log-level", "warning"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert poll(lambda: os.path.exists(sock), 20), "the daemon did not start"
        body = os.path.join(home, "body.json")
        with open(body, "w") as f:
            json.dump({"argv": ["python3", "-c", ESCALATE],
                       "properties": {"AmbientCapabilities": "CAP_SETUID"}}, f)
        os.chmod(body, 0o644)
        as_user = ["setpriv", f"--reuid={throwaway_user}", f"--regid={throwaway_user}",
                   "--clear-groups", "--", "curl", "-s", "--unix-socket", sock]
        sent = subprocess.run([*as_user, "-H", "Content-Type: application/json", "-d",
                               f"@{body}", "http://corral/v1/tasks"], capture_output=True,
                              text=True, timeout=30)
        answer = json.loads(sent.stdout)
        if "error" in answer:
            assert answer["error"]["code"] in ("forbidden", "invalid"), answer
            return  # refused: as it should be
        waited = subprocess.run([*as_user, f"http://corral/v1/tasks/{answer['id']}/wait"
                                 "?timeout=30s"], capture_output=True, text=True, timeout=60)
        result = json.loads(waited.stdout)
        result = result.get("result", result)
        out = result["output"]["stdout"]["head"]
        assert "after setuid(0) 0" not in out, f"the task became root: {out!r}"
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(home, ignore_errors=True)
