"""Process groups at a job-control shell (TaskSpec.process_group, None = auto: shared only when
an inherited terminal has our group in front *when the task starts*).  A careless user types
what they would type without corral."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import termios
import time

from rt_util import CORRAL


class Shell:
    """An interactive bash (job control on) as the session leader of a new pseudo-terminal."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()

        def controlling_tty() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, preexec_fn=controlling_tty,
            env={"PATH": os.environ["PATH"], "PS1": "$ ", "TERM": "dumb"})
        os.close(slave)
        self.screen = b""
        self.pump(0.5)

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([self.master], [], [], 0.05)[0]:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:
                    return

    def type(self, keys: bytes, wait: float) -> None:
        os.write(self.master, keys)
        self.pump(wait)

    def close(self) -> None:
        """SIGKILL (by pid) the shell and whatever it still runs (corral included)."""
        pids = [self.proc.pid]
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                pids += [int(c) for c in f.read().split()]
        except OSError:
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        os.close(self.master)


def test_a_command_started_in_the_background_reads_the_terminal_after_fg(scratch: str) -> None:
    sh = Shell()
    try:
        sh.type(f"{CORRAL} run --cgroup-root {scratch} -q -- cat &\n".encode(), 1.5)
        sh.type(b"fg\n", 1.0)
        sh.type(b"typed-at-the-keyboard\n", 1.5)
        echoed = sh.screen.count(b"typed-at-the-keyboard")
        sh.type(b"\x04", 1.0)  # cat's end of input
        sh.type(b"\x03", 0.3)
        sh.type(b"\x03", 0.3)
        sh.type(b"\x03", 1.5)
    finally:
        sh.close()
    assert echoed >= 2, (f"after `fg`, cat never read what was typed (the terminal's echo "
                         f"only): {sh.screen.decode(errors='replace')[-400:]!r}")
