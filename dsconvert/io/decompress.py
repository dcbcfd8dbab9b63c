"""Compressed tars (``.tar.gz``/``.tgz``, ``.tar.zst``, ``.tar.bz2``, ``.tar.xz``) read as byte
ranges of their decompressed stream, never unpacked to disk.

A tar's index names each member's offset in the *decompressed* stream, so a reader asks for
``get(offset, size)`` as it would of a plain tar: :class:`DecompressedBytes` decompresses
forward from where it is and keeps the last 4 MiB it produced (a shuffle window's small steps
back cost nothing). gzip (what ``webdataset.ShardWriter(..., compress=True)`` writes) keeps a
checkpoint every 1 MiB of output as it goes: zlib's decompressor state can be copied (its 32
KiB window and a few kB, 38 kB in all), so a jump back, or ahead over a part read before, costs
at most 1 MiB of inflation (the spacing doubles past 512 checkpoints: 2 MiB for a stream of
over 512 MiB, and so on, so that a stream holds at most about 19 MB of them). zstd, bzip2 and xz
decompressors cannot be copied: a step back further than the kept bytes decompresses from the
start, so those are for reading in order (a conversion, a stream without shuffle) or by
batches in stream order (:class:`SpansRead`).

Every decompressor here is asked for a bounded number of bytes at a time: a few bytes that
declare gigabytes (a decompression bomb) cost only what is read of them.
"""

from __future__ import annotations

import bz2
import lzma
import os
import threading
import zlib
from bisect import bisect_right, insort
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

from ..errors import BadInputError, MissingDependencyError

__all__ = ["compression_of", "DecompressedBytes", "DecompressedFile", "SpansRead", "COMPRESSED_TAR_SUFFIXES",
           "COMPRESSIONS", "TruncatedStream", "CorruptStream"]

# magic numbers -> compression (what tarfile and file(1) go by, not the name)
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
COMPRESSIONS = tuple(kind for _, kind in MAGIC)
COMPRESSED_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tar.bz2", ".tar.xz")
_CHUNK = 1 << 16  # compressed bytes fed at a time
_PIECE = 1 << 20  # decompressed bytes asked for at a time
CHECKPOINT_EVERY = 1 << 20  # decompressed bytes between two gzip checkpoints (at first)
MAX_CHECKPOINTS = 512  # per stream: about 19 MB of decompressor copies at most
KEEP_BEHIND = 4 << 20  # decompressed bytes kept behind the position, for small steps back


def compression_of(head: bytes) -> Optional[str]:
    """``gzip``, ``zstd``, ``bzip2``, ``xz`` from a file's first bytes, or None (a plain tar)."""
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18":
        return "zstd"  # a skippable frame first (pzstd writes one)
    return None


class TruncatedStream(BadInputError):
    """The compressed file ends inside a member (frame, stream): the bytes before are kept."""


class CorruptStream(BadInputError):
    """The compressed data (or its checksum) fails: nothing of the member it is in can be
    trusted; ``verified``: the decompressed bytes before that member, whose checksums passed."""

    def __init__(self, reason: str, verified: int):
        super().__init__(reason)
        self.verified = verified

    def __reduce__(self) -> Any:
        return (CorruptStream, (self.reason, self.verified))


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingDependencyError("zstd-compressed tars need zstandard: pip install 'dsconvert[zstd]'") from None
    return zstandard


