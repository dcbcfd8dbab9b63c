"""Plain tar headers walked in bulk, for indexing foreign tars at millions of members.

``tarfile`` costs ~35 us a member to walk (a 512-byte read, ``TarInfo.frombuf`` parsing every
field, ``_proc_member``): 20M members of a 10M-sample LAION-style folder took over 15 minutes of
one core, the whole of a conversion's scan. Almost every member such tars hold is *plain*: a
regular file ('0' or NUL type), every numeric field plain octal, the checksum right, no PAX or
GNU extension around it. :class:`PlainHeaders` reads the tar a megabyte at a time and walks
runs of plain headers there (the name, the size and the data offset are all a scan needs),
checking their checksums for the whole run at once with numpy. It never decides anything
``tarfile`` would decide differently: at the first header it cannot take as plain (an
extension, a link, a zero block, a bad checksum, a field ``tarfile`` parses some other way, a
header past the file's end) it stops, and the caller lets ``tarfile`` read that member (and
every member after a global PAX header, which changes how later ones read). A plain header is
accepted only where ``TarInfo.frombuf`` gives the same name, size and type, so the index is
the same either way (``tests/test_tar_walk.py`` compares both walks over hostile tars).
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Tuple

import numpy as np

__all__ = ["PlainHeaders", "PlainMember"]

BLOCK = 512
CHUNK = 1 << 20  # bytes read at a time (a multiple of BLOCK)
# a numeric field tarfile's nti reads as plain octal: spaces, octal digits, spaces, then a NUL
# and anything (nts cuts at the first NUL); base-256, signs, inner spaces and the rest go to tarfile
_OCTAL = re.compile(rb" *[0-7]* *(?:\0.*)?", re.S)
# (start, end) of the numeric fields TarInfo.frombuf parses: mode, uid, gid, size, mtime, chksum,
# devmajor, devminor
_NUMERIC = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337), (337, 345))
_PLAIN_TYPES = (ord("0"), 0)  # REGTYPE, AREGTYPE
# the fields as tarfile, GNU tar and webdataset write them (zero-padded octal, a NUL; the checksum
# six digits, a NUL, a space): a strict subset of the above, checked in two matches
_USUAL = re.compile(rb"[0-7]{7}\0[0-7]{7}\0[0-7]{7}\0[0-7]{11}\0[0-7]{11}\0[0-7]{6}\0 ")  # bytes 100-156
_USUAL_DEVICES = re.compile(rb"(?:[0-7]{7}\0|\0{8}){2}")  # bytes 329-345


class PlainMember:
    """What a scan reads of a plain member (the parts of ``tarfile.TarInfo`` it uses)."""

    __slots__ = ("name", "size", "offset_data")

    def __init__(self, name: str, size: int, offset_data: int):
        self.name, self.size, self.offset_data = name, size, offset_data

    def isdir(self) -> bool:
        return False

    def isreg(self) -> bool:
        return True

    def issparse(self) -> bool:
        return False

    @property
    def next_offset(self) -> int:
        """Where the next header is (the data rounded up to whole blocks)."""
        return self.offset_data + -(-self.size // BLOCK) * BLOCK


def _octal(block: bytes, start: int, end: int) -> Optional[int]:
    """tarfile's ``nti`` of a plain octal field, or None where tarfile would read it otherwise."""
    if _OCTAL.fullmatch(block, start, end) is None:
        return None
    cut = block.find(b"\0", start, end)
    text = block[start: end if cut < 0 else cut].strip()
    return int(text, 8) if text else 0


class PlainHeaders:
    """Runs of plain members read from ``f`` (seekable, ``size`` bytes), names decoded as the
    ``TarFile`` that reads the rest decodes them (``encoding``, ``errors``)."""

    def __init__(self, f: Any, size: int, encoding: str, errors: str):
        self.f, self.size, self.encoding, self.errors = f, size, encoding, errors
        self.start, self.buf = 0, b""  # the bytes held: [start, start + len(buf))

    def _fill(self, offset: int) -> None:
        """Hold the bytes from ``offset`` (block-aligned) on, a chunk of them."""
        self.f.seek(offset)
        self.start, self.buf = offset, self.f.read(min(CHUNK, max(0, self.size - offset)))

    def held(self, offset: int, n: int) -> Optional[bytes]:
        """``n`` bytes at ``offset`` where the chunk held holds them (a label member), else None."""
        at = offset - self.start
        return self.buf[at: at + n] if 0 <= at and at + n <= len(self.buf) else None

    def run(self, offset: int) -> List[PlainMember]:
        """The plain members from ``offset`` on, as many as the next chunk holds (their data may
        end past it); empty where the header at ``offset`` is not plain (tarfile reads it)."""
        if offset % BLOCK or offset + BLOCK > self.size:
            return []
        if not self.start <= offset or offset + BLOCK > self.start + len(self.buf):
            self._fill(offset)
        buf, base = self.buf, self.start
        found: List[Tuple[int, str, int, int]] = []  # (block index in buf, name, size, checksum field)
        at = offset - base
        while at + BLOCK <= len(buf) and base + at + BLOCK <= self.size:
            member = self._plain(buf, at, base)
            if member is None:
                break
            found.append(member)
            at += BLOCK + -(-member[2] // BLOCK) * BLOCK
        if not found:
            return []
        blocks = np.frombuffer(buf, dtype=np.uint8, count=len(buf) // BLOCK * BLOCK).reshape(-1, BLOCK)
        rows = blocks[np.fromiter((m[0] for m in found), dtype=np.int64, count=len(found))]
        # tarfile's unsigned checksum: every byte, the checksum field counted as eight spaces
        sums = rows.sum(axis=1, dtype=np.int64) - rows[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * 32
        wrong = np.flatnonzero(sums != np.fromiter((m[3] for m in found), dtype=np.int64, count=len(found)))
        if len(wrong):  # tarfile reads the first wrong one (it may take the signed sum, or stop there)
            found = found[: int(wrong[0])]
        return [PlainMember(name, size, base + row * BLOCK + BLOCK) for row, name, size, _ in found]

    def _plain(self, buf: bytes, at: int, base: int) -> Optional[Tuple[int, str, int, int]]:
        """(block index, name, size, checksum field) of the header at ``buf[at:]`` when it is
        plain (its checksum still to check), else None."""
        if buf[at + 156] not in _PLAIN_TYPES:
            return None
        if _USUAL.fullmatch(buf, at + 100, at + 156) and _USUAL_DEVICES.fullmatch(buf, at + 329, at + 345):
            size, checksum = int(buf[at + 124: at + 135], 8), int(buf[at + 148: at + 154], 8)
        else:  # each field as tarfile's nti reads it, or tarfile reads the member
            values = []
            for start, end in _NUMERIC:
                value = _octal(buf, at + start, at + end)
                if value is None:
                    return None
                values.append(value)
            size, checksum = values[3], values[5]
        name_end = buf.find(b"\0", at, at + 100)
        name = buf[at: at + 100 if name_end < 0 else name_end].decode(self.encoding, self.errors)
        prefix_end = buf.find(b"\0", at + 345, at + 500)
        prefix = buf[at + 345: at + 500 if prefix_end < 0 else prefix_end]
        if prefix:  # tarfile joins a ustar prefix to the name (GNU tar's atime there too: the same bytes)
            name = prefix.decode(self.encoding, self.errors) + "/" + name
        if not name or name.endswith("/") or base + at + BLOCK + size > self.size:
            return None  # a directory (tarfile's V7 rule) or data past the end: tarfile says what it is
        return at // BLOCK, name, size, checksum
