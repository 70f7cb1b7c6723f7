"""Ask systemd for a delegated scope holding the supervisor, over D-Bus (jeepney, trio).

On a systemd host the cgroup tree is systemd's; a process may only make cgroups in one that
systemd delegated.  A supervisor not already in such a unit asks for a transient scope with
``Delegate=yes`` around its own pid, and makes its own root (``corral-<pid>-<hex>``) below
it itself, with ``supervisor/`` for its own process where controllers must be enabled.  One
scope per supervisor, never one unit per task.

    info = await create_delegated_scope(os.getpid())
    info.unit    # "corral-4242-1a2b3c.scope"
    info.cgroup  # "/sys/fs/cgroup/system.slice/corral-4242-1a2b3c.scope"

Which bus (``"auto"``: the first that exists): as root, the manager's private socket
``/run/systemd/private`` (no bus daemon: no Hello, no AddMatch), then the system bus; other
users, their user manager's private socket, then the session bus, then the system bus.
``"private"``, ``"system"``, ``"user"`` or a private socket's path choose explicitly.

No stop call: a scope is active while its cgroup *subtree* holds a process.  When the last one
exits, the scope goes inactive, is unloaded (``CollectMode=inactive-or-failed``) and systemd
removes its cgroup together with the empty sub-cgroups we made.  A process left in a sub-cgroup
keeps the scope alive: the supervisor kills its tasks before it exits.

Cancellation: one ``fail_after(timeout)`` covers the exchange; the connection is always closed.
Cancelled once StartTransientUnit went out, the scope may exist and hold the pid; it then ends
with the process like any other.  Errors: ``SystemdError`` names the socket, the unit, the D-Bus
error and the fix; bad arguments are ``ValueError`` before any I/O.  Messages are built by pure
functions (``# -- messages``); ``_Client`` is the thin I/O adapter.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import trio
from jeepney import (
    DBusAddress,
    HeaderFields,
    Message,
    MessageType,
    new_method_call,
)
from jeepney.auth import (
    BEGIN,
    NEGOTIATE_UNIX_FD,
    make_auth_external,
)
from jeepney.bus import get_connectable_addresses
from jeepney.bus_messages import MatchRule, message_bus
from jeepney.io.trio import DBusConnection

import cgroupfs
from cgroupfs._record import record

__all__ = ["ScopeInfo", "SystemdError", "create_delegated_scope", "probe", "systemd_running"]

PRIVATE_SOCKET = "/run/systemd/private"
SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"
SYSTEMD = "org.freedesktop.systemd1"
MANAGER = DBusAddress("/org/freedesktop/systemd1", bus_name=SYSTEMD,
                      interface="org.freedesktop.systemd1.Manager")
# systemd < 255 answers an unknown property with PropertyReadOnly ("...or unknown property").
_NO_SUCH_PROPERTY = ("org.freedesktop.DBus.Error.UnknownProperty",
                     "org.freedesktop.DBus.Error.PropertyReadOnly")
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,249}\.scope")


class SystemdError(Exception):
    """systemd could not be reached, refused the scope, or failed to start it."""

    def __init__(self, message: str, *, socket: str | None = None, unit: str | None = None,
                 dbus_name: str | None = None) -> None:
        super().__init__(message)
        self.socket, self.unit, self.dbus_name = socket, unit, dbus_name


@record
class ScopeInfo:
    """The scope systemd made: its unit name, its cgroup directory, and how we asked."""

    unit: str
    cgroup: str  # filesystem path, e.g. /sys/fs/cgroup/system.slice/<unit>
    bus: str  # "private", "system", "user" or "session"
    socket: str  # the socket we talked to
    pids_property: Literal["PIDFDs", "PIDs"]  # PIDFDs needs systemd >= 255


@record
class Endpoint:
    """A socket to reach a systemd manager at, and how to talk to it there."""

    kind: str  # private | system | user | session
    path: str  # socket path ("\0..." for an abstract one)
    direct: bool  # a manager's private socket: no bus daemon, no Hello, no AddMatch


def systemd_running() -> bool:
    """Whether systemd is the init system here (sd_booted's test)."""
    return os.path.isdir("/run/systemd/system")


def resolve_bus(bus: str = "auto") -> Endpoint:
    """The socket ``bus`` means here; ``SystemdError`` when nothing usable exists."""
    if bus.startswith("/"):
        return Endpoint("private", bus, True)
    run = os.environ.get("XDG_RUNTIME_DIR")
    options = {
        "private": [Endpoint("private", PRIVATE_SOCKET, True)],
        "system": [Endpoint("system", _address("DBUS_SYSTEM_BUS_ADDRESS", SYSTEM_BUS_SOCKET),
                            False)],
        "user": [Endpoint("user", f"{run}/systemd/private", True),
                 Endpoint("session", _address("DBUS_SESSION_BUS_ADDRESS", f"{run}/bus"), False)]
        if run else [],
    }
    if bus == "auto":
        tried = options["private" if os.geteuid() == 0 else "user"] + options["system"]
    elif bus in options:
        tried = options[bus]
    else:
        raise ValueError(f'bus must be "auto", "private", "system", "user" or an absolute '
                         f"socket path, got {bus!r}")
    for endpoint in tried:
        if endpoint.path.startswith("\0") or os.path.exists(endpoint.path):
            return endpoint
    if bus != "auto" and tried:
        return tried[-1]  # asked for explicitly: connecting names the missing socket and the fix
    where = ", ".join(e.path for e in tried) or "nothing: XDG_RUNTIME_DIR is unset"
    raise SystemdError(
        f"no systemd reachable over D-Bus (bus {bus!r}; tried {where}); fix: run on a host booted "
        "with systemd, as root or in a session with a systemd user manager, or pass "
        "--cgroup-root PATH", socket=tried[0].path if tried else None)


def _address(variable: str, default: str) -> str:
    """The socket of a D-Bus address in ``variable`` (unparsable: the raw value), or default."""
    value = os.environ.get(variable)
    if not value:
        return default
    try:
        return str(next(get_connectable_addresses(value)))
    except (RuntimeError, ValueError):
        return value


# -- messages (pure) ----------------------------------------------------------------------------

def scope_properties(pid: int, *, description: str, pidfd: int | None) -> list[tuple[str, Any]]:
    """StartTransientUnit's ``a(sv)``: with ``pidfd`` the PIDFDs form, else PIDs."""
    props: list[tuple[str, Any]] = [
        ("Description", ("s", description)),
        ("Delegate", ("b", True)),
        ("CollectMode", ("s", "inactive-or-failed")),
    ]
    props.append(("PIDFDs", ("ah", [pidfd])) if pidfd is not None else ("PIDs", ("au", [pid])))
    return props


def start_transient_unit(unit: str, properties: list[tuple[str, Any]]) -> Message:
    return new_method_call(MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))",
                           (unit, "fail", properties, []))