class _Stream:
    """The members (gzip), streams (bzip2, xz) or frames (zstd) of a compressed file in a row,
    each through a fresh decompressor, at most ``n`` bytes given a call. A member's checksum is
    checked at its end by the library: an error names the bytes before the member as verified.
    gzip keeps checkpoints where all input so far was fed: (compressed offset, decompressed
    offset, a copy of the decompressor), one per ``every`` bytes of output, for the stream's
    life (about 38 kB each; past ``MAX_CHECKPOINTS`` every other one goes and the spacing doubles)."""

    def __init__(self, raw: IO[bytes], kind: str):
        self.raw = raw
        self.kind = kind
        self.zstd = _zstandard() if kind == "zstd" else None
        self.d = self._new()
        self.tail = b""  # compressed bytes read but not yet given to the decompressor
        self.pending = b""  # zstd output not yet given (its decompressor has no output bound)
        self.fed = 0  # compressed bytes read from raw
        self.out = 0  # decompressed bytes given
        self.started = False  # inside a member (some of its input given)
        self.member = 0  # the decompressed offset where the current member began
        self.every = CHECKPOINT_EVERY
        self.cells: Dict[int, Tuple[int, int, Any]] = {0: (0, 0, self.d.copy())} if kind == "gzip" else {}
        self.outs: List[int] = [0]  # the checkpoints' decompressed offsets, sorted

    def _new(self) -> Any:
        if self.kind == "gzip":
            return zlib.decompressobj(31)
        if self.kind == "bzip2":
            return bz2.BZ2Decompressor()
        if self.kind == "xz":
            return lzma.LZMADecompressor()
        assert self.zstd is not None
        return self.zstd.ZstdDecompressor().decompressobj()

    def _checkpoint(self) -> None:
        cell = self.out // self.every
        if cell in self.cells:
            return
        self.cells[cell] = (self.fed, self.out, self.d.copy())
        insort(self.outs, self.out)
        if len(self.cells) > MAX_CHECKPOINTS:
            self.every *= 2
            thinned: Dict[int, Tuple[int, int, Any]] = {}
            for point in sorted(self.cells.values(), key=lambda c: c[1]):
                thinned.setdefault(point[1] // self.every, point)
            self.cells = thinned
            self.outs = sorted(point[1] for point in thinned.values())

    def _step(self, n: int) -> bytes:
        """One call of the decompressor on the tail: its output (maybe none)."""
        d = self.d
        if self.kind == "gzip":
            out = d.decompress(self.tail, n)
            self.tail = d.unconsumed_tail or (d.unused_data if d.eof else b"")
            return out
        if self.kind == "zstd":  # no output bound: fed 1 KiB at a time, at most ~32 MiB out
            chunk, rest = self.tail[:1024], self.tail[1024:]
            out = d.decompress(chunk)
            self.tail = (d.unused_data + rest) if d.eof else rest
            return out
        # bzip2, xz: the input is taken whole and buffered inside; output comes n bytes a call
        out = d.decompress(self.tail if d.needs_input else b"", n)
        self.tail = d.unused_data if d.eof else b""
        return out

    def read(self, n: int) -> bytes:
        while not self.pending:
            d = self.d
            if d.eof:  # the next member, after any zero padding (gzip, xz allow it)
                rest = self.tail.lstrip(b"\0")
                if not rest:
                    more = self.raw.read(_CHUNK)
                    if not more:
                        return b""
                    self.fed += len(more)
                    self.tail = more
                    continue
                self.d, self.tail, self.started, self.member = self._new(), rest, False, self.out
                continue
            if not self.tail and (self.kind not in ("bzip2", "xz") or d.needs_input):
                if self.started and self.cells:
                    self._checkpoint()
                self.tail = self.raw.read(_CHUNK)
                self.fed += len(self.tail)
                if not self.tail:
                    if self.started:
                        raise TruncatedStream(f"the {self.kind} stream ends before its end (truncated) after "
                                              f"{self.out:,} decompressed bytes")
                    return b""
            try:
                data = self._step(n)
            except (zlib.error, OSError, EOFError, ValueError, lzma.LZMAError) as exc:
                raise CorruptStream(f"not valid {self.kind} data after {self.out:,} decompressed bytes: {exc}",
                                    self.member) from None
            except Exception as exc:  # zstandard.ZstdError derives from Exception only
                if self.zstd is not None and isinstance(exc, self.zstd.ZstdError):
                    raise CorruptStream(f"not valid zstd data after {self.out:,} decompressed bytes: {exc}",
                                        self.member) from None
                raise
            self.started = True
            self.pending = data
        data, self.pending = self.pending[:n], self.pending[n:]
        self.out += len(data)
        return data

    def best(self, offset: int) -> int:
        """The decompressed offset of the last checkpoint at or before ``offset`` (0: the start)."""
        return self.outs[bisect_right(self.outs, offset) - 1]

    def jump(self, offset: int) -> int:
        """To the last checkpoint at or before ``offset`` (back or ahead); returns where it is."""
        at = self.best(offset)
        self.tail, self.pending, self.started = b"", b"", at > 0
        if at:
            fed, out, d = self.cells[at // self.every]
            self.raw.seek(fed)
            self.d, self.fed, self.out = d.copy(), fed, out
            self.member = min(self.member, out)
        else:
            self.raw.seek(0)
            self.d, self.fed, self.out, self.member = self._new(), 0, 0, 0
        return self.out


class DecompressedBytes:
    """``get(offset, size)`` over the decompressed bytes of a compressed file (see the module
    doc). ``opener`` gives the compressed file, seekable, opened anew; a file shorter than a
    span asked for raises BadInputError (the index says more than the stream holds)."""

    def __init__(self, opener: Callable[[], IO[bytes]], kind: str, name: str = ""):
        self.raw = opener()
        self.name = name
        self.kind = kind
        self.opener = opener
        self.pid = os.getpid()
        self.reader = _Stream(self.raw, kind)
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
            if os.getpid() != self.pid:  # a forked DataLoader worker: a file of its own (an offset of its own)
                self.raw, self.pid = self.opener(), os.getpid()
                self.reader, self.base, self.buf = _Stream(self.raw, self.kind), 0, bytearray()
            if offset < self.base or offset - KEEP_BEHIND > self.reader.best(offset) > self.end:
                # back before the kept bytes, or far ahead past a checkpoint: from the checkpoint
                self.rewinds += offset < self.base
                self.base = self.reader.jump(offset)
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
            with memoryview(self.buf) as view:  # one copy (a slice of the bytearray would be a second)
                data = bytes(view[lo: lo + n])
            drop = lo + len(data) - KEEP_BEHIND
            if drop > 0:
                del self.buf[:drop]
                self.base += drop
            return data

    def check_member(self, limit: int) -> Optional[CorruptStream]:
        """Decompress on to the end of the member (frame, stream) it is in, up to ``limit`` bytes,
        to have its checksum checked: the CorruptStream when it fails, else None (also where the
        file ends first, or the member is longer than ``limit``). For a tar whose walk stopped at
        a damaged header: the members before it are in the same member of the stream."""
        with self.lock:
            reader, read = self.reader, 0
            member = reader.member
            try:
                while reader.member == member and read < limit:
                    got = reader.read(_PIECE)
                    if not got:
                        break
                    read += len(got)
            except CorruptStream as exc:
                return exc
            except TruncatedStream:
                pass
            finally:  # where it is now is not where the kept bytes end: start again on the next read
                self.base, self.buf = reader.out, bytearray()
            return None

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
