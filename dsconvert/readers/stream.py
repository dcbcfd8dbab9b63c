"""``StreamDataset``: a format's shards as an IterableDataset whose position is state; wds
outputs open as this.

The epoch is one global order of the samples (shards in a seeded order, each window of
``buffer_size`` positions permuted, ``shuffle``), dealt to ranks and DataLoader workers in the
order they consume it (:mod:`dsconvert.readers.order`), so a job can stop anywhere and resume
exactly: with torchdata's StatefulDataLoader (each worker's place, :meth:`state_dict`), or on
another number of ranks and workers (``load_state_dict({"epoch", "samples_seen"})``). A
sample is located by arithmetic, never by reading what came before it. Local shards are read
by ``pread`` (a memory map for ``decode="buffer"`` views), latency-bound and remote ones by
concurrent ranged requests for exactly the members needed, one group ahead. DataLoader workers
take their rank's samples in runs (``batch_size``, else ``STREAM_RUN`` = 64 consecutive
positions): neighbours in a shard, so one request serves a run and no worker fetches bytes
another worker reads (runs of one sample each interleaved the workers, and each merged range
then carried its neighbours' samples too). ``even`` (``"pad"`` by
default, as ``DistributedSampler``) pads or drops so that every rank takes as many samples and
steps; ``None`` splits exactly, ranks differing by one sample.
"""

from __future__ import annotations

import os
from itertools import islice
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, cast

import numpy as np

