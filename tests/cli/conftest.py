"""The CLI tests of the daemon's clients use the daemon tests' ``start_daemon`` (a real
``corral serve`` on a fresh socket, under the test's cgroup; tests/daemon/daemon_util.py)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "daemon"))

from daemon_util import start_daemon

__all__ = ["start_daemon"]
