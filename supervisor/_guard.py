"""Nothing a task does may block the supervisor's event loop: the spawn guard.

A task with write access to corral's cgroups (root, cgroupfs writable: prevented by
``ProtectControlGroups=`` or ``User=``) can write 1 into the supervisor's root's
``cgroup.freeze``, or into a new leaf's.  A child born there by ``clone3(CLONE_INTO_CGROUP |
CLONE_VFORK)`` is frozen before it can exec, and the spawning thread, our event loop's, waits
for that exec in the kernel, with its signals blocked: every other task's time limit would wait
too.  So a thread watches each spawn: one that takes longer than ``STALL`` gets the root and the
leaf thawed (only a ``cgroup.freeze`` of ours that reads 1 is written), as often as needed, and
the task's record says so.  Cost per spawn: two attribute writes; the thread wakes ten times a
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
_PERIOD = 0.1


class SpawnGuard:
    """Thaws ``root`` and the leaf being spawned into when a spawn stalls.  ``start()`` it,
    ``close()`` it before ``root`` is closed.

    The thread never touches the event loop's ``Cgroup`` objects (their fds may be closed, and
    the numbers reused, under it): it opens the two directories by path when it acts, and
    nothing it meets may end it."""

    def __init__(self, root: Cgroup) -> None:
        self._root_path = root.path
        self._leaf_path: str | None = None
        self._since = 0.0
        self._thawed: list[str] = []
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

    def end(self) -> None:
        self._since, self._leaf_path = 0.0, None

    def take_thawed(self) -> list[str]:
        """Notes for the task just spawned: what had to be thawed (usually none)."""
        if not self._thawed:
            return []
        notes, self._thawed = self._thawed, []
        return notes

    def _watch(self) -> None:
        while not self._closing.wait(_PERIOD):
            since, leaf = self._since, self._leaf_path
            if since and leaf is not None and time.monotonic() - since > STALL:
                for path in (self._root_path, leaf):
                    try:
                        self._thaw(path)
                    except Exception:  # never die: the next stall needs this thread
                        log.exception("spawn guard: thawing %s", path)

    def _thaw(self, path: str) -> None:
        try:
            with Cgroup.open(path) as cg:
                if cg.read_file("cgroup.freeze").strip() != "1":
                    return
                cg.write_file("cgroup.freeze", "0")
        except CgroupError as e:  # removed meanwhile: nothing to thaw
            log.debug("spawn guard: %s", e)
            return
        note = (f"{path} was frozen (someone wrote 1 to its cgroup.freeze: a task with write "
                f"access to corral's cgroups?) while this task was being started; corral "
                f"thawed it")
        log.warning("%s", note)
        self._thawed.append(note)
