"""Compressed tars (``.tar.gz``/``.tgz``, ``.tar.zst``, ``.tar.bz2``, ``.tar.xz``) read as byte
ranges of their decompressed stream, never unpacked to disk.

A tar's index names each member's offset in the *decompressed* stream, so a reader asks for
``get(offset, size)`` as it would of a plain tar: :class:`DecompressedBytes` decompresses
forward from where it is, keeps the last few MiB it produced (a shuffle window's small steps
back cost nothing), and for a step further back starts again from the nearest checkpoint.
gzip (what ``webdataset.ShardWriter(..., compress=True)`` writes) keeps a checkpoint every
8 MiB of output: zlib's decompressor state can be copied (it is its 32 KiB window and a few
kB), so a jump anywhere costs at most 8 MiB of inflation. zstd, bzip2 and xz decompressors
cannot be copied: a step back further than the kept bytes decompresses from the start, so
those are for reading in order (a conversion, a stream without shuffle).

Every decompressor here is asked for a bounded number of bytes at a time: a few bytes that
declare gigabytes (a decompression bomb) cost only what is read of them.
"""

from __future__ import annotations

import bz2
import lzma
import threading
import zlib
from bisect import bisect_right
from typing import IO, Any, Callable, List, Optional, Tuple

from ..errors import BadInputError, MissingDependencyError

__all__ = ["compression_of", "DecompressedBytes", "DecompressedFile", "SpansRead", "COMPRESSED_TAR_SUFFIXES",
           "COMPRESSIONS"]

# magic numbers -> compression (what tarfile and file(1) go by, not the name)
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
COMPRESSIONS = tuple(kind for _, kind in MAGIC)
COMPRESSED_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tar.bz2", ".tar.xz")
_CHUNK = 1 << 16  # compressed bytes fed at a time
_PIECE = 1 << 20  # decompressed bytes asked for at a time
CHECKPOINT_EVERY = 8 << 20  # decompressed bytes between two gzip checkpoints
KEEP_BEHIND = 4 << 20  # decompressed bytes kept behind the position, for small steps back


def compression_of(head: bytes) -> Optional[str]:
    """``gzip``, ``zstd``, ``bzip2``, ``xz`` from a file's first bytes, or None (a plain tar)."""
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    return None


class _Gzip:
    """gzip members inflated by zlib, at most ``n`` bytes a call, with checkpoints: (compressed
    offset, decompressed offset, a copy of the decompressor) where all input so far was fed."""

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.d = zlib.decompressobj(31)
        self.tail = b""  # compressed bytes read but not yet consumed
        self.fed = 0  # compressed bytes read from raw
        self.out = 0  # decompressed bytes given
        self.started = False  # inside a member (its header seen)
        self.checkpoints: List[Tuple[int, int, Any]] = [(0, 0, self.d.copy())]

    def read(self, n: int) -> bytes:
        while True:
            if not self.tail:
                if self.started and not self.d.eof and self.out - self.checkpoints[-1][1] >= CHECKPOINT_EVERY:
                    self.checkpoints.append((self.fed, self.out, self.d.copy()))
                self.tail = self.raw.read(_CHUNK)
                self.fed += len(self.tail)
                if not self.tail:
                    if self.started and not self.d.eof:
                        raise BadInputError("the gzip stream ends before its end (truncated)")
                    return b""
            if self.d.eof:  # the next member (gzip allows several), after any zero padding
                rest = self.tail.lstrip(b"\0")
                if not rest:
                    self.tail = b""
                    continue
                self.d = zlib.decompressobj(31)
                self.tail = rest
            try:
                data = self.d.decompress(self.tail, n)
            except zlib.error as exc:
                raise BadInputError(f"not valid gzip data after {self.out:,} decompressed bytes: {exc}") from None
            self.started = True
            self.tail = self.d.unconsumed_tail or (self.d.unused_data if self.d.eof else b"")
            if data:
                self.out += len(data)
                return data

    def rewind(self, offset: int) -> int:
        """Back to the last checkpoint at or before ``offset``; returns its decompressed offset."""
        i = bisect_right([p for _, p, _ in self.checkpoints], offset) - 1
        fed, out, d = self.checkpoints[i]
        self.raw.seek(fed)
        self.d, self.tail, self.fed, self.out = d.copy(), b"", fed, out
        self.started = out > 0
        del self.checkpoints[i + 1:]  # made again on the way forward (the same ones)
        return out


class _Library:
    """zstd, bzip2 and xz through their libraries' readers (bounded reads, several frames or
    streams in a row); no checkpoints: a rewind decompresses from the start."""

    def __init__(self, raw: IO[bytes], kind: str):
        self.raw = raw
        self.kind = kind
        self.f = self._open()

    def _open(self) -> Any:
        if self.kind == "bzip2":
            return bz2.BZ2File(self.raw)
        if self.kind == "xz":
            return lzma.LZMAFile(self.raw)
        try:
            import zstandard
        except ImportError:
            raise MissingDependencyError("zstd-compressed tars need zstandard: pip install 'dsconvert[zstd]'") from None
        return zstandard.ZstdDecompressor().stream_reader(self.raw, read_across_frames=True, closefd=False)

    def read(self, n: int) -> bytes:
        try:
            return self.f.read(n)
        except (EOFError, OSError, ValueError, lzma.LZMAError) as exc:
            raise BadInputError(f"not valid {self.kind} data: {exc}") from None
        except Exception as exc:  # zstandard.ZstdError derives from Exception only
            if type(exc).__name__ == "ZstdError":
                raise BadInputError(f"not valid {self.kind} data: {exc}") from None
            raise

    def rewind(self, offset: int) -> int:
        self.raw.seek(0)
        self.f = self._open()
        return 0


class DecompressedBytes:
    """``get(offset, size)`` over the decompressed bytes of a compressed file (see the module
    doc). ``opener`` gives the compressed file, seekable, opened anew; a file shorter than a
    span asked for raises BadInputError (the index says more than the stream holds)."""

    def __init__(self, opener: Callable[[], IO[bytes]], kind: str, name: str = ""):
        self.raw = opener()
        self.name = name
        self.kind = kind
        self.reader: Any = _Gzip(self.raw) if kind == "gzip" else _Library(self.raw, kind)
        self.base = 0  # decompressed offset of buf[0]
        self.buf = bytearray()  # decompressed bytes [base, base + len(buf))
        self.rewinds = 0  # times it went back (a measure of the access order's cost)
        self.lock = threading.Lock()

    @property
    def end(self) -> int:
        """Decompressed bytes produced so far."""
        return self.base + len(self.buf)

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset``: fewer only where the stream ends."""
        with self.lock:
            if offset < self.base:
                self.rewinds += 1
                self.base = self.reader.rewind(offset)
                self.buf = bytearray()
            while self.end < offset - KEEP_BEHIND:  # far ahead: read past without keeping
                got = self.reader.read(min(_PIECE, offset - KEEP_BEHIND - self.end))
                if not got:
                    return b""
                self.base += len(self.buf) + len(got)
                self.buf = bytearray()
            while self.end < offset + n:
                got = self.reader.read(max(_PIECE, min(offset + n - self.end, 64 << 20)))
                if not got:
                    break
                self.buf += got
            lo = offset - self.base
            data = bytes(self.buf[lo: lo + n])
            drop = lo + len(data) - KEEP_BEHIND
            if drop > 0:
                del self.buf[:drop]
                self.base += drop
            return data

    def get(self, offset: int, size: int) -> bytes:
        """Exactly the bytes [offset, offset + size), or BadInputError where the stream is shorter."""
        data = self.read_at(offset, size)
        if len(data) != size:
            raise BadInputError(f"{self.name}: the decompressed stream ends before bytes {offset:,}-{offset + size:,} "
                                "that its index names (truncated, or changed since it was indexed)")
        return data

    def close(self) -> None:
        self.buf = bytearray()
        self.raw.close()


class DecompressedFile:
    """A read/seek/tell file object over :class:`DecompressedBytes`, for ``tarfile`` (indexing
    a compressed tar by walking its headers, as a plain one is); ``total`` after ``read_to_end``."""

    def __init__(self, source: DecompressedBytes):
        self.source = source
        self.pos = 0

    def read(self, n: Optional[int] = -1) -> bytes:
        if n is None or n < 0:
            raise ValueError("read() of a whole decompressed stream: give a size")
        data = self.source.read_at(self.pos, n)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset += self.pos
        elif whence != 0:
            raise ValueError("a decompressed stream seeks from its start or its position only")
        self.pos = offset
        return offset

    def tell(self) -> int:
        return self.pos


class SpansRead:
    """The spans a reader asked for at once (a batch, a group of a stream), read now from a
    shared :class:`DecompressedBytes` in stream order, whatever order they were asked in; the
    ``get``/``close`` of :class:`dsconvert.io.ranges.ScatteredBytes` (close leaves the stream open)."""

    def __init__(self, source: DecompressedBytes, spans: List[Tuple[int, int]]):
        self.got = {span: source.get(*span) for span in sorted(set(spans))}

    def get(self, offset: int, size: int) -> bytes:
        return self.got[(offset, size)]

    def close(self) -> None:
        self.got = {}
