"""A remote output's manifest read through ``cache_dir``, so that a fully cached output opens
and reads with the remote unreachable.

Each time a remote output is opened with a cache, its manifest is read from the remote (the
remote's manifest always wins: a newer conversion replaces the cache's copy, and the shards it
no longer names are fetched again as their sha256 differ) and its bytes are kept in the cache
beside their own sha256 (:meth:`dsconvert.io.shard_cache.ShardCache.keep`).

When the remote cannot be reached (a connection refused or timed out, no network), the kept
copy is used only if it matches its sha256 (an edited or cut-short copy is refused) and every
file the manifest names (shards, their indexes and tables, the order file) is in the cache and
verified against the manifest's sha256 and size, as the cache checks any copy it hands out. A
partly cached output is refused at open, naming what is missing, rather than failing halfway
through an epoch. One warning (:class:`dsconvert.errors.OfflineCacheWarning`) says the output
runs from the cache.

An answer from the remote is never taken for unreachability: no manifest there (the output is
gone), access denied, a damaged manifest raise as they do without a cache.
"""

from __future__ import annotations

import warnings
from typing import Iterator, List, NamedTuple, Optional, Tuple

from ..errors import DsconvertError, ManifestError, OfflineCacheWarning
from ..formats import get
from ..io.location import Location
from ..io.shard_cache import ShardAccess
from ..manifest import MANIFEST_NAME, ORDER_NAME, Manifest

__all__ = ["ManifestRead", "load_manifest", "read_manifest"]

# errors that are an answer (from the remote, or about the call itself), not a remote out of reach
ANSWERS = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError, DsconvertError,
           TypeError, ValueError, ImportError)


class ManifestRead(NamedTuple):
    """One read of a remote output's manifest: its bytes, or None when the remote holds none
    (``error`` None), or the exception the read raised."""

    raw: Optional[bytes]
    error: Optional[Exception] = None


def read_manifest(location: Location) -> ManifestRead:
    """Read the manifest at ``location`` once (one GET on an object store), keeping whatever
    the read raised but a missing file: ``open_dataset`` reads it once and decides from it
    whether the folder is an output, a table read in place, or out of reach."""
    try:
        return ManifestRead(location.read_bytes(MANIFEST_NAME))
    except FileNotFoundError:
        return ManifestRead(None)
    except Exception as exc:  # noqa: BLE001 - storage clients raise their own classes (botocore's are no OSError)
        return ManifestRead(None, exc)


def load_manifest(access: ShardAccess, read: Optional[ManifestRead] = None) -> Optional[Manifest]:
    """The manifest of the remote output ``access`` reaches, which has a cache: read from the
    remote (or ``read``, made already) and kept in the cache, or, when the remote cannot be
    reached, the kept copy of a fully cached output (see the module doc). None when the remote
    holds no manifest."""
    cache = access.cache
    assert cache is not None
    url = access.url_of(MANIFEST_NAME)
    raw, exc = read if read is not None else read_manifest(access.location)
    if exc is not None:
        if isinstance(exc, ANSWERS):
            raise exc
        return _from_cache(access, exc)
    if raw is None:
        return None
    manifest = Manifest.from_bytes(raw, url)  # a damaged remote manifest is an error, never replaced by the copy
    cache.keep(url, raw)
    return manifest


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _files(manifest: Manifest) -> Iterator[Tuple[str, Optional[str], Optional[int]]]:
    """(name, sha256, bytes) of every file the output's readers open besides the manifest;
    None where the manifest records no digest (an older manifest's index files)."""
    fmt = get(manifest.format)
    for entry in manifest.shards:
        yield entry.name, entry.sha256, entry.bytes
        for name in fmt.files_of(entry)[1:]:
            part = entry.parts.get(name) or {}
            yield name, part.get("sha256"), part.get("bytes")
    if manifest.order is not None:
        yield ORDER_NAME, manifest.order.get("sha256"), manifest.order.get("bytes")


def _from_cache(access: ShardAccess, exc: Exception) -> Manifest:
    cache = access.cache
    assert cache is not None
    url = access.url_of(MANIFEST_NAME)
    raw = cache.kept(url)  # ManifestError when the copy does not match its sha256
    if raw is None:
        raise exc  # never read while reachable: nothing to fall back on
    manifest = Manifest.from_bytes(raw, f"{cache.dir} (the cache's copy of {url})")
    missing: List[str] = [name for name, sha256, size in _files(manifest)
                          if not cache.holds(access.url_of(name), sha256, size)]
    root = access.location.url
    if missing:
        raise ManifestError(
            f"{root} cannot be reached ({_said(exc)}), and {len(missing)} of its files are not in the cache "
            f"{cache.dir} or do not match its manifest (first: {missing[0]}): read it once while it is reachable "
            f"(`dsconvert cache {root} {cache.dir}` fetches and verifies every shard)", root) from exc
    warnings.warn(f"{root} cannot be reached ({_said(exc)}): reading it from the cache {cache.dir}, every file "
                  "verified against the manifest kept there", OfflineCacheWarning, stacklevel=4)
    return manifest
