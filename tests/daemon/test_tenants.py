"""A tenant of ``corral serve`` against the others: real daemons, real second uids.

Each test is an attack a tenant with well-formed requests could make (what it controls: every
byte of a request, its own processes and their signals, the disk its output fills, how many
connections it holds, how fast it reads) and checks that it gets nothing its uid does not
already have and takes nothing from the other tenants.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from daemon_util import RunningDaemon, User, as_user, as_users, raw

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


def _submit_as_if(user: User, sock: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """POST each body on one connection whose peer credentials are ``user``'s, from a process
    whose real uid stays root: the user's own ``kill(-1, SIGSTOP)`` cannot stop this client
    (kill(2) checks the target's real and saved uids), so only what the daemon does for the
    user is exposed to it.  The answers' (status, JSON)."""
    def run() -> Any:
        os.setegid(user.gid)
        os.seteuid(user.uid)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)  # SO_PEERCRED: the effective ids now
        os.seteuid(0)
        os.setegid(0)
        s.settimeout(60)
        answers = []
        reader = s.makefile("rb")
        for body in bodies:
            data = json.dumps(body).encode()
            s.sendall(b"POST /v1/tasks HTTP/1.1\r\nhost: x\r\ncontent-length: "
                      + str(len(data)).encode() + b"\r\n\r\n" + data)
            status = int(reader.readline().split()[1])
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answers.append([status, json.loads(reader.read(length))])
        s.close()
        return answers

    return as_user(None, run)  # type: ignore[no-any-return]


