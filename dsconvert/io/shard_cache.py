"""Reaching shards from a reader: the file itself, a verified copy on local SSD, or ranges.

``ShardAccess`` is what a Dataset holds (it pickles into DataLoader workers): for each shard
it gives a local path when there is one (a local output, or a cached copy) and otherwise
lets the reader fetch byte ranges of the remote object concurrently.

``ShardCache`` keeps whole shards on local disk on first use, for outputs on object stores
or network file systems, fetched through fsspec. It is not fsspec's ``simplecache``, which
downloads under the final name (a killed download leaves a short file that is then served
as if whole); a cache shared by training processes needs:

* downloads to a temp name, checked against the manifest's size and sha256 (shards, and
  their index and samples table where the manifest lists them in ``parts``), then renamed;
* a lock per file (``flock``, :mod:`dsconvert.io.locks`), so that concurrent DataLoader
  workers and ranks never read a half-downloaded shard and download each shard once
  (``simplecache`` writes the download under its final name);
* verification: a shard's copy is hashed once against the manifest's sha256 and size, and a
  ``.sha256`` marker records the result and the version of the copy it checked (inode, size,
  mtime, ctime); a copy changed since (written in place, cut short) is hashed again, and a
  mismatch (a re-converted output, a bad transfer, a damaged disk) downloads it again; a second
  mismatch is a ManifestError;
* a size cap with least-recently-used eviction (each use touches the copy's marker), under an
  exclusive lock that downloads hold shared, so nothing being fetched or verified is
  removed. A copy another process has memory-mapped stays readable after its removal (the
  kernel keeps it until it is unmapped).

Locks are taken only when something will be written (a download, a marker, a kept manifest):
a copy already verified (its marker names the sha256 the manifest gives, its size matches) is
handed out without one, since every copy under its final name is whole (renamed into place
after its check). So a cache on a read-only file system (or one this user may not write)
reads, online and offline; only what it lacks fails, in one line naming the copy.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import mmap
import os
import queue
import shutil
import stat
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

from ..errors import ManifestError, OptionError
from ..units import parse_size
from .localfs import check_name, file_sha256, open_regular, regular_size
from .location import Location, filesystem, is_remote
from .locks import file_lock

if TYPE_CHECKING:  # an entry is only read here (name, sha256, bytes): the manifest stands a floor above
    from ..manifest import ShardEntry

__all__ = ["ShardCache", "ShardAccess"]

MARKER = ".sha256"
# local files whose sha256 this process checked: path -> (device, inode, size, mtime_ns, ctime_ns,
# sha256); ctime too, which no one can set back (os.utime restores an mtime, not a ctime)
_hashed: Dict[str, Tuple[int, int, int, int, int, str]] = {}


_counting = threading.Lock()  # guards ShardCache's download counts; new in a forked child (below)


def _new_counting_lock() -> None:
    """A forked child's own lock: a background fetch of the parent may have held it at the fork."""
    global _counting
    _counting = threading.Lock()


os.register_at_fork(after_in_child=_new_counting_lock)


def _write_marker(local: str, sha256: str, version: str = "") -> None:
    """The marker beside a copy: the sha256 it was checked against and, for shard copies, the
    version of the file that was checked (:func:`_version`)."""
    with open(local + MARKER + ".tmp", "w", encoding="ascii") as f:
        f.write(f"{sha256} {version}".strip())
    os.replace(local + MARKER + ".tmp", local + MARKER)


def _version(st: os.stat_result) -> str:
    """A copy's version as its marker records it: inode, size, mtime and ctime in ns. A write
    into the copy changes its mtime and ctime (and no one can set a ctime back), so a copy
    changed in place after its check no longer matches its marker and is hashed again; the LRU
    stamp goes on the marker, never on the copy, so that using a copy leaves its version alone."""
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _marked(local: str) -> Tuple[str, str]:
    """(sha256, version) a copy's marker names; version "" in markers of earlier releases
    (a copy then trusted by its sha256 alone, as they were)."""
    sha256, _, version = _read_text(local + MARKER).partition(" ")
    return sha256, version


