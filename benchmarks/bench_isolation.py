"""Isolation benchmark: spawn cost with isolation on, against a C program doing the same.

Ours, per task: ``Isolation(user=nobody, private_network, private_tmp,
protect_control_groups).prepare()`` then ``supervisor._spawn.spawn(["/bin/true"])`` into a
leaf, wait on the pidfd.  The child makes a network namespace (lo up), a mount namespace
(slave), a tmpfs on /tmp and /var/tmp, remounts every cgroup mount read-only, changes
groups, gid and uid, and execs.

The floor: a C program, written and compiled here at run time (a measuring tool, not shipped),
whose vfork'd child makes exactly the same syscalls (same paths, same flags) before the same
exec, in the same leaf; the figure it prints is its own per-task time, without Python.  Also
in each round: ``os.posix_spawn`` + waitpid (no isolation), the same C program with a network
namespace only, and ours with PrivateNetwork only.  With pyroute2 installed, one more line:
the netlink way (a thread unshares, brings lo up with pyroute2's IPRoute and hands the
namespace's fd to the spawn), which is what the module docstring of supervisor/_isolation.py
chose against.  systemd-run with the same properties is timed only where systemd runs.

Each figure is given twice: wall time per task, and CPU time per task (user + system of the
spawning process and of its children, from getrusage): on a shared 2-core machine the wall
time moves by +-30% with other people's load, the CPU time far less, so read its ratio when the
load average is high.  (The kernel's asynchronous network-namespace teardown runs in kernel
threads and is in neither.)

Variants alternate in rounds, in an order rotated each round, with a pause between them: the
kernel tears network namespaces down asynchronously (a workqueue), so without it each variant
would pay for the previous one's namespaces.  Figures are medians over rounds; the ratio is the
median of the rounds' ratios (target: ours <= 1.15x the C floor).  Nothing is asserted about
time.

    python benchmarks/bench_isolation.py [--quick] [--tasks 200] [--rounds 7] [--settle 0.5]

The scratch cgroup ``corral-bench-isolation-<pid>-<hex>`` is emptied and removed on every exit;
each task's namespaces and mounts end with it (the host's mount table is checked unchanged).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from _common import host_note, paired_ratio, scratch_cgroup, sync_sigterm_as_interrupt

from cgroupfs import Cgroup
from supervisor._isolation import Isolation
from supervisor._spawn import spawn, unshare

TRUE = "/bin/true"
NOBODY = 65534

FLOOR_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static int net, mnt, user, n_tmp, n_ro;
static char *tmp[8], *ro[64];
static unsigned long ro_flags[64];

static void lo_up(void)
{
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0) _exit(102);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) _exit(103);
    close(s);
}

static void child(void)
{
    gid_t g = 65534;
    char *argv[] = { "/bin/true", NULL };
    if (net) {
        if (unshare(CLONE_NEWNET) < 0) _exit(101);
        lo_up();
    }
    if (mnt) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
            _exit(104);
        for (int i = 0; i < n_tmp; i++)
            if (mount("tmpfs", tmp[i], "tmpfs", MS_NOSUID | MS_NODEV, "mode=01777") < 0)
                _exit(105);
        for (int i = 0; i < n_ro; i++)
            if (mount(NULL, ro[i], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | ro_flags[i], NULL) < 0)
                _exit(106);
    }
    if (user && (setgroups(1, &g) < 0 || setresgid(g, g, g) < 0 || setresuid(g, g, g) < 0))
        _exit(107);
    execve(argv[0], argv, environ);
    _exit(127);
}

/* floor N CGROUP_PROCS [net] [mnt] [user] [tmp=PATH]... [ro=FLAGS:PATH]... -> us per task */
int main(int argc, char **argv)
{
    int n = atoi(argv[1]);
    int fd = open(argv[2], O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) { perror(argv[2]); return 1; }
    close(fd);
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "net")) net = 1;
        else if (!strcmp(argv[i], "mnt")) mnt = 1;
        else if (!strcmp(argv[i], "user")) user = 1;
        else if (!strncmp(argv[i], "tmp=", 4) && n_tmp < 8) tmp[n_tmp++] = argv[i] + 4;
        else if (!strncmp(argv[i], "ro=", 3) && n_ro < 64) {
            char *colon = strchr(argv[i], ':');
            ro_flags[n_ro] = strtoul(argv[i] + 3, NULL, 10);
            ro[n_ro++] = colon + 1;
        }
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        int st;
        pid_t pid = vfork();
        if (pid == 0) child();
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || st != 0) {
            fprintf(stderr, "task %d failed: status %d\n", i, st);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.3f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n);
    return 0;
}
"""


