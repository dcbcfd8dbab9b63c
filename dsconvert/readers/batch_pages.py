"""Shared-memory pages for a worker's batch tensors, used again once every holder has let go.

A DataLoader worker hands each batch to the trainer in shared memory: torch allocates a new
segment per batch, the worker's kernel allocates and zeroes its pages as the batch is written
(~60-76 us of CPU a sample for 3 x 224 x 224 uint8, the largest cost after decoding and
resizing in the fused eval path), and the trainer's kernel frees them when the batch goes. FFCV
and DALI avoid this with a ring of buffers that a batch is overwritten in after a set number of
steps, which is wrong for a user who keeps a batch. Here a segment is written again only when no
process holds it any more, which the kernel says:

* each segment is a ``memfd`` (tmpfs, not bounded by ``/dev/shm``'s size), kept alive between
  batches by one read-only descriptor (the *keeper*) that nothing else ever sees;
* each batch gets a new open file description on it, opened for writing through
  ``/proc/self/fd``, which torch maps and sends to the trainer (SCM_RIGHTS passes that same
  description: every mapping, descriptor and fork of the batch, in any process, holds it);
* the kernel counts the descriptions open for writing on a file; a read lease
  (``F_SETLEASE``, ``F_RDLCK``) on the keeper is granted only when that count is zero, that is
  when the last holder of every batch written in the segment has closed and unmapped it. The
  lease is dropped at once: it is only the question.

torch's receiving side caches storages by inode (``rebuild_storage_fd``): a live storage once
mapped from a segment, whose pages it has since moved (``share_memory_`` under the
``file_system`` strategy), would be handed back for a later batch written in that segment. So a
process with segments sends them with :func:`rebuild_segment`, which maps what it is sent and
replaces the cache's entry (:func:`_reduce_storage`, registered with ``ForkingPickler`` for
``UntypedStorage`` in that process only, and torch's own reduction for every other storage).

What the lease cannot see: a read-only description opened through ``/proc/PID/fd`` by another
program and mapped, pages passed on with ``vmsplice``; and such a program opening the segment
for writing in the microseconds the lease is held gets the worker a SIGIO. Nothing in torch or
dsconvert does either.

Where any of this is missing (another system, no ``/proc``, leases refused, torch's
``file_system`` sharing strategy), :meth:`BatchPages.tensor` returns None and the caller
allocates as torch does.
"""

from __future__ import annotations

import errno
import fcntl
import multiprocessing.reduction
import os
import sys
import threading
from typing import Any, List, Optional, Set, Tuple

import torch
from torch.multiprocessing import reductions

__all__ = ["BatchPages", "batch_pages"]

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)  # Linux's value; Python 3.11 lacks the name


