"""Unbuffered reads and writes of cgroup interface files, with errors translated.

Every cgroup file access in this package goes through here, relative to a
cgroup's directory fd. Interface files are kernfs files: one ``write(2)`` is
one command, and the kernel's verdict (EBUSY, EINVAL, ESRCH...) is the return
value of that very call. Python's buffered ``open(path, "w").write()`` defers
the write to ``flush``/``close`` and can lose that verdict, so only
``os.open``/``os.read``/``os.write`` are used.

The few directory helpers (listing sub-cgroups, a bounded poll) live here too
because the kill fallback and ``Cgroup`` both need them on a bare directory fd.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Generator, Iterator

from ._errors import CgroupOSError, os_error

__all__ = [
    "descendants",
    "exists",
    "join",
    "list_children",
    "poll_until",
    "read_file",
    "read_file_optional",
    "remove_subtree",
    "rmdir_retrying",
    "walk",
    "write_file",
]

_CHUNK = 65536
_O_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def join(dir_path: str, name: str) -> str:
    return os.path.join(dir_path, name) if name != "." else dir_path


def read_file(dir_fd: int, dir_path: str, name: str) -> str:
    """Read interface file ``name`` of the cgroup open at ``dir_fd``."""
    path = join(dir_path, name)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(exc, action="reading", path=path) from exc
    try:
        chunks = []
        while True:
            chunk = os.read(fd, _CHUNK)
            chunks.append(chunk)
            # kernfs and procfs fill a read as far as the file goes: a short read is the
            # end (saves the empty read that would say so, on every file we read)
            if len(chunk) < _CHUNK:
                break
    except OSError as exc:
        # A file of a cgroup removed while we read it answers ENODEV; it is the
        # same situation as ENOENT at open time, so report it as such.
        if exc.errno == errno.ENODEV:
            exc = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        raise os_error(exc, action="reading", path=path) from exc
    finally:
        os.close(fd)
    return os.fsdecode(b"".join(chunks))


def read_file_optional(dir_fd: int, dir_path: str, name: str) -> str | None:
    """Like ``read_file`` but ``None`` when the file does not exist (ENOENT).

    A missing interface file means "this controller or feature is not here"
    (or the cgroup was removed meanwhile); callers turn that into ``None``
    rather than a made-up zero.
    """
    try:
        return read_file(dir_fd, dir_path, name)
    except CgroupOSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


def write_file(
    dir_fd: int,
    dir_path: str,
    name: str,
    text: str,
    *,
    hint: str | None = None,
) -> None:
    """Write ``text`` to interface file ``name`` in a single ``write(2)``."""
    path = join(dir_path, name)
    action = f"writing {text!r} to"
    data = os.fsencode(text)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(exc, action=action, path=path, hint=hint) from exc
    try:
        written = os.write(fd, data)
    except OSError as exc:
        raise os_error(exc, action=action, path=path, hint=hint) from exc
    finally:
        os.close(fd)
    if written != len(data):
        # kernfs takes a whole write as one command; a short write would mean
        # the command was cut, which we must not paper over by writing the rest.
        raise CgroupOSError(
            errno.EIO, f"short write ({written} of {len(data)} bytes)", path, action
        )


def exists(dir_fd: int, name: str) -> bool:
    """Whether ``name`` exists relative to ``dir_fd`` (False if the cgroup is gone)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def list_children(dir_fd: int, rel: str = ".") -> list[str] | None:
    """Names of the sub-cgroups of ``rel`` (relative to ``dir_fd``), sorted.

    ``None`` when ``rel`` no longer exists. A fresh directory fd is opened each
    time: ``scandir`` on the cgroup's own fd would share (and move) its offset.
    """
    try:
        fd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    finally:
        os.close(fd)


def walk(dir_fd: int) -> Iterator[tuple[str, int]]:
    """``(relative path, directory fd)`` of this cgroup (``"."``, ``dir_fd`` itself) and of
    every sub-cgroup, each parent before its children.

    Each sub-cgroup is opened relative to its parent's fd, one name at a time, and the walk
    climbs back through ``..``: a tree deeper than PATH_MAX, or than the fds we have left (a
    task may nest sub-cgroups below its leaf without end), is walked like any other with at
    most two fds of its own open.  A fd is valid only until the walk goes on; the walk closes
    what it opened, also when abandoned.  Sub-cgroups removed meanwhile are skipped.
    """
    yield ".", dir_fd
    with contextlib.closing(_descend(dir_fd)) as steps:
        for entered, names, fd in steps:
            if entered:
                yield "/".join(names), fd


def _descend(dir_fd: int) -> Generator[tuple[bool, list[str], int], None, None]:
    """Depth-first over the sub-cgroups below ``dir_fd`` (see :func:`walk`):
    ``(True, names, fd)`` on entering one (``fd``: its own), ``(False, names, fd)`` once its
    children are done (``fd``: its parent's, ``names[-1]`` its name there).  ``names`` is
    the path from ``dir_fd``, a list the walk goes on changing."""
    levels: list[Iterator[str]] = [iter(list_children(dir_fd) or [])]
    names: list[str] = []
    cur = dir_fd
    try:
        while levels:
            name = next(levels[-1], None)
            if name is None:
                levels.pop()
                if names:
                    cur = _up(cur, dir_fd, depth=len(names) - 1)
                    yield False, names, cur
                    names.pop()
                continue
            try:
                child = os.open(name, _O_DIRECTORY, dir_fd=cur)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed meanwhile
            if cur != dir_fd:
                os.close(cur)
            cur = child
            names.append(name)
            levels.append(iter(list_children(cur) or []))
            yield True, names, cur
    finally:
        if cur != dir_fd:
            os.close(cur)


def _up(cur: int, top: int, *, depth: int) -> int:
    """The parent of the directory open at ``cur`` (closed): ``top`` itself at depth 0."""
    parent = top if depth == 0 else os.open("..", _O_DIRECTORY, dir_fd=cur)
    os.close(cur)
    return parent


def descendants(dir_fd: int) -> list[str]:
    """Relative paths of all sub-cgroups, each parent before its children (for showing: a
    path may be longer than PATH_MAX; :func:`walk` gives fds to act on)."""
    return [rel for rel, _ in walk(dir_fd)][1:]


def remove_subtree(dir_fd: int, path: str) -> None:
    """rmdir every sub-cgroup of the cgroup open at ``dir_fd``, children first, each by name
    relative to its parent's fd: no path handed to the kernel is longer than one name, no
    recursion, at most two fds of its own open (as :func:`walk`): any depth.  EBUSY (processes
    still there) raises at once; a sub-cgroup already gone is fine."""
    with contextlib.closing(_descend(dir_fd)) as steps:
        for entered, names, parent in steps:
            if entered:
                continue
            try:
                os.rmdir(names[-1], dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise os_error(exc, action="removing directory",
                               path="/".join([path, *names])) from exc


def poll_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` with a short backoff until true or ``timeout`` s passed.

    The synchronous layer has no event loop to wait on (the supervisor watches
    cgroup.events with inotify instead), so waits here are bounded polls.
    """
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        if condition():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)


def rmdir_retrying(path: str, busy_timeout: float, *, missing_ok: bool) -> None:
    """rmdir a cgroup, retrying EBUSY for up to ``busy_timeout`` s.

    The kernel can report ``populated 0`` slightly before the cgroup may be
    removed (the last task is still being torn down), so a brief EBUSY right
    after a kill is normal. A sub-cgroup keeps it busy for good: no retry then.
    """
    deadline = time.monotonic() + busy_timeout
    delay = 0.001
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError as exc:
            if missing_ok:
                return
            raise os_error(exc, action="removing directory", path=path) from exc
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise os_error(exc, action="removing directory", path=path) from exc
            busy = exc
        # A child cgroup keeps it busy for good; processes may be on their way out.
        kids = _children_of(path)
        remaining = deadline - time.monotonic()
        if kids or remaining <= 0:
            hint = _busy_hint(path, kids)
            raise os_error(busy, action="removing directory", path=path, hint=hint) from busy
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _children_of(path: str) -> list[str]:
    try:
        fd = os.open(path, _O_DIRECTORY)
    except OSError:
        return []
    try:
        return list_children(fd) or []
    finally:
        os.close(fd)


def _busy_hint(path: str, kids: list[str]) -> str:
    if kids:
        return f"it still has child cgroups {kids}: remove them first (remove(recursive=True))"
    try:
        fd = os.open(path, _O_DIRECTORY)
        try:
            procs = [int(p) for p in read_file(fd, path, "cgroup.procs").split()]
        finally:
            os.close(fd)
    except (OSError, ValueError):
        procs = []
    if procs:
        return (
            f"it still holds processes {procs}: kill them (Cgroup.kill()) and wait for "
            "populated 0 first"
        )
    return "it is still populated (processes on their way out, or in sub-cgroups)"
