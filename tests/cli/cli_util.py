"""Helpers of the CLI tests (a uniquely named module: every test folder's conftest is a module
named ``conftest``)."""

from __future__ import annotations

import signal


def default_signals() -> None:
    """For ``preexec_fn``: every signal's default action and none blocked, whatever this
    pytest inherited (``nohup`` ignores SIGHUP, ``cmd &`` in a script SIGINT and SIGQUIT, and
    an ignored signal stays ignored across exec): a test then starts its command as a login
    shell's would, and knows what it relies on."""
    for signo in signal.valid_signals():
        if signo in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signo, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # (32 and 33: glibc's own, not ours to set)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