def build_floor(tmp: str) -> str:
    src, exe = os.path.join(tmp, "floor.c"), os.path.join(tmp, "floor")
    with open(src, "w") as f:
        f.write(FLOOR_C)
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", exe, src], check=True)
    return exe


def floor_args(iso: Isolation) -> list[str]:
    """The C program's arguments for what ``iso`` makes the child do (same paths, flags)."""
    with iso.prepare() as o:
        args = ["net"] if o.get("new_netns") else []
        if o.get("mount_namespace"):
            args += ["mnt", *(f"tmp={p}" for p in o["tmpfs"]),
                     *(f"ro={flags}:{path}" for path, flags in o["read_only"])]
        if o.get("uid") is not None:
            args.append("user")
    return args


class Measured(NamedTuple):
    wall: float  # seconds per task
    cpu: float  # CPU seconds per task, user + system, of the spawner and its children


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measured(fn: Callable[[], float], n: int) -> Measured:
    """Wall time as ``fn`` reports it per task, CPU time per task around it: the floor's
    process and its tasks are our children, ours are our own time and our children."""
    c0 = _cpu()
    wall = fn()
    return Measured(wall, (_cpu() - c0) / n)


def run_floor(exe: str, n: int, leaf: Cgroup, args: list[str]) -> float:
    out = subprocess.run([exe, str(n), os.path.join(leaf.path, "cgroup.procs"), *args],
                         capture_output=True, text=True, check=True)
    return float(out.stdout) / 1e6


def ours(n: int, leaf: Cgroup, iso: Isolation, devnull: int) -> float:
    env = dict(os.environ)
    t0 = time.perf_counter()
    for _ in range(n):
        with iso.prepare() as options:
            sp = spawn([TRUE], env=env, cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                       stderr=2, **options)
        try:
            res = os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
        finally:
            os.close(sp.pidfd)
        assert res is not None and res.si_status == 0, res
    return (time.perf_counter() - t0) / n


def posix_spawn(n: int, devnull: int) -> float:
    env = dict(os.environ)
    t0 = time.perf_counter()
    for _ in range(n):
        pid = os.posix_spawn(TRUE, [TRUE], env, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
        os.waitpid(pid, 0)
    return (time.perf_counter() - t0) / n


def pyroute2_netns(n: int, leaf: Cgroup, devnull: int) -> float:
    """The netlink way: per task a thread makes the namespace, brings lo up with pyroute2,
    and the spawn joins it by fd."""
    from pyroute2 import IPRoute

    def make(out: list[int]) -> None:
        unshare(0x40000000)
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        out.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))

    env = dict(os.environ)
    t0 = time.perf_counter()
    for _ in range(n):
        made: list[int] = []
        thread = threading.Thread(target=make, args=(made,))
        thread.start()
        thread.join()
        try:
            sp = spawn([TRUE], env=env, cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                       stderr=2, netns_fd=made[0])
        finally:
            os.close(made[0])
        os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
        os.close(sp.pidfd)
    return (time.perf_counter() - t0) / n


