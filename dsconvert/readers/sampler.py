"""``ResumableSampler``: the sampler for map-style outputs (hdf5, npy, sources) whose position
is state, like the wds reader's: a ``DistributedSampler`` that resumes mid-epoch, on the
same number of ranks or another.

The epoch's global order is a permutation of all indices fixed by ``(seed, epoch)`` alone,
computed per position (a keyed Feistel network, :class:`FeistelPermutation`), so a rank holds
nothing per sample at any size: torch's ``RandomSampler`` (``shuffle=True``) materialises
``randperm(N)``, 8 bytes a sample in the main process (3.2 GB at 400M samples);
rank r takes every world-th of the positions not yet consumed (as ``DistributedSampler``
does), so after every rank has taken k batches the job has consumed exactly the first
``k * batch * world`` positions, and ``{"epoch", "samples_seen"}`` says where to continue
whatever the new world size. torchdata's StatefulDataLoader saves and restores it by itself.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sized, Union

from ..distributed import world_info
from ..manifest import Manifest
from .base import _torch_data
from .epoch import check_order, order_of
from .mix_draws import FeistelPermutation
from .order import Deal, check_state, remaining

__all__ = ["ResumableSampler"]

_CHUNK = 1 << 16  # indices computed at once

_Sampler: Any = _torch_data.Sampler if _torch_data is not None else object


class ResumableSampler(_Sampler):
    """Indices of a map-style dataset for this rank, in the epoch's global order, from where
    the job stopped. ``even``: ``"pad"`` (the default, as ``DistributedSampler``: repeat
    indices so that every rank takes as many), ``"drop"`` (drop the last ``len % world``) or
    None, as :func:`dsconvert.open_dataset`'s streaming reader; ``rank``/``world_size`` default
    to torch.distributed's or RANK/WORLD_SIZE. Without ``set_epoch``, each new iteration reads
    the epoch after the previous one's."""

    def __init__(self, data: Union[Sized, int], shuffle: bool = True, seed: int = 0,
                 rank: Optional[int] = None, world_size: Optional[int] = None, even: Optional[str] = "pad"):
        self.n = data if isinstance(data, int) else len(data)
        manifest = getattr(data, "manifest", None)  # open_dataset's: states name their dataset
        self.identity: Optional[str] = manifest.identity() if isinstance(manifest, Manifest) else None
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = world_info(rank, world_size)
        remaining(0, 0, 1, even)  # validates ``even``
        self.even = even
        self.epoch = 0
        self._pending: Optional[int] = None  # samples_seen to start the next iteration of ``epoch`` at
        self._iterated = False  # an iteration of ``epoch`` has started: the next one reads epoch + 1
        self._start = 0
        self._yielded = 0

    def set_epoch(self, epoch: int) -> None:
        """The order for this epoch (call before iterating, on every rank)."""
        if int(epoch) != self.epoch:
            self._pending = None
        self.epoch = int(epoch)
        self._iterated = False

    def _deal(self, seen: int) -> Deal:
        return Deal(remaining(self.n, seen, self.world_size, self.even), self.world_size, self.rank, 1, 0, 1)

    def __len__(self) -> int:
        return self._deal(self._pending or 0).rank_length

    def __iter__(self) -> Iterator[int]:
        """The rest of the epoch; a pending resume is taken when the first index is drawn (a
        loader may make an iterator it never draws from)."""
        if self._iterated and self._pending is None:  # no set_epoch since the last iteration: the next epoch
            self.epoch += 1
        self._iterated = True
        seen, self._pending = self._pending or 0, None
        deal = self._deal(seen)
        self._start, self._yielded = seen, 0
        if not deal.length:
            return
        perm = FeistelPermutation(self.n, self.seed, "sampler", self.epoch) if self.shuffle else None
        for start in range(0, deal.length, _CHUNK):  # O(chunk) memory at any n: no permutation of n is held
            positions = seen + deal.offsets(start, min(deal.length, start + _CHUNK)) % (self.n - seen)
            for i in (perm(positions) if perm is not None else positions).tolist():
                self._yielded += 1
                yield i

    def state_dict(self) -> Dict[str, Any]:
        """``{"epoch", "samples_seen", "seed", "shuffle"}`` (and ``dataset``, its identity, over
        open_dataset's datasets): samples the whole job has drawn, assuming every rank
        drew as many as this one (DDP's lock step). A DataLoader with workers draws ahead of
        what the model consumed, so for an elastic resume take samples_seen from the training
        loop; torchdata's StatefulDataLoader snapshots this at the right moment by itself."""
        ours = {"dataset": self.identity} if self.identity is not None else {}
        ours.update(order_of(self.seed, self.n if self.shuffle else 0))
        if self._pending is not None:
            return {"epoch": self.epoch, "samples_seen": self._pending, **ours}
        return {"epoch": self.epoch, "samples_seen": min(self.n, self._start + self._yielded * self.world_size), **ours}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next iteration continues epoch ``state["epoch"]`` after its first
        ``state["samples_seen"]`` positions, dealt over this sampler's ranks. A state of another
        dataset or order (seed, shuffle), or past the epoch's end, is refused."""
        epoch, seen = check_state(state, self.identity, self.n, self.world_size, self.even)
        check_order(state, self.seed, self.n if self.shuffle else 0)
        self.epoch = epoch
        self._pending = seen
        self._iterated = False
