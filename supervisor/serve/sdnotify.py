"""systemd's side channels, spoken directly (no python-systemd): notify and socket activation.

Notify (sd_notify(3)): a datagram of ``KEY=VALUE`` lines to the AF_UNIX socket in
``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace).  ``READY=1`` once the
socket listens and the records are open; ``STATUS=...`` as the state changes; ``STOPPING=1``
at the drain; ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC`` when ``$WATCHDOG_PID`` is unset
or ours.  Without ``$NOTIFY_SOCKET`` every call is a no-op.

Socket activation (sd_listen_fds(3)): ``$LISTEN_PID`` is our pid and ``$LISTEN_FDS`` counts
the passed descriptors, from fd 3.  The variables are removed once read, so that no task
inherits them.
"""

from __future__ import annotations

import os
import socket

__all__ = ["Notifier", "listen_fds"]

LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify messages; does nothing outside systemd."""

    def __init__(self) -> None:
        address = os.environ.pop("NOTIFY_SOCKET", None)
        self._address: str | bytes | None = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_interval = self._watchdog()

    @staticmethod
    def _watchdog() -> float | None:
        usec = os.environ.pop("WATCHDOG_USEC", None)
        pid = os.environ.pop("WATCHDOG_PID", None)
        if not usec or not usec.isdigit() or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 2e6  # seconds: ping at half the timeout, as sd_watchdog_enabled(3)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, **fields: str) -> None:
        """``notify(READY="1", STATUS="...")``; best effort (systemd may be gone)."""
        if self._address is None:
            return
        message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(message, self._address)
        except OSError:
            pass  # PID 1 not listening (e.g. during its own shutdown): nothing to tell


def listen_fds() -> list[socket.socket]:
    """The listening sockets systemd passed us (empty when not socket-activated)."""
    pid = os.environ.pop("LISTEN_PID", None)
    count = os.environ.pop("LISTEN_FDS", None)
    os.environ.pop("LISTEN_FDNAMES", None)
    if pid != str(os.getpid()) or not count or not count.isdigit():
        return []
    out = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)):
        os.set_inheritable(fd, False)  # never into a task
        out.append(socket.socket(fileno=fd))
    return out
