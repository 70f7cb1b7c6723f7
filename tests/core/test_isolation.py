"""Isolation end to end: real users, real namespaces, real mounts, tried as a hostile task would.

Through the public API (``TaskSpec(..., isolation=Isolation(...))`` on a supervisor rooted in
the test's own cgroup) and through ``corral run -p``.  The users and groups are created here
(``corral-t-<hex>``) and removed at teardown; every mount is the task's own, in its own mount
namespace; the only cgroups touched are the test's.
"""

from __future__ import annotations

import functools
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from sup_util import HANG, wait_for

import cgroupfs
import supervisor
from supervisor import Isolation, SpecError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root supervisor")

PYTHON = "/usr/bin/python3"  # one every user can run (ours may live under /root)
CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    extra: str  # a group the user is a member of (/etc/group)
    extra_gid: int


def _admin(*argv: str) -> None:
    """useradd and friends; retried while another process holds the passwd lock."""
    for _ in range(50):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode == 0 or "lock" not in done.stderr:
            break
        time.sleep(0.1)
    assert done.returncode == 0, f"{argv}: {done.stderr}"


@pytest.fixture
def test_user() -> Iterator[User]:
    import grp
    import pwd

    name = f"corral-t-{secrets.token_hex(4)}"
    extra = f"{name}-x"
    _admin("groupadd", extra)
    try:
        _admin("useradd", "-M", "-U", "-G", extra, "-s", "/usr/sbin/nologin", name)
        try:
            pw = pwd.getpwnam(name)
            yield User(name, pw.pw_uid, pw.pw_gid, extra, grp.getgrnam(extra).gr_gid)
        finally:
            _admin("userdel", name)  # and its own group (USERGROUPS_ENAB)
    finally:
        _admin("groupdel", extra)


@pytest.fixture
async def foreign(test_cgroup: cgroupfs.Cgroup) -> AsyncIterator[cgroupfs.Cgroup]:
    """A cgroup outside the supervisor's tree (but the test's own): the escape target.
    Async, so that it goes before the (async) supervisor fixture's emptiness check."""
    cg = test_cgroup.make_child("foreign")
    yield cg
    cg.kill()
    assert cg.wait_unpopulated(HANG)
    cg.remove(recursive=True, busy_timeout=2.0)


@pytest.fixture
def outsider() -> Iterator[int]:
    """A root process outside every task (with all our capabilities): the ptrace target."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid
    proc.kill()
    proc.wait()


# A hostile task: each line tries one way out and says whether it got through.
RED_TEAM = r"""
try() {
    name=$1; shift
    if "$@" >/dev/null 2>&1; then echo "ESCAPED $name"; else echo "blocked $name"; fi
}
own="$CG2$(sed -n 's/^0:://p' /proc/self/cgroup)"
ptrace="import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True)
sys.exit(libc.ptrace(16, $OUTSIDER, 0, 0) != 0)"  # PTRACE_ATTACH
try move-to-foreign-cgroup sh -c "echo $$ > $FOREIGN/cgroup.procs"
try sub-cgroup-of-own-leaf mkdir "$own/sub"
try sub-cgroup-elsewhere mkdir "$FOREIGN/sub"
try freeze-foreign-cgroup sh -c "echo 1 > $FOREIGN/cgroup.freeze"
try ptrace-outsider $PYTHON -c "$ptrace"
try unshare-mount-namespace unshare --mount true
if [ "$(readlink /proc/self/ns/mnt)" != "$HOST_MNT_NS" ]; then  # never the host's mounts
    try remount-cgroupfs-rw mount -o remount,bind,rw "$CG2"
else
    echo "skipped remount-cgroupfs-rw: the task shares the host's mount namespace"
fi
try remount-in-user-namespace unshare --user --map-root-user --mount \
    sh -c "mount -o remount,bind,rw $CG2 && echo \$\$ > $FOREIGN/cgroup.procs"
