"""The Datasets over a :class:`dsconvert.readers.mix_draws.Mixture`: ``MixedDataset`` (map-style)
and ``MixedStream`` (iterable, dealt over ranks and DataLoader workers, resumable). Made by
:func:`dsconvert.mix` and :func:`dsconvert.subsample`.

Both read their sources by index (``__getitems__`` where a source has it, so a remote output's
batch is requested at once). The epoch lives in a :class:`dsconvert.readers.epoch.SharedEpoch`,
so ``set_epoch`` reaches persistent DataLoader workers, and a stream's epochs advance by
themselves as :class:`dsconvert.readers.stream.StreamDataset`'s do. A stream deals each epoch's
positions exactly as the streaming reader deals its samples (:mod:`dsconvert.readers.order`):
a state ``{"epoch", "samples_seen"}`` continues on any number of ranks and workers, a worker's
own state (torchdata's StatefulDataLoader) where it stopped.

The sources are read at the mixture's epoch, whichever process reads them: a mixture among the
sources (``mix([subsample(a, 3), b])``) reads its own draws of that epoch, so the subsample moves
on each epoch as it does alone; any other source with ``set_epoch`` is told the epoch.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..distributed import distributed_initialized, worker_info, world_info
from ..processes import settle_worker
from .base import TorchDataset, TorchIterableDataset, sample_index
from .epoch import SharedEpoch, begin_iteration
from .mix_draws import Mixture
from .order import Deal, check_state, remaining, worker_place

__all__ = ["MixedDataset", "MixedStream"]

_PIECE = 256  # positions located (and each source's share requested) at once


def _at_epoch(ds: Any, epoch: int) -> None:
    """Tell a source (other than a mixture, read at an epoch directly) the mixture's epoch, in
    the process that reads it, when it has ``set_epoch`` and is not there yet."""
    set_epoch = getattr(ds, "set_epoch", None)
    if callable(set_epoch) and getattr(ds, "epoch", None) != epoch:
        set_epoch(epoch)


def _read(datasets: Sequence[Any], sources: np.ndarray, samples: np.ndarray, epoch: int) -> List[Any]:
    """The samples at (source, index) pairs, in order; each source's read as one batch, at the
    mixture's ``epoch``: a mixture among the sources (a ``subsample``) reads that epoch's draws
    (no shared state is changed, so workers at different epochs never disturb each other), any
    other source with ``set_epoch`` is told it."""
    out: List[Any] = [None] * len(sources)
    for s in np.unique(sources).tolist():
        where = np.flatnonzero(sources == s).tolist()
        wanted = samples[sources == s]
        ds = datasets[s]
        if isinstance(ds, MixedDataset):
            got = _read(ds.datasets, *ds.mixture.locate(epoch, wanted), epoch)
        else:
            _at_epoch(ds, epoch)
            got = ds.__getitems__(wanted.tolist()) if hasattr(ds, "__getitems__") else [ds[i] for i in wanted.tolist()]
        for w, item in zip(where, got):
            out[w] = item
    return out


class MixedDataset(TorchDataset):
    """A map-style mixture: index i of epoch e is (source, sample) by the mixture's arithmetic
    (:mod:`dsconvert.readers.mix_draws`), the same in every process. ``datasets``: the sources;
    ``mixture``: the arithmetic; ``source_of(i)`` names where index i reads."""

    def __init__(self, datasets: Sequence[Any], mixture: Mixture):
        self.datasets = list(datasets)
        self.mixture = mixture
        self._epoch = SharedEpoch()
        self.identity = mixture.identity

    def __len__(self) -> int:
        return self.mixture.length

    @property
    def epoch(self) -> int:
        return self._epoch.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch``'s draws (a subsample or repeat moves on along each source's seeded
        order), and the sources at that epoch (a subsample among them, nested at any depth, takes
        its own epoch's draws; another source with ``set_epoch`` is told it); reaches persistent
        DataLoader workers. Call it with the sampler's."""
        self._epoch.set_epoch(int(epoch))

    def locate(self, indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
        """(source, sample index in it) of each index, in the current epoch."""
        return self._locate(self.epoch, indices)

    def _locate(self, epoch: int, indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
        n = self.mixture.length
        return self.mixture.locate(epoch, np.array([sample_index(i, n) for i in indices], dtype=np.int64))

    def source_of(self, index: int) -> Tuple[int, int]:
        """(source, sample index in it) of ``index``, in the current epoch."""
        return self.mixture.locate_one(self.epoch, sample_index(index, self.mixture.length))

    def __getitem__(self, index: int) -> Any:
        epoch = self.epoch
        s, k = self.mixture.locate_one(epoch, sample_index(index, self.mixture.length))
        ds = self.datasets[s]
        if isinstance(ds, MixedDataset):  # a subsample among the sources: its draws of this epoch
            return _read([ds], np.zeros(1, dtype=np.int64), np.array([k]), epoch)[0]
        _at_epoch(ds, epoch)
        return ds[k]

    def __getitems__(self, indices: Sequence[int]) -> List[Any]:
        epoch = self.epoch
        return _read(self.datasets, *self._locate(epoch, indices), epoch)

    def state_dict(self) -> Dict[str, Any]:
        """``{"epoch", "dataset"}``: the draws; the position in the epoch is the sampler's."""
        return {"epoch": self.epoch, "dataset": self.identity}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        epoch, _ = check_state(dict(state, samples_seen=0), self.identity, len(self), 1, None)
        self.set_epoch(epoch)


class MixedStream(TorchIterableDataset):
    """An iterable mixture: each epoch's positions dealt over ranks and DataLoader workers, in
    order (or, ``infinite``, epoch after epoch without end). ``len`` is this rank's samples in
    an epoch. See :func:`dsconvert.mix`."""

    def __init__(self, datasets: Sequence[Any], mixture: Mixture, infinite: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None, even: Optional[str] = "pad"):
        remaining(0, 0, 1, even)  # validates ``even``
        self.datasets = list(datasets)
        self.mixture = mixture
        self.infinite = bool(infinite)
        self.rank, self.world_size = rank, world_size
        if (rank is None or world_size is None) and distributed_initialized():
            self.rank, self.world_size = world_info(rank, world_size)  # fixed here: spawned workers have no group
        world_info(self.rank, self.world_size)  # validates them
        self.even = even
        self.identity = mixture.identity
        self._epoch = SharedEpoch()
        self._resume: Optional[Dict[str, Any]] = None
        self._state: Optional[Dict[str, Any]] = None
        self._yielded = 0

    @property
    def epoch(self) -> int:
        return self._epoch.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (on every rank); reaches persistent workers. Without it,
        each new iteration reads the epoch after the previous one's. The sources are read at
        the epoch being read (see :meth:`MixedDataset.set_epoch`), an infinite stream's too."""
        self._epoch.set_epoch(int(epoch))

    def _deal(self, seen: int, wid: int, nworkers: int) -> Deal:
        rank, world = world_info(self.rank, self.world_size)
        return Deal(remaining(self.mixture.length, seen, world, self.even), world, rank, nworkers, wid, 1)

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("an infinite mixture has no length: count steps in the training loop")
        return self._deal(self._epoch.pending() or 0, 0, 1).rank_length

    def state_dict(self) -> Dict[str, Any]:
        """Inside a worker (or with no workers): that worker's place, which
        :meth:`load_state_dict` restores exactly in a loader of the same shape; in a process
        that has not iterated, where its next iteration starts. Both name the mixture
        (``dataset``), as :class:`dsconvert.readers.stream.StreamDataset`'s states do."""
        if self._state is None:
            return {"epoch": self.epoch, "samples_seen": self._epoch.pending() or 0, "dataset": self.identity}
        return dict(self._state, yielded=self._yielded, dataset=self.identity)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """``{"epoch": e, "samples_seen": n}``: continue epoch e after the first n positions
        (all ranks'), dealt over this job's ranks and workers; a worker's state (``worker``,
        ``yielded``) resumes that worker. A state of another mixture is refused."""
        epoch, seen = check_state(state, self.identity, self.mixture.length,
                                  world_info(self.rank, self.world_size)[1], self.even)
        if "worker" in state or "yielded" in state:
            where, yielded = worker_place(state)
            self._resume = {"epoch": epoch, "samples_seen": seen, "worker": where, "yielded": yielded}
        else:
            self._resume = None
            self._epoch.resume(epoch, seen)

    def _begin(self) -> Tuple[int, int, int]:
        wid, nworkers = worker_info()
        rank, world = world_info(self.rank, self.world_size)
        resume, self._resume = self._resume, None
        return begin_iteration(self._epoch, resume, [rank, world, wid, nworkers, 1])

    def __iter__(self) -> Iterator[Any]:
        settle_worker()
        epoch, seen, skip = self._begin()
        return self._iterate(epoch, seen, skip)

    def _iterate(self, epoch: int, seen: int, skip: int) -> Iterator[Any]:
        wid, nworkers = worker_info()
        rank, world = world_info(self.rank, self.world_size)
        n = self.mixture.length
        while True:
            deal = self._deal(seen, wid, nworkers)
            self._state = {"epoch": epoch, "samples_seen": seen, "worker": [rank, world, wid, nworkers, 1]}
            self._yielded = skip
            left = n - seen
            for a in range(skip, deal.length, _PIECE):
                positions = seen + deal.offsets(a, a + _PIECE) % left  # past the end wraps (even="pad")
                for item in _read(self.datasets, *self.mixture.locate(epoch, positions), epoch):
                    self._yielded += 1
                    yield item
            if not self.infinite:
                return
            epoch, seen, skip = epoch + 1, 0, 0