def get_manager_property(name: str) -> Message:
    properties = DBusAddress(MANAGER.object_path, SYSTEMD, "org.freedesktop.DBus.Properties")
    return new_method_call(properties, "Get", "ss", (MANAGER.interface, name))


def job_removed_rule() -> MatchRule:
    return MatchRule(type="signal", sender=SYSTEMD, interface=MANAGER.interface,
                     member="JobRemoved", path=MANAGER.object_path)


def parse_job_removed(msg: Message) -> tuple[str, str] | None:
    """``(job path, result)`` of a JobRemoved signal (``uoss``: id, job, unit, result)."""
    fields = msg.header.fields
    if (msg.header.message_type is MessageType.signal
            and fields.get(HeaderFields.member) == "JobRemoved"
            and fields.get(HeaderFields.interface) == MANAGER.interface):
        return str(msg.body[1]), str(msg.body[3])
    return None


def parse_error(msg: Message) -> tuple[str, str] | None:
    if msg.header.message_type is not MessageType.error:
        return None
    text = msg.body[0] if msg.body and isinstance(msg.body[0], str) else ""
    return str(msg.header.fields.get(HeaderFields.error_name)), text


_CONNECT_FIX = {
    "private": "run as root on a host booted with systemd (/run/systemd/system exists)",
    "system": "start the system bus (systemctl start dbus), or use bus='private' as root",
    "user": "log in through a session with a systemd user manager (loginctl enable-linger USER)",
}


def _fix_for(dbus_name: str, unit: str) -> str:
    if dbus_name.endswith(("AccessDenied", "InteractiveAuthorizationRequired")):
        return "run as root, or as a user with a systemd user manager (bus='user')"
    if dbus_name.endswith("UnitExists"):
        return "choose another unit name, or leave name unset for a unique one"
    return f"see 'journalctl -u {unit}' and 'systemctl status {unit}'"


