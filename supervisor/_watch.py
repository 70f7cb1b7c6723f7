"""Wait for a cgroup's ``cgroup.events`` to change (a leaf emptying, a root being frozen).

Polling cgroup.events for readability returns at once, every time (the kernel reports it
readable always); the kernel does send IN_MODIFY on it when ``populated`` or ``frozen`` changes.
One inotify instance serves a whole supervisor (the default limit is 128 instances per user, far
fewer than the tasks a supervisor may hold).  A watch is added before the first read of the
file, so a change between the two is never missed, and removed when its last waiter is done: on
cgroupfs a watch pins the file's inode, so the kernel does not drop it when the cgroup is
removed, and ``max_user_watches`` (shared by every process of the user) would run out.

A task running as our user can use up ``max_user_watches`` itself (ENOSPC).  Then a waiter
polls the file instead (every 10 ms at first, backing off to ``POLL_MAX``): slower to notice,
never wrong, and the watcher says so once in the log.

The kernel sends at most one notification per cgroup.events file every 10 ms (more with a
coarse tick): a change that comes within that of the last one is reported when the interval
ends.  A freeze sends one (``frozen 1``), and each process a kill takes out of the freezer
another, so after a kill of a frozen leaf ``populated 0`` came ~4 ms late on average, whatever
the watch.  A caller that has just set such changes going says so (:meth:`expect_late`):
waiters on that cgroup then also read the file every millisecond or so (an eighth of the time
since, at least 1 ms) until polling would be no faster than the notification (``LATE_FOR``).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from collections.abc import Callable

import trio

from cgroupfs import Cgroup, CgroupEvents, CgroupNotFound

from ._spawn import inotify_add_watch, inotify_init, inotify_rm_watch

__all__ = ["CgroupWatcher"]

log = logging.getLogger(__name__)

POLL_MAX = 0.25  # seconds between polls at most, where no watch can be had
LATE_FOR = 0.08  # after expect_late(): polls every max(1 ms, 1/8 of the time since) until then
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
_IN_IGNORED = 0x8000
_IN_Q_OVERFLOW = 0x4000


class _Watch:
    """One inotify watch: how many wait on it, and the Event for its next change."""

    __slots__ = ("changed", "users")

    def __init__(self) -> None:
        self.users = 0
        self.changed: trio.Event | None = None


class CgroupWatcher:
    """Wakes waiters when a watched cgroup.events changes.  Run :meth:`run` in a nursery."""

    def __init__(self) -> None:
        self._fd = inotify_init()
        self._watches: dict[int, _Watch] = {}
        self._closed = False
        self._polling_said = False
        self._late: dict[str, float] = {}  # cgroup.events path -> when expect_late() was said
        self._scope = trio.CancelScope(shield=True)

    def expect_late(self, cg: Cgroup) -> None:
        """``cg``'s state has just been set changing fast (a kill of a frozen leaf): for the next
        ``LATE_FOR`` s, waiters on it read its cgroup.events now and then too, not only when
        the kernel's rate-limited notification comes."""
        now = trio.current_time()
        self._late = {path: t for path, t in self._late.items() if now - t < LATE_FOR}
        self._late[cg.events_path] = now

    async def wait_empty(self, cg: Cgroup) -> None:
        """Return once ``cg`` has ``populated 0`` (at once if it has already, or is gone)."""
        await self.wait_until(cg, lambda ev: not ev.populated)

    async def wait_until(self, cg: Cgroup, condition: Callable[[CgroupEvents], bool]) -> None:
        """Return once ``condition(cg.read_events())`` holds; a cgroup that is gone counts as
        empty and unfrozen (``populated 0``, ``frozen 0``)."""
        gone = CgroupEvents(False, False)
        try:
            await self.wait_file(cg.events_path, lambda: condition(_events(cg)))
        except FileNotFoundError:
            if not condition(gone):
                raise

    async def wait_file(self, path: str, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checking it again whenever ``path`` is modified
        (the kernel's IN_MODIFY: for cgroup.events a state change, for any other interface
        file a write to it).  FileNotFoundError if ``path`` does not exist."""
        try:
            wd = inotify_add_watch(self._fd, path)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise FileNotFoundError(e.errno, e.strerror, path) from None
            if e.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            await self._poll(path, condition)  # out of watches: look now and then
            return
        watch = self._watches.get(wd)
        if watch is None:
            watch = self._watches[wd] = _Watch()
        watch.users += 1
        try:
            while not condition():
                if self._closed:
                    raise RuntimeError("the cgroup watcher is closed; the supervisor is gone")
                if watch.changed is None:
                    watch.changed = trio.Event()
                await self._changed(path, watch.changed)
        finally:
            watch.users -= 1
            if watch.users == 0:
                self._release(wd)

    async def _changed(self, path: str, changed: trio.Event) -> None:
        """Until ``changed`` is set; or for a while, after :meth:`expect_late` on ``path``."""
        since = self._late.get(path)
        if since is not None:
            elapsed = trio.current_time() - since
            if elapsed < LATE_FOR:
                with trio.move_on_after(max(0.001, elapsed / 8)):
                    await changed.wait()
                return
            del self._late[path]
        await changed.wait()

    async def _poll(self, path: str, condition: Callable[[], bool]) -> None:
        if not self._polling_said:
            self._polling_said = True
            log.warning("no inotify watch to be had (max_user_watches used up, perhaps by a "
                        "task running as our user): polling %s and the like instead", path)
        delay = 0.01
        while not condition():
            if self._closed:
                raise RuntimeError("the cgroup watcher is closed; the supervisor is gone")
            await trio.sleep(delay)
            delay = min(delay * 2, POLL_MAX)

    def _release(self, wd: int) -> None:
        del self._watches[wd]
        if self._closed:
            return
        try:
            inotify_rm_watch(self._fd, wd)
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: the kernel dropped it already
                raise

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the main task, not here
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
                    for watch in self._watches.values():  # events were lost: re-read all
                        _wake(watch)
                    continue
                found = self._watches.get(wd)
                if found is not None:
                    _wake(found)  # waiters re-read the file (also after IN_IGNORED)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self._fd)
            close_in_background(self._fd)
            for watch in self._watches.values():
                _wake(watch)


def close_in_background(fd: int) -> None:
    """``os.close(fd)`` in a thread of its own.  The last close of an inotify instance that
    ever had a watch waits for the kernel's SRCU grace period (14 ms here: a third of
    ``corral run -- true`` after its imports), which neither an event loop nor a process about
    to exit should wait for; a process that exits first leaves it to the kernel, which makes
    nobody wait."""
    threading.Thread(target=os.close, args=(fd,), name="corral-inotify-close",
                     daemon=True).start()


def _wake(watch: _Watch) -> None:
    if watch.changed is not None:
        watch.changed.set()
        watch.changed = None


def _events(cg: Cgroup) -> CgroupEvents:
    try:
        return cg.read_events()
    except CgroupNotFound:
        return CgroupEvents(False, False)
