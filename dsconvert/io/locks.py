"""File locks, in one place. Two kinds, for two jobs:

* by default ``flock``: held by an open file, so two threads, two DataLoader workers and two
  ranks all exclude each other; shared or exclusive; released when the holder dies.
* ``process=True``: a POSIX record lock (``lockf``), held by the process. Forked children do
  not inherit it, so a killed conversion's lock dies with its main process, whatever its pool
  workers do. Within one process a set of held paths does what the kernel does between
  processes (record locks never conflict inside one process).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Iterator, Set

__all__ = ["file_lock"]

_held: Set[str] = set()  # process=True locks this process holds


@contextlib.contextmanager
def file_lock(path: str, shared: bool = False, wait: bool = True, process: bool = False) -> Iterator[bool]:
    """Hold a lock on ``path`` (created if absent) for the block; yield whether it was taken
    (always True when ``wait``; False when ``wait=False`` and someone else holds it). Other
    failures (a file system without locks) raise."""
    if process and path in _held:
        # before opening: closing a second descriptor of the file would drop this process's lock
        if wait:
            raise RuntimeError(f"{path}: this process already holds the lock")
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    got = False
    try:
        try:
            if process:
                fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                _held.add(path)
            else:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
            got = True
        except OSError as exc:
            if wait or exc.errno not in (errno.EAGAIN, errno.EACCES):  # EACCES: lockf's "held" on some systems
                raise
        yield got
    finally:
        if got and process:
            _held.discard(path)
        os.close(fd)  # releases the lock