class BatchPages:
    """The segments of one process, each reused for a batch of at most its size once free.

    ``keep``: how many segments are kept; with more held at once (a trainer that keeps its
    batches), the oldest is let go (its memory returns when its holders drop it) and a new one
    made. A DataLoader worker has at most ``prefetch_factor`` batches queued and one or two
    in the trainer's hands, so four are reused in turn."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.segments: List[Tuple[int, int]] = []  # (keeper descriptor, size), oldest first
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self.usable = sys.platform.startswith("linux") and hasattr(os, "memfd_create")

    def tensor(self, size: int) -> Optional[torch.Tensor]:
        """A uint8 tensor of ``size`` bytes in shared memory that no other holder can see
        (its content is a previous batch's: the caller writes every byte), or None where this
        process cannot reuse pages (see the module's notes)."""
        if not self.usable or size <= 0 or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
            return None
        with self._lock:  # two threads must not both find one segment free
            try:
                for at, (keeper, capacity) in enumerate(self.segments):
                    if capacity >= size and self._free(keeper):
                        self.segments.append(self.segments.pop(at))  # most recently used last
                        return self._map(keeper, size)
                keeper = self._new(size)
                return self._map(keeper, size)
            except OSError:
                self.usable = False  # leases refused, no /proc, no memory: torch's way from now on
                self._forget()
                return None

    def _free(self, keeper: int) -> bool:
        """Whether no description of the segment is open for writing: no batch written in it
        is held, by this process or any other."""
        try:
            fcntl.fcntl(keeper, F_SETLEASE, fcntl.F_RDLCK)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EBUSY):
                return False
            raise
        fcntl.fcntl(keeper, F_SETLEASE, fcntl.F_UNLCK)
        return True

    def _new(self, size: int) -> int:
        """A new segment of ``size`` bytes; the oldest goes if ``keep`` are kept."""
        _send_segments_with_rebuild_segment()
        fd = os.memfd_create("dsconvert-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            keeper = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(fd)  # memfd's own description is not counted as open for writing
        if not self._free(keeper):  # asks the kernel once, so that refused leases show here
            os.close(keeper)
            raise OSError(errno.EBUSY, "a new segment is open for writing")
        if len(self.segments) >= self.keep:  # never written again: torch's cache is right for it
            oldest = self.segments.pop(0)[0]
            _inodes.discard(_inode(oldest))
            os.close(oldest)
        self.segments.append((keeper, size))
        _inodes.add(_inode(keeper))
        return keeper

    @staticmethod
    def _map(keeper: int, size: int) -> torch.Tensor:
        """The segment's first ``size`` bytes, mapped through a new description open for
        writing (the one torch keeps, and sends with the batch)."""
        fd = os.open(f"/proc/self/fd/{keeper}", os.O_RDWR | os.O_CLOEXEC)
        try:
            storage = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]  # dups it
        finally:
            os.close(fd)
        return torch.empty(0, dtype=torch.uint8).set_(storage)

    def _forget(self) -> None:
        for keeper, _ in self.segments:
            try:
                os.close(keeper)
            except OSError:
                pass
        self.segments = []
        self.pid = os.getpid()

    def _after_fork(self) -> None:
        """In a fork's child (one thread): the parent's segments and lock are not its own."""
        self._lock = threading.Lock()
        self._forget()

    def __del__(self) -> None:
        if getattr(self, "pid", None) == os.getpid():
            self._forget()


_pages: Optional[BatchPages] = None
_inodes: Set[Tuple[int, int]] = set()  # (device, inode) of this process's kept segments


def batch_pages() -> BatchPages:
    """This process's segments."""
    global _pages
    if _pages is None:
        _pages = BatchPages()
    return _pages


def _after_fork_in_child() -> None:
    _inodes.clear()
    if _pages is not None:
        _pages._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _inode(fd: int) -> Tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def rebuild_segment(cls: Any, df: Any, size: int) -> Any:
    """The receiving side of a segment's storage: mapped from the description sent, never a
    storage torch's cache holds for the inode (it may be a batch from before, moved since);
    the cache's entry then names this one, as torch's ``rebuild_storage_fd`` leaves it."""
    fd = df.detach()
    try:
        storage = cls._new_shared_fd_cpu(fd, size)
        reductions.shared_cache[reductions.fd_id(fd)] = reductions.StorageWeakRef(storage)
        return storage
    finally:
        os.close(fd)


def _reduce_storage(storage: Any) -> Any:
    """torch's ``reduce_storage``, except that a segment of this process goes with
    :func:`rebuild_segment`."""
    if (storage.device.type == "cpu" and storage.size() > 0 and _inodes and storage.is_shared()
            and torch.multiprocessing.get_sharing_strategy() == "file_descriptor"):
        fd, size = storage._share_fd_cpu_()
        if _inode(fd) in _inodes:
            df = multiprocessing.reduction.DupFd(fd)
            reductions.shared_cache[reductions.fd_id(fd)] = reductions.StorageWeakRef(storage)
            return (rebuild_segment, (type(storage), df, size))
    return reductions.reduce_storage(storage)


def _send_segments_with_rebuild_segment() -> None:
    multiprocessing.reduction.ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
