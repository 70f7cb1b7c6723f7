"""Is systemd restarting us?  One question to PID 1 over D-Bus, asked on SIGTERM.

``systemctl restart corral`` and ``systemctl stop corral`` both send SIGTERM; only a restart
should hand the running tasks over (``fdstore.py``).  systemd queues a job for the unit first
and the job's type says which: while the unit stops for a restart, its ``Job`` property names a
job of type ``restart`` (or ``try-restart``, ``reload-or-restart``...).  So::

    unit = Manager.GetUnitByPID(our pid)             -> object path
    (id, job) = unit.Job                             -> (0, "/") when no job is queued
    job.JobType                                      -> "restart", "stop", ...

Spoken synchronously (a blocking socket, run in a worker thread by the caller): as root over
the manager's private socket ``/run/systemd/private`` (no bus daemon: no Hello), else the
system bus.  Messages are jeepney's; authentication is the three-line SASL EXTERNAL exchange.
Any failure answers "not a restart" (the safe side: the daemon then drains as for a stop),
with the reason for the log.
"""

from __future__ import annotations

import os
import socket
from typing import Any, NamedTuple

from jeepney import DBusAddress, HeaderFields, Message, MessageType, Parser, new_method_call
from jeepney.auth import BEGIN, make_auth_external
from jeepney.bus_messages import message_bus

__all__ = ["RESTART_JOBS", "Restart", "restart_queued", "unit_job"]

PRIVATE_SOCKET = "/run/systemd/private"
SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"
SYSTEMD = "org.freedesktop.systemd1"
MANAGER = DBusAddress("/org/freedesktop/systemd1", bus_name=SYSTEMD,
                      interface="org.freedesktop.systemd1.Manager")
RESTART_JOBS = ("restart", "try-restart", "reload-or-restart")
TIMEOUT = 2.0


class _Bus:
    """One blocking D-Bus connection, used sequentially."""

    def __init__(self, path: str, direct: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(TIMEOUT)
        self.parser = Parser()
        self.serial = 0
        try:
            self.sock.connect(path)
            self._authenticate()
            if not direct:
                self.call(message_bus.Hello())
        except BaseException:
            self.sock.close()
            raise

    def _authenticate(self) -> None:
        self.sock.sendall(b"\0" + make_auth_external() + BEGIN)
        answer = b""
        while b"\r\n" not in answer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise OSError("the D-Bus peer closed the connection while authenticating")
            answer += chunk
        line, _, rest = answer.partition(b"\r\n")
        if not line.startswith(b"OK "):
            raise OSError(f"D-Bus authentication refused: {line!r}")
        self.parser.add_data(rest)

    def call(self, msg: Message) -> Any:
        """Send ``msg``; its reply's body.  OSError for an error reply."""
        self.serial += 1
        self.sock.sendall(msg.serialise(serial=self.serial))
        while True:
            reply = self.parser.get_next_message()
            if reply is None:
                data = self.sock.recv(65536)
                if not data:
                    raise OSError("systemd closed the D-Bus connection")
                self.parser.add_data(data)
                continue
            if reply.header.fields.get(HeaderFields.reply_serial) != self.serial:
                continue  # a signal (the private socket sends them unasked)
            if reply.header.message_type is MessageType.error:
                name = reply.header.fields.get(HeaderFields.error_name)
                raise OSError(f"{name}: {reply.body[0] if reply.body else ''}")
            return reply.body

    def close(self) -> None:
        self.sock.close()


def _get(bus: _Bus, path: str, interface: str, name: str) -> Any:
    props = DBusAddress(path, bus_name=SYSTEMD, interface="org.freedesktop.DBus.Properties")
    body = bus.call(new_method_call(props, "Get", "ss", (interface, name)))
    return body[0][1]  # a variant: (signature, value)


def _connect() -> _Bus:
    if os.geteuid() == 0 and os.path.exists(PRIVATE_SOCKET):
        return _Bus(PRIVATE_SOCKET, direct=True)
    return _Bus(SYSTEM_BUS_SOCKET, direct=False)


class Restart(NamedTuple):
    """What systemd said: a restart is queued (``queued``), why we think so (``why``, for the
    log), and the unit's ``FileDescriptorStoreMax=`` (None: unknown)."""

    queued: bool
    why: str
    store_max: int | None = None


def unit_job(pid: int | None = None) -> tuple[str, str | None, int | None]:
    """(our unit's name, the type of the job queued for it or None, its
    FileDescriptorStoreMax=).  Blocking; OSError (incl. socket.timeout) when systemd cannot be
    asked."""
    bus = _connect()
    try:
        unit_path = bus.call(new_method_call(MANAGER, "GetUnitByPID", "u",
                                             (pid or os.getpid(),)))[0]
        unit = str(_get(bus, unit_path, "org.freedesktop.systemd1.Unit", "Id"))
        try:
            store = int(_get(bus, unit_path, "org.freedesktop.systemd1.Service",
                             "FileDescriptorStoreMax"))
        except OSError:
            store = None  # not a service (a scope, when run by hand under systemd-run)
        job_id, job_path = _get(bus, unit_path, "org.freedesktop.systemd1.Unit", "Job")
        if not job_id:
            return unit, None, store
        kind = str(_get(bus, job_path, "org.freedesktop.systemd1.Job", "JobType"))
        return unit, kind, store
    finally:
        bus.close()


def restart_queued() -> Restart:
    """Whether systemd is restarting our unit now.  Never raises: anything unexpected is
    "no" (the daemon then stops as asked).  Ask only when systemd started us
    ($NOTIFY_SOCKET was set).  Blocking (up to 2 s per step): call it in a worker thread."""
    try:
        unit, kind, store = unit_job()
    except (OSError, ValueError, IndexError, TypeError) as e:
        return Restart(False, f"could not ask systemd whether a restart is queued: {e}")
    if kind in RESTART_JOBS:
        return Restart(True, f"systemd queued a {kind} job for {unit}", store)
    return Restart(False, f"the job queued for {unit} is {kind or 'none'}, not a restart",
                   store)
