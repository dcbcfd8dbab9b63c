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
from typing import Iterator, List, Optional, Tuple

from ..errors import DsconvertError, ManifestError, OfflineCacheWarning
from ..formats import get
from ..io.shard_cache import ShardAccess
from ..manifest import MANIFEST_NAME, ORDER_NAME, Manifest

__all__ = ["load_manifest"]

# errors that are an answer (from the remote, or about the call itself), not a remote out of reach
ANSWERS = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError, DsconvertError,
           TypeError, ValueError, ImportError)


def load_manifest(access: ShardAccess) -> Optional[Manifest]:
    """The manifest of the remote output ``access`` reaches, which has a cache: read from the
    remote and kept in the cache, or, when the remote cannot be reached, the kept copy of a
    fully cached output (see the module doc). None when the remote holds no manifest."""
    cache = access.cache
    assert cache is not None
    url = access.url_of(MANIFEST_NAME)
    try:
        raw = access.location.read_bytes(MANIFEST_NAME)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - storage clients raise their own classes (botocore's are no OSError)
        if isinstance(exc, ANSWERS):
            raise
        return _from_cache(access, exc)
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
