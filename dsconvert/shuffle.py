"""Write-time shuffling: the order a shuffled output stores its samples in, and the file that
maps it back to the source's order.

Why: ImageFolder's order is class by class, so shards cut from it hold a few classes each, and
no reading-time buffer mixes them well (a batch of 256 read from a buffer of 1,000 consecutive
samples of ImageNet holds about 2 classes, where a uniform shuffle gives 226). Stored in a
uniform seeded permutation, every window of consecutive samples is a uniform sample of the
dataset, so streaming reads mix like ``RandomSampler`` at no read amplification. Random access
still returns the source's sample i as ``ds[i]``, through the order file.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import IO, Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from .errors import ManifestError

__all__ = ["ORDERS", "shuffled_order", "order_bytes", "load_order", "mapped_order", "order_header", "StoredPositions"]

ORDERS = ("auto", "shuffled", "source")  # auto: shuffled for labelled wds outputs (see convert)


_CHUNK = 8192  # positions hashed (and tie-scanned) per step: ~1 MB of digests in flight
_TOP_BITS = 32  # digest bits sorted with the position in one uint64; ties there are re-ordered


def _digests(start: int, stop: int, key: bytes) -> np.ndarray:
    """The keyed BLAKE2b digests of positions ``start..stop`` as uint64 (big-endian: the
    integers sort as the digests' bytes do)."""
    blake2b = hashlib.blake2b
    raw = b"".join(blake2b(i.to_bytes(8, "little"), digest_size=8, key=key).digest() for i in range(start, stop))
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


def shuffled_order(n: int, seed: int) -> np.ndarray:
    """A seeded permutation of ``range(n)`` (int64): source positions sorted by a keyed BLAKE2b
    hash of each position, ties by position. Pinned by its definition, not by a library's
    generator (numpy does not promise its streams across versions), so the same source and
    seed give the same shards with any dsconvert, numpy or worker count.

    Computed in one uint64 per position, in place: the digest's top bits above the position,
    sorted; positions whose top bits tie are then put in the order of their whole digests (a
    few thousand at 10M). So the order costs 8 bytes a sample, not a Python int and a digest."""
    key = hashlib.sha256(str(seed).encode()).digest()[:32]
    if n >= 1 << (64 - _TOP_BITS):  # positions do not fit beside the top bits: the plain definition
        whole = np.concatenate([_digests(a, min(n, a + _CHUNK), key) for a in range(0, n, _CHUNK)] or [
            np.zeros(0, dtype=np.uint64)])
        return np.argsort(whole, kind="stable").astype(np.int64)
    low = np.uint64((1 << (64 - _TOP_BITS)) - 1)
    shift = np.uint64(64 - _TOP_BITS)
    packed = np.empty(n, dtype=np.uint64)
    for a in range(0, n, _CHUNK):
        b = min(n, a + _CHUNK)
        packed[a:b] = ((_digests(a, b, key) >> shift) << shift) | np.arange(a, b, dtype=np.uint64)
    packed.sort()
    for start, stop in _tied_runs(packed, shift):
        run = packed[start:stop] & low
        whole = _digests_of(run, key)
        packed[start:stop] = run[np.lexsort((run, whole))]  # by whole digest, then position
    packed &= low
    return packed.view(np.int64)


def _tied_runs(packed: np.ndarray, shift: np.uint64) -> List[Tuple[int, int]]:
    """[start, stop) runs of sorted ``packed`` whose top bits are equal (two values or more)."""
    runs: List[Tuple[int, int]] = []
    n = len(packed)
    for a in range(0, n - 1, _CHUNK):
        b = min(n - 1, a + _CHUNK)
        top = packed[a:b + 1] >> shift
        for i in np.flatnonzero(top[1:] == top[:-1]).tolist():
            i += a
            if runs and runs[-1][1] == i + 1:
                runs[-1] = (runs[-1][0], i + 2)
            else:
                runs.append((i, i + 2))
    return runs


def _digests_of(positions: np.ndarray, key: bytes) -> np.ndarray:
    """The digests of scattered positions (a tied run's)."""
    return np.concatenate([_digests(p, p + 1, key) for p in positions.tolist()])


def order_bytes(stored_sources: Sequence[int]) -> bytes:
    """The order file for shards whose samples, in stored order, came from these source
    positions: for the i-th of them in source order, its stored position (int64 .npy)."""
    order = np.argsort(np.asarray(stored_sources, dtype=np.int64), kind="stable").astype(np.int64)
    buf = io.BytesIO()
    np.save(buf, order, allow_pickle=False)
    return buf.getvalue()


def load_order(data: bytes, n: int, where: str) -> np.ndarray:
    """The order file's array, checked: an int64 permutation of ``range(n)`` (the bytes were
    checked against the manifest's sha256 by whoever read them; this checks what they say)."""
    try:
        order = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # ValueError, EOFError, OSError: not a .npy file
        raise ManifestError(f"{where}: not an order file ({str(exc)[:100]})", where) from None
    if order.dtype != np.int64 or order.shape != (n,):
        raise ManifestError(f"{where}: an order file holds {n} int64 positions, not {order.dtype} {order.shape}", where)
    seen = np.zeros(n, dtype=bool)
    if n and (order.min() < 0 or order.max() >= n):
        raise ManifestError(f"{where}: positions outside 0..{n - 1}", where)
    seen[order] = True
    if not seen.all():
        raise ManifestError(f"{where}: not a permutation (a position is repeated)", where)
    return order


def mapped_order(buf: Any, n: int, where: str) -> np.ndarray:
    """The order file's array over ``buf`` (a read-only memory map of it, or its bytes) without
    a copy: its .npy header read by numpy's own helpers and checked (int64, ``n`` values), each
    position then bounded where it is used. What :func:`load_order` checks besides (that it is
    a permutation) was checked when it was written, and is again by ``verify`` and the cache;
    a reader checks the file's sha256 against the manifest before it trusts it. A worker
    holds no copy: the map's pages are the page cache's, shared."""
    offset = order_header(bytes(buf[:4096]), n, where)
    if len(buf) != offset + 8 * n:
        raise ManifestError(f"{where}: {len(buf):,} bytes, not the {offset + 8 * n:,} of {n} positions", where)
    return np.frombuffer(buf, dtype="<i8", count=n, offset=offset)


def order_header(start: bytes, n: int, where: str) -> int:
    """Where an order file's positions begin, from its first bytes (``start``, up to 4096: the
    .npy header read by numpy's own helpers), checked to announce ``n`` int64 values in C order.
    Only the header: a reader that streams the file checks its length against this itself."""
    head = io.BytesIO(start)
    try:
        version = np.lib.format.read_magic(head)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(head) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(head))
    except Exception as exc:  # ValueError: not a .npy file, or a header numpy refuses
        raise ManifestError(f"{where}: not an order file ({str(exc)[:100]})", where) from None
    if dtype != np.dtype("<i8") or shape != (n,) or (fortran and n > 1):
        raise ManifestError(f"{where}: an order file holds {n} int64 positions, not {dtype} {shape}", where)
    return head.tell()


