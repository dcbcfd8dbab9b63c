"""``MapDataset``: random access (``len``, indexing) over the shards of any format, the drop-in
for ``ImageFolder``: ``ds[i]`` is the source's sample i, whatever order the shards store the
samples in (a shuffled output's order file maps it: :mod:`dsconvert.shuffle`). Shuffling,
DDP and every other sampler come from the DataLoader, exactly as with ImageFolder.

Local shards are read by one ``pread`` a sample. Where each read pays a round trip
(latency-bound mounts such as NFS or FUSE, and remote shards without a cache), a batch
(``__getitems__``, which the DataLoader calls once per batch) requests all its samples' bytes
at once, concurrently, so the round trips overlap instead of adding up.

Memory does not grow with the dataset: a shard's record is memory-mapped binary columns
(:mod:`dsconvert.formats.columns`), the order file is mapped too (:func:`dsconvert.shuffle.mapped_order`),
and a process keeps at most ``max_open_shards`` shards open, closing the least recently used.
Their pages are the page cache's, shared by every worker: a shuffled read that touches every
shard holds no per-sample Python object."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..codecs import ENCODED_MODES, decode_errors_naming, decode_field
from ..errors import ManifestError
from ..formats.base import ShardReader
from ..io.localfs import is_latency_bound
from ..io.shard_cache import ShardAccess
from ..manifest import ORDER_NAME, Manifest
from ..processes import ProcessLocal, settle_worker
from ..shuffle import mapped_order
from .base import ShardDataset, TorchDataset, cumulative, locate, sample_index

__all__ = ["MapDataset"]


class MapDataset(ShardDataset, TorchDataset):
    """Map-style Dataset of ``(image, label)`` (or dicts of decoded fields, for wds outputs of
    other sources); a drop-in for ImageFolder. Shards open lazily, in the process that reads
    (h5py and mmap handles never cross a fork). Outputs that store pixels give them as
    zero-copy views (npy) with ``decode="numpy"``. See :func:`dsconvert.open_dataset`."""

    def __init__(self, root: str, manifest: Manifest, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil",
                 access: Optional[ShardAccess] = None, allow_pickle: bool = False,
                 max_member_bytes: int = 1 << 31, prefetch: Optional[bool] = None, max_open_shards: int = 64):
        super().__init__(root, manifest, transform, target_transform, decode, access)
        if not self.classification and not self.format.holds_dicts(manifest):
            raise ValueError(f"{root}: {manifest.format} outputs hold (image, label) samples only")
        self.stored = manifest.stored
        if decode in ENCODED_MODES and self.stored == "decoded":
            raise ValueError(f"{root} stores decoded pixels, so there are no encoded bytes for "
                             f"decode={decode!r}; use decode='numpy' or 'pil'")
        self.allow_pickle = allow_pickle  # pickled fields run code when loaded: only for trusted data
        self._open_options = {"max_member_bytes": max_member_bytes}
        # True: a batch's bytes are requested concurrently (None: decided by the storage, see the module doc)
        self.prefetch = prefetch
        self._sizes = [s.num_samples for s in manifest.shards]
        self._ends = cumulative(self._sizes)
        if type(max_open_shards) is not int or max_open_shards < 1:
            raise ValueError(f"max_open_shards must be an int >= 1, not {max_open_shards!r}")
        self.max_open_shards = max_open_shards
        self._shards: Dict[int, ShardReader] = ProcessLocal()  # most recently used last
        self._local: Dict[str, Any] = ProcessLocal()  # the mapped order, per process
        self._fetch_ahead()  # first: the order file's download runs beside the shards'
        self._order_map()  # here, so that a damaged order file is refused when the dataset opens

    def _order_map(self) -> Optional[np.ndarray]:
        """Source position -> stored position (shuffled outputs; None: stored as the source),
        mapped in this process, checked against the manifest's sha256 once per file version."""
        if self.manifest.order is None:
            return None
        order = self._local.get("order")
        if order is None:
            buf = self.access.mapped_file(ORDER_NAME, self.manifest.order)
            order = self._local["order"] = mapped_order(buf, self.manifest.num_samples, self.access.url_of(ORDER_NAME))
        return order

    def __len__(self) -> int:
        return self.manifest.num_samples

    def close(self) -> None:
        """Close the shards this process opened (they reopen on the next read); also done
        when the dataset is collected."""
        shards = self.__dict__.get("_shards") or {}
        for shard in list(shards.values()):
            shard.close()
        shards.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown, or a shard already gone
            pass

    def shard(self, k: int) -> ShardReader:
        """Shard k, opened in this process on first use."""
        shards = self._shards
        shard = shards.pop(k, None)
        if shard is None:
            settle_worker()
            if len(shards) >= self.max_open_shards:  # the least recently used closes (it reopens when read)
                shards.pop(next(iter(shards))).close()
            shard = self.format.open_shard(self.access, self.manifest.shards[k], self.manifest, **self._open_options)
            if self.decode == "buffer" and self.format.iterable:  # zero-copy views of the tar's memory map
                shard.prepare(0, len(shard.keys), False, views=True)
        shards[k] = shard
        return shard

    def _fetch_ahead(self) -> None:
        """A remote output read through the cache: every file it lacks fetched in background
        threads of the process that opens it, from the open on (the DataLoader's workers, forked
        or spawned later, find them in the cache, or wait on a file's lock while it arrives,
        never building an S3 client of their own), the order file and the shards' records
        first, then the shards, all at once (as many threads as files, up to the S3 client's
        pool of connections); where the output fits in half the cache's bound (a larger one
        would evict what it fetched; it is fetched as read). The open then waits for the order
        file only, already on its way."""
        cache = self.access.cache
        if cache is None or not self.access.remote:
            return
        order = self.manifest.order
        records: List[Tuple[str, Optional[str], Optional[int], bool]] = (
            [] if order is None else [(ORDER_NAME, order.get("sha256"), order.get("bytes"), False)])
        shards: List[Tuple[str, Optional[str], Optional[int], bool]] = []
        for entry in self.manifest.shards:
            names = self.format.files_of(entry)
            shards.append((names[0], entry.sha256, entry.bytes, True))
            records += [(name, (entry.parts.get(name) or {}).get("sha256"), (entry.parts.get(name) or {}).get("bytes"),
                         False) for name in names[1:]]
        total = sum(size or 0 for _, _, size, _ in records + shards)
        if cache.max_bytes is not None and 2 * total > cache.max_bytes:
            return
        self.access.fetch_ahead(records + shards)

    def where(self, index: int) -> Tuple[int, int]:
        """(shard, sample in it) of the source's sample ``index``."""
        n = self.manifest.num_samples
        i = sample_index(index, n)  # what ImageFolder's indexing takes, tensors too
        if self.manifest.order is not None:
            order = self._local.get("order")
            if order is None:
                order = self._order_map()
            i = int(order[i])  # type: ignore[index]
            if not 0 <= i < n:
                raise ManifestError(f"{self.access.url_of(ORDER_NAME)}: position {i} outside 0..{n - 1} (a damaged "
                                    "order file)", self.access.url_of(ORDER_NAME))
        return locate(self._ends, i, self._sizes)

    def _fetches(self) -> bool:
        if self.prefetch is None:
            remote_uncached = self.access.remote and self.access.cache is None
            self.prefetch = remote_uncached or self.access.compressed or (
                not self.access.remote and is_latency_bound(self.access.cache_dir_or_root()))
        return bool(self.prefetch) and hasattr(self.format, "iterable") and self.format.iterable

    def __getitem__(self, index: int) -> Any:
        if self._fetches():
            return self.__getitems__([index])[0]
        k, j = self.where(index)
        shard = self.shard(k)
        if not self.classification:
            return self._fields(shard, k, j)
        try:  # a plain try: free on the hot path, where a context manager costs as much as the read
            image = self._image(shard.image(j), self.stored == "decoded")
        except Exception:
            with decode_errors_naming(f"{self.manifest.shards[k].name}[{j}]"):
                raise
        return self._finish(image, shard.labels[j])

    def _fields(self, shard: ShardReader, k: int, j: int, source: Any = None) -> Dict[str, Any]:
        sample: Dict[str, Any] = {"__key__": shard.keys[j]}
        with decode_errors_naming(f"{self.manifest.shards[k].name}: {shard.keys[j]}"):
            stored = shard.fields(j, source) if source is not None else shard.fields(j)
            for name, data in stored.items():
                if isinstance(data, np.ndarray):  # a packed array (npy): a view of the map with decode="numpy"
                    sample[name] = data if self.decode == "numpy" else np.array(data)
                    continue
                sample[name] = decode_field(name, data, self.decode, self.allow_pickle)
        return self._finish_dict(sample)

    def _batch_shape(self) -> Optional[Tuple[int, int, int]]:
        """(3, height, width) where a batch's images are decoded into one tensor
        (:mod:`dsconvert.readers.into_batch`): ``decode="fused"`` with a crop of known size
        ending in ``PILToTensor``, over encoded (image, label) samples; else None."""
        if self.fused is None or not self.classification or self.stored == "decoded":
            return None
        return self.fused.batch_shape

    def _into_batch(self, indices: List[int], shape: Tuple[int, int, int],
                    places: Optional[List[Tuple[int, int]]] = None, sources: Optional[Dict[int, Any]] = None
                    ) -> List[Any]:
        """The batch's images decoded into the rows of one uint8 tensor, which torch's
        ``default_collate`` then returns without a copy (see :mod:`dsconvert.readers.into_batch`);
        ``places`` and ``sources``: where each sample is and its shard's bytes, already fetched."""
        from .into_batch import RowsOfBatch, new_batch

        images = new_batch(len(indices), shape)
        rows = images.numpy()
        into = self.fused.into  # type: ignore[union-attr]
        where, shard_of, target_transform = self.where, self.shard, self.target_transform
        labels = []
        for slot, index in enumerate(indices):
            k, j = where(index) if places is None else places[slot]
            shard = shard_of(k)
            try:  # a plain try, as in __getitem__
                into(shard.image(j) if sources is None else shard.image(j, sources[k]),  # type: ignore[call-arg]
                     rows[slot])
            except Exception:
                with decode_errors_naming(f"{self.manifest.shards[k].name}[{j}]"):
                    raise
            label = shard.labels[j]
            labels.append(label if target_transform is None else target_transform(label))
        return RowsOfBatch(images, labels)

    def __getitems__(self, indices: List[int]) -> List[Any]:
        """The samples of one batch (torch's DataLoader calls this once per batch, then
        collates): one call instead of ``len(indices)`` from the fetcher; on latency-bound
        storage, their bytes requested at once."""
        shape = self._batch_shape()
        if not self._fetches():
            if shape is not None:
                return self._into_batch(indices, shape)
            getitem = self.__getitem__
            return [getitem(i) for i in indices]
        places = [self.where(i) for i in indices]
        wanted: Dict[int, List[int]] = {}
        for k, j in places:
            wanted.setdefault(k, []).append(j)
        sources: Dict[int, Any] = {}
        try:
            for k, js in wanted.items():
                sources[k] = self.shard(k).scattered(js, self.classification)
            if shape is not None:
                return self._into_batch(indices, shape, places, sources)
            out: List[Any] = []
            for k, j in places:
                shard, source = self.shard(k), sources[k]
                if not self.classification:
                    out.append(self._fields(shard, k, j, source))
                    continue
                try:
                    image = self._image(shard.image(j, source))  # type: ignore[call-arg]
                except Exception:
                    with decode_errors_naming(f"{self.manifest.shards[k].name}[{j}]"):
                        raise
                out.append(self._finish(image, shard.labels[j]))
            return out
        finally:
            for source in sources.values():
                source.close()
