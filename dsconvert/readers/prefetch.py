"""Every shard of an output fetched ahead into a local cache and verified (``dsconvert cache``),
so that training then reads only local copies."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Optional, Union

from ..errors import OptionError
from ..formats import get
from ..io.location import local_form
from ..io.shard_cache import ShardAccess
from ..manifest import ORDER_NAME, Manifest, ShardEntry
from .offline import load_manifest

__all__ = ["prefetch"]


def prefetch(url: str, cache_dir: str, max_bytes: Union[int, str, None] = None,
             storage_options: Optional[Dict[str, Any]] = None, workers: int = 8,
             log: Optional[Any] = None) -> Dict[str, Any]:
    """Fetch every shard (and index) of the output at ``url`` into ``cache_dir`` and verify
    them; ``open_dataset(url, cache_dir=...)`` then reads only local copies."""
    cache_dir = local_form(cache_dir)  # file:// URLs as the paths they name
    access = ShardAccess(url, storage_options, cache_dir, max_bytes)
    cache = access.cache
    assert cache is not None
    manifest = load_manifest(access) if access.remote else None  # kept in the cache, for reads offline
    if manifest is None:
        manifest = Manifest.load(access.location)
    total = sum(e.bytes for e in manifest.shards)
    if cache.max_bytes is not None and total > cache.max_bytes:
        raise OptionError(f"{url} holds {total:,} bytes of shards, more than the cache's cap of "
                          f"{cache.max_bytes:,}: fetching them all would evict earlier ones; raise the cap, or "
                          "let open_dataset(..., cache_dir=...) fetch shards as training reads them")
    fmt = get(manifest.format)
    started = time.perf_counter()

    def fetch_file(name: str, part: Optional[Dict[str, Any]]) -> None:
        """A shard's other file (its record...) or the order file, copied and checked, not read
        into memory: the order file is 8 bytes a sample."""
        cache.get(access.url_of(name), (part or {}).get("sha256"), (part or {}).get("bytes"), counted=False)

    def fetch(entry: ShardEntry) -> None:
        access.local_shard(entry)
        for name in fmt.files_of(entry)[1:]:
            fetch_file(name, entry.parts.get(name))
        if log is not None:
            log(f"cached {entry.name}")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for _ in pool.map(fetch, manifest.shards):  # nothing kept per shard
            pass
    if manifest.order is not None:  # a shuffled output's order file: read at every open
        fetch_file(ORDER_NAME, manifest.order)
    files, nbytes = cache.usage()
    return {"url": access.location.url, "cache_dir": cache.dir, "shards": len(manifest.shards), "bytes": total,
            "downloaded": cache.downloads, "downloaded_bytes": cache.downloaded_bytes,
            "already_cached": len(manifest.shards) - cache.downloads, "cache_files": files, "cache_bytes": nbytes,
            "seconds": time.perf_counter() - started}
