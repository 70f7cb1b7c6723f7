"""``corral check``: what corral finds on this machine and what it means.

It does not guess from version numbers: it prepares a root exactly as ``corral run`` would,
spawns ``/bin/true`` into a leaf there (which tells whether clone3 placed it, or the fallback),
looks for cgroup.kill in that leaf, then removes everything it made.  Exit 0 when ``corral run``
would work.

The ``-p`` properties it lists are every one of the core's table (``SUPPORTED``) that ``corral
run`` would take here: a limit when its controller is enabled for tasks, an isolation
property (``User=``, ``PrivateNetwork=``, ...) when the core's own checks of the host accept
a value that needs what the property needs (:data:`ISOLATION_PROBES`: another uid needs
CAP_SETUID, a namespace needs the kernel to allow it), everything else always.  The refused
ones are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

import trio

from cgroupfs import (
    CgroupError,
    NoCgroup2Error,
    find_cgroup2_mount,
    hierarchy_mode,
    own_cgroup,
    parse_mountinfo,
)

from .. import Isolation, PlacementError
from ..lowlevel import SpawnError, spawn
from ..placement import place_async
from ..syntax import SUPPORTED
from . import missing_cgroup_root

__all__ = ["add_parser", "collect", "main", "run_check"]

# which -p properties each controller makes work
PROPERTIES_BY_CONTROLLER = {
    "memory": ("MemoryMax", "MemoryHigh", "MemorySwapMax"),
    "pids": ("TasksMax",),
    "cpu": ("CPUQuota", "CPUWeight"),
    "io": ("IOWeight",),
}
CONTROLLER_OF = {name: c for c, names in PROPERTIES_BY_CONTROLLER.items() for name in names}

# an isolation property -> settings that need what it needs here (a Limit*= lowered to 0
# needs nothing: those are always taken)
_OTHER_ID = "65534" if os.geteuid() != 65534 else "65533"  # (numeric: no database entry needed)
ISOLATION_PROBES: dict[str, tuple[tuple[str, str], ...]] = {
    "User": (("User", _OTHER_ID), ("Group", _OTHER_ID)),
    "Group": (("Group", _OTHER_ID),),
    "SupplementaryGroups": (("SupplementaryGroups", _OTHER_ID),),
    "NoNewPrivileges": (("NoNewPrivileges", "yes"),),
    "UMask": (("UMask", "0077"),),
    "PrivateNetwork": (("PrivateNetwork", "yes"),),
    "PrivateTmp": (("PrivateTmp", "yes"),),
    "ProtectControlGroups": (("ProtectControlGroups", "yes"),),
    "CapabilityBoundingSet": (("CapabilityBoundingSet", "~CAP_SYS_ADMIN"),),
    "AmbientCapabilities": (("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),),
}


def usable_properties(controllers: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ``-p`` properties ``corral run`` takes here, in the core's order, and the refused
    ones with the reason (``controllers``: those enabled for tasks)."""
    usable: list[str] = []
    refused: dict[str, str] = {}
    for name in SUPPORTED:
        controller = CONTROLLER_OF.get(name)
        reason = None
        if controller is not None and controller not in controllers:
            reason = f"no {controller} controller here"
        elif name in ISOLATION_PROBES:
            try:
                Isolation.from_properties(ISOLATION_PROBES[name])
            except ValueError as e:
                reason = str(e)
        if reason is None:
            usable.append(name)
        else:
            refused[name] = reason
    return usable, refused


def _short(names: list[str]) -> str:
    """``a, b, Limit{CPU,NOFILE}``: the Limit*= names folded into one."""
    limits = [n.removeprefix("Limit") for n in names if n.startswith("Limit")]
    rest = [n for n in names if not n.startswith("Limit")]
    return ", ".join(rest + ([f"Limit{{{','.join(limits)}}}"] if limits else []))


def _probe_spawn(tasks_path: str) -> dict[str, Any]:
    from cgroupfs import Cgroup

    out: dict[str, Any] = {}
    with Cgroup.open(tasks_path) as tasks:
        leaf = tasks.make_child(f"check-{os.getpid()}")
        try:
            out["cgroup_kill"] = os.path.exists(os.path.join(leaf.path, "cgroup.kill"))
            devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                sp = spawn(["/bin/true"], cgroup_fd=leaf.fd, stdin=devnull, stdout=devnull,
                           stderr=devnull)
                os.waitid(os.P_PIDFD, sp.pidfd, os.WEXITED)
                os.close(sp.pidfd)
                out["spawn_method"] = sp.method
                out["clone_into_cgroup"] = sp.fallback_errno == 0
                if sp.fallback_errno:
                    out["clone3_refused_with"] = os.strerror(sp.fallback_errno)
            except SpawnError as e:
                out["spawn_error"] = str(e)
            finally:
                os.close(devnull)
        finally:
            leaf.remove()
    return out


