"""``Cgroup``: one cgroup v2 directory, held open, and the verbs that act on it.

A ``Cgroup`` keeps an ``O_RDONLY|O_DIRECTORY`` fd on its directory. Every
interface file is opened relative to that fd, so a cgroup renamed or removed
under us gives ENOENT instead of silently acting on whatever now sits at the
old path, and the same fd is what ``clone3(CLONE_INTO_CGROUP)`` needs to start
a child straight inside the cgroup.

Typical use::

    with Cgroup.open(root_path) as root:
        leaf = root.make_child("job-1")
        leaf.set_limits(Limits(pids_max=64))
        leaf.add_proc(pid)
        ...
        leaf.kill()
        leaf.wait_unpopulated(5.0)
        leaf.remove()
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
import warnings
from collections.abc import Collection, Iterable
from types import TracebackType

from . import _controllers, _fileio
from ._errors import (
    CgroupBusy,
    CgroupError,
    CgroupNotFound,
    CgroupOSError,
    InvalidName,
    NoCgroup2Error,
    os_error,
)
from ._kill import kill_subtree
from ._limits import Limits
from ._record import record
from ._stats import CgroupEvents, CgroupStats, parse_events, read_stats

__all__ = ["Cgroup", "Destroyed"]

logger = logging.getLogger(__name__)

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Interface files are "<controller>.<name>"; a child called "memory.x" would
# read like one (and "cgroup.*" names clash with the core files).
_RESERVED_PREFIXES = frozenset(
    {"cgroup", "cpu", "cpuset", "io", "memory", "pids", "rdma", "hugetlb", "misc", "dmem"}
)


def _check_name(name: object, *, creating: bool, what: str = "cgroup name") -> str:
    fix = 'use a plain name such as "job-1"' if creating else "name one entry of the directory"
    if not isinstance(name, str) or not name:
        raise InvalidName(name, "a non-empty string", fix, what=what)
    if "/" in name or "\0" in name or name in (".", ".."):
        rule = 'a single path component (no "/", not "." or "..")'
        raise InvalidName(name, rule, fix, what=what)
    if creating:
        if "\n" in name:
            # /proc/PID/cgroup is line-based; a newline would corrupt it for readers.
            raise InvalidName(name, "free of newlines", fix)
        if len(os.fsencode(name)) > 255:
            raise InvalidName(name, "at most 255 bytes long", fix)
        prefix, dot, _ = name.partition(".")
        if dot and prefix in _RESERVED_PREFIXES:
            raise InvalidName(
                name,
                'free of interface-file prefixes ("cgroup.", "memory.", "cpu.", ...)',
                f'{fix}, or replace the "." (e.g. {prefix}-{name[len(prefix) + 1:]})',
            )
    return name


@record
class Destroyed:
    """What :meth:`Cgroup.destroy` did: whether it had to kill, and the first error (with its
    path) if something could not be emptied or removed (``None``: gone, every sub-cgroup too)."""

    killed: bool
    error: str | None = None


class Cgroup:
    """An open cgroup v2 directory. Close it (or use ``with``) when done."""

    __slots__ = ("_fd", "_path")

    def __init__(self, path: str, fd: int) -> None:
        """Adopt ``fd`` (a directory fd of ``path``); prefer ``Cgroup.open``."""
        self._path = path
        self._fd = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Cgroup:
        """Open the cgroup directory at ``path`` (made absolute)."""
        abspath = os.path.abspath(os.fspath(path))
        try:
            fd = os.open(abspath, _O_DIR)
        except OSError as exc:
            raise os_error(exc, action="opening cgroup directory", path=abspath) from exc
        if not _fileio.exists(fd, "cgroup.controllers"):
            os.close(fd)
            raise NoCgroup2Error(
                f"{abspath} is not a cgroup v2 directory (it has no cgroup.controllers); "
                "pass a directory on the cgroup2 mount (see find_cgroup2_mount())"
            )
        return cls(abspath, fd)

    # -- the handle ---------------------------------------------------------

    @property
    def path(self) -> str:
        """Absolute filesystem path of the cgroup directory."""
        return self._path

    @property
    def name(self) -> str:
        return os.path.basename(self._path)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def fd(self) -> int:
        """The directory fd (for ``clone3(CLONE_INTO_CGROUP)``); still owned by us."""
        if self._fd < 0:
            raise ValueError(f"operation on closed Cgroup {self._path}")
        return self._fd

    def fileno(self) -> int:
        return self.fd

    @property
    def events_path(self) -> str:
        """Absolute path of ``cgroup.events`` (watch it for IN_MODIFY)."""
        return os.path.join(self._path, "cgroup.events")

    def close(self) -> None:
        """Close the directory fd; the cgroup itself is untouched. Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"fd={self._fd}"
        return f"<Cgroup {self._path!r} {state}>"

    # -- file access ----------------------------------------------------------

    def read_file(self, name: str) -> str:
        """Read interface file ``name`` (e.g. ``"memory.oom.group"``) unbuffered."""
        _check_name(name, creating=False, what="interface file name")
        return self._read(name)

    def read_file_optional(self, name: str) -> str | None:
        """Like :meth:`read_file`, but ``None`` when the file does not exist here (ENOENT:
        a controller or feature this cgroup does not have)."""
        _check_name(name, creating=False, what="interface file name")
        return self._read_optional(name)

    def write_file(self, name: str, text: str) -> None:
        """Write ``text`` to interface file ``name`` in one ``write(2)``.

        The escape hatch for files without a verb here; kernel refusals come
        out as ``CgroupOSError`` with errno and the file's path.
        """
        _check_name(name, creating=False, what="interface file name")
        self._write(name, text)

    def _read(self, name: str) -> str:
        return _fileio.read_file(self.fd, self._path, name)

    def _read_optional(self, name: str) -> str | None:
        return _fileio.read_file_optional(self.fd, self._path, name)

    def _write(self, name: str, text: str, *, hint: str | None = None) -> None:
        _fileio.write_file(self.fd, self._path, name, text, hint=hint)

    # -- the tree -----------------------------------------------------------

    def make_child(self, name: str, *, exist_ok: bool = False) -> Cgroup:
        """Create sub-cgroup ``name`` and return it open.

        Raises ``InvalidName`` (a ``ValueError``) for a name that is not one
        plain path component, before touching the filesystem.
        """
        _check_name(name, creating=True)
        try:
            os.mkdir(name, 0o755, dir_fd=self.fd)
        except OSError as exc:
            if not (exist_ok and exc.errno == errno.EEXIST):
                path = os.path.join(self._path, name)
                raise os_error(exc, action="creating directory", path=path) from exc
        else:
            logger.debug("created cgroup %s/%s", self._path, name)
        return self.child(name)

    def child(self, name: str) -> Cgroup:
        """Open the existing sub-cgroup ``name``."""
        _check_name(name, creating=False)
        path = os.path.join(self._path, name)
        try:
            fd = os.open(name, _O_DIR, dir_fd=self.fd)
        except OSError as exc:
            raise os_error(exc, action="opening cgroup directory", path=path) from exc
        return Cgroup(path, fd)

    def children(self) -> list[str]:
        """Names of the direct sub-cgroups, sorted."""
        names = _fileio.list_children(self.fd)
        if names is None:
            raise CgroupNotFound(
                errno.ENOENT, os.strerror(errno.ENOENT), self._path, "listing"
            )
        return names

    def descendants(self) -> list[str]:
        """Relative paths (``"a"``, ``"a/b"``) of all sub-cgroups, parents first."""
        return _fileio.descendants(self.fd)

    def try_lock(self) -> bool:
        """Take an exclusive ``flock`` on the directory, without waiting; False if another
        open file description holds it.

        cgroup2 directories take flocks like any directory.  The lock belongs to this
        ``Cgroup``'s open file description (and any fd dup'd from it, e.g. one passed to a
        child), and goes when the last of those closes: a process that dies loses it.
        That makes it a proof of ownership that needs no pid and no clock.
        """
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise os_error(exc, action="locking", path=self._path) from exc
        return True

    def procs_tree(self) -> dict[str, list[int]]:
        """Pids in this cgroup and in every sub-cgroup, by relative path (``"."`` first, each
        parent before its children).  Sub-cgroups removed meanwhile are left out."""
        out: dict[str, list[int]] = {}
        for rel, fd in _fileio.walk(self.fd):
            text = _fileio.read_file_optional(fd, _fileio.join(self._path, rel), "cgroup.procs")
            if text is not None:
                out[rel] = [int(pid) for pid in text.split()]
        return out

    def thaw_tree(self) -> list[str]:
        """Write 0 to ``cgroup.freeze`` of this cgroup and of every sub-cgroup that was asked
        to freeze; returns the relative paths thawed.  (A cgroup frozen only because an
        ancestor is says ``frozen 1`` in cgroup.events but 0 in its own cgroup.freeze.)"""
        thawed = []
        for rel, fd in _fileio.walk(self.fd):
            path = _fileio.join(self._path, rel)
            if (_fileio.read_file_optional(fd, path, "cgroup.freeze") or "0").strip() == "1":
                try:
                    _fileio.write_file(fd, path, "cgroup.freeze", "0")
                except CgroupNotFound:
                    continue
                thawed.append(rel)
        return thawed

    def destroy(self, *, timeout: float = 5.0) -> Destroyed:
        """Kill everything in this subtree, wait until it is empty, remove every sub-cgroup
        depth-first and then this one, and close (also on error).  Never raises for what it
        finds: the
        result says whether it killed anything and the first error with its path.

        The one synchronous way to end a cgroup (a supervisor's root, a leaf after a bug, an
        orphan of a dead supervisor).  It blocks up to ``timeout`` s polling ``populated``:
        callers on an event loop run it in a thread, or wait for ``populated 0`` themselves
        (inotify) and then call it, when it returns at once.
        """
        killed = False
        error: str | None = None
        try:
            if self.is_populated():
                self.thaw_tree()  # a frozen subtree still dies of cgroup.kill; this is tidier
                self.kill()
                killed = True
                if not self.wait_unpopulated(timeout):
                    error = f"{self._path} still had processes {timeout:g}s after the kill"
            self.remove(recursive=True, busy_timeout=min(timeout, 1.0))
        except CgroupNotFound:
            pass  # gone already: nothing left to end
        except CgroupError as exc:
            error = error or str(exc)
        finally:
            self.close()
        return Destroyed(killed, error)

    def remove(
        self, *, recursive: bool = False, busy_timeout: float = 1.0, missing_ok: bool = True
    ) -> None:
        """rmdir this cgroup (and with ``recursive``, its sub-cgroups first), then close.

        The kernel refuses (EBUSY) while processes remain, and briefly even
        after ``populated 0``, so EBUSY is retried with a small backoff for up
        to ``busy_timeout`` s before ``CgroupBusy`` (naming the processes left)
        is raised; then the cgroup stays open, so the caller can kill and
        retry. Nothing is killed here. An already removed cgroup is fine
        unless ``missing_ok=False`` (then ``CgroupNotFound``).
        """
        if recursive:
            # the usual leaf has no sub-cgroups: one rmdir, and the walk only if it is refused
            try:
                _fileio.rmdir_retrying(self._path, 0, missing_ok=missing_ok)
            except CgroupBusy:
                # sub-cgroups, by fd (a task may nest them deeper than PATH_MAX); EBUSY
                # retried while their processes are on their way out
                _fileio.poll_until(self._try_remove_subtree, busy_timeout)
                _fileio.remove_subtree(self.fd, self._path)
            else:
                logger.debug("removed cgroup %s", self._path)
                self.close()
                return
        _fileio.rmdir_retrying(self._path, busy_timeout, missing_ok=missing_ok)
        logger.debug("removed cgroup %s", self._path)
        self.close()

    def _try_remove_subtree(self) -> bool:
        try:
            _fileio.remove_subtree(self.fd, self._path)
        except CgroupBusy:
            return False
        return True

    # -- processes ------------------------------------------------------------

    def procs(self) -> list[int]:
        """Pids (thread-group ids) of the processes directly in this cgroup."""
        return [int(pid) for pid in self._read("cgroup.procs").split()]

    def add_proc(self, pid: int) -> None:
        """Move process ``pid`` (``0``: the calling process) into this cgroup."""
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
            raise ValueError(f"pid must be an int >= 0 (0 means the caller), got {pid!r}")
        try:
            self._write("cgroup.procs", str(pid))
        except CgroupBusy as exc:
            raise exc.with_hint(
                "controllers are enabled in its cgroup.subtree_control, and then only its "
                "leaf children may hold processes (the no-internal-process rule): add the "
                "process to a child cgroup instead",
            ) from exc
        except CgroupOSError as exc:
            if exc.errno != errno.EOPNOTSUPP:
                raise
            # "domain invalid": an ancestor holds processes and has threaded
            # controllers (cpu, pids) enabled, which made it a thread root.
            kind = (self._read_optional("cgroup.type") or "?").strip()
            raise exc.with_hint(
                f"its cgroup.type is {kind!r}: an ancestor holds processes with threaded "
                "controllers (cpu, pids) enabled, making it a thread root; move those "
                "processes into a leaf before enabling controllers"
            ) from exc

    def move_procs_into(self, child_name: str, *, timeout: float = 1.0) -> Cgroup:
        """Move every process of this cgroup into child ``child_name`` (created if needed).

        Processes may fork while we move them, so this repeats until
        ``cgroup.procs`` reads empty, for up to ``timeout`` s. Used to obey the
        no-internal-process rule before ``enable_controllers``.
        """
        child = self.make_child(child_name, exist_ok=True)
        try:
            deadline = time.monotonic() + timeout
            while pids := self.procs():
                if time.monotonic() > deadline:
                    raise CgroupBusy(
                        errno.EBUSY,
                        os.strerror(errno.EBUSY),
                        os.path.join(self._path, "cgroup.procs"),
                        f"moving processes into {child.path} from",
                        f"processes {pids} were still there after {timeout} s",
                    )
                for pid in pids:
                    try:
                        child.add_proc(pid)
                    except CgroupOSError as exc:
                        if exc.errno != errno.ESRCH:  # ESRCH: exited meanwhile
                            raise
        except BaseException:
            child.close()
            raise
        return child

    def kill(self, *, force_fallback: bool = False) -> str:
        """SIGKILL every process here and in all sub-cgroups; return the method.

        ``"cgroup.kill"`` where the kernel has it, else ``"freeze+signal"``
        (freeze, SIGKILL each listed pid, always thaw), which ``force_fallback``
        selects on any kernel. Returns once the signals are sent; use
        ``wait_unpopulated`` for the processes to be gone.
        """
        method = kill_subtree(self.fd, self._path, force_fallback=force_fallback)
        logger.debug("killed the processes of %s by %s", self._path, method)
        return method

    def freeze(self) -> None:
        """Ask the kernel to freeze the subtree; see ``wait_frozen``."""
        self._write("cgroup.freeze", "1")

    def thaw(self) -> None:
        self._write("cgroup.freeze", "0")

    def read_events(self) -> CgroupEvents:
        return parse_events(self._read("cgroup.events"))

    def is_populated(self) -> bool:
        """Whether any process is in this cgroup or below."""
        return self.read_events().populated

    def wait_unpopulated(self, timeout: float) -> bool:
        """Poll until ``populated 0``; False if ``timeout`` s passed first."""
        return _fileio.poll_until(lambda: not self.read_events().populated, timeout)

    def wait_frozen(self, timeout: float) -> bool:
        """Poll until ``frozen 1``; False if ``timeout`` s passed first."""
        return _fileio.poll_until(lambda: self.read_events().frozen, timeout)

    # -- controllers and limits -------------------------------------------------

    def available_controllers(self) -> frozenset[str]:
        """``cgroup.controllers``: what the parent enabled for this cgroup."""
        return frozenset(self._read("cgroup.controllers").split())

    def enabled_controllers(self) -> frozenset[str]:
        """``cgroup.subtree_control``: what this cgroup enables for its children."""
        return frozenset(self._read("cgroup.subtree_control").split())

    def enable_controllers(self, names: Iterable[str]) -> None:
        """Enable controllers for this cgroup's children.

        Raises ``ControllerUnavailable`` (and writes nothing) if one is not in
        ``cgroup.controllers``, and ``CgroupBusy`` explaining the
        no-internal-process rule if this cgroup still holds processes.
        """
        _controllers.enable_controllers(self.fd, self._path, names)

    def set_limits(self, limits: Limits) -> None:
        """Write each set field of ``limits`` to this cgroup.

        Raises ``ControllerUnavailable`` before writing anything if a needed
        controller is not enabled for this cgroup by its parent.
        """
        _controllers.set_limits(self.fd, self._path, limits)

    def read_stats(self, controllers: Collection[str] | None = None, *,
                   only: Collection[str] | None = None) -> CgroupStats:
        """Usage figures; ``None`` for each file this cgroup does not have.  ``controllers``:
        the ones enabled for it, if the caller knows (saves trying the others' files);
        ``only``: read just these files (e.g. ``{"cpu.stat", "memory.peak"}``), the rest is
        ``None``."""
        return read_stats(self._read_optional, controllers, only)

