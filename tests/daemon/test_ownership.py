"""Ownership by SO_PEERCRED: two real uids that cannot see or stop each other's tasks; tasks
run as their submitter; ``--allow-group`` admits only a group's members."""

from __future__ import annotations

import grp
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from daemon_util import RunningDaemon, User, as_user

from supervisor.client import ApiError, Client

Start = Callable[..., RunningDaemon]


def test_two_uids_cannot_see_or_stop_each_others_tasks(start_daemon: Start,
                                                       users: list[User]) -> None:
    d = start_daemon()
    alice, bob = users[0], users[1]

    def submit() -> Any:
        with Client(d.socket) as c:
            t = c.submit(["sh", "-c", "id -u; id -g; sleep 30"])
            return t.id

    a_task = as_user(alice, submit)
    b_task = as_user(bob, submit)

    def bobs_view() -> Any:
        out = {}
        with Client(d.socket) as c:
            out["list"] = [t.id for t in c.list()]
            for verb, call in (("show", lambda: c.show(a_task)),
                               ("wait", lambda: c.wait(a_task, timeout=0.1)),
                               ("stop", lambda: c.stop(a_task, force=True)),
                               ("output", lambda: list(c.output(a_task)))):
                try:
                    call()
                    out[verb] = "allowed"
                except ApiError as e:
                    out[verb] = [e.status, e.code]
        return out

    view = as_user(bob, bobs_view)
    assert view["list"] == [b_task]
    for verb in ("show", "wait", "stop", "output"):
        assert view[verb] == [404, "not_found"], (verb, view)
    with d.client() as root:  # root sees every uid's tasks
        assert {t.id for t in root.list()} == {a_task, b_task}
        assert root.show(a_task).uid == alice.uid
        # alice's task still runs (bob's stop did nothing), as alice
        assert root.show(a_task).state == "running"

    def alice_stops() -> Any:
        with Client(d.socket) as c:
            c.stop(a_task, force=True)
            info = c.wait(a_task)
            out = b"".join(f.data for f in c.output(a_task)).decode()
            return [info.outcome, out]

    outcome, out = as_user(alice, alice_stops)
    assert outcome == "cancelled"
    assert out.split() == [str(alice.uid), str(alice.gid)]
    with d.client() as root:
        root.stop(b_task, force=True)
        root.wait(b_task)
    assert b"".join(f.data for f in Client(d.socket).output(b_task)).split() == [
        str(bob.uid).encode(), str(bob.gid).encode()]


def test_root_submits_as_root_and_users_cannot_set_user(start_daemon: Start,
                                                        users: list[User]) -> None:
    d = start_daemon()
    with d.client() as c:
        t = c.wait(c.submit(["id", "-u"]).id)
        assert t.outcome == "succeeded"
        assert b"".join(f.data for f in c.output(t.id)) == b"0\n"

    def sneaky() -> Any:
        with Client(d.socket) as c:
            c.submit(["id"], properties={"User": "root"})

    with pytest.raises(ApiError) as caught:
        as_user(users[0], sneaky)
    assert caught.value.status == 403 and caught.value.field == "properties.User"


@pytest.fixture
def group(users: list[User]) -> Iterator[str]:
    name = f"corral-g{secrets.token_hex(3)}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    subprocess.run(["usermod", "-a", "-G", name, users[2].name], check=True,
                   capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def test_allow_group_admits_members_and_root_only(start_daemon: Start, users: list[User],
                                                  group: str) -> None:
    d = start_daemon("--allow-group", group)
    gid = grp.getgrnam(group).gr_gid
    member, stranger = users[2], users[3]
    # a member has a socket of its own from the start, before any contact (a first contact
    # never waits behind another uid's flood on the shared socket), its own and 0600
    own = os.lstat(os.path.join(d.socket + ".uid", str(member.uid)))
    assert (own.st_uid, own.st_mode & 0o777) == (member.uid, 0o600)

    def my_uid() -> Any:
        with Client(d.socket) as c:
            return c.limits()["uid"]

    # the socket file is root:GROUP 0660: the kernel refuses a stranger's connect()
    st = os.stat(d.socket)
    assert (st.st_gid, st.st_mode & 0o777) == (gid, 0o660)
    with pytest.raises(AssertionError, match="Permission denied"):
        as_user(stranger, my_uid)
    # a member (a supplementary group, as a login gives it) is admitted; root always is
    assert as_user(None, lambda: _drop_then(member, gid, my_uid)) == member.uid
    with d.client() as root:
        assert root.limits()["uid"] == 0
    # and the daemon checks again itself (a socket unit may have made the socket 0666)
    os.chmod(d.socket, 0o666)
    with pytest.raises(ApiError) as caught:
        as_user(stranger, my_uid)
    assert caught.value.status == 403 and "--allow-group" in caught.value.message
    assert as_user(None, lambda: _drop_then(member, gid, my_uid)) == member.uid
    # (root's own, made at the start too; a stranger never gets one)
    assert sorted(os.listdir(d.socket + ".uid")) == sorted(["0", str(member.uid)])