"""


def red_team_env(foreign: cgroupfs.Cgroup, outsider: int) -> dict[str, str]:
    return {"FOREIGN": foreign.path, "OUTSIDER": str(outsider), "PYTHON": PYTHON,
            "CG2": cgroupfs.find_cgroup2_mount().mount_point,
            "HOST_MNT_NS": os.readlink("/proc/self/ns/mnt")}


def assert_nothing_escaped(out: str, foreign: cgroupfs.Cgroup, outsider: int) -> None:
    lines = out.splitlines()
    assert len(lines) == 8 and all(line.startswith(("blocked ", "skipped ")) for line in lines)
    assert sum(line.startswith("blocked ") for line in lines) >= 7, out
    assert foreign.procs() == [] and foreign.children() == []
    assert "frozen 0" in pathlib.Path(foreign.path, "cgroup.events").read_text()
    status = pathlib.Path(f"/proc/{outsider}/status").read_text()
    assert "TracerPid:\t0\n" in status and "State:\tS" in status


async def test_a_user_task_cannot_escape(sup: supervisor.Supervisor, test_user: User,
                                         foreign: cgroupfs.Cgroup, outsider: int) -> None:
    iso = Isolation(user=test_user.name)
    r = await sup.run(["sh", "-c", RED_TEAM], env=red_team_env(foreign, outsider),
                      isolation=iso)
    assert r.outcome == "succeeded", r.stderr
    assert_nothing_escaped(r.stdout.decode(), foreign, outsider)
    facts = iso.describe()
    assert facts["uid"] == test_user.uid and facts["capabilities"] == []
    assert facts["could_escape"] is False and facts["cgroupfs_read_only"] is False
    assert facts["escape_caveats"] == []


ROOT_LOCKED = Isolation(protect_control_groups=True,
                        capability_bounding_set="~CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_SYS_MODULE")


async def test_a_root_task_with_read_only_cgroupfs_and_fewer_caps_cannot_escape(
        sup: supervisor.Supervisor, foreign: cgroupfs.Cgroup, outsider: int) -> None:
    r = await sup.run(["sh", "-c", RED_TEAM], env=red_team_env(foreign, outsider),
                      isolation=ROOT_LOCKED)
    assert r.outcome == "succeeded", r.stderr
    assert "blocked remount-cgroupfs-rw" in r.stdout.decode()  # tried, in its own namespace
    assert_nothing_escaped(r.stdout.decode(), foreign, outsider)
    facts = ROOT_LOCKED.describe()
    assert facts["uid"] == 0 and facts["cgroupfs_read_only"] is True
    assert cgroupfs.find_cgroup2_mount().mount_point in facts["read_only_paths"]
    assert "CAP_SYS_ADMIN" not in facts["capabilities"] and facts["namespaces"] == ["mnt"]
    assert facts["could_escape"] is False and facts["syscalls_refused"] == ["clone3"]
    assert "/proc/PID/root" in facts["escape_caveats"][0]  # its root siblings matter


async def test_known_limit_a_root_sibling_sharing_the_hosts_mounts_is_a_way_out(
        sup: supervisor.Supervisor, foreign: cgroupfs.Cgroup) -> None:
    # What escape_caveats says: the protected root task reaches cgroupfs through
    # /proc/PID/root of a root sibling with the same capabilities in the host's mounts.
    # (Only a sub-cgroup of the test's own is made.)  Pinned so that a fix updates the caveat.
    same_caps = Isolation(capability_bounding_set=ROOT_LOCKED.capability_bounding_set)
    async with trio.open_nursery() as nursery:
        sibling = await nursery.start(functools.partial(sup.start, ["sleep", "600"],
                                                        isolation=same_caps))
        r = await sup.run(["mkdir", f"/proc/{sibling.pid}/root{foreign.path}/via-sibling"],
                          isolation=ROOT_LOCKED)
        direct = await sup.run(["mkdir", f"{foreign.path}/direct"], isolation=ROOT_LOCKED)
        sibling.stop(force=True)
    assert (r.outcome, direct.outcome) == ("succeeded", "failed")
    assert [c.rsplit("/", 1)[-1] for c in foreign.children()] == ["via-sibling"]
    os.rmdir(f"{foreign.path}/via-sibling")


CONTROL = r"""
try() {
    name=$1; shift
    if "$@" >/dev/null 2>&1; then echo "ESCAPED $name"; else echo "blocked $name"; fi
}
try sub-cgroup-elsewhere mkdir "$FOREIGN/sub"
try ptrace-outsider $PYTHON -c "import ctypes, sys
sys.exit(ctypes.CDLL(None).ptrace(16, $OUTSIDER, 0, 0) != 0)"
try unshare-mount-namespace unshare --mount true
"""


async def test_a_plain_root_task_could_escape_and_says_so(
        sup: supervisor.Supervisor, foreign: cgroupfs.Cgroup, outsider: int) -> None:
    # the control: without isolation the same probes get through (harmless ones only:
    # a sub-cgroup of the test's own, a ptrace of our own sleep, a namespace of its own)
    r = await sup.run(["sh", "-c", CONTROL], env=red_team_env(foreign, outsider))
    assert r.stdout.decode().split("\n") == ["ESCAPED sub-cgroup-elsewhere",
                                              "ESCAPED ptrace-outsider",
                                              "ESCAPED unshare-mount-namespace", ""]
    assert [c.rsplit("/", 1)[-1] for c in foreign.children()] == ["sub"]
    os.rmdir(f"{foreign.path}/sub")
    facts = Isolation().describe()
    assert facts["could_escape"] is True and facts["escape_routes"] == [
        "runs as uid 0", "cgroupfs is writable in its mount namespace"]
    kept_admin = Isolation(protect_control_groups=True).describe()
    assert kept_admin["could_escape"] is True
    assert "CAP_SYS_ADMIN" in kept_admin["escape_routes"][1]


async def test_user_runs_with_its_uid_primary_group_and_groups(
        sup: supervisor.Supervisor, test_user: User) -> None:
    u = test_user
    r = await sup.run(["sh", "-c", "id -u; id -g; id -G"], isolation=Isolation(user=u.name))
    assert r.stdout.decode().split("\n")[:3] == [str(u.uid), str(u.gid),
                                                  f"{u.gid} {u.extra_gid}"]
    # Group= replaces the primary group; SupplementaryGroups= adds to the user's groups
    iso = Isolation(user=u.uid, group="nogroup", supplementary_groups=["nogroup", u.extra])
    r = await sup.run(["sh", "-c", "id -u; id -g; id -G"], isolation=iso)
    uid, gid, groups = r.stdout.decode().split("\n")[:3]
    nogroup = str(iso.describe()["gid"])
    assert (uid, gid) == (str(u.uid), nogroup)
    assert set(groups.split()) == {nogroup, str(u.extra_gid)}
    assert iso.describe()["user"] == u.name


# Run inside a task: its network interfaces, and whether each is up (SIOCGIFFLAGS).
LINKS = ("import fcntl, socket, struct\n"
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "for _, name in socket.if_nameindex():\n"
         "    raw = fcntl.ioctl(s, 0x8913, struct.pack(\"16sH14x\", name.encode(), 0))\n"
         "    print(name, \"UP\" if struct.unpack(\"16sH14x\", raw)[1] & 1 else \"DOWN\")")


async def test_private_network_sees_only_lo_and_not_the_hosts_loopback(
        sup: supervisor.Supervisor, test_user: User) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = (f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), 5)\n"
                 f" print('connected')\nexcept OSError as e:\n print(type(e).__name__)")
        iso = Isolation(user=test_user.name, private_network=True)
        r = await sup.run(["sh", "-c", f"{PYTHON} -c '{LINKS}'; {PYTHON} -c \"{probe}\""],
                          isolation=iso)
        assert r.stdout.decode().splitlines() == ["lo UP", "ConnectionRefusedError"], r.stderr
        control = await sup.run([PYTHON, "-c", probe], isolation=Isolation(user=test_user.name))
        assert control.stdout == b"connected\n"
    assert iso.describe()["namespaces"] == ["net"]


async def test_private_network_seen_from_outside_with_pyroute2(
        sup: supervisor.Supervisor) -> None:
    pyroute2 = pytest.importorskip("pyroute2")
    from supervisor._spawn import setns

    async with trio.open_nursery() as nursery:
        task = await nursery.start(functools.partial(
            sup.start, ["sleep", "600"], isolation=Isolation(private_network=True)))
        links: list[tuple[str, bool]] = []

        def look() -> None:  # setns moves only this thread; its netlink socket lives there
            fd = os.open(f"/proc/{task.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            setns(fd, 0x40000000)
            os.close(fd)
            with pyroute2.IPRoute() as ipr:
                links.extend((link.get("ifname"), bool(link["flags"] & 1))
                             for link in ipr.get_links())

        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        task.stop(force=True)
    assert links == [("lo", True)]


async def test_rlimits_hold_inside(sup: supervisor.Supervisor, test_user: User) -> None:
    iso = Isolation(user=test_user.name, rlimits={"NOFILE": "64:128", "CORE": 0,
                                                  "FSIZE": "1K"})
    r = await sup.run(["sh", "-c", "ulimit -n; ulimit -Hn; ulimit -c; "
                                   "head -c 2048 /dev/zero > /dev/null; ulimit -f"],
                      isolation=iso)
    assert r.stdout.decode().split() == ["64", "128", "0", "2"]  # ulimit -f: 512-byte blocks
    assert iso.describe()["rlimits"] == {"CORE": [0, 0], "FSIZE": [1024, 1024],
                                         "NOFILE": [64, 128]}


async def test_cpu_limit_stops_a_busy_task(sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "while :; do :; done"], time_limit=HANG,
                      isolation=Isolation(rlimits={"CPU": "1s"}))
    assert r.outcome == "signaled" and r.signal in (signal.SIGXCPU, signal.SIGKILL)


async def test_private_tmp_is_the_tasks_own_and_gone_with_it(
        sup: supervisor.Supervisor, test_user: User) -> None:
    marker = f"corral-private-{secrets.token_hex(4)}"
    iso = Isolation(user=test_user.name, private_tmp=True)
    script = (f"ls -A /tmp /var/tmp | grep -c . ; echo secret > /var/tmp/{marker}; "
              f"echo secret > /tmp/{marker}; exec sleep 600")
    async with trio.open_nursery() as nursery:
        task = await nursery.start(functools.partial(sup.start, ["sh", "-c", script],
                                                     isolation=iso))
        inside = pathlib.Path(f"/proc/{task.pid}/root/tmp/{marker}")  # its mount namespace
        await wait_for(lambda: inside.exists() and inside.read_text() == "secret\n",
                       what="markers written")
        assert not os.path.exists(f"/tmp/{marker}")
        assert not os.path.exists(f"/var/tmp/{marker}")
        task.stop(force=True)
    r = await task.wait()
    assert r.stdout.decode().split()[0] == "2"  # only the two directory headers: empty
    again = await sup.run(["ls", "-A", "/tmp", "/var/tmp"], isolation=iso)
    assert marker not in again.stdout.decode()
    assert not os.path.exists(f"/tmp/{marker}")


async def test_umask_and_no_new_privileges(sup: supervisor.Supervisor) -> None:
    iso = Isolation(umask="0027", no_new_privileges=True)
    r = await sup.run(["sh", "-c", "umask; grep NoNewPrivs /proc/self/status"], isolation=iso)
    assert r.stdout.decode().split() == ["0027", "NoNewPrivs:", "1"]


async def test_ambient_capability_lets_a_user_bind_a_low_port(
        sup: supervisor.Supervisor, test_user: User) -> None:
    bind = (f"{PYTHON} -c \"import socket; s = socket.socket(); "
            f"s.bind(('127.0.0.1', 80)); print('bound')\" 2>&1 | tail -1")
    with_cap = Isolation(user=test_user.name, private_network=True,
                         ambient_capabilities="CAP_NET_BIND_SERVICE")
    r = await sup.run(["sh", "-c", bind], isolation=with_cap)
    assert r.stdout == b"bound\n"
    r = await sup.run(["sh", "-c", bind], isolation=Isolation(user=test_user.name,
                                                               private_network=True))
    assert b"PermissionError" in r.stdout
    assert with_cap.describe()["capabilities"] == ["CAP_NET_BIND_SERVICE"]


async def test_a_failed_isolation_step_is_spawn_failed_with_the_step(
        sup: supervisor.Supervisor, test_user: User, tmp_path: pathlib.Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    r = await sup.run(["true"], cwd=str(private), isolation=Isolation(user=test_user.name))
    assert r.outcome == "spawn_failed" and r.error_step == "chdir"


# --- validation: refused before anything is made, with the value, the rule and the fix ------


@pytest.mark.parametrize(("kwargs", "field", "fragments"), [
    ({"user": "corral-no-such-user"}, "user", ["corral-no-such-user", "does not exist",
                                               "useradd"]),
    ({"group": "corral-no-such-group"}, "group", ["does not exist", "groupadd"]),
    ({"supplementary_groups": "nogroup corral-no-such-group"}, "supplementary_groups",
     ["corral-no-such-group"]),
    ({"user": 4000000000}, "user", ["no entry in the user database", "give group"]),
    ({"umask": "0999"}, "umask", ['"0999"', "octal"]),
    ({"rlimits": {"NOFILE": "10:5"}}, "rlimits['NOFILE']", ['"10:5"', "swap them"]),
    ({"rlimits": {"NOFILE": "many"}}, "rlimits['NOFILE']", ['"many"', "whole number"]),
    ({"rlimits": {"FILES": 10}}, "rlimits", ['"FILES"', "NOFILE"]),
    ({"rlimits": {"CPU": "5 parsecs"}}, "rlimits['CPU']", ["duration"]),
    ({"private_network": "maybe"}, "private_network", ['"maybe"', '"yes" or "no"']),
    ({"capability_bounding_set": "CAP_NO_SUCH"}, "capability_bounding_set",
     ['"CAP_NO_SUCH" is not one', "capabilities(7)"]),
    ({"capability_bounding_set": "sys_admin"}, "capability_bounding_set",
     ['write "CAP_SYS_ADMIN"']),
    ({"capability_bounding_set": "CAP_CHOWN", "ambient_capabilities": "CAP_NET_RAW"},
     "ambient_capabilities", ["CAP_NET_RAW", "must also be in capability_bounding_set"]),
])
def test_validation_errors_name_value_rule_and_fix(kwargs: dict[str, object], field: str,
                                                   fragments: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        Isolation(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field and str(info.value).startswith(field)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_raising_a_hard_limit_needs_cap_sys_resource() -> None:
    # run where corral lacks CAP_SYS_RESOURCE (setpriv drops it from what root gets at exec)
    out = _python_without_caps(["sys_resource"], "Isolation(rlimits={'NOFILE': 'infinity'})")
    assert "needs CAP_SYS_RESOURCE" in out and "give at most" in out


def test_private_network_where_namespaces_are_refused() -> None:
    out = _python_without_caps(["sys_admin"], "Isolation(private_network=True)")
    assert out.startswith("private_network=yes needs a network namespace, which this host "
                          "refuses corral (unshare(CLONE_NEWNET): [Errno 1]"), out
    assert "CAP_SYS_ADMIN" in out


def test_another_user_needs_cap_setuid() -> None:
    out = _python_without_caps(["setuid"], "Isolation(user='nobody')")
    assert "needs CAP_SETUID" in out and "run corral as root" in out


def _python_without_caps(caps: list[str], expr: str) -> str:
    code = (f"from supervisor import Isolation, SpecError\ntry:\n {expr}\n print('accepted')\n"
            f"except SpecError as e:\n print(e)")
    drop = ",".join(f"-{c}" for c in caps)
    done = subprocess.run(["setpriv", f"--bounding-set={drop}", "--", sys.executable, "-c",
                           code], capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_properties_build_one_isolation(test_user: User) -> None:
    from supervisor._properties import parse_properties

    opts = parse_properties([
        f"User={test_user.name}", "PrivateNetwork=yes", "PrivateTmp=true", "UMask=077",
        "LimitNOFILE=64:128", "LimitCPU=1min 30s", "LimitRTTIME=500ms", "LimitNICE=0",
        "CapabilityBoundingSet=~CAP_SYS_ADMIN", "CapabilityBoundingSet=~CAP_SYS_PTRACE",
        "SupplementaryGroups=nogroup", "SupplementaryGroups=", "NoNewPrivileges=yes",
    ]).options
    iso = opts["isolation"]
    assert iso.user == test_user.name and iso.private_network and iso.private_tmp
    assert iso.umask == 0o077 and iso.no_new_privileges and iso.supplementary_groups == ()
    assert iso.rlimits == {"CPU": (90, 90), "NICE": (0, 0), "NOFILE": (64, 128),
                           "RTTIME": (500_000, 500_000)}
    assert iso.capability_bounding_set is not None
    assert not {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE"} & set(iso.capability_bounding_set)
    assert "CAP_CHOWN" in iso.capability_bounding_set


@pytest.mark.parametrize(("item", "fragments"), [
    ("User=corral-no-such-user", ["User names a user that does not exist"]),
    ("LimitNOFILE=1:x", ["LimitNOFILE must be"]),
    ("AmbientCapabilities=CAP_NOPE", ["AmbientCapabilities must be", '"CAP_NOPE"']),
    ("LimitFOO=1", ["unknown or unsupported property 'LimitFOO'", "Limit{CPU,"]),
    ("LimitNICE=+30", ['LimitNICE must be a nice level from "-20" to "+19"']),
])
def test_property_errors_name_the_property(item: str, fragments: list[str]) -> None:
    from supervisor._properties import parse_properties

    with pytest.raises(SpecError) as info:
        parse_properties([item])
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_limit_values_read_as_systemd_reads_them() -> None:
    from supervisor._isovalues import parse_rlimit as _rlimit

    infinity = 2**64 - 1
    assert _rlimit("NICE", "-5", "LimitNICE") == (25, 25)  # RLIMIT_NICE is 20 - nice
    assert _rlimit("NICE", "+19", "LimitNICE") == (1, 1)
    assert _rlimit("CPU", "1.5s", "LimitCPU") == (2, 2)  # whole seconds, rounded up
    assert _rlimit("RTTIME", "250", "LimitRTTIME") == (250, 250)  # microseconds
    assert _rlimit("AS", "1G:infinity", "LimitAS") == (2**30, infinity)
    assert _rlimit("NOFILE", (10, None), "rlimits") == (10, infinity)
    assert _rlimit("STACK", ("8M", "16M"), "rlimits") == (8 << 20, 16 << 20)


@pytest.mark.parametrize("first, then", [((1, 5), (True, 5)), (1, True), ((0, 5), (False, 5)),
                                         ((1, 2), (1.0, 2)), ("5", 5.0)])
def test_a_limit_parsed_again_is_read_by_its_value_and_type(first: Any, then: Any) -> None:
    """A limit's parse is kept for the same value (a daemon's tenant's 16 limits, at every
    request), keyed by exact types: ``True`` read after ``1`` is refused as before, never
    taken from what ``1`` parsed to."""
    from supervisor._isovalues import parse_rlimit as _rlimit

    assert _rlimit("NOFILE", first, "LimitNOFILE") == _rlimit("NOFILE", first, "LimitNOFILE")
    with pytest.raises(SpecError):
        _rlimit("NOFILE", then, "LimitNOFILE")


def test_an_empty_assignment_resets_the_setting() -> None:
    from supervisor._properties import parse_properties

    opts = parse_properties(["User=nobody", "User=", "LimitNOFILE=64", "LimitNOFILE=",
                             "PrivateNetwork=yes", "PrivateNetwork="]).options
    assert opts["isolation"].is_empty()


def test_capability_sets_merge_as_systemd_says() -> None:
    from supervisor._properties import parse_properties

    def bounding(*lines: str) -> set[str]:
        iso = parse_properties([f"CapabilityBoundingSet={line}" for line in lines])
        return set(iso.options["isolation"].capability_bounding_set)

    assert bounding("CAP_CHOWN CAP_KILL", "CAP_NET_RAW") == {"CAP_CHOWN", "CAP_KILL",
                                                             "CAP_NET_RAW"}
    assert bounding("CAP_CHOWN CAP_KILL", "~CAP_KILL") == {"CAP_CHOWN"}
    assert bounding("CAP_CHOWN", "") == set()
    assert "CAP_SYS_ADMIN" in bounding("CAP_CHOWN", "~")


def test_empty_isolation_is_empty() -> None:
    assert Isolation().is_empty() and not Isolation(no_new_privileges=True).is_empty()
    with Isolation().prepare() as options:
        assert options == {}


# --- corral run -p ----------------------------------------------------------------------


def test_corral_run_with_isolation_properties(test_cgroup: cgroupfs.Cgroup,
                                              test_user: User) -> None:
    done = subprocess.run(
        [CORRAL, "run", "--cgroup-root", test_cgroup.path, "-p", f"User={test_user.name}",
         "-p", "PrivateNetwork=yes", "-p", "PrivateTmp=yes", "-p", "LimitNOFILE=64",
         "-p", "ProtectControlGroups=yes", "--",
         "sh", "-c", "id -un; ulimit -n; ls /proc/self/net/dev_snmp6; ls -A /tmp | wc -l"],
        capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [test_user.name, "64", "lo", "0"]


def test_corral_run_refuses_a_bad_property_before_anything(test_cgroup: cgroupfs.Cgroup) -> None:
    done = subprocess.run(
        [CORRAL, "run", "--cgroup-root", test_cgroup.path, "-p", "User=corral-no-such-user",
         "--", "true"], capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 125
    assert "User names a user that does not exist" in done.stderr
    assert test_cgroup.children() == []


HYBRID = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
"""