from ..codecs import ENCODED_MODES, decode_errors_naming, decode_field
from ..distributed import distributed_initialized, worker_info, world_info
from ..formats.base import ShardReader
from ..io.localfs import is_latency_bound
from ..io.ranges import PreadBytes
from ..io.shard_cache import ShardAccess
from ..manifest import Manifest
from ..processes import settle_worker
from .base import ShardDataset, TorchIterableDataset, collate
from .epoch import SharedEpoch, begin_iteration, check_order, order_of
from .order import Deal, GlobalOrder, check_state, epoch_order, remaining, worker_place

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
        even: Optional[str] = "pad",
        max_member_bytes: int = 1 << 31,
        prefetch: Optional[bool] = None,
        allow_pickle: bool = False,
        batch_size: Optional[int] = None,
        collate: bool = True,
        access: Optional[ShardAccess] = None,
    ):
        super().__init__(root, manifest, transform, target_transform, decode, access)
        if buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError("batch_size must be a positive int or None")
        if type(collate) is not bool:
            raise ValueError("collate must be True or False")
        remaining(0, 0, 1, even)  # validates ``even``
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
        # collate=False: samples one by one, still dealt in whole batches of batch_size, for
        # DataLoader(ds, batch_size=batch_size, num_workers=N): exact len and elastic resumption
        self.collate = collate
        self._batches = batch_size is not None and collate  # items are batches
        self._encoded_images = decode in ENCODED_MODES and transform is None  # bytes of differing lengths: a list
        self._epoch = SharedEpoch()  # the epoch, shared with (persistent) DataLoader workers
        self._resume: Optional[Dict[str, Any]] = None  # a worker's own saved place (StatefulDataLoader)
        self._state: Optional[Dict[str, Any]] = None  # the running iteration's place
        self._yielded = 0  # samples it has produced (in batches or one by one)
        self._identity: Optional[str] = None  # the manifest's identity, taken once (states carry it)

    @property
    def epoch(self) -> int:
        return self._epoch.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.set_epoch(int(epoch))

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for this epoch (call before iterating, on every rank). Reaches DataLoader
        workers started with ``persistent_workers=True`` too (:mod:`dsconvert.readers.epoch`).
        Without it, each new iteration reads the epoch after the previous one's."""
        self.epoch = int(epoch)

    # --- position: the StatefulDataLoader protocol and elastic resumption -----------------

    def state_dict(self) -> Dict[str, Any]:
        """Where this process's iteration is: inside a DataLoader worker (torchdata's
        StatefulDataLoader calls it there) or with ``num_workers=0``, the worker's own place,
        which :meth:`load_state_dict` restores exactly in a loader of the same shape. A process
        that has not iterated (the trainer's, when workers read) cannot see the workers'
        progress: it returns where its next iteration starts, ``{"epoch", "samples_seen"}``;
        save the StatefulDataLoader's state, or count samples in the training loop. Every state
        names its dataset (``dataset``: :meth:`Manifest.identity`) and its order (``seed``,
        ``shuffle``)."""
        if self._state is None:
            pending = self._epoch.pending()
            return {"epoch": self.epoch, "samples_seen": pending or 0, "dataset": self.identity, **self._order_named()}
        # samples, whether items are samples or batches
        return dict(self._state, yielded=self._yielded, dataset=self.identity, **self._order_named())

    def _order_named(self) -> Dict[str, Any]:
        """The seed and shuffle window a state names (:func:`dsconvert.readers.epoch.order_of`)."""
        return order_of(self.seed, self.buffer_size if self.shuffle else 0)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue an epoch. ``{"epoch": e, "samples_seen": n}``, n the number of samples the
        whole job (all ranks) consumed in epoch e: the next iteration of epoch e deals the
        samples after the first n of the epoch's global order over this job's ranks and workers,
        whatever their number (exact when the consumed ones were a prefix: see
        :mod:`dsconvert.readers.order`). A state from :meth:`state_dict` inside a worker
        (with ``worker`` and ``yielded``) resumes that worker where it stopped. A state naming
        another dataset (``dataset``) or another order (``seed``, ``shuffle``), or past the epoch's
        end, is refused in one line."""
        epoch, seen = check_state(state, self.identity, self.manifest.num_samples,
                                  world_info(self.rank, self.world_size)[1], self.even)
        check_order(state, self.seed, self.buffer_size if self.shuffle else 0)
        if "worker" in state or "yielded" in state:
            where, yielded = worker_place(state)
            self._resume = {"epoch": epoch, "samples_seen": seen, "worker": where, "yielded": yielded}
        else:
            self._resume = None
            self._epoch.resume(epoch, seen)

    @property
    def identity(self) -> str:
        """The dataset's identity (:meth:`Manifest.identity`), which its states carry."""
        if self._identity is None:
            self._identity = self.manifest.identity()
        return self._identity

    # --- the epoch's order and this worker's part of it ----------------------------------

    def _order(self, epoch: int) -> GlobalOrder:
        return epoch_order([s.num_samples for s in self.manifest.shards], self.shuffle, self.buffer_size,
                           self.seed, epoch)

    def _run(self, nworkers: int) -> int:
        """The run of consecutive positions each worker takes in turn: the batch when the
        dataset knows it, else :data:`STREAM_RUN` (one sample per run would interleave the
        workers sample by sample, each then fetching its neighbours' bytes too); one worker's
        run changes nothing, and is recorded as 1 (as states saved before runs had)."""
        return self.batch_size or (STREAM_RUN if nworkers > 1 else 1)

    def _deal(self, seen: int, wid: int, nworkers: int) -> Deal:
        rank, world = world_info(self.rank, self.world_size)
        length = remaining(self.manifest.num_samples, seen, world, self.even)
        return Deal(length, world, rank, nworkers, wid, self.batch_size or 1, self._run(nworkers))

    def __len__(self) -> int:
        """Samples for this rank in an epoch (batches with ``batch_size``; the last one may be
        short); what is left of it when an elastic resume is pending for the current epoch."""
        deal = self._deal(self._epoch.pending() or 0, 0, 1)
        return deal.batches() if self._batches else deal.rank_length

    def _begin(self) -> Tuple[int, int, Deal, int]:
        """(epoch, samples_seen at its start, this worker's deal, samples to skip) of the
        iteration starting now, taking the resume meant for it."""
        wid, nworkers = worker_info()
        rank, world = world_info(self.rank, self.world_size)
        resume, self._resume = self._resume, None
        here = [rank, world, wid, nworkers, self._run(nworkers)]
        epoch, seen, skip = begin_iteration(self._epoch, resume, here, "run")
        deal = self._deal(seen, wid, nworkers)
        self._state = {"epoch": epoch, "samples_seen": seen, "worker": here}
        self._yielded = skip
        return epoch, seen, deal, skip

    def _pieces(self, epoch: int, seen: int, deal: Deal, first: int) -> Iterator[Tuple[List[int], List[int]]]:
        """(shard indices, sample indices) of this worker's samples from its ``first``-th, in
        groups located at once (numpy), in reading order."""
        n = self.manifest.num_samples
        order = self._order(epoch)
        left = n - seen
        for a in range(first, deal.length, _PIECE):
            g = seen + deal.offsets(a, a + _PIECE) % left  # positions past the end wrap (even="pad")
            ks, js = order.locate(g)
            yield ks.tolist(), js.tolist()

    def _raw_samples(self, epoch: int, seen: int, deal: Deal, first: int,
                     pairs: bool = False) -> Iterator[Any]:
        """(shard, sample, raw bytes or fields) for this worker's samples from its ``first``-th;
        with ``pairs``, the samples themselves, (encoded image, label), counted as yielded: the
        raw fast path, one generator layer where a layer costs a third of a warm read."""
        if self.manifest.num_samples == 0 or first >= deal.length:
            return
        if self.prefetch is None:  # remote objects are always read ahead, by ranges or into the cache
            self.prefetch = not self.access.remote and is_latency_bound(self.access.cache_dir_or_root())
        # compressed tars: each group's samples read at once, in stream order (not one jump each)
        fetch = self.prefetch or self.access.remote and not self.access.cache or self.access.compressed
        views = self.decode == "buffer"
        image_only = self.classification
        shards = _OpenShards(self, prepare=not fetch, views=views)
        pread, fd = os.pread, -1
        data: Union[bytes, np.ndarray]
        pieces: Iterator[Tuple[List[int], List[int], Dict[int, Any]]] = (
            (ks, js, {}) for ks, js in self._pieces(epoch, seen, deal, first))
        if fetch:
            pieces = _fetched_ahead(pieces, shards, image_only)
        try:
            for ks, js, sources in pieces:
                current = -1
                try:
                    for k, j in zip(ks, js):
                        if k != current:
                            current = k
                            shard = shards.get(k)
                            source = sources.get(k) or shard.source
                            get = source.get
                            member: Any = shard.image_member if image_only else None  # type: ignore[attr-defined]
                            check = shard.check_headers if image_only else False  # type: ignore[attr-defined]
                            header_len: Any = getattr(shard, "header_len", None)
                            whole = (np.frombuffer(source.mm, dtype=np.uint8)
                                     if views and getattr(source, "mm", None) is not None else None)
                            labels = shard.labels
                            fd = source.fd if not views and type(source) is PreadBytes else -1
                        if not image_only:
                            try:  # a plain try: free on the hot path
                                fields = shard.fields(j, source)
                            except Exception:  # a damaged member (a zstd field), named as decoding errors are
                                with decode_errors_naming(f"{shard.name}: {shard.keys[j]}"):
                                    raise
                            yield shard, j, fields
                            continue
                        field, o, sz = member(j)
                        if fd >= 0 and check:  # PreadBytes.get, inlined, the member's headers with its data
                            h = header_len(j, field, o, sz)
                            data = pread(fd, sz + h, o - h)
                            if len(data) != sz + h:
                                data = get(o - h, sz + h)  # reads again, and raises if still short
                            shard.check_header(data[:h], j, field, sz)  # type: ignore[attr-defined]
                            data = data[h:]
                        elif fd >= 0:
                            data = pread(fd, sz, o)
                            if len(data) != sz:
                                data = get(o, sz)
                        elif whole is not None:
                            if check:
                                shard.check_header(whole[o - header_len(j, field, o, sz): o], j, field,  # type: ignore
                                                   sz)
                            data = whole[o: o + sz]
                        elif views:
                            data = np.frombuffer(shard.read(get, j, field, o, sz), dtype=np.uint8)  # type: ignore
                        else:
                            data = shard.read(get, j, field, o, sz)  # type: ignore[attr-defined]
                        if pairs:
                            self._yielded += 1
                            yield data, labels[j]
                        else:
                            yield shard, j, data
                finally:
                    for source in sources.values():
                        source.close()
        finally:
            shards.close()

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
        """This worker's part of the epoch (see :mod:`dsconvert.readers.order`). The position
        is fixed here, not at the first ``next``: torchdata asks for it in between."""
        settle_worker()
        epoch, seen, deal, skip = self._begin()
        if self._plain() and not self._batches:
            return self._raw_samples(epoch, seen, deal, skip, pairs=True)
        return self._iterate(self._raw_samples(epoch, seen, deal, skip))

    def _plain(self) -> bool:
        """Samples are the stored bytes and their labels: nothing to decode or transform."""
        return (self.classification and self.decode in ENCODED_MODES
                and self.transform is None and self.target_transform is None)

    def _iterate(self, items: Iterator[Tuple[ShardReader, int, Any]]) -> Iterator[Any]:
        plain = self._plain()
        if not self._batches:  # (plain samples one by one come from _raw_samples directly)
            for shard, i, raw in items:
                sample = self._decode(shard, i, raw)
                self._yielded += 1
                yield sample
            return
        shape = self.fused.batch_shape if self.fused is not None and self.classification else None
        if shape is not None:
            yield from self._into_batches(items, shape)
            return
        if plain:
            samples: Iterator[Any] = ((raw, shard.labels[i]) for shard, i, raw in items)
        else:
            samples = (self._decode(shard, i, raw) for shard, i, raw in items)
        batch: List[Any] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == self.batch_size:
                out = collate(batch, self._encoded_images)
                batch = []
                self._yielded += self.batch_size
                yield out
        if batch:
            out = collate(batch, self._encoded_images)
            self._yielded += len(batch)
            yield out

    def _into_batches(self, items: Iterator[Tuple[ShardReader, int, Any]], shape: Tuple[int, int, int]
                      ) -> Iterator[Any]:
        """Batches of ``batch_size`` whose images are decoded into the rows of one uint8 tensor
        (:mod:`dsconvert.readers.into_batch`, as the map-style reader's ``__getitems__``): the
        same samples and draws as decoding each and collating them, without the copy."""
        from .into_batch import new_batch

        size = cast(int, self.batch_size)
        into, target_transform = self.fused.into, self.target_transform  # type: ignore[union-attr]
        done = False
        while not done:
            taken = list(islice(items, size))
            done = len(taken) < size
            if not taken:
                return
            images = new_batch(len(taken), shape)
            rows = images.numpy()
            labels = []
            for slot, (shard, i, raw) in enumerate(taken):
                try:  # a plain try, as in _decode
                    into(raw, rows[slot])
                except Exception:
                    with decode_errors_naming(f"{shard.name}: {shard.keys[i]}"):
                        raise
                label = shard.labels[i]
                labels.append(label if target_transform is None else target_transform(label))
            out = [images, collate(labels)]
            self._yielded += len(taken)
            yield out


