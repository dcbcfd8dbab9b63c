"""Every folder dsconvert reads or writes, local or remote, through fsspec.

A *location* is a folder given as a local path or a URL (``s3://bucket/train-wds``). What
conversion and reading need of it is small: read a file, its size, list names, remove one,
and write one **atomically**: the file is written under a temporary name on local disk and
then moved into place, by a rename beside the target on a local disk, by one upload (PUT
or multipart) on an object store, so it appears whole or not at all. Manifests are written
last either way, so a finished output is one whose manifest exists.

Local paths use fsspec's ``LocalFileSystem``; only opening a local file for reading goes
through :func:`dsconvert.io.localfs.open_regular`, which refuses anything but a regular file
on the open descriptor (a FIFO or ``/dev/zero`` behind a shard name would block or never
end). File systems come from fsspec's own instance cache, which resets in a forked child.

Credentials and endpoints come from fsspec's own configuration (``~/.config/fsspec``, the
``FSSPEC_<PROTOCOL>_<KEY>`` and ``FSSPEC_<PROTOCOL>`` environment variables) and the
protocol's usual ones (``AWS_*`` for S3), overridden by explicit ``storage_options``
(``--storage-option key=value`` on the command line). Options apply to remote protocols
only; local paths never need them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import posixpath
import shutil
import tempfile
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import MissingDependencyError, NotRegularFileError, OptionError
from .localfs import atomic_write, check_name, open_regular

__all__ = ["local_form", "json_bytes", "is_remote", "join_url", "parse_storage_options", "filesystem", "Location",
           "protocol_of", "mtime_ns_of"]

LOCAL_PROTOCOLS = ("file", "local")


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def local_form(url: str) -> str:
    """``file:///data/train`` (or ``local://``) as the plain path ``/data/train``; any other URL
    or path as it is. Entry points take both, and the rest of dsconvert sees one form."""
    url = str(url)
    if "://" in url and protocol_of(url) in LOCAL_PROTOCOLS:
        return url.split("://", 1)[1]
    return url


def is_remote(url: str) -> bool:
    """True for URLs of anything but the local file system (``s3://``, ``gs://``, ``http://``...)."""
    return protocol_of(str(url)) not in LOCAL_PROTOCOLS


def join_url(base: str, name: str) -> str:
    if not is_remote(base):
        return os.path.join(base, name)
    return base.rstrip("/") + "/" + name.lstrip("/")


def _value(text: str) -> Any:
    """'true' -> True, '3' -> 3, '{"a": 1}' -> dict; anything else stays a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_storage_options(items: Optional[Sequence[str]]) -> Dict[str, Any]:
    """``["anon=true", "client_kwargs.endpoint_url=http://127.0.0.1:9000"]`` ->
    ``{"anon": True, "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}``.
    Values are JSON when they parse as JSON; dots in keys make nested objects."""
    out: Dict[str, Any] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise OptionError(f"--storage-option takes key=value, not {item!r}")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise OptionError(f"--storage-option {key}: {part} is already a value")
        node[parts[-1]] = _value(text)
    return out


def filesystem(url: str, storage_options: Optional[Dict[str, Any]] = None) -> Tuple[Any, str]:
    """(fsspec file system, path within it) for a local path or a URL. A local path is taken
    as it is (fsspec's URL parsing would split a folder named ``a::b``).

    fsspec is imported here, on first use, not with dsconvert: its ~13,000 objects in a
    training process made every DataLoader worker's start 0.2 s slower (the child's garbage
    collector touches them all, copying their pages), and reading local shards never needs it."""
    import fsspec

    if not is_remote(url):
        return fsspec.filesystem("file"), os.path.abspath(local_form(url))
    try:
        return fsspec.core.url_to_fs(url, **_pooled(url, storage_options or {}))
    except ImportError as exc:
        hint = {"s3": "pip install 'dsconvert[s3]'", "gs": "pip install gcsfs", "gcs": "pip install gcsfs",
                "az": "pip install adlfs", "abfs": "pip install adlfs"}.get(protocol_of(url), str(exc))
        raise MissingDependencyError(f"{protocol_of(url)}:// needs its fsspec implementation: run `{hint}`") \
            from None


def mtime_ns_of(info: Dict[str, Any]) -> int:
    """A listing entry's modification time in ns (0 where the store gives none)."""
    for name in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9) if value < 1e12 else int(value)
        try:
            from datetime import datetime

            return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1e9)
        except ValueError:
            continue
    return 0


