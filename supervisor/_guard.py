"""Nothing a task does may hold a spawn for long: the spawn guard.

A child made by ``clone3(CLONE_VM | CLONE_VFORK)`` shares our memory until it execs, and the
thread that spawned it waits for that exec in the kernel, with its signals blocked.  Two
things can hold the child before its exec:

- **a freeze**: a task with write access to corral's cgroups (root, cgroupfs writable:
  prevented by ``ProtectControlGroups=`` or ``User=``) can write 1 into the supervisor's
  root's ``cgroup.freeze``, or into a new leaf's, and a child born there never runs;
- **SIGSTOP**: a child that runs as another user (``User=``; every task of a non-root
  ``corral serve`` tenant) takes that uid a few syscalls before its exec, and from then on
  every process of that uid may stop it (kill(2) checks the uids, nothing else), as a
  ``kill(-1, SIGSTOP)`` loop does.

So a thread watches every spawn in flight.  One slower than ``STALL`` (10 ms) gets the leaf,
the root and the base (the cgroup given to corral, which a task may freeze as well) thawed (only a
``cgroup.freeze`` that reads 1 is written), as often as needed, and the task's record says so;
a child stopped by a signal is killed in its leaf at once (a stopped process dies of SIGKILL)
and the spawn fails with step ``stopped``.  A freeze from further up (an ancestor of the base:
not corral's to undo) would still hold the child: after ``GIVE_UP`` it is killed the same way
and the spawn fails with step ``frozen``; so is one not started after ``DEADLINE`` for any
other reason (a PATH search made slow on purpose, a hung filesystem), with step
``timeout``.  Either way the thread waiting for the child is released.  The spawns a stop
could hold run in a worker thread (``_life.py``), so the event
loop never waits for them; a freeze holds the event loop's thread for at most ``GIVE_UP``.

Cost per spawn: a dict entry and an event set; the thread sleeps while no spawn is in flight,
and looks every 10 ms while one is (most end well before).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from cgroupfs import Cgroup, CgroupError

from ._spawn import shares_our_memory

__all__ = ["GIVE_UP", "LOG_GAP", "STALL", "SpawnGuard", "Spawning"]

log = logging.getLogger(__name__)

STALL = 0.01  # a spawn slower than this gets its cgroups checked for a freeze or a stop
GIVE_UP = 2.0  # a spawn still frozen this long after it began: its child is killed
DEADLINE = 10.0  # a spawn not done this long after it began, for any reason: killed too
_PERIOD = 0.01  # while a spawn is in flight; otherwise the thread sleeps until one begins
# A tenant's own kill(-1, SIGSTOP) loop stops ~23 spawns a second: each task's record says so,
# and the log says it once per this many seconds (with how many more there were), not 23 lines
# a second into the admin's journal.
LOG_GAP = 60.0


class Spawning:
    """One spawn in flight: its leaf, when it began, what the guard did about it."""

    __slots__ = ("killed", "leaf", "notes", "since")

    def __init__(self, leaf: str, since: float) -> None:
        self.leaf = leaf
        self.since = since
        self.notes: list[str] = []  # what had to be thawed (usually nothing)
        self.killed: str | None = None  # "frozen" or "stopped": the guard killed its child


class SpawnGuard:
    """Thaws ``root`` and the leaves being spawned into when a spawn stalls, and kills a
    child held before its exec.  ``start()`` it, ``close()`` it before ``root`` is closed.

    The thread never touches the event loop's ``Cgroup`` objects (their fds may be closed, and
    the numbers reused, under it): it opens the directories by path when it acts, and
    nothing it meets may end it."""

    def __init__(self, root: Cgroup, base: str | None = None) -> None:
        self._root_path = root.path
        self._base_path = base or None
        self._spawning: dict[int, Spawning] = {}
        self._lock = threading.Lock()  # _spawning and each one's notes
        self._closing = threading.Event()
        self._begun = threading.Event()  # a spawn began: wake the thread
        self._said: dict[str, tuple[float, int]] = {}  # kind: (last logged, not logged since)
        self._thread = threading.Thread(target=self._watch, name="corral-spawn-guard",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self._begun.set()
        if self._thread.is_alive():
            self._thread.join()

    def begin(self, leaf: Cgroup) -> Spawning:
        """A spawn into ``leaf`` starts; :meth:`end` it in a ``finally`` (plain calls, not a
        context manager: this is on every spawn).  Any thread."""
        spawning = Spawning(leaf.path, time.monotonic())
        with self._lock:
            self._spawning[id(spawning)] = spawning
        self._begun.set()
        return spawning

    def end(self, spawning: Spawning) -> tuple[str | None, list[str]]:
        """The spawn returned: whether the guard killed its child (``"frozen"``,
        ``"stopped"``: the spawn has failed), and the notes for the task's record."""
        with self._lock:
            self._spawning.pop(id(spawning), None)
            return spawning.killed, list(spawning.notes)

    def _watch(self) -> None:
        while not self._closing.wait(_PERIOD):
            if not self._spawning:
                self._begun.wait()  # (set by begin(); close() sets it too)
                self._begun.clear()
                continue
            now = time.monotonic()
            with self._lock:
                stalled = [s for s in self._spawning.values()
                           if now - s.since > STALL and s.killed is None]
            for s in stalled:
                try:
                    self._look_after(s, now - s.since)
                except Exception:  # never die: the next stall needs this thread
                    log.exception("spawn guard: the spawn into %s", s.leaf)

    def _look_after(self, s: Spawning, stalled: float) -> None:
        if self._stopped_before_exec(s.leaf):
            self._kill(s, "stopped", f"its new process was stopped by a signal before it "
                       f"could run (SIGSTOP: any process of the user it runs as may send "
                       f"it); corral killed it in {s.leaf}")
            return
        for path in (self._base_path, self._root_path, s.leaf):
            if path is not None:
                self._thaw(s, path)
        if stalled > GIVE_UP:
            self._give_up(s)
        if stalled > DEADLINE and s.killed is None:
            self._kill(s, "timeout", f"its new process had not started within {DEADLINE:g}s "
                       f"(a search along a long PATH, a filesystem that does not answer?); "
                       f"corral killed it in {s.leaf}")

    def _stopped_before_exec(self, leaf: str) -> bool:
        """Whether the child in ``leaf`` is stopped and has not exec'd (it still shares our
        memory): it cannot exec until someone continues it.  One stopped after its exec is
        the task's own business, and its spawn is over."""
        try:
            with Cgroup.open(leaf) as cg:
                pids = cg.procs()
        except CgroupError:
            return False
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rpartition(b")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state in (b"T", b"t") and shares_our_memory(pid):
                return True
        return False

    def _give_up(self, s: Spawning) -> None:
        """The spawn's child is still frozen, by an ancestor we may not thaw: kill it."""
        above = self._base_path or self._root_path
        try:
            with Cgroup.open(s.leaf) as cg:
                if not cg.read_events().frozen:
                    return  # slow, not frozen (a loaded machine): let it be
        except CgroupError as e:
            log.debug("spawn guard: %s", e)
            return
        self._kill(s, "frozen", f"{s.leaf} was frozen from above (an ancestor of {above} is, "
                   f"and that is not corral's to thaw) while this task was being started; "
                   f"corral killed it there after {GIVE_UP:g}s")

    def _kill(self, s: Spawning, why: str, note: str) -> None:
        """Kill the held child in its leaf (which holds nothing else yet), if its spawn is
        still in flight: under the lock, so that :meth:`end` (which the kill lets come) sees
        ``why`` and the note."""
        with self._lock:
            if id(s) not in self._spawning:
                return  # the spawn is over (exec'd): nothing of ours to end
            try:
                with Cgroup.open(s.leaf) as cg:
                    cg.kill()
            except CgroupError as e:
                log.debug("spawn guard: %s", e)
                return  # not killed: the next turn tries again
            s.notes.append(note)
            s.killed = why
        self._warn(why, note)

    def _warn(self, kind: str, note: str) -> None:
        """Log ``note`` unless one of its ``kind`` was logged within :data:`LOG_GAP` (then it
        is counted, and the next one logged says how many were not); each is in its task's
        record either way.  (Only the guard's thread calls this.)"""
        now = time.monotonic()
        last, quiet = self._said.get(kind, (-LOG_GAP, 0))
        if now - last < LOG_GAP:
            self._said[kind] = (last, quiet + 1)
            return
        self._said[kind] = (now, 0)
        more = (f" ({quiet} more like it in the last {now - last:.0f}s, each in its task's "
                f"record)" if quiet else "")
        log.warning("%s%s", note, more)

    def _thaw(self, s: Spawning, path: str) -> None:
        """Thaw ``path`` if it is frozen and ``s`` is still in flight: under the lock, so that
        a freeze of corral's own after the spawn returned (a stop's snapshot of a task that
        had just started) is never taken for a task's, thawed, and logged as one.  (An
        independent attack saw it: a stop 33 us after the start, the guard a turn late.)"""
        note = (f"{path} was frozen (someone wrote 1 to its cgroup.freeze: a task with write "
                f"access to corral's cgroups?) while this task was being started; corral "
                f"thawed it")
        with self._lock:
            if id(s) not in self._spawning:
                return  # the spawn is over: a freeze now is not in its way
            try:
                with Cgroup.open(path) as cg:
                    if cg.read_file("cgroup.freeze").strip() != "1":
                        return
                    cg.write_file("cgroup.freeze", "0")
            except CgroupError as e:  # removed meanwhile: nothing to thaw
                log.debug("spawn guard: %s", e)
                return
            s.notes.append(note)  # (end(), which the thaw lets come, waits for the lock)
        self._warn("thawed", note)


def runs_as_another_user(options: dict[str, object]) -> bool:
    """Whether a spawn with these keywords makes a child that takes another uid before its
    exec (so that the processes of that uid may stop it: spawn it in a worker thread)."""
    uid = options.get("uid")
    return uid is not None and uid != os.geteuid()