# -- I/O ----------------------------------------------------------------------------------------

class _Client:
    """One D-Bus connection, used sequentially: a call, then waiting for its job."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.conn: Any = None
        self.step = "connecting"
        self._removed: dict[str, str] = {}  # JobRemoved seen while waiting for replies

    def error(self, what: str, **kw: Any) -> SystemdError:
        return SystemdError(f"systemd at {self.endpoint.path} ({self.endpoint.kind} bus): {what}",
                            socket=self.endpoint.path, **kw)

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[_Client]:
        """Connect, authenticate; on a bus also Hello and the JobRemoved match.  Closes at exit."""
        kind, path = self.endpoint.kind, self.endpoint.path
        fix = _CONNECT_FIX.get(kind, _CONNECT_FIX["user"])
        try:
            sock = await trio.open_unix_socket(path)
        except OSError as e:
            raise SystemdError(f"cannot connect to systemd at {path} ({kind} bus): "
                               f"{e.strerror or e}; fix: {fix}, or pass --cgroup-root PATH",
                               socket=path) from e
        async with DBusConnection(sock.socket, enable_fds=True) as self.conn:
            self.step = "authenticating (SASL EXTERNAL)"
            try:
                leftover = await _authenticate(sock)
            except trio.BrokenResourceError as e:
                raise self.error(f"connection lost while {self.step} ({e})") from e
            if isinstance(leftover, str):
                raise self.error(f"authentication failed: {leftover}; fix: {fix}")
            self.conn.parser.add_data(leftover)
            if not self.endpoint.direct:
                # A manager's private socket sends every signal to every peer, unasked; a bus
                # daemon wants a Hello first and delivers signals only to matching peers.
                self.step = "saying Hello to the bus"
                await self.checked(message_bus.Hello(), "Hello")
                self.step = "adding the JobRemoved match"
                await self.checked(message_bus.AddMatch(job_removed_rule()), "AddMatch")
            yield self

    async def _receive(self) -> Message:
        try:
            msg = await self.conn.receive()
        except (trio.EndOfChannel, trio.BrokenResourceError) as e:
            raise self.error(f"connection lost while {self.step} ({e or 'end of stream'})") from e
        if (removed := parse_job_removed(msg)) is not None:
            self._removed[removed[0]] = removed[1]
        return msg

    async def call(self, msg: Message) -> Message:
        serial = next(self.conn.outgoing_serial)
        try:
            await self.conn.send(msg, serial=serial)
        except trio.BrokenResourceError as e:
            raise self.error(f"connection lost while {self.step} ({e})") from e
        while True:
            reply = await self._receive()
            if reply.header.fields.get(HeaderFields.reply_serial) == serial:
                return reply

    async def checked(self, msg: Message, what: str, unit: str | None = None) -> Message:
        """``call``, turning an error reply into ``SystemdError``."""
        reply = await self.call(msg)
        if (err := parse_error(reply)) is not None:
            name, text = err
            raise self.error(f"{what} failed: {name}: {text}; fix: {_fix_for(name, unit or '')}",
                             unit=unit, dbus_name=name)
        return reply

    async def wait_job(self, job: str) -> str:
        while job not in self._removed:
            await self._receive()
        return self._removed.pop(job)


async def _authenticate(sock: trio.SocketStream) -> bytes | str:
    """SASL EXTERNAL with fd passing, pipelined as sd-bus does; what followed, or the refusal.

    AUTH, NEGOTIATE_UNIX_FD and BEGIN go out in one write, before any reply.  Sent step by step
    (jeepney's ``Authenticator``), BEGIN can reach sd-bus in one read with the first message;
    if that message carries an fd (PIDFDs), sd-bus sees an fd "during authentication" and
    drops the connection.
    """
    await sock.send_all(b"\0" + make_auth_external() + NEGOTIATE_UNIX_FD + BEGIN)
    received = b""
    while received.count(b"\r\n") < 2:
        if len(received) > 4096 or not (data := await sock.receive_some(4096)):
            return f"the server answered {received!r} and stopped"
        received += data
    ok, agree, rest = received.split(b"\r\n", 2)
    if not ok.startswith(b"OK "):
        return f"AUTH EXTERNAL (uid {os.geteuid()}) was answered {ok.decode(errors='replace')!r}"
    if agree != b"AGREE_UNIX_FD":
        return f"fd passing was refused: {agree.decode(errors='replace')!r}"
    return rest


async def create_delegated_scope(
    pid: int, *, name: str | None = None, description: str = "corral supervisor",
    bus: str = "auto", timeout: float = 10.0,
) -> ScopeInfo:
    """Move ``pid`` into a new transient scope with ``Delegate=yes``; return where it now is.

    Waits for the scope's start job to finish (``JobRemoved`` with result ``done``).  The match
    for that signal is in place before StartTransientUnit goes out, and signals that arrive
    before its reply are kept, so the job's end cannot be missed.
    """
    unit = name if name is not None else f"corral-{pid}-{secrets.token_hex(3)}.scope"
    if not _UNIT_NAME.fullmatch(unit):
        raise ValueError(f"scope name must be up to 255 characters of [A-Za-z0-9:_.\\@-] "
                         f"ending in '.scope', like 'corral-1.scope', got {unit!r}")
    endpoint = resolve_bus(bus)
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        raise ValueError(f"pid {pid} names no running process; pass a live pid") from None
    except OSError:  # no pidfd_open (kernel < 5.3): systemd gets the plain pid
        pidfd = None
    client = _Client(endpoint)
    try:
        with trio.fail_after(timeout):
            async with client.connect():
                job, used = await _start_scope(client, unit, pid, description, pidfd)
                client.step = f"waiting for job {job} (starting {unit})"
                result = await client.wait_job(job)
    except trio.TooSlowError:
        raise SystemdError(
            f"no answer from systemd at {endpoint.path} ({endpoint.kind} bus) within {timeout}s "
            f"while {client.step}; fix: check that systemd is responsive ('systemctl "
            "is-system-running') or raise the timeout", socket=endpoint.path, unit=unit) from None
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if result != "done":
        raise SystemdError(
            f"systemd at {endpoint.path} could not start {unit}: job result '{result}'; fix: see "
            f"'journalctl -u {unit}'", socket=endpoint.path, unit=unit)
    try:
        cgroup = cgroupfs.own_cgroup(pid)
    except (cgroupfs.NoCgroup2Error, ProcessLookupError) as e:
        raise SystemdError(f"{unit} started, but the cgroup of process {pid} cannot be found: {e}",
                           socket=endpoint.path, unit=unit) from e
    if os.path.basename(cgroup) != unit:
        raise SystemdError(
            f"{unit} started, but process {pid} is in {cgroup}, not in the scope: did it move "
            "itself meanwhile?", socket=endpoint.path, unit=unit)
    return ScopeInfo(unit, cgroup, endpoint.kind, endpoint.path, used)


async def _start_scope(
    client: _Client, unit: str, pid: int, description: str, pidfd: int | None,
) -> tuple[str, Literal["PIDFDs", "PIDs"]]:
    """StartTransientUnit with PIDFDs (systemd >= 255), again with PIDs if it is unknown."""
    client.step = f"asking for {unit} (StartTransientUnit)"
    what = f"StartTransientUnit({unit})"
    if pidfd is not None:
        props = scope_properties(pid, description=description, pidfd=pidfd)
        reply = await client.call(start_transient_unit(unit, props))
        if (err := parse_error(reply)) is None:
            return str(reply.body[0]), "PIDFDs"
        if err[0] not in _NO_SUCH_PROPERTY:
            raise client.error(f"{what} failed: {err[0]}: {err[1]}; fix: {_fix_for(err[0], unit)}",
                               unit=unit, dbus_name=err[0])
    props = scope_properties(pid, description=description, pidfd=None)
    reply = await client.checked(start_transient_unit(unit, props), what, unit)
    return str(reply.body[0]), "PIDs"


async def probe(bus: str = "auto", *, timeout: float = 2.0) -> str | None:
    """systemd's version (Manager.Version, e.g. ``"252.38-1~deb12u1"``), or None if unreachable."""
    try:
        client = _Client(resolve_bus(bus))
        with trio.fail_after(timeout):
            async with client.connect():
                client.step = "reading Manager.Version"
                reply = await client.checked(get_manager_property("Version"), "Get Version")
    except (SystemdError, trio.TooSlowError):
        return None
    return str(reply.body[0][1])