def systemd_run_note() -> str:
    if not os.path.exists("/run/systemd/system") or shutil.which("systemd-run") is None:
        return "systemd-run: not timed (systemd is not running here)"
    props = ["-p", "User=nobody", "-p", "PrivateNetwork=yes", "-p", "PrivateTmp=yes",
             "-p", "ProtectControlGroups=yes"]
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        subprocess.run(["systemd-run", "--wait", "--quiet", *props, TRUE], check=True)
        times.append(time.perf_counter() - t0)
    return f"systemd-run --wait with the same properties: {statistics.median(times) * 1e3:.1f} ms"


def report(times: dict[str, list[Measured]]) -> None:
    print(f"  {'':42s} {'wall':>7s}    {'CPU':>7s}")
    for name, ms in times.items():
        print(f"  {name:42s} {statistics.median(m.wall for m in ms) * 1e6:7.0f} us "
              f"{statistics.median(m.cpu for m in ms) * 1e6:7.0f} us /task")
    for label, a, b in (("ours / C floor, full", "ours, full", "C floor, full"),
                        ("ours / C floor, netns only", "ours, PrivateNetwork only",
                         "C floor, netns only"),
                        ("C floor full / posix_spawn", "C floor, full",
                         "posix_spawn (no isolation)")):
        wall = paired_ratio([m.wall for m in times[a]], [m.wall for m in times[b]])
        cpu = paired_ratio([m.cpu for m in times[a]], [m.cpu for m in times[b]])
        print(f"  ratio {label:28s} wall {wall:.2f}x, CPU {cpu:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 tasks x 2 rounds: a smoke test")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--settle", type=float, default=0.5,
                    help="seconds between variants, for the kernel's namespace cleanup")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.rounds = 30, 2

    sync_sigterm_as_interrupt()
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    full = Isolation(user=NOBODY, private_network=True, private_tmp=True,
                     protect_control_groups=True)
    net_only = Isolation(private_network=True)
    try:
        import pyroute2  # noqa: F401
        have_pyroute2 = True
    except ImportError:
        have_pyroute2 = False
    mounts_before = pathlib.Path("/proc/self/mountinfo").read_text()
    print(host_note())
    print("target: ours <= 1.15x the C floor doing the same; no assertion on time")
    with tempfile.TemporaryDirectory(prefix="corral-bench-isolation-") as tmp, \
            scratch_cgroup("isolation") as parent:
        exe = build_floor(tmp)
        leaf = parent.make_child("tasks")
        print(f"isolation benchmark: {args.tasks} tasks x {args.rounds} rounds, {TRUE}; "
              f"full = {' '.join(floor_args(full))}")
        variants: dict[str, Callable[[], float]] = {
            "posix_spawn (no isolation)": lambda: posix_spawn(args.tasks, devnull),
            "C floor, netns only": lambda: run_floor(exe, args.tasks, leaf, ["net"]),
            "ours, PrivateNetwork only": lambda: ours(args.tasks, leaf, net_only, devnull),
            "C floor, full": lambda: run_floor(exe, args.tasks, leaf, floor_args(full)),
            "ours, full": lambda: ours(args.tasks, leaf, full, devnull),
        }
        if have_pyroute2:
            variants["netns by thread + pyroute2, joined by fd"] = \
                lambda: pyroute2_netns(args.tasks, leaf, devnull)
        times: dict[str, list[Measured]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                time.sleep(args.settle)
                times[name].append(measured(variants[name], args.tasks))
        report(times)
        if not have_pyroute2:
            print("  (pyroute2 not installed: the netlink variant was not timed)")
        print(f"  {systemd_run_note()}")
    if pathlib.Path("/proc/self/mountinfo").read_text() != mounts_before:
        print("ERROR: the host's mount table changed", file=sys.stderr)
        return 1
    print(f"  at the end: {host_note()}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # (SIGTERM too) the scratch cgroup was cleaned on the way out
        print("\ninterrupted; the scratch cgroup was removed", file=sys.stderr)
        sys.exit(130)
