"""The state directory is root's alone, whatever the daemon found there.

The records hold every tenant's requests (their environments among them), and a queued row
is run again at start-up as the uid it names: whoever can write ``state.db`` can have root run
anything.  The output files are every tenant's output.  A directory that existed before the
daemon keeps its mode (a Kubernetes ``emptyDir`` is 0777), and files SQLite makes beside the
database (``-wal``, ``-shm``) take the mode the process's umask gives them.  So, before
anything is opened (:func:`make_private`):

- every directory on the way to the state directory belongs to root (or to us) and only its
  owner may write it, unless it is sticky (``/tmp``); else the daemon refuses to start;
- the state directory and ``output/`` in it are made ours and 0700 first (nobody else can
  add an entry after that; an ``output/`` of someone else's is removed and made anew), then
  what is in them is checked: the records' files (``state.db`` and its ``-wal``, ``-shm``,
  ``-journal``, ``lock``, ``pending-ends``) must be plain files of ours with one link, else the
  daemon refuses to start (their content cannot be trusted), naming the file and the fix;
  each is made 0600.  Anything else in ``output/`` that is not a plain file of ours with one
  link was put there by someone else and is removed (never followed).

``state.db`` is made 0600 by the daemon before SQLite opens it: SQLite gives ``-wal`` and
``-shm`` the database's mode.  What the daemon writes later (output files, their tails) is made
0600, in a directory only root may enter.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

__all__ = ["RECORD_FILES", "StateDirError", "check_ancestors", "make_private"]

log = logging.getLogger(__name__)

RECORD_FILES = ("state.db", "state.db-wal", "state.db-shm", "state.db-journal", "lock",
                "pending-ends")
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


class StateDirError(Exception):
    """The state directory cannot be made private: names the path, the reason and the fix."""


def make_private(state_dir: str) -> None:
    """Make ``state_dir`` and ``state_dir/output`` ours, 0700 and free of anything planted
    (see the module docstring), and ``state.db`` exist, 0600; StateDirError if they cannot be
    trusted."""
    state_dir = os.path.abspath(state_dir)
    check_ancestors(os.path.dirname(state_dir), f"the state directory {state_dir}",
                    "--state-dir")
    fd = _own_directory(state_dir, None)
    try:
        for name in RECORD_FILES:
            _check_record_file(fd, name, state_dir)
        os.close(os.open("state.db", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=fd))
        # (records.Reserve: zeros of ours)
        _clear_foreign(fd, state_dir, only=("reserve", "reserve.start"))
        out = _own_directory("output", fd, os.path.join(state_dir, "output"),
                             foreign_ok=True)
        try:
            _clear_foreign(out, os.path.join(state_dir, "output"))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def check_ancestors(directory: str, what: str, option: str) -> None:
    """Every directory from / to ``directory`` (links resolved) belongs to root or us and is
    writable by its owner alone, unless sticky; else another user could swap ``what`` (a
    path in it) for something of its own.  StateDirError naming ``option`` as the fix."""
    real = os.path.realpath(directory)
    path = "/"
    for part in [""] + [p for p in real.split("/") if p]:
        path = os.path.join(path, part) if part else "/"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return  # made below by us
        if st.st_uid not in (0, os.geteuid()):
            raise StateDirError(f"{what} lies in {path}, which belongs to uid {st.st_uid}: "
                                f"that user could replace it; give {option} a path under "
                                f"directories only root controls")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise StateDirError(f"{what} lies in {path}, which other users may write (mode "
                                f"{stat.S_IMODE(st.st_mode):04o}, not sticky): they could "
                                f"replace it; chmod go-w {path}, or give {option} another "
                                f"path")


def _own_directory(path: str, dir_fd: int | None, shown: str | None = None, *,
                   foreign_ok: bool = False) -> int:
    """Make (0700) or open the directory ``path`` (relative to ``dir_fd``), never through a
    link; it must be ours (``foreign_ok``: what is there otherwise is removed, and a
    directory of ours made); made 0700 before anything in it is looked at.  Its fd."""
    shown = shown or path
    if foreign_ok:
        _remove_unless_ours(dir_fd, path, shown)
    try:
        os.mkdir(path, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    except OSError as e:
        raise StateDirError(f"making the state directory {shown}: {e.strerror}; give "
                            f"--state-dir a directory root may create and write") from None
    try:
        fd = os.open(path, _O_DIR, dir_fd=dir_fd)
    except OSError as e:
        why = ("is a symbolic link or not a directory" if e.errno in (errno.ELOOP,
                                                                     errno.ENOTDIR)
               else e.strerror)
        raise StateDirError(f"the state directory {shown} {why}; give --state-dir the real "
                            f"directory (or remove what is there)") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise StateDirError(f"the state directory {shown} belongs to uid {st.st_uid}, not to "
                            f"the daemon's uid {os.geteuid()}: another user made it and may "
                            f"have put anything in it; remove it (rm -r {shown}) or give "
                            f"--state-dir another directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.fchmod(fd, 0o700)
        log.warning("%s was mode %04o: made 0700 (the records and output are root's alone)",
                    shown, stat.S_IMODE(st.st_mode))
    return fd


def _check_record_file(dir_fd: int, name: str, state_dir: str) -> None:
    path = os.path.join(state_dir, name)
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    foreign = (not stat.S_ISREG(st.st_mode) and "is not a plain file") or \
        (st.st_uid != os.geteuid() and f"belongs to uid {st.st_uid}") or \
        (st.st_nlink != 1 and f"has {st.st_nlink} hard links")
    if foreign:
        raise StateDirError(f"{path} {foreign}: someone other than the daemon made it, and "
                            f"records it did not write cannot be trusted (a queued row runs "
                            f"as the uid it names); move it aside (mv {path} {path}.untrusted)"
                            f" and start again")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(name, 0o600, dir_fd=dir_fd)  # (a plain file: lstat'ed above)


def _clear_foreign(dir_fd: int, shown: str, only: tuple[str, ...] | None = None) -> None:
    """Remove from the directory (``output/``; or of the names in ``only``) whatever is not a
    plain file of ours with one link; make the rest 0600."""
    for name in os.listdir(dir_fd) if only is None else only:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1
        if not ours:
            log.warning("%s/%s was not the daemon's (uid %d, mode %06o, %d links): removed",
                        shown, name, st.st_uid, st.st_mode, st.st_nlink)
            _remove(dir_fd, name, st)
        elif stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(name, 0o600, dir_fd=dir_fd)  # (a plain file: lstat'ed above)


def _remove_unless_ours(dir_fd: int | None, name: str, shown: str) -> None:
    """Remove ``name`` unless it is a directory of ours (it holds no records: output files
    only, which the records can do without)."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        return
    log.warning("%s was not the daemon's directory (uid %d, mode %06o): removed and made "
                "anew", shown, st.st_uid, st.st_mode)
    assert dir_fd is not None
    _remove(dir_fd, name, st)


def _remove(dir_fd: int, name: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    import shutil

    shutil.rmtree(name, dir_fd=dir_fd)  # (fd-based: it follows no link)
