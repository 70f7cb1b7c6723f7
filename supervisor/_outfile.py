"""Opening a file corral writes (a log, a JSON result, a plot) without being led elsewhere.

corral often runs as root and writes where a task running as another user may write too (its
workspace).  A symbolic link planted there, as the file itself or as a directory on its way,
would have root write the task's output into any file the link names.  So:

- every symbolic link on the way must belong to root or to us (a user can only make links of
  its own: the kernel's ``protected_symlinks`` rule, for every directory and not only sticky
  ones), and the file itself may not be one;
- the directory is then opened one component at a time with ``O_NOFOLLOW`` from ``/`` along
  the path those links resolved to, so that a link swapped in after the check is refused
  (ELOOP) rather than followed.

/dev and /proc/PID/fd are trusted as they are (``/dev/stdout``, ``/dev/fd/63`` of a shell's
``>(...)``): no task can put a link there.
"""

from __future__ import annotations

import errno
import os
import re
import stat

__all__ = ["open_output"]

_TRUSTED_DIRS = re.compile(r"/dev|/proc/(self|\d+)/fd")
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS


def open_output(path: str, flags: int, what: str, mode: int = 0o666) -> int:
    """``os.open(path, flags)`` as described above; OSError naming ``what``, the rule and the
    fix for a link that is not to be followed."""
    flags |= os.O_CLOEXEC | os.O_NOCTTY
    absolute = os.path.abspath(path)
    parent, name = os.path.split(absolute)
    if _TRUSTED_DIRS.fullmatch(os.path.realpath(parent)):
        return os.open(path, flags, mode)
    real_parent = _checked(parent, what, path, 0)
    dir_fd = _open_dir(real_parent, what, path)
    try:
        return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{what} {path} is a symbolic link, which corral does "
                                       f"not follow (a task may have planted it); give the "
                                       f"path of the file itself") from None
        raise
    finally:
        os.close(dir_fd)


def _checked(directory: str, what: str, path: str, links: int) -> str:
    """``directory`` with its links resolved, each checked to belong to root or to us."""
    resolved = "/"
    for part in directory.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        here = os.path.join(resolved, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            resolved = here  # (the open will say it is missing)
            continue
        if not stat.S_ISLNK(st.st_mode):
            resolved = here
            continue
        if st.st_uid not in (0, os.geteuid()):
            raise OSError(errno.ELOOP, f"{what} {path}: {here} is a symbolic link that belongs "
                                       f"to uid {st.st_uid}, which corral does not follow (it "
                                       f"would write wherever that user points it); give a "
                                       f"path without it")
        if links >= _MAX_LINKS:
            raise OSError(errno.ELOOP, f"{what} {path}: too many symbolic links")
        target = os.readlink(here)
        resolved = _checked(os.path.join(resolved, target), what, path, links + 1)
    return resolved


def _open_dir(directory: str, what: str, path: str) -> int:
    """``directory`` (no links left in it) opened from / one component at a time."""
    fd = os.open("/", _O_DIR)
    try:
        for part in directory.split("/"):
            if not part:
                continue
            try:
                nxt = os.open(part, _O_DIR, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(errno.ELOOP, f"{what} {path}: {directory} changed while "
                                               f"corral opened it (a directory on its way "
                                               f"became a symbolic link); not followed") from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd
