"""A FUSE passthrough that sleeps in open() and read(), as network storage would, and can cap
the bandwidth of all readers together (a link's or a filer's limit: flat with more readers).

    python scripts/slowfs.py ROOT MOUNTPOINT --delay-ms 5 [--mb-per-s 150]   # foreground; Ctrl-C or
    fusermount -u MOUNTPOINT                                   # to unmount

Needs `apt-get install -y fuse libfuse2` and `pip install fusepy`.
"""

from __future__ import annotations

import argparse
import errno
import os
import threading
import time

from fuse import FUSE, FuseOSError, Operations  # type: ignore


class SlowPassthrough(Operations):
    def __init__(self, root: str, delay: float, bytes_per_s: float = 0.0):
        self.root = os.path.realpath(root)
        self.delay = delay
        self.bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the capped link has sent everything asked of it so far

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._full(path))
        except OSError as exc:
            raise FuseOSError(exc.errno)
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                            "st_nlink", "st_size", "st_uid")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._full(path))

    def readlink(self, path):
        return os.readlink(self._full(path))

    def statfs(self, path):
        st = os.statvfs(self._full(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                            "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        time.sleep(self.delay)
        return os.open(self._full(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        time.sleep(self.delay)
        data = os.pread(fh, size, offset)
        if self.bytes_per_s:  # every reader's bytes queue on one link
            with self._lock:
                start = max(time.monotonic(), self._free_at)
                self._free_at = start + len(data) / self.bytes_per_s
                done = self._free_at
            time.sleep(max(0.0, done - time.monotonic()))
        return data

    def release(self, path, fh):
        os.close(fh)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("mountpoint")
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--mb-per-s", type=float, default=0.0, help="bandwidth of all readers together (0: no cap)")
    args = p.parse_args()
    FUSE(SlowPassthrough(args.root, args.delay_ms / 1000.0, args.mb_per_s * 1e6), args.mountpoint, foreground=True,
         nothreads=False, ro=True)


if __name__ == "__main__":
    main()
