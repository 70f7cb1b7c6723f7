"""corral serve as an unprivileged submitter (an agent host's model, a CI user) sees it: what it
asks for is honoured or refused, never silently dropped."""

from __future__ import annotations

import pytest

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
