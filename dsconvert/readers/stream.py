"""``StreamDataset``: a format's shards read in file order, as an IterableDataset; wds outputs
open as this.

Each (rank, DataLoader worker) reads a contiguous slice of the epoch's sequence of samples
(shards in a seeded order, ``shuffle``), so a shard is read sequentially, memory-mapped or
fetched ahead; a bounded buffer shuffles samples within that (encoded bytes, never decoded
images). ``even`` pads or drops so that every rank sees as many samples.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..codecs import ENCODED_MODES, decode_errors_naming, decode_field
from ..distributed import distributed_initialized, rank_span, split_range, worker_info, world_info
from ..formats.base import ShardReader
from ..io.localfs import is_latency_bound
from ..io.shard_cache import ShardAccess
from ..manifest import Manifest, ShardEntry
from .base import ShardDataset, TorchIterableDataset, collate, cumulative, locate

__all__ = ["StreamDataset"]


class StreamDataset(ShardDataset, TorchIterableDataset):
    """Iterable Dataset over a format's shards, read in file order; wds outputs open as this.
    A drop-in for ImageFolder in a DataLoader.

    Samples are ``(image, label)`` for ImageFolder and list sources, dicts of decoded fields
    otherwise. ``len()`` is exact for this rank. See :func:`dsconvert.open_dataset`.
    """

    def __init__(
        self,
        root: str,
        manifest: Manifest,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        decode: str = "pil",
        shuffle: bool = False,
        seed: int = 0,
        buffer_size: int = 1000,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        even: Optional[str] = None,
        max_member_bytes: int = 1 << 31,
        prefetch: Optional[bool] = None,
        allow_pickle: bool = False,
        batch_size: Optional[int] = None,
        access: Optional[ShardAccess] = None,
    ):
        super().__init__(root, manifest, transform, target_transform, decode, access)
        if buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError("batch_size must be a positive int or None")
        rank_span(0, 0, 1, even)  # validates ``even``
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_size = buffer_size
        self.rank = rank
        self.world_size = world_size
        if (rank is None or world_size is None) and distributed_initialized():
            # fixed now, in the trainer's process: spawned DataLoader workers have no group
            self.rank, self.world_size = world_info(rank, world_size)
        self.even = even
        self.max_member_bytes = max_member_bytes
        self.prefetch = prefetch  # None: decided by the storage (latency-bound or not)
        self.allow_pickle = allow_pickle  # pickled fields run code when loaded: only for trusted data
        # batches built in the worker (DataLoader(ds, batch_size=None)): one collate per batch, and
        # whole batches per worker, so len() is exact whatever the number of workers
        self.batch_size = batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for this epoch (call before iterating, on every rank)."""
        self.epoch = int(epoch)

    def _span(self) -> Tuple[int, int]:
        rank, world = world_info(self.rank, self.world_size)
        return rank_span(self.manifest.num_samples, rank, world, self.even)

    def __len__(self) -> int:
        """Samples for this rank; batches with ``batch_size`` (the last one may be short)."""
        start, stop = self._span()
        return stop - start if self.batch_size is None else -(-(stop - start) // self.batch_size)

    def _shard_order(self) -> List[ShardEntry]:
        shards = list(self.manifest.shards)
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(shards)
        return shards

    def _positions(self) -> Tuple[List[ShardEntry], int, int]:
        """Shard order and this worker's [start, stop) in the global sequence."""
        start, stop = self._span()
        wid, nworkers = worker_info()
        if self.batch_size is None:
            lo, hi = split_range(stop - start, nworkers, wid)
        else:  # whole batches per worker: only the rank's last batch is short
            b = self.batch_size
            lo, hi = split_range(-(-(stop - start) // b), nworkers, wid)
            lo, hi = lo * b, min(hi * b, stop - start)
        return self._shard_order(), start + lo, start + hi

    def _raw_samples(self) -> Iterator[Tuple[ShardReader, int, Any]]:
        """(shard, position, raw bytes) for this worker's samples, read in file order."""
        shards, start, stop = self._positions()
        n = self.manifest.num_samples
        if n == 0 or start >= stop:
            return
        if self.prefetch is None:  # remote objects are always read ahead, by ranges or into the cache
            self.prefetch = not self.access.remote and is_latency_bound(self.access.cache_dir_or_root())
        sizes = [s.num_samples for s in shards]
        ends = cumulative(sizes)
        pos = start
        while pos < stop:
            p = pos % n  # positions past n wrap around (even="pad")
            k, first = locate(ends, p, sizes)
            run = min(ends[k] - p, stop - pos)
            shard = self.format.open_shard(self.access, shards[k], self.manifest,
                                           max_member_bytes=self.max_member_bytes)
            shard.prepare(first, first + run, self.prefetch, views=self.decode == "buffer")
            try:
                if self.classification:
                    for i, raw in shard.images(first, first + run, views=self.decode == "buffer"):
                        yield shard, i, raw
                else:
                    for i in range(first, first + run):
                        yield shard, i, shard.fields(i)
            finally:
                shard.close()
            pos += run

    def _decode(self, shard: ShardReader, i: int, raw: Any) -> Any:
        if self.classification:
            try:  # a plain try: free on the hot path
                image = self._image(raw)
            except Exception:
                with decode_errors_naming(f"{shard.name}: {shard.keys[i]}"):
                    raise
            return self._finish(image, shard.labels[i])
        sample: Dict[str, Any] = {"__key__": shard.keys[i]}
        with decode_errors_naming(f"{shard.name}: {shard.keys[i]}"):
            for name, data in raw.items():
                sample[name] = decode_field(name, data, self.decode, self.allow_pickle)
        return self._finish_dict(sample)

    def __iter__(self) -> Iterator[Any]:
        items: Iterator[Tuple[ShardReader, int, Any]] = self._raw_samples()
        if self.shuffle and self.buffer_size > 1:
            rank, _ = world_info(self.rank, self.world_size)
            wid, _ = worker_info()
            rng = random.Random(f"{self.seed}:{self.epoch}:{rank}:{wid}")
            items = _shuffled(items, self.buffer_size, rng)
        plain = (self.classification and self.decode in ENCODED_MODES
                 and self.transform is None and self.target_transform is None)
        if self.batch_size is None:  # one loop per case: a generator layer costs as much as a raw read
            if plain:  # the raw fast path: nothing to decode or transform
                for shard, i, raw in items:
                    yield raw, shard.labels[i]
            else:
                for shard, i, raw in items:
                    yield self._decode(shard, i, raw)
            return
        if plain:
            samples: Iterator[Any] = ((raw, shard.labels[i]) for shard, i, raw in items)
        else:
            samples = (self._decode(shard, i, raw) for shard, i, raw in items)
        batch: List[Any] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield collate(batch, self.decode in ENCODED_MODES)
                batch = []
        if batch:
            yield collate(batch, self.decode in ENCODED_MODES)


def _shuffled(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Bounded-buffer shuffle; holds encoded bytes, never decoded samples."""
    buffer: List[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer
