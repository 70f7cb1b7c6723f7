"""A task's main process, held by its pidfd: whether it has ended, and how.

Usually it is our child: ``waitid(P_PIDFD)`` tells whether it exited (``WNOWAIT``: without
reaping it, so that its zombie still shows where it died) and then reaps it.  A main process
adopted across a daemon's restart is not our child: its exit shows as the pidfd turning
readable, and its status comes from the kernel's ``PIDFD_GET_INFO`` with ``PIDFD_INFO_EXIT``
(Linux >= 6.15) once its new parent (PID 1, or the unit's) has reaped it; on older kernels the
status is unknown and the record says so.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import struct

import trio

from cgroupfs._record import record

__all__ = ["Exit", "MainProcess"]

# struct pidfd_info (linux/pidfd.h): u64 mask, u64 cgroupid, u32 pid, tgid, ppid, ruid, rgid,
# euid, egid, suid, sgid, fsuid, fsgid, s32 exit_code, u32 coredump_mask, u32 spare
_INFO = struct.Struct("=QQ11IiII")
_PIDFD_GET_INFO = (3 << 30) | (_INFO.size << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, ...)
_PIDFD_INFO_CGROUPID = 1 << 1
_PIDFD_INFO_EXIT = 1 << 3
_NO_INFO = (errno.ENOTTY, errno.EINVAL, errno.ESRCH, errno.EOPNOTSUPP)
_cgroup_ids = [True]  # PIDFD_INFO_CGROUPID answers here (False once it did not: Linux < 6.13)


@record
class Exit:
    """How the main process ended: ``code`` when it exited, ``signal`` when a signal ended
    it; both None when that could not be learnt (see the module docstring)."""

    code: int | None
    signal: int | None

    @classmethod
    def from_wait_status(cls, status: int) -> Exit:
        if os.WIFEXITED(status):
            return cls(os.WEXITSTATUS(status), None)
        return cls(None, os.WTERMSIG(status))


class MainProcess:
    """The main process of a running task.  ``adopted``: not our child (see the module)."""

    __slots__ = ("adopted", "pid", "pidfd")

    def __init__(self, pid: int, pidfd: int, *, adopted: bool = False) -> None:
        self.pid, self.pidfd, self.adopted = pid, pidfd, adopted

    def has_exited(self) -> bool:
        """Has it exited (reaped or not)?  Never reaps it.  (An adopted one may still be our
        child: a process that handed over and then exec'd its successor keeps its children.)"""
        try:
            found = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            if self.adopted:  # not ours: the pidfd turns readable when it exits
                return bool(select.select([self.pidfd], [], [], 0)[0])
            return True  # ours, and already reaped
        return found is not None

    def reap(self) -> Exit | None:
        """Once it has exited: reap it (our child) and say how it ended; for one that is not
        our child, None until its parent has reaped it (then :meth:`exit_info` tells)."""
        try:
            found = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            if self.adopted:
                return self.exit_info()
            raise
        if found is None:
            return None
        if found.si_code == os.CLD_EXITED:
            return Exit(found.si_status, None)
        return Exit(None, found.si_status)

    def cgroup_id(self) -> int | None:
        """The id (the directory's inode number) of the cgroup v2 the process is in, or, once
        it has exited unreaped, died in: one ioctl (PIDFD_INFO_CGROUPID, Linux >= 6.13);
        None where the kernel cannot say."""
        if not _cgroup_ids[0]:
            return None
        try:
            fields = self._info(_PIDFD_INFO_CGROUPID)
        except OSError as e:
            if e.errno not in _NO_INFO:
                raise
            if e.errno != errno.ESRCH:  # (ESRCH: reaped, this one; the others: no such ioctl)
                _cgroup_ids[0] = False
            return None
        return int(fields[1]) if fields[0] & _PIDFD_INFO_CGROUPID else None

    def _info(self, mask: int) -> tuple[int, ...]:
        """PIDFD_GET_INFO asking for ``mask``: struct pidfd_info's fields."""
        buf = bytearray(_INFO.size)
        _INFO.pack_into(buf, 0, mask, *([0] * 15))
        fcntl.ioctl(self.pidfd, _PIDFD_GET_INFO, buf, True)
        return _INFO.unpack_from(buf)

    def exit_info(self) -> Exit | None:
        """PIDFD_INFO_EXIT: how a process that is not our child ended, once reaped; None
        while it is not (or where the kernel cannot say)."""
        try:
            fields = self._info(_PIDFD_INFO_EXIT)
        except OSError as e:
            if e.errno in _NO_INFO:
                return None
            raise
        if not fields[0] & _PIDFD_INFO_EXIT:
            return None
        return Exit.from_wait_status(fields[13])

    async def wait_exit_info(self, timeout: float) -> Exit | None:
        """For an adopted process that has exited: its status, waiting up to ``timeout``
        for its new parent to reap it (shielded: the record waits for this)."""
        with trio.move_on_after(timeout, shield=True):
            while True:
                found = self.exit_info()
                if found is not None:
                    return found
                await trio.sleep(0.02)
        return None

    def signal(self, sig: int) -> bool:
        """Send ``sig`` through the pidfd; False if the process is gone."""
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            return False
        return True
