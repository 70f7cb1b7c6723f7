"""A tenant of ``corral serve`` against the others: real daemons, real second uids.

Each test is an attack a tenant with well-formed requests could make (what it controls: every
byte of a request, its own processes and their signals, the disk its output fills, how many
connections it holds, how fast it reads) and checks that it gets nothing its uid does not
already have and takes nothing from the other tenants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daemon_util import RunningDaemon, User, as_user

from supervisor.client import ApiError, Client

Start = Callable[..., RunningDaemon]

ESCALATE = ("import os; print('uid', os.getuid(), 'caps', open('/proc/self/status').read()"
            ".split('CapEff:')[1].split()[0]); os.setuid(0); print('became root')")
PADDINGS = [(" ", ""), ("", " "), ("\t", ""), ("", "\n"), ("\u00a0", ""), ("\u3000", ""),
            (" ", "\t")]


def test_a_padded_root_only_property_never_reaches_a_tenants_task(start_daemon: Start,
                                                                  users: list[User]) -> None:
    d = start_daemon()
    wanted = {"AmbientCapabilities": "CAP_SETUID CAP_SETGID CAP_DAC_OVERRIDE CAP_SYS_ADMIN",
              "User": "root", "Group": "root", "SupplementaryGroups": "root"}

    def attack() -> Any:
        answers = []
        with Client(d.socket) as c:
            for name, value in wanted.items():
                for before, after in PADDINGS:
                    try:
                        t = c.submit(["python3", "-c", ESCALATE],
                                     properties={before + name + after: value})
                        answers.append(["accepted", t.id])
                    except ApiError as e:
                        answers.append([e.status, e.code, e.field])
            return answers, [t.id for t in c.list()]

    answers, listed = as_user(users[0], attack)
    assert listed == [], f"a task ran: {answers}"
    for answer in answers:
        assert answer[:2] in ([403, "forbidden"], [400, "invalid"]), answers
    # read as the name it spells (ASCII blanks): refused as that property, 403
    assert [403, "forbidden", "properties.AmbientCapabilities"] in answers
    assert [403, "forbidden", "properties.User"] in answers


def test_what_a_tenant_may_ask_for_it_gets_and_runs_as_itself(start_daemon: Start,
                                                              users: list[User]) -> None:
    """Deny by default does not deny what only takes away: a dropped bounding set, a lower
    Limit*=, a namespace, no_new_privs, a umask (cgroup limits: the fuzz test, and the VM
    tier, since this host has no controllers)."""
    d = start_daemon()

    def submit() -> Any:
        with Client(d.socket) as c:
            t = c.submit(["sh", "-c", "grep -E '^(Uid|CapBnd|NoNewPrivs)' /proc/self/status; "
                                      "ulimit -n; umask"],
                         properties={" CapabilityBoundingSet": "~CAP_SYS_ADMIN",
                                     "LimitNOFILE": "64", "PrivateTmp": "yes",
                                     "NoNewPrivileges": "yes", "UMask": "0027"})
            info = c.wait(t.id)
            return info.outcome, b"".join(f.data for f in c.output(t.id)).decode()

    outcome, out = as_user(users[1], submit)
    assert outcome == "succeeded", out
    lines = dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)
    assert lines["Uid"].split()[0] == str(users[1].uid)
    assert not int(lines["CapBnd"], 16) & (1 << 21)  # CAP_SYS_ADMIN dropped
    assert lines["NoNewPrivs"] == "1"
    assert out.splitlines()[-2:] == ["64", "0027"]