class StoredPositions:
    """The source positions of each shard's written samples, kept on disk as shards finish
    (in any order), then turned into the order file in bounded memory: the same bytes as
    :func:`order_bytes` of them all, in shard order, without holding them.

    How: the (source position, stored place) pairs are spread over bucket files by source
    position, each bucket then scattered into a window of its positions and compacted; the
    order file is those stored places in rising source position, which is what ``argsort``
    of distinct positions gives."""

    WINDOW = 1 << 16  # source positions per bucket, at least (~32 bytes each in memory while one is read)
    MAX_BUCKETS = 256  # open bucket files at most

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="dsconvert-positions-")
        self._where: Dict[int, Tuple[int, int]] = {}  # shard index -> (offset, count), per shard
        self._size = 0
        self.count = 0
        self.largest = -1

    def add(self, shard: int, positions: Sequence[int]) -> None:
        arr = np.asarray(positions, dtype="<i8")
        if arr.size and arr.min() < 0:
            raise ValueError("source positions are never negative")
        os.pwrite(self._file.fileno(), arr.tobytes(), self._size)
        self._where[shard] = (self._size, len(arr))
        self._size += arr.nbytes
        self.count += len(arr)
        if arr.size:
            self.largest = max(self.largest, int(arr.max()))

    def count_of(self, shard: int) -> int:
        """Positions added for ``shard`` (-1: none)."""
        return self._where[shard][1] if shard in self._where else -1

    def positions_of(self, shard: int) -> np.ndarray:
        """The positions added for ``shard``, read back from disk."""
        offset, count = self._where[shard]
        return np.frombuffer(os.pread(self._file.fileno(), 8 * count, offset), dtype="<i8")

    def close(self) -> None:
        self._file.close()

    def write_order(self, out: IO[bytes], shards: Sequence[int]) -> Tuple[int, str]:
        """The order file of the shards ``shards`` (their indexes, in stored order) written to
        ``out``; its (bytes, sha256)."""
        digest = hashlib.sha256()
        written = 0

        def emit(data: bytes) -> None:
            nonlocal written
            out.write(data)
            digest.update(data)
            written += len(data)

        total = sum(self._where[s][1] for s in shards)
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, {"descr": "<i8", "fortran_order": False, "shape": (total,)})
        emit(head.getvalue())
        for chunk in self.order_chunks(shards):
            emit(chunk)
        return written, digest.hexdigest()

    def order_chunks(self, shards: Sequence[int]) -> Iterator[bytes]:
        """The order file's positions (after its header), a bucket's worth at a time: the
        stored places of ``shards``' samples in rising source position. ValueError when a
        source position is stored twice."""
        total = sum(self._where[s][1] for s in shards)
        span = self.largest + 1
        width = max(1, min(span, max(self.WINDOW, -(-span // self.MAX_BUCKETS))))  # a bucket's positions
        buckets = [tempfile.TemporaryFile(prefix="dsconvert-order-", buffering=0)  # no buffer each
                   for _ in range(max(1, -(-span // width)))]
        try:
            place = 0
            for shard in shards:
                values = self.positions_of(shard)
                pairs = np.empty((len(values), 2), dtype="<i8")
                pairs[:, 0] = values
                pairs[:, 1] = np.arange(place, place + len(values), dtype=np.int64)
                place += len(values)
                which = values // width
                for b in np.unique(which).tolist():
                    buckets[b].write(pairs[which == b].tobytes())
            seen = 0
            for b, bucket in enumerate(buckets):
                bucket.flush()
                bucket.seek(0)
                pairs = np.frombuffer(bucket.read(), dtype="<i8").reshape(-1, 2)
                bucket.close()
                window = np.full(width, -1, dtype="<i8")
                window[pairs[:, 0] - b * width] = pairs[:, 1]
                kept = window[window >= 0]
                if len(kept) != len(pairs):
                    raise ValueError("a source position is stored twice")
                seen += len(kept)
                yield kept.tobytes()
            if seen != total:
                raise ValueError("positions lost while writing the order")
        finally:
            for bucket in buckets:
                bucket.close()
