"""``open_dataset``: read a manifest and return the Dataset its format is read with; ``open_source``:
a source scanned and read in place, without conversion."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Optional, Union

from ..errors import OptionError, UpgradeWarning
from ..formats import FORMATS, get
from ..io.default_cache import default_shard_cache
from ..io.localfs import is_latency_bound
from ..io.location import Location, is_remote, local_form
from ..io.owner import LOCK_NAME, OWNER_NAME
from ..io.shard_cache import ShardAccess
from ..manifest import MANIFEST_NAME, Manifest
from ..source import scan
from ..source.parquet import looks_like_arrow, looks_like_parquet
from ..source.tars import looks_like_tars
from .offline import ManifestRead, load_manifest, read_manifest
from .tars import open_tars

__all__ = ["open_dataset", "open_source"]


def open_dataset(
    path: str,
    transform: Optional[Callable] = None,
    target_transform: Optional[Callable] = None,
    decode: str = "pil",
    *,
    storage_options: Optional[Dict[str, Any]] = None,
    cache_dir: Union[str, bool, None] = None,
    cache_size: Union[int, str, None] = None,
    stream: Optional[bool] = None,
    **options: Any,
) -> Any:
    """Open a dsconvert output as a Dataset, a drop-in for ``ImageFolder(root, transform)``.

    ``decode``: ``"pil"`` (RGB PIL images, exactly as ImageFolder loads them), ``"numpy"``
    (HWC uint8 arrays through the fastest JPEG decoder that loads), ``"raw"`` (the encoded
    bytes) or ``"fused"`` (``transform``'s leading crop and resize folded into decoding:
    :mod:`dsconvert.fused`). For ImageFolder and list sources a sample is ``(image, label)``; for other
    sources a dict of decoded fields with ``__key__``.

    ``path`` may also be Parquet (a file or a folder of them) or Arrow (a Hugging Face
    ``save_to_disk`` folder) without a manifest: read in place, map-style, sample i being the
    sample i a conversion of it would hold (:class:`dsconvert.readers.source.SourceDataset`;
    ``label=`` as for :func:`dsconvert.convert`).

    Local outputs open **map-style** by default (``len``, ``ds[i]``, ``__getitems__``): the drop-in
    for ``ImageFolder`` with ``DataLoader(ds, batch_size=B, shuffle=True, num_workers=W)``,
    ``DistributedSampler`` or any other sampler; ``ds[i]`` is the source's sample i (ImageFolder's
    sample i when no input was skipped), whatever order the shards store them in. wds outputs
    are read by one ``pread`` per sample from local shards or from ``cache_dir``; on latency-bound
    mounts (NFS, FUSE...) and remote shards, each batch's bytes are requested at once, concurrently
    (``prefetch=True/False`` overrides the detection).

    ``stream=True`` (or any of the streaming options below) opens a wds output as an
    IterableDataset instead, reading the shards in order: for remote shards without a cache,
    latency-bound storage, or a resumable position across ranks and workers. A wds output on a
    latency-bound mount (NFS, CephFS, FUSE...), or on an object store read with
    ``cache_dir=False``, streams by default: the stream reads ahead in threads while the worker
    decodes, and deals each DataLoader worker runs of 64 consecutive samples
    (``stream=False`` reads it by index, each batch's members requested at once). With a cache on
    a local SSD it is read by index from there.

    Streaming options (wds): ``shuffle``, ``seed``, ``buffer_size``, ``rank``, ``world_size``,
    ``even`` (``"pad"``, the default: every rank takes as many samples, the last ones
    repeating the epoch's first, as ``DistributedSampler`` does; ``"drop"``; None: split exactly),
    ``prefetch``, ``batch_size`` (whole batches built in the worker, for
    ``DataLoader(ds, batch_size=None)``; with ``collate=False`` the samples one by one, dealt in
    whole batches, for ``DataLoader(ds, batch_size=...)``), ``allow_pickle`` (default False:
    pickled fields stay bytes, since loading them runs code from the data); see
    :class:`dsconvert.readers.stream.StreamDataset`. The wds reader's position is state:
    ``state_dict``/``load_state_dict`` (torchdata's StatefulDataLoader saves and restores it;
    ``load_state_dict({"epoch": e, "samples_seen": n})`` continues on any number of ranks and
    workers), and ``set_epoch`` reaches persistent workers; map-style outputs resume through
    their sampler (:class:`dsconvert.data.ResumableSampler`). Images larger than
    ``PIL.Image.MAX_IMAGE_PIXELS`` raise BadInputError (decompression bombs), on every decode path.
    hdf5 and npy outputs are map-style (``len``, indexing; shuffle and DDP through the
    DataLoader's sampler, e.g. ``DistributedSampler``); decoded ones have no ``"raw"`` mode,
    and npy's ``"numpy"`` mode returns zero-copy, read-only views of the memory map.

    ``path`` may be a URL fsspec reaches (``s3://bucket/train-wds``), with ``storage_options``.
    **A remote output is cached on local disk by default**, as litdata and MosaicML Streaming do:
    in ``$DSCONVERT_CACHE/shards`` (else ``$XDG_CACHE_HOME/dsconvert/shards``, else
    ``~/.cache/dsconvert/shards``), bounded by ``cache_size``, ``$DSCONVERT_CACHE_SIZE``, or half
    of the disk's free space (at most 50 GB); ``cache_dir=False`` or ``DSCONVERT_CACHE=off``
    turns it off, and where no disk is at hand (the folder cannot be written, or the bound would
    be under 256 MB), or where the output is larger than the bound, it is read without one
    (:mod:`dsconvert.io.default_cache`). A cached
    output opens map-style, as a local one. Without a cache remote wds shards are read by
    concurrent ranged requests ahead of use and hdf5 through fsspec's file objects; npy needs a
    cache. With a cache (``cache_dir``: a local SSD folder, or the default) every shard is fetched
    whole on first use, verified against the manifest's sha256, and read from there after;
    ``cache_size`` caps it ("500GB"), evicting the least recently used shards. Safe for any
    number of workers and ranks at once. A local output on a network file system can be cached
    the same way (``cache_dir=True``: the default folder). A remote output's manifest is
    kept in the cache each time it is read, so a fully cached output opens and reads with the
    remote unreachable (every file verified against that manifest; an OfflineCacheWarning says
    so); while the remote answers, its manifest wins: :mod:`dsconvert.readers.offline`.
    """
    path = local_form(path)  # file:// URLs as the paths they name
    if cache_dir is not None and type(cache_dir) is not bool:
        cache_dir = local_form(cache_dir)

    label = options.pop("label", None)
    index_dir = options.pop("index_dir", None)
    # a remote manifest is read once, here (one GET), and that read decides the rest: no HEAD before it
    read = read_manifest(Location(path, storage_options, flat=False)) if is_remote(path) else None
    if _in_place_table(path, storage_options, read):
        if stream or cache_dir not in (None, False) or index_dir is not None or options:
            given = sorted([*options, *(["stream"] if stream else []), *(["cache_dir"] if cache_dir else []),
                            *(["index_dir"] if index_dir is not None else [])])
            raise OptionError(f"{path} is Parquet or Arrow read in place, map-style (sample i is the conversion's "
                              f"sample i): {', '.join(given)} apply to dsconvert outputs and tar shards")
        from .source import SourceDataset  # here, not at the top: the Dataset modules import torch

        return SourceDataset(scan(path, storage_options=storage_options, label=label), transform=transform,
                             target_transform=target_transform, decode=decode, storage_options=storage_options)
    # a remote output is cached on local disk by default (io/default_cache.py): read by index from there
    by_default = cache_dir is None or cache_dir is True
    cache_dir, cache_size = default_shard_cache(path, cache_dir, cache_size)
    access = ShardAccess(path, storage_options, cache_dir, cache_size)
    # a remote output's manifest is kept in the cache, and read from there when the remote is out of reach
    kept = load_manifest(access, read) if access.cache is not None and access.remote else None
    if read is not None and read.error is not None and kept is None:
        raise read.error  # out of reach, and no cache to read it from
    # tars without a manifest are read in place; a damaged manifest is a damaged output, never foreign data, and
    # an output being written (or stopped before it finished) is never read as the tars it holds so far
    if (kept is not None or _has_manifest(access, read) or _output_folder(access)
            or not looks_like_tars(path, storage_options)):
        if label is not None or index_dir is not None:
            raise OptionError(f"label= and index_dir= are for tar shards without a manifest, and {path} is not one "
                              "(a dsconvert output keeps its labels)")
        if kept is not None:
            manifest = kept
        elif read is not None and read.raw is not None:
            manifest = Manifest.from_bytes(read.raw, access.url_of(MANIFEST_NAME))
        else:  # a local output, or none there: the load says why in one line
            manifest = Manifest.load(access.location)
        if by_default and access.cache is not None and _larger_than(manifest, access.cache.max_bytes):
            # the default cache cannot hold it: a shuffled read through it would fetch shards again and again
            access = ShardAccess(path, storage_options)
        if any((e.index or "").endswith(".index.json") for e in manifest.shards):
            warnings.warn(f"{path}: its shard records are JSON (written by an earlier dsconvert), parsed whole each "
                          "time a shard opens; `dsconvert upgrade " + path + "` rewrites them as memory-mapped binary "
                          "records in place (shards untouched)", UpgradeWarning, stacklevel=2)
    else:
        manifest, access = open_tars(path, storage_options, cache_dir, cache_size, label, index_dir)
    root = access.location.url
    if manifest.format not in FORMATS:
        raise ValueError(f"{root}: format {manifest.format!r} is not one this dsconvert reads")
    if _streams(get(manifest.format).iterable, access, stream, options, root):
        # here, not at the top: the Dataset modules import torch
        from .stream import StreamDataset as dataset
    else:
        from .map import MapDataset as dataset  # type: ignore[assignment]
    return dataset(root, manifest, transform=transform, target_transform=target_transform,
                   decode=decode, access=access, **options)


def _larger_than(manifest: Manifest, bound: Optional[int]) -> bool:
    """Whether the output's files (shards, their parts, the order file) take more than ``bound`` bytes."""
    total = sum(e.bytes + sum(int((p or {}).get("bytes") or 0) for p in e.parts.values()) for e in manifest.shards)
    total += int((manifest.order or {}).get("bytes") or 0)
    return bound is not None and total > bound


def _has_manifest(access: ShardAccess, read: Optional[ManifestRead]) -> bool:
    """Whether the output holds a manifest: the read made already for a remote one."""
    return read.raw is not None if read is not None else access.location.exists(MANIFEST_NAME)


def _output_folder(access: ShardAccess) -> bool:
    """Whether a folder holds a dsconvert conversion's control files (its lock, its owner
    journal): an output, finished or not, whose manifest then says what it is."""
    try:
        return any(access.location.exists(name) for name in (LOCK_NAME, OWNER_NAME))
    except Exception:  # an unreachable store: the manifest's own read says why
        return False


def _in_place_table(path: str, storage_options: Optional[Dict[str, Any]], read: Optional[ManifestRead]) -> bool:
    """Whether ``path`` is Parquet or Arrow (a Hugging Face export) without a dsconvert manifest
    (``read``: the remote manifest's read, made already)."""
    if read is not None:
        if read.raw is not None or read.error is not None:  # an output, or a store out of reach: not a table
            return False  # to read in place; the output path below says why, or reads it from the cache
    elif Location(path, storage_options, flat=False).exists(MANIFEST_NAME):
        return False
    return looks_like_parquet(path, storage_options) or looks_like_arrow(path, storage_options)


def open_source(src: str, transform: Optional[Callable] = None, target_transform: Optional[Callable] = None,
                decode: str = "pil", layout: str = "auto", storage_options: Optional[Dict[str, Any]] = None) -> Any:
    """Scan ``src`` (a path or URL) and return it as a map-style Dataset, without conversion:
    :class:`dsconvert.readers.source.SourceDataset`."""
    from .source import SourceDataset  # here, not at the top: the Dataset modules import torch

    return SourceDataset(scan(src, layout, storage_options=storage_options), transform=transform,
                         target_transform=target_transform, decode=decode, storage_options=storage_options)


STREAM_OPTIONS = ("shuffle", "seed", "buffer_size", "rank", "world_size", "even", "batch_size", "collate")


def _streams(iterable: bool, access: ShardAccess, stream: Optional[bool], options: Dict[str, Any], root: str) -> bool:
    """Whether the output opens as a stream (see :func:`open_dataset`)."""
    if stream not in (None, True, False):
        raise OptionError(f"stream must be True, False or None, not {stream!r}")
    asked = sorted(o for o in options if o in STREAM_OPTIONS)
    if not iterable:
        if stream:
            raise OptionError(f"{root} is map-style only: read it with a sampler (shuffle=True, DistributedSampler)")
        return False
    if stream is False and asked:
        raise OptionError(f"{', '.join(asked)} are streaming options, and stream=False reads by index: shuffle, "
                          "shard over ranks and batch with the DataLoader and its sampler instead")
    if stream is None:  # random reads pay a round trip each on object stores and latency-bound mounts
        uncached = access.cache is None
        far = access.remote or is_latency_bound(access.location.url)
        return bool(asked) or (uncached and far)
    return stream