def _matches(local: str, st: os.stat_result, sha256: str) -> bool:
    marked, version = _marked(local)
    return marked == sha256 and (not version or version == _version(st))


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _unwritable(exc: OSError) -> bool:
    """Whether ``exc`` says the cache cannot be written here (a read-only file system, or
    files this user may not write)."""
    return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def _verified(local: str, sha256: Optional[str], size: Optional[int]) -> bool:
    """Whether ``local`` is a regular file of ``size`` whose marker names ``sha256`` (a copy
    checked against it), read without writing or locking anything."""
    try:
        st = os.stat(local)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
        return False
    return sha256 is None or _matches(local, st, sha256)


def _touch(local: str) -> bool:
    """Stamp a copy as just used (LRU), on its marker (the copy's own times are its version);
    False if it was removed meanwhile (evicted). A cache that cannot be written keeps its stamps."""
    try:
        os.utime(local + MARKER if os.path.exists(local + MARKER) else local)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if not _unwritable(exc):
            raise
    return True


def _read_kept(local: str) -> Optional[Tuple[bytes, str]]:
    try:
        with open_regular(local) as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return data, _read_text(local + MARKER)


class ShardCache:
    """Whole files of remote (or network-mounted) outputs on local disk; see the module doc.

    ``max_bytes``: the cap (an int or a size such as ``"500GB"``); None for no cap."""

    def __init__(self, cache_dir: str, max_bytes: Union[int, str, None] = None,
                 storage_options: Optional[Dict[str, Any]] = None):
        self.dir = os.path.abspath(cache_dir)
        self.files = os.path.join(self.dir, "files")
        self.locks = os.path.join(self.dir, "locks")
        self.max_bytes = parse_size(max_bytes) if isinstance(max_bytes, str) else max_bytes
        if self.max_bytes is not None and self.max_bytes < 1:
            raise OptionError(f"the cache size cap must be positive, not {max_bytes!r}")
        self.storage_options = dict(storage_options or {})
        self.downloads = 0  # files fetched (and verified) by this instance, for reports
        self.downloaded_bytes = 0
        try:
            os.makedirs(self.files, exist_ok=True)
            os.makedirs(self.locks, exist_ok=True)
        except OSError as exc:
            if not (_unwritable(exc) and os.path.isdir(self.files)):
                raise  # a read-only cache that holds copies reads them; one that holds nothing cannot

    def _lock_path(self, url: str) -> str:
        return os.path.join(self.locks, hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:40])

    def _local_path(self, url: str) -> str:
        digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:40]
        return os.path.join(self.files, f"{digest}-{check_name(url.rsplit('/', 1)[-1], url)}")

    def _download(self, url: str, local: str, sha256: Optional[str], size: Optional[int]) -> None:
        """Fetch ``url`` to a temp name beside ``local``, check it, and only then rename it into
        place: a process killed mid-download leaves a temp file, never a short copy under the
        final name (fsspec's simplecache writes the final name directly). Caller holds the
        file's lock."""
        for stale in glob.glob(glob.escape(local) + ".*.tmp"):  # left by a killed download
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)
        tmp = f"{local}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            for attempt in range(2):
                if is_remote(url):
                    fs, path = filesystem(url, self.storage_options)
                    fs.get_file(path, tmp)
                else:
                    with open_regular(url) as src, open(tmp, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)  # 1 MB: a thread keeps what it last freed
                if (size is None or os.path.getsize(tmp) == size) and (sha256 is None or file_sha256(tmp) == sha256):
                    break
                if attempt:
                    raise ManifestError(f"{url}: its bytes do not match the manifest's sha256 even after a second "
                                        "download: the output changed while being read, or the store returns bad data",
                                        url)
            os.replace(tmp, local)  # checked before the rename: a copy in place is always a checked one
            if sha256 is not None:  # after it, with the version renamed into place (a rename sets the ctime)
                _write_marker(local, sha256, _version(os.stat(local)))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)

    def _unwritable_here(self, exc: OSError) -> bool:
        return _unwritable(exc) or (exc.errno == errno.ENOENT and not os.path.isdir(self.locks))

    def get(self, url: str, sha256: Optional[str] = None, size: Optional[int] = None,
            refresh: bool = False, counted: bool = True) -> str:
        """A local path holding ``url``'s bytes, fetched on first use; with ``sha256`` (and
        ``size``) verified against them. ``refresh`` fetches it again (a stale copy).
        ``counted``: whether a fetch counts in ``downloads`` (shards do; their small files not).
        A verified copy is handed out without a lock (the module doc)."""
        local = self._get(url, sha256, size, refresh, counted, wait=True)
        assert local is not None
        return local

    def fetch_unless_busy(self, url: str, sha256: Optional[str] = None, size: Optional[int] = None,
                          counted: bool = True) -> bool:
        """Fetch ``url`` as :meth:`get` does, unless another thread or process holds its lock
        (fetching it now): then return False at once instead of waiting for that download, so
        that a fetch-ahead thread goes on to a file nobody fetches (one download per file
        across workers and ranks, none of them idle behind another's)."""
        return self._get(url, sha256, size, False, counted, wait=False) is not None

    def _get(self, url: str, sha256: Optional[str], size: Optional[int], refresh: bool, counted: bool,
             wait: bool) -> Optional[str]:
        local = self._local_path(url)
        if not refresh and _verified(local, sha256, size) and _touch(local):
            return local
        fetched = False
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(file_lock(os.path.join(self.dir, "evict.lock"), shared=True))
                if not held.enter_context(file_lock(self._lock_path(url), wait=wait)):
                    return None  # another is fetching it (wait=False)
            except OSError as exc:
                if not self._unwritable_here(exc):
                    raise
                if not refresh and self._present(local, sha256, size, record=False):
                    return local  # a copy never marked, checked now (a read-only cache cannot record it)
                raise OSError(exc.errno, f"the cache {self.dir} cannot be written ({os.strerror(exc.errno or 0)}) "
                                         f"and holds no verified copy of {url}: fill it where it is writable "
                                         "(dsconvert cache), or read without cache_dir") from None
            present = not refresh and self._present(local, sha256, size)
            if not present:
                self._remove(local)
                self._download(url, local, sha256, size)
                fetched = True
            _touch(local)  # the LRU stamp
        if fetched and counted:
            with _counting:
                self.downloads += 1
                self.downloaded_bytes += os.path.getsize(local)
        if fetched and self.max_bytes is not None and self.usage()[1] > self.max_bytes:
            # looked at without the lock first: evict's exclusive lock waits until no download
            # anywhere holds it shared, so taking it after every fetch would make each download
            # wait for all the others (the last to finish sees every copy, and evicts)
            self.evict(keep=local)
        return local

    @staticmethod
    def _present(local: str, sha256: Optional[str], size: Optional[int], record: bool = True) -> bool:
        """Whether the copy ``local`` is there and, with ``sha256``, checked against it (hashed
        now when its marker names another digest or none, and the result marked if ``record``).
        Caller holds the file's lock, or the cache cannot be written."""
        try:  # a copy of another size than the manifest's is not it, whatever its marker says (cut short)
            present = size is None or os.path.getsize(local) == size
        except FileNotFoundError:
            present = False
        if present and sha256 is not None and not _matches(local, os.stat(local), sha256):
            # a copy checked against another digest (the output was rewritten), never checked, or changed since
            st = os.stat(local)
            present = (size is None or st.st_size == size) and file_sha256(local) == sha256
            if present and record:
                _write_marker(local, sha256, _version(st))
        return present

    def holds(self, url: str, sha256: Optional[str] = None, size: Optional[int] = None) -> bool:
        """Whether ``url``'s copy is in the cache (with ``sha256``, checked against it), without
        fetching anything: what a read with the remote unreachable can count on."""
        local = self._local_path(url)
        if _verified(local, sha256, size):
            return True
        try:
            if size is not None and regular_size(local) != size:
                return False
        except OSError:  # not there, or not a regular file
            return False
        try:
            with file_lock(os.path.join(self.dir, "evict.lock"), shared=True), file_lock(self._lock_path(url)):
                return self._present(local, sha256, size)
        except OSError as exc:
            if not self._unwritable_here(exc):
                raise
            return self._present(local, sha256, size, record=False)

    def _kept_path(self, url: str) -> str:
        digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:40]
        return os.path.join(self.dir, "kept", f"{digest}-{check_name(url.rsplit('/', 1)[-1], url)}")

    def keep(self, url: str, data: bytes) -> None:
        """Keep ``data``, the bytes just read of ``url`` (an output's manifest), as the cache's
        copy of it, with its own sha256 beside it, replacing an older one; never evicted. The
        copy is what :meth:`kept` gives when ``url`` cannot be reached."""
        local = self._kept_path(url)
        digest = hashlib.sha256(data).hexdigest()
        if _read_text(local + MARKER) == digest and os.path.exists(local):
            return  # kept already: nothing to write (a read-only cache opens online too)
        try:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with file_lock(self._lock_path(url)):
                self._keep(local, digest, data)
        except OSError as exc:
            if not self._unwritable_here(exc):
                raise
            # a cache that cannot be written keeps the copy it has: read offline, that copy and
            # the shards it names (verified as ever) are what the cache holds

    @staticmethod
    def _keep(local: str, digest: str, data: bytes) -> None:
        """Write the kept copy and its marker; the caller holds the file's lock."""
        if _read_text(local + MARKER) == digest and os.path.exists(local):
            return
        tmp = f"{local}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            # the marker first: a crash between the two leaves copy and marker disagreeing, a
            # copy :meth:`kept` refuses (and the next read of ``url`` replaces)
            _write_marker(local, digest)
            os.replace(tmp, local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)

    def kept(self, url: str) -> Optional[bytes]:
        """The copy of ``url`` that :meth:`keep` made, checked against its sha256; None when
        there is none. A copy that does not match its sha256 (edited, or cut short) is never
        handed out: ManifestError."""
        local = self._kept_path(url)
        try:
            with file_lock(self._lock_path(url)):
                found = _read_kept(local)
        except OSError as exc:
            if not self._unwritable_here(exc):
                raise
            found = _read_kept(local)  # nothing can write a read-only cache meanwhile
        if found is None:
            return None
        data, digest = found
        if hashlib.sha256(data).hexdigest() != digest:
            raise ManifestError(f"{local}: the cache's copy of {url} does not match its sha256 (edited or damaged): "
                                f"not trusted; remove it, and read {url} once while it is reachable", local)
        return data

    @staticmethod
    def _remove(local: str) -> None:
        for path in (local, local + MARKER):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def usage(self) -> Tuple[int, int]:
        """(files, bytes) in the cache."""
        n = total = 0
        for entry in os.scandir(self.files):
            if entry.is_file() and not entry.name.endswith((MARKER, ".tmp")):
                n += 1
                total += entry.stat().st_size
        return n, total

    def evict(self, keep: Optional[str] = None) -> int:
        """Remove least-recently-used copies until the cache fits its cap; return how many.
        Waits until no process is fetching or verifying (they hold the lock shared)."""
        if self.max_bytes is None:
            return 0
        with file_lock(os.path.join(self.dir, "evict.lock")):
            entries = []
            for entry in os.scandir(self.files):
                if entry.is_file() and not entry.name.endswith((MARKER, ".tmp")):
                    st = entry.stat()
                    try:  # the LRU stamp is on the marker (a copy without one: its own time)
                        used = os.stat(entry.path + MARKER).st_mtime
                    except FileNotFoundError:
                        used = st.st_mtime
                    entries.append((used, st.st_size, entry.path))
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, path in sorted(entries):
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                self._remove(path)
                total -= size
                removed += 1
            return removed


