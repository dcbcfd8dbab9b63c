"""A FUSE passthrough that sleeps in open() and read(), as network storage would, and can cap
the bandwidth of all readers together (a link's or a filer's limit: flat with more readers).

    python tests/support/slowfs.py ROOT MOUNTPOINT --delay-ms 5 [--mb-per-s 150]   # foreground; Ctrl-C or
    fusermount -u MOUNTPOINT                                   # to unmount

Needs `apt-get install -y fuse libfuse2` and `pip install fusepy`. ``mount()`` runs it in a
subprocess for the time of a ``with`` block (this module imports without fusepy; only the
mount process needs it).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

try:
    from fuse import FUSE, FuseOSError, Operations  # type: ignore
except ImportError:  # mount() and the mounting process need it; importing this module does not
    FUSE = FuseOSError = None  # type: ignore
    Operations = object  # type: ignore


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
            raise FuseOSError(exc.errno) from exc
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


@contextlib.contextmanager
def mount(backing: str, mnt: str, delay_ms: float, mb_per_s: float = 0.0, timeout: float = 10.0) -> Iterator[str]:
    """``backing`` seen through the slow passthrough at ``mnt`` (made if missing) for the time of
    the ``with`` block; RuntimeError when the mount does not come up (no FUSE here)."""
    os.makedirs(mnt, exist_ok=True)
    with tempfile.TemporaryFile() as log:  # a file, not a pipe nobody reads while mounted
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), backing, mnt, "--delay-ms",
                                 str(delay_ms), "--mb-per-s", str(mb_per_s)], stderr=log)
        deadline = time.time() + timeout
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                proc.wait()
                log.seek(0)
                err = log.read().decode(errors="replace")[-300:]
                raise RuntimeError(f"FUSE mount failed (apt-get install fuse libfuse2; pip install fusepy): {err}")
            time.sleep(0.05)
        try:
            yield mnt
        finally:
            subprocess.run(["fusermount", "-uz", mnt], check=False)
            proc.wait(timeout=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("mountpoint")
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--mb-per-s", type=float, default=0.0, help="bandwidth of all readers together (0: no cap)")
    args = p.parse_args()
    if FUSE is None:
        sys.exit("fusepy is not installed (pip install fusepy)")
    FUSE(SlowPassthrough(args.root, args.delay_ms / 1000.0, args.mb_per_s * 1e6), args.mountpoint, foreground=True,
         nothreads=False, ro=True)


if __name__ == "__main__":
    main()
