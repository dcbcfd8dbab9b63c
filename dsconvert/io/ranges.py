"""Byte ranges of a shard, read the way its storage wants.

A local file on a local disk is memory-mapped: the page cache serves slices without a
syscall. Latency-bound storage (NFS, CephFS, FUSE) and object stores are read ahead with
concurrent ranged requests instead, since page faults or one large read would pay a round
trip per 128 kB, one at a time. Both give ``get(offset, size) -> bytes`` and ``close()``.
"""

from __future__ import annotations

import mmap
import os
from bisect import bisect_right
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..errors import ManifestError
from ..processes import ProcessLocal
from .location import Location

__all__ = ["MappedBytes", "PreadBytes", "PrefetchedBytes", "ScatteredBytes", "local_fill", "remote_fill"]


class MappedBytes:
    """Local files: slices of a memory map (the page cache serves them without a syscall)."""

    def __init__(self, path: str, size: int):
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        if self.mm is not None and hasattr(mmap, "MADV_SEQUENTIAL"):
            self.mm.madvise(mmap.MADV_SEQUENTIAL)  # read in file order: larger readahead (cold: +10-25%)

    def get(self, offset: int, size: int) -> bytes:
        return self.mm[offset: offset + size] if self.mm is not None else b""

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # decode="buffer" views still use it; it closes when they are gone


class PreadBytes:
    """Local files: each slice by one ``pread``. As fast as a memory map's slice when the pages
    are cached, and 1.3-1.5x faster cold: the kernel's read-ahead for read() fetches larger runs
    than page faults on a map do (``MADV_WILLNEED`` on the map was slower still: it reads the
    whole span before the first sample). A file that shrinks under it raises, where a map
    would kill the process with SIGBUS."""

    def __init__(self, path: str, size: int):
        # a file object owns the descriptor: closing twice is a no-op, and one dropped unclosed
        # closes it (a bare number closed twice could close another file that reused it)
        self.file = open(path, "rb", buffering=0)
        self.fd = self.file.fileno()
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self.path = path

    def get(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise ManifestError(f"{self.path} is shorter than its index says (changed while being read)", self.path)
        return data

    def close(self) -> None:
        self.fd = -1
        self.file.close()


_pools = ProcessLocal()  # a forked DataLoader worker makes its own threads


def _io_pool(threads: int) -> ThreadPoolExecutor:
    pool = _pools.get(threads)
    if pool is None:
        pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="dsconvert-read")
    return pool


class PrefetchedBytes:
    """Latency-bound storage (NFS, CephFS, FUSE, object stores): a forward window over the
    bytes this worker needs, filled by concurrent ranged reads, with the next window fetched in
    the background.

    Page faults or one large read() would pay the storage's round trip once per 128 kB
    request, one request at a time; 8 concurrent 1 MB requests hide most of it. ``fill(view,
    offset)`` reads into ``view`` from ``offset`` and returns the bytes read: ``os.preadv`` on
    a local descriptor, or a ranged GET of the object.
    """

    def __init__(self, fill: Callable[[memoryview, int], int], end: int, close: Callable[[], None] = lambda: None,
                 window: int = 16 << 20, threads: int = 8, piece: int = 1 << 20):
        self.fill = fill
        self._close = close
        self.piece = piece  # bytes per request
        self.end = end
        self.window = window
        self.pool = _io_pool(threads)
        self.base = 0
        self.buf = bytearray()
        self.ahead: Optional[Tuple[int, bytearray, List[Future]]] = None

    def _start(self, offset: int, length: int) -> Tuple[int, bytearray, List[Future]]:
        buf = bytearray(length)
        view = memoryview(buf)
        futures = [self.pool.submit(self.fill, view[a: a + self.piece], offset + a)
                   for a in range(0, length, self.piece)]
        return offset, buf, futures

    @staticmethod
    def _finish(job: Tuple[int, bytearray, List[Future]]) -> Tuple[int, bytearray]:
        offset, buf, futures = job
        got = sum(f.result() for f in futures)
        return offset, buf[:got] if got < len(buf) else buf

    def get(self, offset: int, size: int) -> bytes:
        lo = offset - self.base
        if 0 <= lo and offset + size <= self.base + len(self.buf):
            return bytes(self.buf[lo: lo + size])
        if size > self.window:
            _, buf = self._finish(self._start(offset, size))
            return bytes(buf)
        job = self.ahead
        self.ahead = None
        if job is None or not (job[0] <= offset and offset + size <= job[0] + len(job[1])):
            if job is not None:
                self._finish(job)
            job = self._start(offset, max(size, min(self.window, self.end - offset)))
        self.base, self.buf = self._finish(job)
        nxt = self.base + len(self.buf)
        if nxt < self.end:
            self.ahead = self._start(nxt, min(self.window, self.end - nxt))
        lo = offset - self.base
        return bytes(self.buf[lo: lo + size])

    def close(self) -> None:
        if self.ahead is not None:
            self._finish(self.ahead)
            self.ahead = None
        self._close()

    @classmethod
    def local(cls, path: str, end: int, **kw: Any) -> PrefetchedBytes:
        fill, close = local_fill(path)
        return cls(fill, end, close, **kw)

    @classmethod
    def remote(cls, location: Location, name: str, end: int, **kw: Any) -> PrefetchedBytes:
        """Object stores: 4 MB ranged GETs, 8 at a time (a request costs a round trip and
        some server work whatever its size; stores advise parts of several MB)."""
        kw.setdefault("piece", 4 << 20)
        kw.setdefault("window", 32 << 20)
        return cls(remote_fill(location, name), end, **kw)