class ShardAccess:
    """Where a reader finds a shard's bytes; picklable into DataLoader workers. ``compressed``:
    shards are read through decompressed streams (compressed tars another tool wrote), so
    readers ask for a batch's or group's samples at once, read in stream order."""

    compressed = False

    def __init__(self, root: str, storage_options: Optional[Dict[str, Any]] = None,
                 cache_dir: Optional[str] = None, cache_size: Union[int, str, None] = None):
        self.location = Location(root, storage_options)
        self.cache = ShardCache(cache_dir, cache_size, storage_options) if cache_dir else None

    @property
    def remote(self) -> bool:
        return self.location.remote

    def url_of(self, name: str) -> str:
        return self.location.url_of(name)

    def file_bytes(self, name: str, part: Optional[Dict[str, Any]] = None, refresh: bool = False) -> bytes:
        """A small file of the output (an index, a samples table), through the cache if any;
        with ``part`` (the manifest's {bytes, sha256} of it) checked against it."""
        want = (part or {}).get("sha256")
        if self.cache is not None:  # the cache checks a copy against ``want`` before it hands it out
            with open_regular(self.cache.get(self.url_of(name), want, (part or {}).get("bytes"),
                                             refresh=refresh, counted=False)) as f:
                return f.read()
        data = self.location.read_bytes(name)
        if want is not None and hashlib.sha256(data).hexdigest() != want:
            raise ManifestError(f"{self.url_of(name)}: its sha256 differs from the manifest's (was the output "
                                "rewritten while being read?)", self.url_of(name))
        return data

    def mapped_file(self, name: str, part: Optional[Dict[str, Any]] = None) -> Any:
        """A file of the output (a shard's binary record, the order file) as a read-only memory
        map where it is local (the output, or the cache's checked copy), else its bytes; with
        ``part`` checked against the manifest's {bytes, sha256}. A map's pages are the page
        cache's, shared by every process that maps the file: nothing is copied per process.

        The sha256 of a local file is taken once per process and file version (device, inode,
        size, mtime, ctime): reopening it (a reader's bounded set of open shards evicts and reopens)
        costs an ``fstat``, not a hash."""
        want = (part or {}).get("sha256")
        if self.cache is not None:
            path: Optional[str] = self.cache.get(self.url_of(name), want, (part or {}).get("bytes"), counted=False)
        else:
            path = self.location.local_path(name)
        if path is None:
            return self.file_bytes(name, part)
        try:
            f = open_regular(path)
        except FileNotFoundError:
            raise ManifestError(f"{self.url_of(name)} is gone since the output was opened (was the output rewritten "
                                "or upgraded while being read?): open it again", self.url_of(name)) from None
        with f:
            st = os.fstat(f.fileno())
            if part is not None and st.st_size != part.get("bytes", st.st_size):
                raise ManifestError(f"{self.url_of(name)}: {st.st_size:,} bytes, the manifest says {part['bytes']:,} "
                                    "(was the output rewritten while being read?)", self.url_of(name))
            if not st.st_size:
                return b""
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if want is not None and self.cache is None:
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, want)
            if _hashed.get(path) != identity:
                if hashlib.sha256(mm).hexdigest() != want:
                    mm.close()
                    raise ManifestError(f"{self.url_of(name)}: its sha256 differs from the manifest's (was the output "
                                        "rewritten while being read?)", self.url_of(name))
                _hashed[path] = identity
                if hasattr(mmap, "MADV_DONTNEED"):  # the hash touched every page: unmapped here (the page cache
                    mm.madvise(mmap.MADV_DONTNEED)  # keeps them), or a 10M order file stayed 80 MB in this process
        return mm

    def local_shard(self, entry: ShardEntry) -> Optional[str]:
        """A local path with the shard's bytes (verified against the manifest when cached), or
        None when it is only reachable remotely. Only a regular file is handed out (a symlink to
        ``/dev/zero`` or a FIFO would never end, or block)."""
        if self.cache is not None:
            return self.cache.get(self.url_of(entry.name), entry.sha256, entry.bytes)
        path = self.location.local_path(entry.name)
        if path is not None:
            regular_size(path)
        return path

    def fetch_ahead(self, files: Sequence[Tuple[str, Optional[str], Optional[int], bool]], threads: int = 64) -> None:
        """Fetch ``files`` ((name, sha256, bytes, counted) each) into the cache in ``threads``
        background threads (by default as many as an S3 client's pool, :data:`dsconvert.io.location.POOL`), in
        the order given, while the caller goes on: a shuffled first
        epoch, whose first batches touch every shard, then waits for the downloads running
        side by side rather than for each shard when it first needs it, one after another. A
        file another thread or process is fetching is skipped (:meth:`ShardCache.fetch_unless_busy`:
        two ranks fetch different files, none waits behind the other's). The threads are daemons
        (a process that ends leaves a temp file at most, which the next download removes); a
        file whose fetch fails is left to the read that needs it, which says why."""
        cache = self.cache
        if cache is None or not files:
            return
        todo: queue.SimpleQueue = queue.SimpleQueue()
        for item in files:
            todo.put(item)

        def fetch() -> None:
            while True:
                try:
                    name, sha256, size, counted = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    cache.fetch_unless_busy(self.url_of(name), sha256, size, counted=counted)
                except Exception:  # noqa: BLE001 - the read that needs the file raises it, in one line
                    pass

        for _ in range(max(1, min(threads, len(files)))):
            threading.Thread(target=fetch, name="dsconvert-fetch-ahead", daemon=True).start()

    def cache_dir_or_root(self) -> str:
        """The local folder reads come from (to judge whether it is latency-bound)."""
        return self.cache.dir if self.cache is not None else self.location.url
