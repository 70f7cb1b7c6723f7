"""systemd's side channels, spoken directly (no python-systemd): notify, fd store, activation.

Notify (sd_notify(3)): a datagram of ``KEY=VALUE`` lines to the AF_UNIX socket in
``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace).  ``READY=1`` once the
socket listens and the records are open; ``STATUS=...`` as the state changes; ``STOPPING=1``
at the drain; ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC`` when ``$WATCHDOG_PID`` is unset
or ours.  Without ``$NOTIFY_SOCKET`` every call is a no-op.

The fd store (systemd.io's FILE_DESCRIPTOR_STORE): ``FDSTORE=1`` with ``FDNAME=name`` and the
fd as SCM_RIGHTS keeps a duplicate in PID 1 (up to the unit's ``FileDescriptorStoreMax=``),
passed back at the next start; ``FDPOLL=0`` stops PID 1 from dropping it on POLLHUP (a pipe
whose writers are gone: its unread bytes would go with it); ``FDSTOREREMOVE=1`` with
``FDNAME=`` drops it again.  ``BARRIER=1`` with an fd (sd_notify_barrier(3)): PID 1 closes
that fd once it has processed every message before it.

Socket activation and the fd store's return (sd_listen_fds_with_names(3)): ``$LISTEN_PID``
is our pid, ``$LISTEN_FDS`` counts the descriptors from fd 3, ``$LISTEN_FDNAMES`` names them
(colon-separated; a socket unit's default name is the unit's).  The variables are removed once
read, so that no task inherits them.
"""

from __future__ import annotations

import array
import os
import select
import socket

__all__ = ["LISTEN_FDS_START", "Notifier", "listen_fds"]

LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify messages; does nothing outside systemd."""

    def __init__(self) -> None:
        address = os.environ.pop("NOTIFY_SOCKET", None)
        self._address: str | None = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_interval = self._watchdog()

    @staticmethod
    def _watchdog() -> float | None:
        usec = os.environ.pop("WATCHDOG_USEC", None)
        pid = os.environ.pop("WATCHDOG_PID", None)
        if not usec or not (usec.isascii() and usec.isdigit()) or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 2e6  # seconds: ping at half the timeout, as sd_watchdog_enabled(3)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, **fields: str) -> None:
        """``notify(READY="1", STATUS="...")``; best effort (systemd may be gone)."""
        try:
            self.send(fields)
        except OSError:
            pass  # PID 1 not listening (e.g. during its own shutdown): nothing to tell

    def send(self, fields: dict[str, str], fds: tuple[int, ...] = ()) -> None:
        """One message with ``fds`` attached; OSError if it could not be sent (nothing is
        sent without ``$NOTIFY_SOCKET``)."""
        if self._address is None:
            return
        message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] \
            if fds else []
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendmsg([message], ancillary, 0, self._address)

    def store(self, name: str, fd: int) -> None:
        """Keep a duplicate of ``fd`` in the unit's fd store under ``name`` (OSError)."""
        self.send({"FDSTORE": "1", "FDNAME": name, "FDPOLL": "0"}, (fd,))

    def remove(self, name: str) -> None:
        """Drop every fd named ``name`` from the fd store (best effort)."""
        self.notify(FDSTOREREMOVE="1", FDNAME=name)

    def barrier(self, timeout: float = 5.0) -> bool:
        """Wait until PID 1 has processed every message sent before; False on timeout (an
        old systemd without BARRIER=1 support never closes the fd: then we waited for
        nothing)."""
        if self._address is None:
            return True
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self.send({"BARRIER": "1"}, (w,))
            except OSError:
                return False
            os.close(w)
            w = -1
            poller = select.poll()
            poller.register(r, select.POLLHUP)
            return bool(poller.poll(timeout * 1000))
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)


def listen_fds() -> list[tuple[str, int]]:
    """The descriptors systemd passed us, with their names (empty when none were passed);
    each is made close-on-exec, so that no task inherits one."""
    pid = os.environ.pop("LISTEN_PID", None)
    count = os.environ.pop("LISTEN_FDS", None)
    names = os.environ.pop("LISTEN_FDNAMES", "")
    os.environ.pop("LISTEN_PIDFDID", None)
    if pid != str(os.getpid()) or not count or not (count.isascii() and count.isdigit()):
        return []
    fds = range(LISTEN_FDS_START, LISTEN_FDS_START + int(count))
    labels = names.split(":") if names else []
    out = []
    for i, fd in enumerate(fds):
        os.set_inheritable(fd, False)
        out.append((labels[i] if i < len(labels) else "unknown", fd))
    return out