class Location:
    """A folder on local disk or behind fsspec; picklable (a worker makes its own client)."""

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None, flat: bool = True):
        """``flat``: every name is a plain file name of the folder, checked (an output, whose
        names come from manifests); False for a scanned source's relative paths."""
        self.flat = flat
        self.remote = is_remote(url)
        self.url = url.rstrip("/") if self.remote else os.path.abspath(local_form(url))
        self.storage_options = dict(storage_options or {}) if self.remote else {}

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    @property
    def fs(self) -> Any:
        return filesystem(self.url, self.storage_options)[0]

    def path(self, name: str = "") -> str:
        """The file system's path of ``name`` (a local path, or bucket/key), ``name`` checked
        to be a plain file name (names come from manifests, and a URL's protocol may decode
        ``%2f``)."""
        if name and self.flat:
            check_name(name, self.url)
        if not self.remote:  # local paths need no fsspec (see filesystem())
            return os.path.join(self.url, name) if name else self.url
        base = filesystem(self.url, self.storage_options)[1].rstrip("/") or "/"
        return posixpath.join(base, name) if name else base

    def url_of(self, name: str) -> str:
        return join_url(self.url, check_name(name, self.url) if self.flat else name)

    def local_path(self, name: str) -> Optional[str]:
        return None if self.remote else self.path(name)

    def open(self, name: str, block_size: int = 1 << 20) -> IO[bytes]:
        """A readable file object: a local regular file only, or fsspec's, reading ahead
        ``block_size`` bytes per request."""
        if not self.remote:
            return open_regular(self.path(name))
        return self.fs.open(self.path(name), "rb", block_size=block_size)

    def read_bytes(self, name: str) -> bytes:
        """The whole of ``name``, in one request (GET) on an object store."""
        if not self.remote:
            with self.open(name) as f:
                return f.read()
        fs = self.fs
        return fs.cat_file(self.path(name), **_one_request(fs))

    def read_range(self, name: str, start: int, end: int) -> bytes:
        if not self.remote:
            with self.open(name) as f:
                f.seek(start)
                return f.read(max(0, end - start))
        return self.fs.cat_file(self.path(name), start=start, end=end)

    def size(self, name: str) -> int:
        """Bytes of ``name`` (symlinks followed); FileNotFoundError when it is not there,
        NotRegularFileError when it is not a regular file (a device, FIFO, folder)."""
        info = self.fs.info(self.path(name))
        if info.get("type", "file") != "file":
            raise NotRegularFileError(f"{self.url_of(name)} is not a regular file (a device, FIFO, socket or "
                                      "folder): not read", self.url_of(name))
        return int(info["size"])

    def exists(self, name: str) -> bool:
        if not self.remote:  # without fsspec, which local reads never import
            return os.path.lexists(self.path(name))  # a dangling link is there, for a local folder
        return bool(self.fs.lexists(self.path(name)))

    def listdir(self) -> List[str]:
        fs, base = self.fs, self.path()
        try:
            fs.invalidate_cache(base)
            listed = fs.ls(base, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed if p.rstrip("/") != base)  # a file lists itself

    def remove(self, name: str) -> None:
        """Remove ``name``; nothing happens when it is not there."""
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass

    def makedirs(self) -> None:
        self.fs.makedirs(self.path(), exist_ok=True)

    @contextlib.contextmanager
    def write(self, name: str, mode: str = "wb", before: Optional[Callable[[str], None]] = None) -> Iterator[IO]:
        """Write ``name`` whole or not at all: through a local temporary file (its ``.name`` is
        a path: h5py writes through it) that is moved into place only when the block succeeds.
        Locally the temporary file is ``.NAME.RANDOM.tmp`` beside the target, renamed over it,
        and ``before(its name)`` runs before it is made (see :func:`atomic_write`); on an object
        store it is staged outside the output."""
        if not self.remote:
            with atomic_write(self.path(name), mode, before) as f:
                yield f
            return
        staging = tempfile.mkdtemp(prefix="dsconvert-upload-")
        try:
            local = os.path.join(staging, name)
            with open(local, mode, encoding=None if "b" in mode else "utf-8") as f:
                yield f
            self.fs.put_file(local, self.path(name))  # one PUT (or a multipart upload): whole or nothing
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def write_bytes(self, name: str, data: bytes, before: Optional[Callable[[str], None]] = None) -> None:
        with self.write(name, before=before) as f:
            f.write(data)

    def write_json(self, name: str, obj: Any, before: Optional[Callable[[str], None]] = None) -> None:
        self.write_bytes(name, json_bytes(obj), before)


POOL = 64  # connections an S3 client may hold open at once, unless storage_options name another number


def _pooled(url: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` for an S3 URL with room for :data:`POOL` connections: botocore's default of
    10 queued a cache's fetch-ahead (a record and a shard per shard, all at once) in waves of
    10, a round trip each, behind connections it would not open. A pool size the caller gives
    (``config_kwargs.max_pool_connections``) is kept; other protocols are left as they are."""
    if protocol_of(url) not in ("s3", "s3a"):
        return options
    config = options.get("config_kwargs")
    if config is not None and (not isinstance(config, dict) or "max_pool_connections" in config):
        return options
    return dict(options, config_kwargs=dict(config or {}, max_pool_connections=POOL))


_ONE_REQUEST: Dict[type, Dict[str, Any]] = {}  # file system class -> its options (below)


def _one_request(fs: Any) -> Dict[str, Any]:
    """``cat_file``'s options that read a file in one request: recent s3fs asks for the
    object's size first (a HEAD) to read a large one in parallel ranges, a round trip more for
    each manifest, record and source file, which are small; ``max_concurrency=1`` reads it in
    one GET, and the same errors (a missing file is FileNotFoundError either way)."""
    cls = type(fs)
    if cls not in _ONE_REQUEST:
        try:
            params = inspect.signature(cls._cat_file).parameters
        except (AttributeError, TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        _ONE_REQUEST[cls] = {"max_concurrency": 1} if "max_concurrency" in params else {}
    return _ONE_REQUEST[cls]


def json_bytes(obj: Any) -> bytes:
    """How dsconvert writes JSON files: UTF-8, one space of indent, a final newline."""
    return (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
