"""Local disks and everything fsspec reaches (S3, GCS, HTTP, ...), behind one small interface.

A *location* is a folder given as a local path or a URL (``s3://bucket/train-wds``). What
conversion and reading need of it is small: read a file, its size, list names, remove one,
and write one **atomically**: on a local disk through a hidden temp file renamed into place;
on an object store by staging the file on local disk and uploading it with one PUT, so the
object appears whole or not at all. Manifests are written last either way, so a finished
output is one whose manifest exists.

Credentials and endpoints come from fsspec's own configuration (``~/.config/fsspec``, the
``FSSPEC_<PROTOCOL>_<KEY>`` and ``FSSPEC_<PROTOCOL>`` environment variables) and the
protocol's usual ones (``AWS_*`` for S3), overridden by explicit ``storage_options``
(``--storage-option key=value`` on the command line). Options apply to remote protocols
only; local paths never need them. File systems are made once per process (fsspec's async
clients do not survive a fork, so a forked worker makes its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import IO, Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import OptionError
from .optional import require
from .storage import atomic_write, check_name, open_regular, regular_size

__all__ = ["json_bytes", "is_remote", "join_url", "parse_storage_options", "filesystem", "Location", "protocol_of",
           "mtime_ns_of"]

LOCAL_PROTOCOLS = ("file", "local")


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


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


_filesystems: Dict[Tuple[int, str, str], Any] = {}


def filesystem(url: str, storage_options: Optional[Dict[str, Any]] = None) -> Tuple[Any, str]:
    """(fsspec file system, path within it) for a remote URL; one per process and options."""
    fsspec = require("fsspec", f"reading {protocol_of(url)}:// URLs")
    options = storage_options or {}
    key = (os.getpid(), protocol_of(url), json.dumps(options, sort_keys=True, default=str))
    if key not in _filesystems:
        if key[0] not in {k[0] for k in _filesystems}:
            _filesystems.clear()  # made before a fork: never reuse in the child
        try:
            fs, _ = fsspec.core.url_to_fs(url, **options)
        except ImportError as exc:
            hint = {"s3": "pip install 'dsconvert[s3]'", "gs": "pip install gcsfs", "gcs": "pip install gcsfs",
                    "az": "pip install adlfs", "abfs": "pip install adlfs"}.get(protocol_of(url), str(exc))
            from .errors import MissingDependencyError

            raise MissingDependencyError(f"{protocol_of(url)}:// needs its fsspec implementation: run `{hint}`") \
                from None
        _filesystems[key] = fs
    fs = _filesystems[key]
    return fs, fs._strip_protocol(url)


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
        self.url = url.rstrip("/") if self.remote else os.path.abspath(url)
        self.storage_options = dict(storage_options or {}) if self.remote else {}

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    @property
    def fs(self) -> Any:
        return filesystem(self.url, self.storage_options)[0]

    def path(self, name: str = "") -> str:
        """The local path or the file system's path (bucket/key) of ``name``, a plain file name
        (checked: names come from manifests, and a URL's protocol may decode ``%2f``)."""
        if name and self.flat:
            check_name(name, self.url)
        if not self.remote:
            return os.path.join(self.url, name) if name else self.url
        base = filesystem(self.url, self.storage_options)[1]
        return f"{base}/{name}" if name else base

    def url_of(self, name: str) -> str:
        return join_url(self.url, check_name(name, self.url) if self.flat else name)

    def local_path(self, name: str) -> Optional[str]:
        return None if self.remote else self.path(name)

    def read_bytes(self, name: str) -> bytes:
        """The whole of ``name``: a local regular file (never a device or FIFO), or the object."""
        if not self.remote:
            with open_regular(self.path(name)) as f:
                return f.read()
        return self.fs.cat_file(self.path(name))

    def read_range(self, name: str, start: int, end: int) -> bytes:
        if not self.remote:
            with open_regular(self.path(name)) as f:
                f.seek(start)
                return f.read(max(0, end - start))
        return self.fs.cat_file(self.path(name), start=start, end=end)

    def size(self, name: str) -> int:
        """Bytes of ``name``; FileNotFoundError when it is not there, NotRegularFileError when
        it is not a regular file."""
        if not self.remote:
            return regular_size(self.path(name))
        return int(self.fs.info(self.path(name))["size"])

    def exists(self, name: str) -> bool:
        if not self.remote:
            return os.path.lexists(self.path(name))
        return bool(self.fs.exists(self.path(name)))

    def listdir(self) -> List[str]:
        if not self.remote:
            return os.listdir(self.url) if os.path.isdir(self.url) else []
        fs = self.fs
        try:
            fs.invalidate_cache(self.path())
            return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(self.path(), detail=False))
        except FileNotFoundError:
            return []

    def remove(self, name: str) -> None:
        """Remove ``name``; nothing happens when it is not there."""
        try:
            if not self.remote:
                os.unlink(self.path(name))
            else:
                self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass

    def makedirs(self) -> None:
        if not self.remote:
            os.makedirs(self.url, exist_ok=True)
        else:
            self.fs.makedirs(self.path(), exist_ok=True)

    def open(self, name: str, block_size: int = 1 << 20) -> IO[bytes]:
        """A readable file object (remote: fsspec's, reading ahead ``block_size`` bytes)."""
        if not self.remote:
            return open_regular(self.path(name))
        return self.fs.open(self.path(name), "rb", block_size=block_size)

    @contextlib.contextmanager
    def write(self, name: str, mode: str = "wb") -> Iterator[IO]:
        """Write ``name`` whole or not at all. The file object has a local ``.name`` (h5py
        writes through the path)."""
        if not self.remote:
            with atomic_write(self.path(name), mode) as f:
                yield f
            return
        staging = tempfile.mkdtemp(prefix="dsconvert-upload-")
        try:
            local = os.path.join(staging, name)
            with open(local, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
                yield f
            self.fs.put_file(local, self.path(name))  # one PUT (or a multipart upload): whole or nothing
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.write(name) as f:
            f.write(data)

    def write_json(self, name: str, obj: Any) -> None:
        self.write_bytes(name, json_bytes(obj))


def json_bytes(obj: Any) -> bytes:
    """How dsconvert writes JSON files: UTF-8, one space of indent, a final newline."""
    return (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
