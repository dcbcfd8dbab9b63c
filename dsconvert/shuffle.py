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
from typing import Any, List, Sequence

import numpy as np

from .errors import ManifestError

__all__ = ["ORDERS", "shuffled_order", "order_bytes", "load_order", "mapped_order"]

ORDERS = ("auto", "shuffled", "source")  # auto: shuffled for labelled wds outputs (see convert)


def shuffled_order(n: int, seed: int) -> List[int]:
    """A seeded permutation of ``range(n)``: source positions sorted by a keyed BLAKE2b hash of
    each position. Pinned by its definition, not by a library's generator (numpy does not
    promise its streams across versions), so the same source and seed give the same shards
    with any dsconvert, numpy or worker count."""
    key = hashlib.sha256(str(seed).encode()).digest()[:32]
    blake2b = hashlib.blake2b
    digests = b"".join(blake2b(i.to_bytes(8, "little"), digest_size=8, key=key).digest() for i in range(n))
    # big-endian: the integers sort as the digests' bytes do; ties (2**-64 a pair) by position
    return np.argsort(np.frombuffer(digests, dtype=">u8"), kind="stable").tolist()


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
    head = io.BytesIO(bytes(buf[:4096]))
    try:
        version = np.lib.format.read_magic(head)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(head) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(head))
    except Exception as exc:  # ValueError: not a .npy file, or a header numpy refuses
        raise ManifestError(f"{where}: not an order file ({str(exc)[:100]})", where) from None
    if dtype != np.dtype("<i8") or shape != (n,) or (fortran and n > 1):
        raise ManifestError(f"{where}: an order file holds {n} int64 positions, not {dtype} {shape}", where)
    offset = head.tell()
    if len(buf) != offset + 8 * n:
        raise ManifestError(f"{where}: {len(buf):,} bytes, not the {offset + 8 * n:,} of {n} positions", where)
    return np.frombuffer(buf, dtype="<i8", count=n, offset=offset)