STREAM_RUN = 64  # consecutive positions a worker takes in turn when the dataset does not know the batch
_PIECE = 256  # samples located at once, and fetched at once from latency-bound storage
_FETCH_BUDGET = 64 << 20  # ... at most this many bytes per group (two groups in memory)


class _OpenShards:
    """The shards one iteration reads, opened on first use and kept while the order moves
    between the few a shuffle window spans (closing the least recently used past ``limit``)."""

    def __init__(self, ds: StreamDataset, prepare: bool, views: bool, limit: int = 16):
        self.ds, self.prepare, self.views, self.limit = ds, prepare, views, limit
        self.open: Dict[int, ShardReader] = {}

    def get(self, k: int) -> ShardReader:
        shard = self.open.pop(k, None)
        if shard is None:
            ds = self.ds
            shard = ds.format.open_shard(ds.access, ds.manifest.shards[k], ds.manifest,
                                         max_member_bytes=ds.max_member_bytes)
            if self.prepare:
                shard.prepare(0, len(shard.keys), False, views=self.views)
            if len(self.open) >= self.limit:
                self.open.pop(next(iter(self.open))).close()
        self.open[k] = shard  # most recently used last
        return shard

    def close(self) -> None:
        for shard in self.open.values():
            shard.close()
        self.open.clear()