@pytest.mark.parametrize(("mountinfo", "expected"), [
    (HYBRID, [("/sys/fs/cgroup", 0xE), ("/sys/fs/cgroup/cpu", 0x20000E),
              ("/sys/fs/cgroup/unified", 0x20000E)]),
    # pure v2; a tmpfs root is no holder (it would make / read-only); escaped spaces
    ("1 0 0:1 / / rw - tmpfs rootfs rw\n"
     "2 1 0:2 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
     "3 1 0:3 /x /srv/my\\040cg ro - cgroup2 cgroup2 rw\n",
     [("/srv/my cg", 0), ("/sys/fs/cgroup", 0x2)]),
    # a cgroup mount hidden under another mount at the same point is not the one one sees
    (HYBRID + "50 41 0:40 / /sys/fs/cgroup/unified rw - tmpfs tmpfs rw\n",
     [("/sys/fs/cgroup", 0xE), ("/sys/fs/cgroup/cpu", 0x20000E)]),
])
def test_cgroup_mounts_to_make_read_only(mountinfo: str,
                                         expected: list[tuple[str, int]]) -> None:
    from supervisor._isohost import cgroup_mounts as _cgroup_mounts

    assert list(_cgroup_mounts(mountinfo)) == expected


async def test_numeric_ids_are_used_as_given(sup: supervisor.Supervisor) -> None:
    # what the daemon does with a peer's credentials: no database entry needed for numbers
    iso = Isolation(user=4000000000, group=4000000001, supplementary_groups=[4000000002])
    r = await sup.run(["sh", "-c", "id -u; id -g; id -G"], isolation=iso)
    assert r.stdout.decode().split() == ["4000000000", "4000000001", "4000000001",
                                         "4000000002"]
    assert iso.describe()["user"] is None


