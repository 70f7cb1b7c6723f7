"""The daemon tests' fixtures live in daemon_util.py (importable by that unique name)."""

from daemon_util import start_daemon, users

__all__ = ["start_daemon", "users"]