def _fetched_ahead(pieces: Iterator[Tuple[List[int], List[int], Dict[int, Any]]], shards: _OpenShards,
                   image_only: bool) -> Iterator[Tuple[List[int], List[int], Dict[int, Any]]]:
    """Each group of samples with its bytes requested one group ahead (latency-bound storage);
    a group holds at most ``_FETCH_BUDGET`` bytes (or one sample), so memory stays bounded
    whatever the members' sizes."""
    budget = _FETCH_BUDGET
    def request(ks: List[int], js: List[int]) -> Dict[int, Any]:
        by_shard: Dict[int, List[int]] = {}
        for k, j in zip(ks, js):
            by_shard.setdefault(k, []).append(j)
        return {k: shards.get(k).scattered(samples, image_only) for k, samples in by_shard.items()}

    def bounded() -> Iterator[Tuple[List[int], List[int]]]:
        for ks, js, _ in pieces:
            start, total = 0, 0
            for i, (k, j) in enumerate(zip(ks, js)):
                size = shards.get(k).sample_bytes(j, image_only)
                if total and total + size > budget:
                    yield ks[start:i], js[start:i]
                    start, total = i, 0
                total += size
            yield ks[start:], js[start:]

    ahead = None
    try:
        for ks, js in bounded():
            job = (ks, js, request(ks, js))
            if ahead is not None:
                yield ahead
            ahead = job
        if ahead is not None:
            job, ahead = ahead, None
            yield job
    finally:
        if ahead is not None:
            for source in ahead[2].values():
                source.close()