async def test_a_user_task_stopped_before_its_exec_fails_alone_and_holds_nothing_else(
        sup: supervisor.Supervisor, test_user: User, stopper: str, slow_path: str) -> None:
    """From its uid change to its exec the child runs as the user, and any process of that
    user may SIGSTOP it there (here a loop of ``kill(-1, SIGSTOP)``, with a PATH slow to
    search to widen the window: each failed execve is a moment for it to land).
    The thread that spawned it waits for that exec: it was the event loop's, so nothing else
    ran until someone sent SIGCONT.  Now such a spawn runs in a worker thread, the guard
    kills a child it finds stopped before its exec (spawn_failed, step ``stopped``), and the
    event loop, a root task's spawn among it, goes on."""
    spec = supervisor.TaskSpec(["true"], isolation=Isolation(user=test_user.name),
                               env={"PATH": slow_path}, time_limit="2s", grace="0.5s")
    worst = 0.0

    async def beat() -> None:
        nonlocal worst
        while True:
            t = time.monotonic()
            await trio.sleep(0.01)
            worst = max(worst, time.monotonic() - t)

    stopping = subprocess.Popen(["setpriv", f"--reuid={test_user.uid}",
                                 f"--regid={test_user.gid}", "--clear-groups", "--", stopper,
                                 "20"])
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(beat)
            rs = await sup.run_batch([spec] * 12, max_concurrency=4)
            root = await sup.run(["true"])
            nursery.cancel_scope.cancel()
    finally:
        stopping.kill()
        stopping.wait()
    steps = {(str(r.outcome), r.error_step) for r in rs}
    assert steps <= {("spawn_failed", "stopped"), ("timed_out", None), ("succeeded", None)}
    assert ("spawn_failed", "stopped") in steps, steps  # (the attack landed)
    failed = next(r for r in rs if r.outcome == "spawn_failed")
    assert "stopped by a signal before it could run" in str(failed.to_dict()["error"])
    assert sum("stopped by a signal" in n for n in failed.notes) == 1
    assert root.outcome == "succeeded"
    # the loop was never held until the stopper's end (20 s): at most a guard's round or two
    assert worst < 5.0, worst


