"""Wait for a leaf to empty, through inotify on its cgroup.events.

Polling cgroup.events for readability returns at once, every time (the kernel reports it readable
always); the kernel does send IN_MODIFY on it when ``populated`` or ``frozen`` changes.  One
inotify instance serves a whole supervisor (the default limit is 128 instances per user, far
fewer than the tasks a supervisor may hold); a watch per leaf is cheap.  The watch is added
before the first read of the file, so a change between the two is never missed.
"""

from __future__ import annotations

import errno
import os
import struct

import trio

from cgroupfs import Cgroup

from ._spawn import inotify_add_watch, inotify_init

__all__ = ["CgroupWatcher"]

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
_IN_IGNORED = 0x8000
_IN_Q_OVERFLOW = 0x4000


class CgroupWatcher:
    """Wakes waiters when a watched cgroup.events changes.  Run :meth:`run` in a nursery."""

    def __init__(self) -> None:
        self._fd = inotify_init()
        self._changed: dict[int, trio.Event] = {}
        self._closed = False
        self._scope = trio.CancelScope(shield=True)

    async def wait_empty(self, cg: Cgroup) -> None:
        """Return once ``cg`` has ``populated 0`` (at once if it has already)."""
        try:
            wd = inotify_add_watch(self._fd, cg.events_path)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return  # the cgroup is gone: nothing can be in it
            raise
        while cg.read_events().populated:
            if self._closed:
                raise RuntimeError("the cgroup watcher is closed; the supervisor is gone")
            event = self._changed.get(wd)
            if event is None:
                event = self._changed[wd] = trio.Event()
            await event.wait()

    async def run(self) -> None:
        """Dispatch inotify events until :meth:`stop`; then release the fd.

        Shielded: a cancellation around the supervisor must not take the watcher away from
        tasks still cleaning up (shielded) below it; the supervisor stops it last.
        """
        try:
            with self._scope:
                while True:
                    await trio.lowlevel.wait_readable(self._fd)
                    self._dispatch()
        finally:
            self.close()

    def stop(self) -> None:
        self._scope.cancel()

    def _dispatch(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    # events were lost: wake every waiter to re-read its file
                    for waiting in self._changed.values():
                        waiting.set()
                    self._changed.clear()
                    continue
                event = self._changed.pop(wd, None)
                if event is not None:
                    event.set()  # waiters re-read the file; a fresh Event is made on demand
                if mask & _IN_IGNORED:
                    self._changed.pop(wd, None)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self._fd)
            os.close(self._fd)
            for event in self._changed.values():
                event.set()
            self._changed.clear()
