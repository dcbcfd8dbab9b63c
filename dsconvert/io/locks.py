"""File locks, in one place. Two kinds, for two jobs:

* by default ``flock``: held by an open file, so two threads, two DataLoader workers and two
  ranks all exclude each other; shared or exclusive; released when the holder dies.
* ``process=True``: a POSIX record lock (``lockf``), held by the process. Forked children do
  not inherit it, so a killed conversion's lock dies with its main process, whatever its pool
  workers do. Record locks never conflict inside one process, so the process keeps a set of
  the lock files it holds, by file identity (device, inode): another spelling of the same
  file (through a symlinked folder, a bind mount, a hard link) is the same lock.

A lock file is a control file: it is opened without following a symlink (``O_NOFOLLOW``),
so a link planted in its place never makes the lock create or lock a file elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
import sys
import threading
from typing import Iterator, List, Optional, Set, Tuple

__all__ = ["file_lock", "lock_held"]

_held: Set[Tuple[int, int]] = set()  # (device, inode) of the process=True locks this process holds
_stray: List[int] = []  # descriptors of held lock files opened by mistake (see file_lock), kept open
_guard = threading.Lock()  # one check-and-open at a time within the process
_flocked: Set[int] = set()  # descriptors of the flock()s this process holds now (file_lock, process=False)
# held while a flock's descriptor is opened and recorded, or forgotten and closed, and across a
# fork: a fork between the two steps would give the child an unrecorded copy of a locked file
# (one opened not yet recorded, or one forgotten not yet closed), holding the lock for its life
_fd_guard = threading.Lock()


def _before_fork() -> None:
    _fd_guard.acquire()


def _forked_parent() -> None:
    _fd_guard.release()


def _forked_child() -> None:
    """In a forked child, close the descriptors of the flocks other threads of the parent held
    at the fork: an flock belongs to the open file, which the child's copy of the descriptor
    would keep locked for as long as the child lives (a DataLoader worker forked while a
    background fetch held a cached file's lock would then wait on itself)."""
    global _fd_guard
    _fd_guard = threading.Lock()  # the parent's, held by the forking thread: a new one
    for fd in list(_flocked):
        _flocked.discard(fd)
        with contextlib.suppress(OSError):
            os.close(fd)  # the child's copy only: the parent's lock stays with the parent


os.register_at_fork(before=_before_fork, after_in_parent=_forked_parent, after_in_child=_forked_child)


def _identity(path: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def file_lock(path: str, shared: bool = False, wait: bool = True, process: bool = False) -> Iterator[bool]:
    """Hold a lock on ``path`` (created if absent) for the block; yield whether it was taken
    (always True when ``wait``; False when ``wait=False`` and someone else holds it). Other
    failures (a file system without locks, a symlink where the lock file goes: ELOOP) raise."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    if not process:
        with _fd_guard:
            fd = os.open(path, flags, 0o644)
            _flocked.add(fd)
        try:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
            except OSError as exc:
                if wait or exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                yield False
                return
            yield True
        finally:
            with _fd_guard:
                if fd in _flocked:  # else a forked child closed it already (_forked_child)
                    _flocked.discard(fd)
                    os.close(fd)  # releases the lock
        return
    fd = -1
    with _guard:
        # checked before opening: closing a second descriptor of a held file would drop this
        # process's lock on it
        ident = _identity(path)
        if ident is None or ident not in _held:
            opened = os.open(path, flags, 0o644)
            st = os.fstat(opened)
            ident = (st.st_dev, st.st_ino)
            if ident in _held:  # swapped for a link to a held file between the check and the open:
                _stray.append(opened)  # never closed, so that the held lock stays
            else:
                _held.add(ident)  # reserved: another thread of this process is refused from here on
                fd = opened
    if fd < 0:
        if wait:
            raise RuntimeError(f"{path}: this process already holds the lock")
        yield False
        return
    got = False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            got = True
        except OSError as exc:
            if wait or exc.errno not in (errno.EAGAIN, errno.EACCES):  # EACCES: lockf's "held" on some systems
                raise
        yield got
    finally:
        os.close(fd)  # releases the lock
        with _guard:
            _held.discard(ident)


# struct flock, for asking who holds a record lock: its layout is the platform's
_FLOCK: Optional[str] = ("hhqqi" if sys.platform.startswith("linux")
                         else "qqihh" if sys.platform == "darwin" or "bsd" in sys.platform else None)


def lock_held(path: str) -> Optional[bool]:
    """Whether some process holds the ``process=True`` lock on ``path`` (this one included),
    asked of the kernel (``F_GETLK``) and never taken: asking cannot make a conversion that
    starts at that moment fail, and needs no write permission. The file is opened read-only,
    not created and not followed through a symlink. False when there is no such file (no
    conversion ever ran there, or it is not a regular file); None when it cannot be told."""
    with _guard:
        if _identity(os.path.realpath(path)) in _held:
            return True  # before opening: closing a descriptor of the file would drop this process's lock
    if _FLOCK is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        return False if exc.errno == errno.ELOOP else None  # a link is never our lock file
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, *_query()))
        kind = struct.unpack(_FLOCK, got)[0 if _FLOCK.startswith("h") else 3]
        return kind != fcntl.F_UNLCK
    except OSError:  # a file system without record locks
        return None
    finally:
        os.close(fd)


def _query() -> tuple:
    """The whole file, for writing (what ``lockf(LOCK_EX)`` takes), in ``_FLOCK``'s order."""
    if _FLOCK == "hhqqi":
        return (fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    return (0, 0, 0, fcntl.F_WRLCK, os.SEEK_SET)
