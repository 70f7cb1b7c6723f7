"""The systemd tier: one throw-away systemd per test session (see systemd_sandbox.py).

Skips (never fails) when systemd cannot be booted here: not root, systemd/dbus/util-linux
missing, unshare refused, or ``CORRAL_SKIP_SYSTEMD=1``. Around the session it checks that the
host's /tmp and /var/tmp kept a sentinel file and that the kernel settings systemd likes to
raise are unchanged: a failure there means the sandbox leaked, and says so.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from systemd_sandbox import SandboxUnavailable, SystemdSandbox

# What systemd as PID 1 writes at boot when it can (net.* are per network namespace, the rest
# global): all must be the same after the session.
WATCHED_SYSCTLS = ("fs/nr_open", "fs/file-max", "kernel/core_pattern", "net/unix/max_dgram_qlen")


def _sysctls() -> dict[str, str]:
    values = {}
    for name in WATCHED_SYSCTLS:
        with open(f"/proc/sys/{name}") as f:
            values[name] = f.read().strip()
    return values


@pytest.fixture(scope="session")
def systemd_sandbox() -> Iterator[SystemdSandbox]:
    if os.environ.get("CORRAL_SKIP_SYSTEMD") == "1":
        pytest.skip("CORRAL_SKIP_SYSTEMD=1")
    sentinels = []
    for directory in ("/tmp", "/var/tmp"):
        fd, path = tempfile.mkstemp(prefix="corral-sandbox-sentinel-", dir=directory)
        os.write(fd, b"the systemd sandbox must not remove this\n")
        os.close(fd)
        sentinels.append(path)
    before = _sysctls()
    try:
        try:
            sandbox = SystemdSandbox.boot()
        except SandboxUnavailable as e:
            pytest.skip(f"cannot boot systemd in namespaces here: {e}")
        try:
            yield sandbox
        finally:
            sandbox.stop()
        assert not os.path.exists(sandbox.cgroup), f"{sandbox.cgroup} was not removed"
        assert not sandbox.state.exists(), f"{sandbox.state} was not removed"
        gone = [p for p in sentinels if not os.path.exists(p)]
        assert not gone, f"the sandbox leaked onto the host: {gone} were deleted"
        assert _sysctls() == before, "the sandbox changed host sysctls"
    finally:
        for path in sentinels:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
