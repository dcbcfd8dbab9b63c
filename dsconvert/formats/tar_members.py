"""Tar members as our shards hold them, built without ``tarfile``'s per-member machinery.

``TarFile.addfile`` cost ~30 us a member (a ``TarInfo`` copied, its info dict, the PAX tests,
every field formatted): for a 1.2 kB JPEG and its label, more than reading and hashing them.
Our members are all alike (a regular file, mode 0444, mtime 0, uid/gid 0, no user or group
names), so a member whose name is ASCII and at most 100 characters and whose size fits the
ustar field (what ``tarfile`` writes as one plain 512-byte header) is built here from a
template: the name, the size and the checksum are all that differ. Any other member (a long
or non-ASCII name, a size past 8 GiB: a PAX record first) takes ``TarInfo.tobuf`` itself, as
``TarFile`` calls it. ``tests/test_tar_members.py`` compares the bytes with ``tarfile``'s.
"""

from __future__ import annotations

import tarfile

__all__ = ["member_header", "padding", "archive_end", "BLOCK", "MODE", "MTIME"]

BLOCK = 512
RECORD = 20 * BLOCK  # tarfile pads an archive to whole records of 20 blocks
MODE = 0o444
MTIME = 0
_BIG = 8 ** 11  # sizes from here on need a PAX record (the ustar field holds 11 octal digits)

# the fixed fields of a plain header, as tarfile's _create_header writes them for our members
_MODE_IDS = b"%07o\0" % MODE + b"0000000\0" * 2  # mode, uid, gid
_MTIME_CHECK_TYPE = b"%011o\0" % MTIME + b" " * 8 + tarfile.REGTYPE  # mtime, checksum placeholder, type
_REST = bytes(100) + tarfile.POSIX_MAGIC + bytes(BLOCK - 265)  # linkname, magic, names, devices, prefix
_FIXED_SUM = sum(_MODE_IDS) + sum(_MTIME_CHECK_TYPE) + sum(_REST)


def member_header(name: str, size: int) -> bytes:
    """The header block(s) ``TarFile.addfile`` writes, in PAX format, for one of our members."""
    if len(name) <= 100 and name.isascii() and 0 <= size < _BIG:
        encoded = name.encode("ascii")
        digits = b"%011o\0" % size
        checksum = _FIXED_SUM + sum(encoded) + sum(digits)
        return b"".join((encoded, bytes(100 - len(encoded)), _MODE_IDS, digits, _MTIME_CHECK_TYPE[:12],
                         b"%06o\0 " % checksum, _MTIME_CHECK_TYPE[20:], _REST))
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, MTIME, MODE
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def padding(size: int) -> bytes:
    """The zeros after a member's data, to a whole block."""
    return bytes(-size % BLOCK)


def archive_end(offset: int) -> bytes:
    """What ``TarFile.close`` appends to an archive of ``offset`` bytes: two zero blocks, then
    zeros to a whole record."""
    end = offset + 2 * BLOCK
    return bytes(2 * BLOCK + (-end % RECORD))

