"""Storage helpers: atomic writes, page-cache eviction for honest cold reads, and what a path
is stored on.

``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` drops a file's clean pages from the page
cache without root (no ``drop_caches`` sysctl). The host may still serve some "cold" reads
from its own cache, so compare cold against warm in one run, not against absolute numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
from typing import IO, Any, Callable, Dict, Iterable, Iterator, Optional, Protocol, Tuple

from ..errors import ManifestError, NotRegularFileError

__all__ = ["open_regular", "regular_size", "SizeBoundedFile", "check_name", "atomic_write", "temp_name",
           "stream_sha256", "file_sha256", "evict_page_cache", "free_bytes", "mount_of", "is_latency_bound",
           "storage_kind", "LATENCY_BOUND_FS"]


TEMP_SUFFIX = ".tmp"


def temp_name(base: str) -> str:
    """The hidden name an atomic write of ``base`` goes through first: ``.BASE.RANDOM.tmp``,
    random so that no two writes share one (two writers in one process, a pid reused)."""
    return f".{base}.{secrets.token_hex(8)}{TEMP_SUFFIX}"


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb", before: Optional[Callable[[str], None]] = None) -> Iterator[IO]:
    """Write ``path`` through a hidden temp file beside it (:func:`temp_name`) that replaces
    ``path`` only when the block succeeds; a crash leaves the old file or none, never half.
    ``before(temp name)`` runs before the temp file is made (an output journals it there, so
    that cleaning up after a kill can prove the file its own). The temp file is created
    exclusively and never through a link: an existing file (or link) of its name is never
    written, nor, on failure, removed."""
    folder, base = os.path.split(path)
    name = temp_name(base)
    tmp = os.path.join(folder, name)
    if before is not None:
        before(name)

    def exclusive(p: str, flags: int) -> int:
        return os.open(p, flags | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)

    f = open(tmp, mode, encoding=None if "b" in mode else "utf-8", opener=exclusive)
    try:
        with f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _regular(path: str, st: os.stat_result) -> os.stat_result:
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path} is not a regular file (a device, FIFO, socket or folder): not read", path)
    return st


def regular_size(path: str) -> int:
    """The size of ``path`` (symlinks followed), refusing anything but a regular file."""
    return _regular(path, os.stat(path)).st_size


def open_regular(path: str, follow: bool = True) -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file, checked on the open descriptor
    (no race with a swap): O_NONBLOCK keeps a FIFO from blocking the open itself. Not
    ``follow``: a symlink is not opened either (ELOOP), as control files never are."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        _regular(path, os.fstat(fd))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class SizeBoundedFile:
    """A read-only file object that never asks for more bytes than the file has left.

    Parsers (tarfile's PAX headers, say) read as many bytes as the data declares; a header
    declaring a terabyte would otherwise allocate one before finding the file is short."""

    def __init__(self, f: IO[bytes], size: int):
        self.f = f
        self.size = size
        self.overrun = 0  # the most bytes a read asked for past the end: data declaring too much

    def read(self, n: Optional[int] = -1) -> bytes:
        left = max(0, self.size - self.f.tell())
        if n is not None and n > left:
            self.overrun = max(self.overrun, n - left)
        return self.f.read(left if n is None or n < 0 else min(n, left))

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


# Every name dsconvert writes into an output: PREFIX-NNNNNN.<suffix>, dsconvert.json, and the
# hidden temp names of atomic writes. Nothing that a protocol could decode into a separator
# (``%2f``), no separators, no query or fragment, no control characters.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}")


def check_name(name: Any, where: str = "") -> str:
    """``name`` if it is a plain file name inside an output, else a ManifestError: names come
    from manifests and records, which may be hostile, and are joined to local paths and URLs."""
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or name in (".", ".."):
        raise ManifestError(f"{where + ': ' if where else ''}{name!r} is not a plain file name of an output "
                            "(letters, digits, '_', '.', '-'; no separators or %-escapes)", where or None)
    return name


class _Readable(Protocol):
    """What stream_sha256 reads from: a binary file, or a :class:`SizeBoundedFile` over one."""

    def read(self, n: int, /) -> bytes: ...


def stream_sha256(f: _Readable, block: int = 1 << 20) -> str:
    """The sha256 of what a binary file object holds from here on, read in blocks (hashlib
    releases the GIL on large ones)."""
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(block), b""):
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    with open_regular(path) as f:
        return stream_sha256(f)


def evict_page_cache(paths: Iterable[str]) -> int:
    """Write back and evict each file's pages; return how many files were evicted."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    done = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)  # dirty pages (a file just written) are not dropped otherwise
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return done


# File systems where every request pays a network (or user-space) round trip: reading them
# with few large sequential requests leaves the latency unhidden, so readers fetch ahead
# with concurrent ranged reads instead of page faults.
LATENCY_BOUND_FS = ("nfs", "nfs4", "ceph", "fuse", "cifs", "smb3", "smbfs", "9p", "glusterfs",
                    "lustre", "beegfs", "gpfs", "afs", "davfs")


def _unescape_mount(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path: str) -> Tuple[str, str]:
    """(mount point, file system type) holding ``path``, from /proc/self/mounts."""
    real = os.path.realpath(path)
    best = ("/", "unknown")
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point, fstype = _unescape_mount(parts[1]), parts[2]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fstype)
    return best


def is_latency_bound(path: str) -> bool:
    fstype = mount_of(path)[1]
    return fstype.split(".")[0] in LATENCY_BOUND_FS or fstype.startswith("fuse")


def free_bytes(path: str) -> int:
    """Bytes an unprivileged user may still write on the file system holding ``path``."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


_KINDS = {"ext2": "local-disk", "ext3": "local-disk", "ext4": "local-disk", "xfs": "local-disk",
          "btrfs": "local-disk", "zfs": "local-disk", "f2fs": "local-disk", "vfat": "local-disk",
          "tmpfs": "tmpfs", "ramfs": "tmpfs", "nfs": "nfs", "nfs4": "nfs", "ceph": "cephfs",
          "overlay": "overlay", "9p": "vm-share", "virtiofs": "vm-share", "cifs": "smb", "smb3": "smb",
          "lustre": "lustre", "gpfs": "gpfs", "beegfs": "beegfs", "glusterfs": "glusterfs"}


def storage_kind(path: str) -> Dict[str, Any]:
    """What ``path`` is stored on: kind (local-disk, tmpfs, nfs, cephfs, fuse, overlay, ...),
    the file system type and mount point from /proc/self/mounts, and whether every request
    pays a round trip (see LATENCY_BOUND_FS)."""
    point, fstype = mount_of(path)
    kind = "fuse" if fstype.startswith("fuse") else _KINDS.get(fstype, fstype)
    return {"kind": kind, "fstype": fstype, "mount": point, "latency_bound": is_latency_bound(path)}