def collect(cgroup_root: str | None = None) -> dict[str, Any]:
    """Everything ``corral check`` reports, as a dict; ``ok`` says whether run would work."""
    report: dict[str, Any] = {"kernel": platform.release(), "problems": []}
    problems: list[str] = report["problems"]
    try:
        os.close(os.pidfd_open(os.getpid()))
        report["pidfd"] = True
    except OSError as e:
        report["pidfd"] = False
        problems.append(f"pidfd_open is not available ({e.strerror}): Linux >= 5.3 is needed")
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = parse_mountinfo(f.read())
        report["cgroup_mode"] = hierarchy_mode(mounts)
        mount = find_cgroup2_mount()
        report["cgroup2_mount"] = mount.mount_point
        report["cgroup2_read_only"] = mount.read_only
        report["own_cgroup"] = own_cgroup()
    except NoCgroup2Error as e:
        problems.append(str(e))
    report["systemd"] = _systemd_report()
    missing = missing_cgroup_root(cgroup_root)
    if missing is not None:
        problems.append(missing)
    if not problems:
        try:
            placement = trio.run(place_async, cgroup_root)
        except (PlacementError, CgroupError) as e:
            problems.append(str(e))
        else:
            try:
                report["root"] = placement.base
                report["probe_root"] = placement.root.path
                report["root_kind"] = placement.how
                report["controllers"] = sorted(placement.controllers)
                report["notes"] = placement.notes
                report.update(_probe_spawn(placement.root.path))
                if "spawn_error" in report:
                    problems.append(f"spawning into a leaf failed: {report['spawn_error']}")
            finally:
                placement.close()
            report["properties"], report["properties_refused"] = usable_properties(
                report["controllers"])
    report["ok"] = not problems
    return report


def _systemd_report() -> dict[str, Any]:
    running = os.path.isdir("/run/systemd/system")  # what sd_booted() checks
    report: dict[str, Any] = {"running": running}
    if running:
        from ..placement.systemd import probe

        version = trio.run(probe)
        report["reachable"] = version is not None
        if version is not None:
            report["version"] = version
    return report


def run_check(*, json_output: bool, cgroup_root: str | None) -> int:
    report = collect(cgroup_root)
    if json_output:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0 if report["ok"] else 1
    yes = {True: "yes", False: "no"}
    lines = [f"kernel:             {report['kernel']}",
             f"pidfd:              {yes[report['pidfd']]}"]
    if "cgroup_mode" in report:
        lines.append(f"cgroup mode:        {report['cgroup_mode']}")
    if "cgroup2_mount" in report:
        ro = " (read-only)" if report["cgroup2_read_only"] else ""
        lines.append(f"cgroup2 mount:      {report['cgroup2_mount']}{ro}")
        lines.append(f"our cgroup:         {report['own_cgroup']}")
    if "root" in report:
        lines.append(f"roots go in:        {report['root']} ({report['root_kind']}; each "
                     f"corral makes its own corral-<pid>-<hex> there, locked while it runs, "
                     f"removed when it ends)")
        if "probe_root" in report:
            lines.append(f"probe root:         {report['probe_root']} (made for this check, "
                         f"removed)")
        lines.append(f"CLONE_INTO_CGROUP:  {yes[report.get('clone_into_cgroup', False)]}"
                     + (f" (fallback: {report['spawn_method']}, clone3 refused: "
                        f"{report['clone3_refused_with']})"
                        if report.get("clone3_refused_with") else ""))
        lines.append(f"cgroup.kill:        {yes[report.get('cgroup_kill', False)]}"
                     + ("" if report.get("cgroup_kill") else " (freeze + SIGKILL + thaw instead)"))
        lines.append(f"controllers:        {' '.join(report['controllers']) or 'none'}")
        lines.append(f"-p properties:      {_short(report['properties'])}")
        by_reason: dict[str, list[str]] = {}
        for name, reason in report["properties_refused"].items():
            by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            lines.append(f"-p not here:        {_short(names)}: {reason}")
        for note in report.get("notes", []):
            lines.append(f"note:               {note}")
    sd = report["systemd"]
    lines.append(f"systemd:            {'running' if sd['running'] else 'not running'}"
                 + (f", version {sd['version']}" if sd.get("version") else ""))
    for p in report["problems"]:
        lines.append(f"problem:            {p}")
    lines.append("corral run works here" if report["ok"] else "corral run cannot work here")
    print("\n".join(lines))
    return 0 if report["ok"] else 1


def add_parser(sub: Any) -> None:
    check = sub.add_parser("check", help="what corral found on this machine, and what works")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.add_argument("--cgroup-root", metavar="PATH", help="check this root instead")


def main(args: argparse.Namespace) -> int:
    return run_check(json_output=args.json, cgroup_root=args.cgroup_root)
