"""A throw-away systemd, booted as PID 1 of new namespaces, for the systemd test tier.

``SystemdSandbox.boot()`` starts systemd (the distribution's, 252 on Debian 12) as PID 1 of new
pid/mount/cgroup/uts/net/ipc namespaces inside a uniquely named sub-cgroup of the host's cgroup2
mount, waits until ``systemctl is-system-running`` says running or degraded and starts the
sandbox's own D-Bus system bus. ``run()`` executes a command inside it (``nsenter`` into its
mount, pid and cgroup namespaces: root there reaches systemd at ``/run/systemd/private`` and the
system bus at ``/run/dbus/system_bus_socket``). ``stop()`` kills it, empties and removes its
cgroups and removes its state directory.

SAFETY. Apart from the few private mounts below, the sandbox sees and writes the host's real
filesystem (/etc, /var/lib, the repository). A careless boot is destructive: anything that
pulls in ``sysinit.target``'s wants (dbus.socket with default dependencies, a transient
*service* with default dependencies) runs systemd-tmpfiles-setup, which EMPTIES THE HOST'S
/tmp, plus sysctl, sysusers, utmp, journald on the host's /var/log.
So, in depth:

1. Every distribution unit that could run something (``*.service``, ``*.socket``, ``*.timer``,
   ``*.path``, ``*.mount``, ``*.automount``, ``*.swap``) is masked (a /dev/null symlink in the
   sandbox's unit directory, which comes first); ``/etc/systemd/system`` is not searched at all.
   Only targets and slices, which run nothing, stay, so a unit with default dependencies (the
   corral.service test) pulls in empty targets and masked units only. The sandbox's dbus units
   are its own, with ``DefaultDependencies=no``; prefer that for transient services too.
2. Generators (fstab, getty, sysv, postgresql, ...) are switched off: they run programs at boot.
3. Before systemd runs, the boot script mounts fresh tmpfs on /tmp, /var/tmp, /run and
   /var/log inside the private mount namespace (propagation private), checks that each one is
   now an empty tmpfs (i.e. not the host's directory), and refuses to start systemd otherwise.
   The unit directory is copied onto the private /run first, since the state dir lives under
   the host's /var/tmp.
4. ``/dev/console`` inside is a file in the state dir (whatever PID 1 writes to its console
   stays off the host's); ``/proc/sys`` is read-only inside (systemd as PID 1 tries to
   raise limits such as fs.nr_open, which are global) and the network namespace is private (net.*
   sysctls, loopback).
5. Teardown kills only what the sandbox's own cgroup holds (``cgroup.kill``), removes only the
   cgroups below the sandbox's uniquely named one, and only a state dir it created under
   /var/tmp whose name it checks. systemd is signalled through a pidfd taken when it was
   identified, so a recycled pid can never be hit.

Still the host's: /etc, /var/lib, /home. A unit with ``StateDirectory=`` started in here
creates its directory on the host's /var/lib (the unit-file test drops that line).

Nothing here reads ../shared; this is the project's own fixture.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SYSTEMD_BINARY = "/lib/systemd/systemd"
DIST_UNITS = Path("/lib/systemd/system")
DBUS_DAEMON = "/usr/bin/dbus-daemon"
STATE_PARENT = Path("/var/tmp")
STATE_PREFIX = "corral-systemd-sandbox-"
INSIDE_DIR = "/run/corral-sandbox"  # on the sandbox's private /run
RUNNABLE_SUFFIXES = (".service", ".socket", ".timer", ".path", ".mount", ".automount", ".swap")

# Runs as PID 1 of the new namespaces, then becomes systemd.  $1 = state dir.
BOOT_SCRIPT = r"""
set -eu
state=$1
mount --make-rprivate /
umount -R /sys/fs/cgroup 2>/dev/null || umount -l /sys/fs/cgroup
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount --bind "$state/console" /dev/console  # PID 1 logs to /dev/console: not the host's
fresh_tmpfs() {  # mount a tmpfs on $1 (mode $2) and prove it is not the host's directory
    mount -t tmpfs -o "mode=$2,nosuid,nodev" tmpfs "$1"
    [ "$(stat -f -c %T "$1")" = tmpfs ] || { echo "sandbox: $1 is not a tmpfs" >&2; exit 1; }
    [ -z "$(ls -A "$1")" ] || { echo "sandbox: $1 is not a fresh tmpfs" >&2; exit 1; }
}
fresh_tmpfs /run 0755
mkdir -p /run/systemd /run/dbus __INSIDE__/no-generators
cp -a "$state/units" __INSIDE__/units  # before /var/tmp (where $state is) is covered
fresh_tmpfs /tmp 1777
fresh_tmpfs /var/tmp 1777
fresh_tmpfs /var/log 0755
export container=corral-test
export SYSTEMD_UNIT_PATH=__INSIDE__/units:/lib/systemd/system
export SYSTEMD_GENERATOR_PATH=__INSIDE__/no-generators
export SYSTEMD_ENVIRONMENT_GENERATOR_PATH=__INSIDE__/no-generators
exec __SYSTEMD__ --system --unit=minimal.target --log-target=console
""".replace("__INSIDE__", INSIDE_DIR)

DBUS_SOCKET_UNIT = """\
[Unit]
Description=D-Bus system bus socket (corral sandbox)
DefaultDependencies=no