def local_fill(path: str) -> Tuple[Callable[[memoryview, int], int], Callable[[], None]]:
    """``fill(view, offset)`` by ``preadv`` on one descriptor, and its ``close``. A file object
    owns the descriptor: ``close`` may run twice (the second does nothing), and a fill after it
    raises instead of reading whatever file has since reused the number."""
    f = open(path, "rb", buffering=0)
    return (lambda view, offset: os.preadv(f.fileno(), [view], offset)), f.close


def remote_fill(location: Location, name: str) -> Callable[[memoryview, int], int]:
    """``fill(view, offset)`` by one ranged GET of object ``name``."""
    def fill(view: memoryview, offset: int) -> int:
        data = location.read_range(name, offset, offset + len(view))
        view[: len(data)] = data
        return len(data)
    return fill


class ScatteredBytes:
    """Latency-bound storage read in a shuffled or dealt order: exactly the spans a worker
    reads next, merged where they nearly touch (``gap``) up to ``piece`` bytes per request,
    all requested at once on the shared thread pool, so that the round trips overlap and
    the next group can be fetched while this one is decoded."""

    def __init__(self, fill: Callable[[memoryview, int], int], spans: Sequence[Tuple[int, int]],
                 threads: int = 8, gap: int = 64 << 10, piece: int = 4 << 20):
        pool = _io_pool(threads)
        merged: List[List[int]] = []
        for offset, size in sorted(spans):
            if merged and offset - merged[-1][1] <= gap and max(merged[-1][1], offset + size) - merged[-1][0] <= piece:
                merged[-1][1] = max(merged[-1][1], offset + size)
            else:
                merged.append([offset, offset + size])
        self.starts = [a for a, _ in merged]
        self.ranges: List[Tuple[int, bytearray, Future]] = []
        for a, b in merged:
            buf = bytearray(b - a)
            self.ranges.append((a, buf, pool.submit(fill, memoryview(buf), a)))

    def get(self, offset: int, size: int) -> bytes:
        i = bisect_right(self.starts, offset) - 1
        if i < 0:
            raise ValueError(f"bytes at {offset} were not fetched")
        start, buf, future = self.ranges[i]
        got = future.result()
        lo = offset - start
        if lo + size > got:
            raise ManifestError(f"the shard ends before byte {offset + size} (was it truncated?)")
        return bytes(buf[lo: lo + size])

    def close(self) -> None:
        """Waits for requests already running (they write into buffers and read a descriptor
        that the caller may close next)."""
        running = [future for _, _, future in self.ranges if not future.cancel()]
        wait(running)
