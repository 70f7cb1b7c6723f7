"""Nothing a task does may block the supervisor's event loop: the spawn guard.

A task with write access to corral's cgroups (root, cgroupfs writable: prevented by
``ProtectControlGroups=`` or ``User=``) can write 1 into the supervisor's root's
``cgroup.freeze``, or into a new leaf's.  A child born there by ``clone3(CLONE_INTO_CGROUP |
CLONE_VFORK)`` is frozen before it can exec, and the spawning thread, our event loop's, waits
for that exec in the kernel, with its signals blocked: every other task's time limit would wait
too.  So a thread watches each spawn: one that takes longer than ``STALL`` gets the leaf, the
root and the base (the cgroup given to corral, which a task may freeze as well) thawed (only a
``cgroup.freeze`` that reads 1 is written), as often as needed, and the task's record says so.
A freeze from further up (an ancestor of the base: not corral's to undo) would still hold the
child: after ``GIVE_UP`` the leaf is killed (a frozen process dies of SIGKILL), the spawn fails
and its record says why.  Cost per spawn: two attribute writes; the thread wakes ten times a
second and takes the GIL only to compare two numbers.
"""

from __future__ import annotations

import logging
import threading
import time

from cgroupfs import Cgroup, CgroupError

__all__ = ["SpawnGuard"]

log = logging.getLogger(__name__)

STALL = 0.1  # a spawn slower than this gets its cgroups checked for a freeze
GIVE_UP = 2.0  # a spawn still frozen this long after it began: its child is killed
_PERIOD = 0.1


class SpawnGuard:
    """Thaws ``root`` and the leaf being spawned into when a spawn stalls.  ``start()`` it,
    ``close()`` it before ``root`` is closed.

    The thread never touches the event loop's ``Cgroup`` objects (their fds may be closed, and
    the numbers reused, under it): it opens the two directories by path when it acts, and
    nothing it meets may end it."""

    def __init__(self, root: Cgroup, base: str | None = None) -> None:
        self._root_path = root.path
        self._base_path = base or None
        self._given_up = 0.0  # the ``since`` of the spawn abandoned last
        self._leaf_path: str | None = None
        self._since = 0.0
        self._thawed: list[str] = []
        self._lock = threading.Lock()  # _thawed, between this thread and the event loop's
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="corral-spawn-guard",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join()

    def begin(self, leaf: Cgroup) -> None:
        """A spawn into ``leaf`` starts (on the event loop's thread); :meth:`end` after it,
        in a ``finally`` (plain calls, not a context manager: this is on every spawn)."""
        self._leaf_path, self._since = leaf.path, time.monotonic()

    def end(self) -> bool:
        """The spawn returned; True if it was given up (its child killed, frozen from above:
        the spawn has failed)."""
        gave_up = self._given_up == self._since != 0.0
        self._since, self._leaf_path = 0.0, None
        return gave_up

    def take_thawed(self) -> list[str]:
        """Notes for the task just spawned: what had to be thawed (usually none)."""
        if not self._thawed:
            return []
        with self._lock:
            notes, self._thawed = self._thawed, []
        return notes

    def _watch(self) -> None:
        while not self._closing.wait(_PERIOD):
            since, leaf = self._since, self._leaf_path
            if not since or leaf is None:
                continue
            stalled = time.monotonic() - since
            if stalled <= STALL:
                continue
            for path in (self._base_path, self._root_path, leaf):
                try:
                    if path is not None:
                        self._thaw(path)
                except Exception:  # never die: the next stall needs this thread
                    log.exception("spawn guard: thawing %s", path)
            if stalled > GIVE_UP and self._given_up != since:
                try:
                    self._give_up(leaf, since)
                except Exception:
                    log.exception("spawn guard: giving up the spawn into %s", leaf)

    def _give_up(self, leaf: str, since: float) -> None:
        """The spawn's child is still frozen, by an ancestor we may not thaw: kill it."""
        above = self._base_path or self._root_path
        note = (f"{leaf} was frozen from above (an ancestor of {above} is, and that is not "
                f"corral's to thaw) while this task was being started; corral killed it "
                f"there after {GIVE_UP:g}s")
        try:
            with Cgroup.open(leaf) as cg:
                if not cg.read_events().frozen:
                    return  # slow, not frozen (a loaded machine): let it be
                self._note(note)  # first: the kill ends the spawn, whose end() takes the notes
                self._given_up = since
                cg.kill()
        except CgroupError as e:
            log.debug("spawn guard: %s", e)
            self._unnote(note)
            if self._given_up == since:
                self._given_up = 0.0  # not killed: the next turn tries again
            return
        log.warning("%s", note)

    def _thaw(self, path: str) -> None:
        note = (f"{path} was frozen (someone wrote 1 to its cgroup.freeze: a task with write "
                f"access to corral's cgroups?) while this task was being started; corral "
                f"thawed it")
        try:
            with Cgroup.open(path) as cg:
                if cg.read_file("cgroup.freeze").strip() != "1":
                    return
                self._note(note)  # first: the thaw ends the spawn, whose end() takes the notes
                cg.write_file("cgroup.freeze", "0")
        except CgroupError as e:  # removed meanwhile: nothing to thaw
            log.debug("spawn guard: %s", e)
            self._unnote(note)
            return
        log.warning("%s", note)

    def _note(self, note: str) -> None:
        with self._lock:
            self._thawed.append(note)

    def _unnote(self, note: str) -> None:
        with self._lock:
            if note in self._thawed:
                self._thawed.remove(note)