[Socket]
ListenStream=/run/dbus/system_bus_socket
"""

DBUS_SERVICE_UNIT = f"""\
[Unit]
Description=D-Bus system bus (corral sandbox)
DefaultDependencies=no
Requires=dbus.socket
After=dbus.socket

[Service]
ExecStart={DBUS_DAEMON} --system --address=systemd: --nofork --nopidfile --systemd-activation \\
    --syslog-only
"""


class SandboxUnavailable(Exception):
    """systemd cannot be booted here; the message says what is missing."""


def find_cgroup2_mount_point() -> str | None:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[0] == "cgroup2":
                return left.split()[4]
    return None


def missing_prerequisites() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create namespaces and cgroups"
    for path in (SYSTEMD_BINARY, DBUS_DAEMON, "/usr/bin/unshare", "/usr/bin/nsenter",
                 "/usr/bin/systemctl", "/usr/bin/busctl"):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (install systemd, dbus and util-linux)"
    if not DIST_UNITS.is_dir():
        return f"{DIST_UNITS} is missing"
    mount = find_cgroup2_mount_point()
    if mount is None:
        return "no cgroup2 mount in /proc/self/mountinfo"
    if not os.access(os.path.join(mount, "cgroup.procs"), os.W_OK):
        return f"the cgroup2 mount at {mount} is not writable"
    return None


def _write_units(units: Path) -> None:
    units.mkdir(parents=True)
    (units / "minimal.target").write_text("[Unit]\nDescription=corral sandbox boot target\n")
    for entry in DIST_UNITS.iterdir():
        if entry.name.endswith(RUNNABLE_SUFFIXES):
            (units / entry.name).symlink_to("/dev/null")
    # The wants directories may name units that live elsewhere: mask those by name as well.
    for wants in DIST_UNITS.glob("*.wants"):
        for entry in wants.iterdir():
            target = units / entry.name
            if entry.name.endswith(RUNNABLE_SUFFIXES) and not target.is_symlink():
                target.symlink_to("/dev/null")
    for name, text in (("dbus.socket", DBUS_SOCKET_UNIT), ("dbus.service", DBUS_SERVICE_UNIT)):
        (units / name).unlink()  # replace the mask, never write through it to /dev/null
        (units / name).write_text(text)


@dataclass
class SystemdSandbox:
    name: str
    state: Path
    cgroup: str  # host path of the sandbox's cgroup
    outer: subprocess.Popen[bytes]
    pid: int = 0  # systemd's pid, as the host sees it
    pidfd: int = -1
    log_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_file = self.state / "log"

    # -- boot ---------------------------------------------------------------------------------

    @classmethod
    def boot(cls, *, timeout: float = 20.0, with_dbus: bool = True) -> SystemdSandbox:
        reason = missing_prerequisites()
        if reason:
            raise SandboxUnavailable(reason)
        mount = find_cgroup2_mount_point()
        assert mount is not None
        name = f"corral-systemd-{secrets.token_hex(4)}"
        state = STATE_PARENT / f"{STATE_PREFIX}{name}"
        state.mkdir(mode=0o700)
        cgroup = os.path.join(mount, name)
        try:
            _write_units(state / "units")
            (state / "console").touch()
            (state / "boot").write_text(BOOT_SCRIPT.replace("__SYSTEMD__", SYSTEMD_BINARY))
            os.mkdir(cgroup)
            # The shell puts itself into the sandbox's cgroup, then becomes unshare: the new
            # cgroup namespace is rooted there and everything the sandbox starts is below it.
            with open(state / "log", "wb") as log:
                outer = subprocess.Popen(
                    ["/bin/sh", "-c",
                     'echo $$ > "$1/cgroup.procs" && exec unshare --pid --fork --mount --cgroup '
                     '--uts --net --ipc --mount-proc --propagation private /bin/sh "$2/boot" "$2"',
                     "sh", cgroup, str(state)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            if os.path.isdir(cgroup):
                os.rmdir(cgroup)
            shutil.rmtree(state)
            raise
        sandbox = cls(name=name, state=state, cgroup=cgroup, outer=outer)
        try:
            sandbox._wait_booted(timeout, with_dbus=with_dbus)
        except BaseException:
            sandbox.stop()
            raise
        return sandbox

    def _wait_booted(self, timeout: float, *, with_dbus: bool) -> None:
        deadline = time.monotonic() + timeout
        systemd_exe = os.stat(SYSTEMD_BINARY)
        while not self.pid:
            if self.outer.poll() is not None:
                raise SandboxUnavailable(
                    f"unshare/boot exited with status {self.outer.returncode} before systemd "
                    f"started: {self.log_tail()}"
                )
            self._check_deadline(deadline, "systemd to start")
            try:
                children = Path(f"/proc/{self.outer.pid}/task/{self.outer.pid}/children")
                child = int(children.read_text().split()[0])
                pidfd = os.pidfd_open(child)  # first the pidfd, then check whom it names
                exe = os.stat(f"/proc/{child}/exe")  # the file, whatever path a chroot shows
                if (exe.st_dev, exe.st_ino) == (systemd_exe.st_dev, systemd_exe.st_ino):
                    self.pid, self.pidfd = child, pidfd
                else:
                    os.close(pidfd)
            except (OSError, ValueError, IndexError):
                pass
            time.sleep(0.02)
        state = ""
        while state not in ("running", "degraded"):
            self._check_deadline(deadline, f"systemctl is-system-running (last: {state!r})")
            state = self.run(["systemctl", "is-system-running"], check=False).stdout.strip()
            if state not in ("running", "degraded"):
                time.sleep(0.05)
        if with_dbus:
            self.run(["systemctl", "start", "dbus.socket", "dbus.service"])
            while self.run(["busctl", "--system", "status", "org.freedesktop.systemd1"],
                           check=False).returncode != 0:
                self._check_deadline(deadline, "the sandbox's system bus")
                time.sleep(0.05)

    def _check_deadline(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise SandboxUnavailable(f"timed out waiting for {what}; log: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        """The end of the boot script's output and of systemd's console messages."""
        text = ""
        for path in (self.log_file, self.state / "console"):
            try:
                text += path.read_text(errors="replace")
            except OSError as e:
                text += f"(no {path.name}: {e})\n"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty)"

    # -- use ----------------------------------------------------------------------------------

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` wrapped to run inside: systemd's mount, pid and cgroup namespaces."""
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-C", "-r", "-w", "--", *args]

    def run(
        self, args: Sequence[str], *, check: bool = True, timeout: float = 30.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.command(args), capture_output=True, text=True, timeout=timeout, input=input,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode} in the sandbox:\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run(["systemctl", "show", "-p", ",".join(props), "--", unit]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def host_path(self, inside_cgroup: str) -> str:
        """Host path of a cgroup path as systemd sees it (``/system.slice/x.scope``)."""
        return os.path.join(self.cgroup, inside_cgroup.lstrip("/"))

    # -- teardown -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill systemd and everything below the sandbox's cgroup; remove cgroups and state."""
        if self.pidfd >= 0:
            try:  # PID 1 of its pid namespace: every process in it goes too
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(self.pidfd)
            self.pidfd = -1
        if os.path.isdir(self.cgroup):
            # Processes that joined the namespaces with nsenter were moved below it by systemd.
            with open(os.path.join(self.cgroup, "cgroup.kill"), "w") as f:
                f.write("1")
        try:
            self.outer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.outer.kill()
            self.outer.wait(timeout=5)
        problems: list[str] = []
        if os.path.isdir(self.cgroup):
            _wait_unpopulated(self.cgroup, 5.0)
            for dirpath, _dirs, _files in sorted(os.walk(self.cgroup), reverse=True):
                _rmdir_retry(dirpath, problems)
        if self.state.parent == STATE_PARENT and self.state.name.startswith(STATE_PREFIX):
            shutil.rmtree(self.state, ignore_errors=True)
        if problems:
            raise RuntimeError("sandbox teardown: " + "; ".join(problems))


def _wait_unpopulated(cgroup: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            if "populated 0" in f.read():
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def _rmdir_retry(path: str, problems: list[str]) -> None:
    deadline = time.monotonic() + 2.0
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > deadline:
                problems.append(f"rmdir {path}: {e}")
                return
            time.sleep(0.02)