def _drop_then(user: User, extra_gid: int, fn: Callable[[], Any]) -> Any:
    os.setgroups([extra_gid])
    os.setgid(user.gid)
    os.setuid(user.uid)
    return fn()


def test_a_users_isolation_properties_are_kept_as_it_runs_as_that_user(
        start_daemon: Start, users: list[User]) -> None:
    """PrivateNetwork=, NoNewPrivileges=, LimitNOFILE= asked by a non-root submitter reach
    its task, which runs as that submitter."""
    d = start_daemon()
    user = users[0]

    def submit() -> Any:
        with Client(d.socket) as c:
            t = c.submit(["sh", "-c", "cat /proc/self/status /proc/net/dev; ulimit -n"],
                         properties={"PrivateNetwork": "yes", "NoNewPrivileges": "yes",
                                     "LimitNOFILE": "77"})
            done = c.wait(t.id)
            return done.outcome, b"".join(f.data for f in c.output(t.id)).decode()

    outcome, out = as_user(user, submit)
    assert outcome == "succeeded", out
    status = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    assert status["Uid"].split()[0] == str(user.uid)
    assert status["NoNewPrivs"].strip() == "1"
    net = out.split(" face |", 1)[1].splitlines()[1:-1]  # /proc/net/dev's rows
    assert [row.split(":")[0].strip() for row in net] == ["lo"], out
    assert out.strip().splitlines()[-1] == "77"


def test_a_task_no_longer_in_memory_is_still_its_owners_alone(start_daemon: Start,
                                                               users: list[User]) -> None:
    """After a restart nothing is in memory: a stop, a signal, a resize or stdin for a task
    is answered from its record (by its uid and state alone: the record's request and result,
    MiBs of them, are not read for these), to its owner; another uid gets 404 for each."""
    d = start_daemon()
    alice, bob = users[0], users[1]

    def submit() -> Any:
        with Client(d.socket) as c:
            return c.wait(c.submit(["echo", "x" * 1000], env={"PAD": "p" * 100_000}).id).id

    a_task = as_user(alice, submit)
    d.stop()
    again = start_daemon(like=d)

    def verbs() -> Any:
        out = {}
        with Client(again.socket) as c:
            for verb, call in (("stop", lambda: c.stop(a_task, force=True)),
                               ("signal", lambda: c.signal(a_task, "INT")),
                               ("resize", lambda: c.resize(a_task, 40, 100)),
                               ("stdin", lambda: c.write_stdin(a_task, b"hi"))):
                try:
                    out[verb] = ["allowed", call()]
                except ApiError as e:
                    out[verb] = [e.status, e.code]
        return out

    theirs = as_user(bob, verbs)
    assert all(v == [404, "not_found"] for v in theirs.values()), theirs
    mine = as_user(alice, verbs)
    assert mine["stop"] == ["allowed", False], mine
    assert all(v[0] == 409 for k, v in mine.items() if k != "stop"), mine


def test_a_plain_submissions_isolation_is_made_again_only_for_other_credentials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's plain submission made its Isolation anew each time (its groups looked up,
    each limit parsed and clamped: ~270 us of a `true`'s ~390 us spec): one made in the last
    second for the same uid, gid, kernel groups and limits is the one used; any of them
    different, or a property asked, makes its own."""
    from supervisor import Isolation
    from supervisor.serve import peers
    from supervisor.serve.peers import Peer, run_as_isolation

    now = [1000.0]
    monkeypatch.setattr(peers.time, "monotonic", lambda: now[0])
    peers._made.clear()
    me = Peer(os.getpid(), 65534, 65534, (65534,))
    limits = {"NOFILE": (1024, 4096)}
    first = run_as_isolation(me, None, limits)
    assert run_as_isolation(me, None, dict(limits)) is first
    assert (first.user, first.group, first.supplementary_groups) == (65534, 65534, (65534,))
    others = [run_as_isolation(me, None, {"NOFILE": (1024, 2048)}),
              run_as_isolation(me._replace(groups=(65534, 100)), None, limits),
              run_as_isolation(me._replace(gid=100), None, limits),
              run_as_isolation(me._replace(uid=65533), None, limits),
              run_as_isolation(me, Isolation(private_network=True), limits)]
    assert all(o is not first for o in others)
    assert others[0].rlimits["NOFILE"] == (1024, 2048) and others[1].supplementary_groups == (
        65534, 100) and others[4].private_network
    now[0] += peers.MADE_FOR
    assert run_as_isolation(me, None, limits) is not first  # (made again: the host checked)
