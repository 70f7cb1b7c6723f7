"""Stands in for ``corral serve`` under systemd/corral.service in the sandbox (stdlib only).

Does what the daemon will do with its delegated cgroup: moves itself into ``supervisor/``,
starts tasks in ``tasks/t1`` and ``tasks/t2``, says READY=1 over $NOTIFY_SOCKET. On SIGTERM
it writes to STATUS whether its tasks were still alive when the stop began (KillMode=process:
they must be, the stop is the daemon's to carry out; systemd would otherwise kill them the
moment a restarting daemon exits), stops both, and exits 0, leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

STATUS = sys.argv[1]


def _read(path: str) -> list[str]:
    with open(path) as f:
        return f.read().split()


def main() -> None:
    with open("/proc/self/cgroup") as f:
        own = next(line[3:].strip() for line in f if line.startswith("0::"))
    root = "/sys/fs/cgroup" + own
    for sub in ("supervisor", "tasks", "tasks/t1", "tasks/t2"):
        os.mkdir(os.path.join(root, sub))
    with open(os.path.join(root, "supervisor", "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    procs = {}
    for leaf in ("t1", "t2"):
        path = os.path.join(root, "tasks", leaf)
        procs[leaf] = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {path}/cgroup.procs && exec sleep 300"],
            stdin=subprocess.DEVNULL, start_new_session=True)
    for leaf, proc in procs.items():
        while str(proc.pid) not in _read(os.path.join(root, "tasks", leaf, "cgroup.procs")):
            time.sleep(0.01)

    def on_term(signo: int, frame: object) -> None:
        alive = all(task.poll() is None for task in procs.values())
        for task in procs.values():
            task.terminate()
            task.wait()
        with open(STATUS, "w") as f:
            json.dump({"tasks_alive_at_sigterm": alive, "root": root}, f)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    address = os.environ["NOTIFY_SOCKET"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"READY=1", "\0" + address[1:] if address.startswith("@") else address)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