def test_our_memory_stays_undumpable_while_any_child_of_another_uid_shares_it(
        test_user: User, stopper: str, test_cgroup: cgroupfs.Cgroup, slow_path: str) -> None:
    """A child that takes another uid makes our memory not dumpable until it execs: that is
    what keeps a process of that uid from ptrace-attaching to it (our memory) before then.
    With spawns in more than one thread, a spawn that gave the flag back at its own end (it
    began before the other child's uid change) would give it back while that child, stopped
    before its exec, still shares our memory: the flag comes back only once no spawn is in
    flight.  Here one thread spawns children of the user (stopped before their exec, often),
    this one slow spawns of its own (a long PATH), and between them the flag is read."""
    import ctypes

    from supervisor._spawn import shares_our_memory, spawn

    libc = ctypes.CDLL(None, use_errno=True)

    def dumpable() -> int:
        return int(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE

    def held() -> list[int]:
        return [p for p in leaf.procs() if _state(p) == "T" and shares_our_memory(p)]

    assert dumpable() == 1
    leaf = test_cgroup.make_child("held")
    path = slow_path  # (a few ms before each exec in which a stop lands, or a spawn goes by)
    stopping = subprocess.Popen(["setpriv", f"--reuid={test_user.uid}",
                                 f"--regid={test_user.gid}", "--clear-groups", "--", stopper,
                                 "30"])
    done: list[str] = []
    seen_held = bad = 0

    def users_spawns() -> None:
        while not done:
            s = spawn(["true"], env={"PATH": path}, cgroup_fd=leaf.fd, stdin=0, stdout=1,
                      stderr=2, uid=test_user.uid, gid=test_user.gid, groups=[])
            signal.pidfd_send_signal(s.pidfd, signal.SIGKILL)  # (stopped after its exec?)
            os.waitid(os.P_PIDFD, s.pidfd, os.WEXITED)
            os.close(s.pidfd)

    thread = threading.Thread(target=users_spawns, daemon=True)
    thread.start()
    try:
        for _ in range(60):
            s = spawn(["true"], env={"PATH": path}, stdin=0, stdout=1, stderr=2)
            os.waitid(os.P_PIDFD, s.pidfd, os.WEXITED)
            os.close(s.pidfd)
            stopped = held()
            if stopped:
                seen_held += 1
                bad += dumpable() == 1 and bool(held())  # (still held: no exec meanwhile)
                for pid in stopped:
                    os.kill(pid, signal.SIGKILL)  # (the guard's job in a supervisor)
    finally:
        done.append("enough")
        stopping.kill()
        stopping.wait()
        deadline = time.monotonic() + 30
        while thread.is_alive() and time.monotonic() < deadline:
            for pid in held():  # (one stopped since: it would wait for a SIGCONT)
                os.kill(pid, signal.SIGKILL)
            thread.join(0.05)
    assert seen_held, "no child of the user was ever stopped before its exec"
    assert bad == 0, f"{bad} of {seen_held} times our memory was dumpable while a child of " \
                     f"uid {test_user.uid} shared it"
    assert dumpable() == 1  # none in flight: given back
    leaf.kill()
    assert leaf.wait_unpopulated(10)
    leaf.remove()


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None
