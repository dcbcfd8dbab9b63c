"""Where a remote output is cached when the caller names no ``cache_dir``: a local copy by
default, as litdata and MosaicML Streaming keep one, since without it every epoch downloads
every shard again and an object store is read sample by sample instead of from disk.

The folder is ``$DSCONVERT_CACHE/shards``, else ``$XDG_CACHE_HOME/dsconvert/shards``, else
``~/.cache/dsconvert/shards``; ``DSCONVERT_CACHE=off`` (or ``cache_dir=False``) turns it off.
Its bound is ``cache_size`` or ``$DSCONVERT_CACHE_SIZE`` when given, else half of what the
cache could hold on its disk (its free space plus what it holds already, so that the bound does
not shrink as the cache fills), at most 50 GB; least recently used shards are evicted past it
(:class:`dsconvert.io.shard_cache.ShardCache`, which also keeps concurrent readers safe: a lock
per file, downloads renamed into place once checked against the manifest's sha256). A disk is
"at hand" when that folder can be made and written and the computed bound is at least 256 MB;
otherwise the output is read without a cache (streamed by concurrent ranged requests). So is an
output larger than the bound (``open_dataset`` checks it against the manifest): read shuffled by
index through a cache that cannot hold it, its shards would be fetched again and again.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple, Union

from ..units import parse_size
from .location import is_remote

__all__ = ["cache_home", "cache_off", "default_bound", "default_shard_cache", "DEFAULT_CAP", "MIN_CAP"]

DEFAULT_CAP = 50 * 10**9  # bytes: the default bound's ceiling
MIN_CAP = 256 << 20  # below this the disk is not "at hand": shards are streamed instead
OFF = ("off", "0", "false", "no", "none")


def cache_home() -> str:
    """dsconvert's cache folder: ``$DSCONVERT_CACHE``, else ``$XDG_CACHE_HOME/dsconvert``, else
    ``~/.cache/dsconvert`` (``DSCONVERT_CACHE=off`` turns the shard cache off, not this folder:
    a tar folder's small saved indexes still go here)."""
    named = os.environ.get("DSCONVERT_CACHE", "")
    if named and named.strip().lower() not in OFF:
        return os.path.abspath(os.path.expanduser(named))
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsconvert")


def cache_off() -> bool:
    """Whether ``DSCONVERT_CACHE`` turns the default shard cache off."""
    return os.environ.get("DSCONVERT_CACHE", "").strip().lower() in OFF


def _held(folder: str) -> int:
    """Bytes the cache's copies take now (what it could hold again if evicted)."""
    total = 0
    try:
        with os.scandir(os.path.join(folder, "files")) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


def default_bound(folder: str) -> int:
    """The default cap of the cache in ``folder``: half of (free space + what the cache holds
    already), at most :data:`DEFAULT_CAP`."""
    st = os.statvfs(folder)
    return min(DEFAULT_CAP, (st.f_bavail * st.f_frsize + _held(folder)) // 2)


def default_shard_cache(path: str, cache_dir: Union[str, bool, None],
                        cache_size: Union[int, str, None]) -> Tuple[Optional[str], Union[int, str, None]]:
    """(cache folder or None, its cap) for reading the output at ``path``: the caller's
    ``cache_dir`` as given; ``False`` for none; ``None``, for a remote output, the default
    cache (module doc) where a disk is at hand; ``True``, the default cache for any output
    (a local one on a network file system)."""
    if cache_dir is False:
        return None, None
    if cache_dir is not None and cache_dir is not True:
        return str(cache_dir), cache_size
    if cache_dir is None and (not is_remote(path) or cache_off()):
        return None, None  # local outputs are read in place
    folder = os.path.join(cache_home(), "shards")
    named = cache_size if cache_size is not None else os.environ.get("DSCONVERT_CACHE_SIZE") or None
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            return None, None
        if named is not None:
            return folder, parse_size(named) if isinstance(named, str) else named
        cap = default_bound(folder)
    except OSError:  # no home, a read-only one: no disk at hand
        return None, None
    return (folder, cap) if cap >= MIN_CAP else (None, None)