def test_a_tenant_stopping_its_own_processes_never_holds_the_daemon(
        start_daemon: Start, users: list[User], stopper: str) -> None:
    """Item 2 of the tenants' issue: a child that takes the tenant's uid before its exec
    could be SIGSTOPped there by any process of that uid, and the daemon's event loop waited
    for that exec in the kernel: nothing was answered, no time limit fired, SIGTERM waited.
    Now the spawn fails with its own record (or the task runs and meets its time limit), and
    the other tenant is answered all along."""
    d = start_daemon()
    attacker, victim = users[0], users[1]
    stopping = subprocess.Popen(["setpriv", f"--reuid={attacker.uid}",
                                 f"--regid={attacker.gid}", "--clear-groups", "--", stopper,
                                 "60"])
    try:
        time.sleep(0.2)  # (the loop runs)

        def victim_runs() -> Any:
            took = []
            with Client(d.socket, timeout=30) as c:
                for _ in range(5):
                    start = time.monotonic()
                    info = c.wait(c.submit(["true"], time_limit="20s").id)
                    took.append([info.outcome, time.monotonic() - start])
            return took

        # (a PATH of 300 missing directories: 300 failed execve(2) before the real one, each
        # a moment for the SIGSTOP to land in: what a tenant does to widen the window)
        path = ":".join([f"/nonexistent/{i}" for i in range(300)] + ["/usr/bin", "/bin"])
        attack = [{"argv": ["true"], "time_limit": "2s", "grace": "1s",
                   "env": {"PATH": path}}] * 20
        answers, took = as_users([
            (None, lambda: _submit_as_if(attacker, d.socket, attack)),
            (victim, victim_runs)])
    finally:
        stopping.kill()
        stopping.wait()
    assert [a[0] for a in answers] == [201] * 20, answers
    assert [t[0] for t in took] == ["succeeded"] * 5, took
    # every attacker's task ends, each with one record: stopped before its exec (spawn
    # failed, step "stopped"), or stopped after it and ended at its time limit, or done
    with d.client() as root:
        ended = [root.wait(a[1]["id"], timeout=60) for a in answers]
    outcomes = {(e.outcome, (e.result.get("error") or {}).get("step")) for e in ended}
    assert outcomes <= {("spawn_failed", "stopped"), ("timed_out", None),
                        ("succeeded", None)}, outcomes
    assert ("spawn_failed", "stopped") in outcomes, outcomes  # (the attack did land)
    failed = next(e for e in ended if e.outcome == "spawn_failed")
    assert "stopped by a signal before it could run" in failed.result["error"]["message"]


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _flood(d: RunningDaemon, head: bytes, total: int) -> int:
    """Send ``head``, then junk, while the daemon answers; how many junk bytes it took
    before it closed the connection (``total``: it never did)."""
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(d.socket)
        s.sendall(head)
        chunk = b"x" * 65536
        try:
            while sent < total:
                sent += s.send(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
    return sent


def test_bytes_sent_during_a_long_answer_are_bounded_per_connection(start_daemon: Start,
                                                                   users: list[User]) -> None:
    """Item 3: what a client sends while its stream or long poll runs was buffered without
    bound (+512 MiB in 0.7 s).  Now the daemon holds at most a request's worth (the head and
    body limits) and then drops the connection; its memory stays put."""
    d = start_daemon("--max-body", "64K")
    with d.client() as c:
        sleeper = c.submit(["sleep", "60"]).id
    before = _rss(d.proc.pid)
    heads = [b"GET /v1/events HTTP/1.1\r\nhost: x\r\n\r\n",
             f"GET /v1/tasks/{sleeper}/output?follow=true HTTP/1.1\r\nhost: x\r\n\r\n".encode(),
             f"GET /v1/tasks/{sleeper}/wait?timeout=60s HTTP/1.1\r\nhost: x\r\n\r\n".encode()]
    for head in heads:
        took = _flood(d, head, 256 << 20)
        assert took < 16 << 20, (head, took)  # a few socket buffers, then the door
    assert _rss(d.proc.pid) - before < 32 << 20
    with d.client() as c:
        c.stop(sleeper, force=True)
        assert c.wait(sleeper).outcome == "cancelled"


def test_a_requests_time_starts_at_its_first_byte(start_daemon: Start) -> None:
    """Item 8: the daemon's deadline for a request counted from the moment the connection
    went idle, so the project's own client, idle on a kept-alive connection for longer than
    the header timeout, got 408 for its next request and its stdin bytes were lost."""
    d = start_daemon("--header-timeout", "1s")
    with d.client() as c:
        t = c.submit(["sh", "-c", "wc -c"], stdin="pipe")
        c.show(t.id)  # (the connection is kept alive from here)
        time.sleep(2.5)  # idle: longer than the header timeout, shorter than the idle one
        c.write_stdin(t.id, b"y" * 200_000, eof=True)
        info = c.wait(t.id)
        out = b"".join(f.data for f in c.output(t.id))
    assert info.outcome == "succeeded" and out.strip() == b"200000"


def test_a_head_above_the_limit_is_431_however_it_arrives(start_daemon: Start) -> None:
    d = start_daemon()
    head = b"GET /v1/limits HTTP/1.1\r\nhost: x\r\nx-filler: " + b"a" * 20000 + b"\r\n\r\n"
    status, answer = raw(d, head)  # in one piece: h11's own bound never sees it incomplete
    assert status == 431 and answer["error"]["code"] == "headers_too_large", answer
    status, _ = raw(d, b"GET /v1/limits HTTP/1.1\r\nhost: x\r\nx-filler: " + b"a" * 15000 +
                    b"\r\n\r\n")
    assert status == 200


def test_a_task_has_one_id_and_any_other_spelling_is_404(start_daemon: Start) -> None:
    d = start_daemon()
    with d.client() as c:
        t = c.submit(["sleep", "60"])
    assert t.id == "1"
    for spelling in ("01", "0001", "1" + "0" * 25, "99999999999999999999", "+1", "1.0"):
        for method, path in (("GET", f"/v1/tasks/{spelling}"),
                             ("POST", f"/v1/tasks/{spelling}/stop"),
                             ("GET", f"/v1/tasks/{spelling}/wait?timeout=0"),
                             ("GET", f"/v1/tasks/{spelling}/output")):
            request = (f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            status, answer = raw(d, request.encode())
            assert status == 404 and answer["error"]["code"] in ("not_found", "no_such_path"), \
                (path, answer)
    with d.client() as c:
        assert c.show("1").state == "running"  # no stop reached it through another spelling
        c.stop("1", force=True)
        c.wait("1")
    assert "Traceback" not in d.log_text()


@pytest.fixture
def open_dir() -> Iterator[str]:
    """A 0755 directory every uid may reach (the state directory goes in it)."""
    where = tempfile.mkdtemp(prefix="corral-test-open-")
    os.chmod(where, 0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_state_directory_that_existed_is_made_root_s_alone(start_daemon: Start,
                                                           users: list[User],
                                                           open_dir: str) -> None:
    """Item 5: a state directory made before the daemon (a Kubernetes emptyDir is 0777) kept
    its mode; state.db-wal, -shm and the tails were 0644: tenant A read B's environment from
    the WAL, swapped in an output/ of its own and deleted B's output.  Now the daemon makes
    the directory 0700 before it looks inside, removes what another uid planted in output/,
    and every file it keeps is 0600."""
    attacker, victim = users[0], users[1]
    state = os.path.join(open_dir, "state")
    os.mkdir(state)
    os.chmod(state, 0o777)

    def plant() -> Any:
        os.mkdir(os.path.join(state, "output"), 0o777)
        os.chmod(os.path.join(state, "output"), 0o777)
        for name in ("1", "1.stderr", "1.tail"):
            with open(os.path.join(state, "output", name), "w") as f:
                f.write("planted")
        return sorted(os.listdir(os.path.join(state, "output")))

    assert as_user(attacker, plant) == ["1", "1.stderr", "1.tail"]
    d = start_daemon(state_dir=state)

    def submit() -> Any:
        with Client(d.socket) as c:
            t = c.submit(["sh", "-c", "echo secret output; head -c 70000 /dev/zero"],
                         env={"API_TOKEN": "hunter2-of-the-victim"})
            return c.wait(t.id).id

    task_id = as_user(victim, submit)
    assert task_id == "1"

    def snoop() -> Any:
        found = {}
        for name in ("state.db", "state.db-wal", "state.db-shm", "lock", "output",
                     "output/1", "output/1.stderr"):
            path = os.path.join(state, name)
            try:
                with open(path, "rb") as f:
                    found[name] = b"hunter2" in f.read()
            except IsADirectoryError:
                found[name] = sorted(os.listdir(path))
            except OSError as e:
                found[name] = e.strerror
            try:
                os.unlink(path)
                found[name + " unlink"] = "removed"
            except OSError as e:
                found[name + " unlink"] = e.strerror
        return found

    seen = as_user(attacker, snoop)
    assert set(seen.values()) == {"Permission denied"}, seen
    modes = {name: stat.S_IMODE(os.stat(os.path.join(state, name)).st_mode)
             for name in ("", "output", "state.db", "state.db-wal", "state.db-shm", "lock")}
    assert modes == {"": 0o700, "output": 0o700, "state.db": 0o600, "state.db-wal": 0o600,
                     "state.db-shm": 0o600, "lock": 0o600}, modes
    outputs = os.listdir(os.path.join(state, "output"))
    for name in outputs:
        st = os.lstat(os.path.join(state, "output", name))
        assert st.st_uid == 0 and not st.st_mode & 0o077, (name, oct(st.st_mode))
    with d.client() as c:
        out = b"".join(f.data for f in c.output(task_id))
    assert out.startswith(b"secret output\n") and b"planted" not in out


def test_records_another_uid_could_write_are_refused_with_the_fix(start_daemon: Start,
                                                                 users: list[User],
                                                                 open_dir: str) -> None:
    """A state.db that is not the daemon's own (a queued row runs as the uid it names: whoever
    writes it has root run anything) is never opened: the daemon says which file, whose, and
    what to do."""
    state = os.path.join(open_dir, "state")
    os.mkdir(state, 0o700)
    db = os.path.join(state, "state.db")
    with open(db, "w"):
        pass
    os.chown(db, users[0].uid, users[0].gid)
    d = start_daemon(state_dir=state, expect_exit=True)
    assert d.proc.returncode == 125
    text = d.log_text()
    assert f"belongs to uid {users[0].uid}" in text and f"mv {db} {db}.untrusted" in text, text
    # and a state directory that another user owns, or that lies in one other users may write
    os.chown(db, 0, 0)
    os.chown(state, users[0].uid, users[0].gid)
    d = start_daemon(state_dir=state, expect_exit=True)
    assert d.proc.returncode == 125 and f"belongs to uid {users[0].uid}" in d.log_text()
    os.chown(state, 0, 0)
    os.chmod(open_dir, 0o777)
    d = start_daemon(state_dir=state, expect_exit=True)
    assert d.proc.returncode == 125 and "other users may write" in d.log_text()
    os.chmod(open_dir, 0o755)


def test_a_socket_directory_others_could_write_is_made_the_daemon_s(start_daemon: Start,
                                                                  open_dir: str) -> None:
    where = os.path.join(open_dir, "run")
    os.mkdir(where)
    os.chmod(where, 0o777)  # (a pod's shared emptyDir)
    d = start_daemon(socket=os.path.join(where, "corral.sock"))
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o755
    assert d.client().limits()["uid"] == 0
