"""The epoch's order, and who reads which part of it: pure arithmetic, so that a position is
state and a job resumes exactly, with the same topology or another.

An epoch is a **global sequence** of N sample positions, fixed by ``(seed, epoch)`` alone and
independent of ranks, workers and batch size: the shards in a seeded order, concatenated, and
(with shuffling) every window of ``window`` consecutive positions permuted by its own seeded
generator. A job that has consumed ``samples_seen`` samples of the epoch has consumed the first
``samples_seen`` positions of that sequence, because the rest of it is **dealt** in consumption
order: global step s takes the next ``ranks * chunk`` positions, rank r the r-th ``chunk`` of
them, and within a rank the DataLoader's round robin takes chunk i from worker ``i % workers``.
So the remaining positions can be dealt afresh over any new topology, each exactly once.

``chunk`` is the batch a rank takes per step when the dataset knows it (``batch_size``), else
one sample. Within a rank, workers take runs of ``worker_chunk`` positions: the batch when the
dataset knows it, else 64 (``STREAM_RUN`` in the stream reader), so that a worker reads runs of
neighbouring samples. A worker's samples are always exactly determined (so the
StatefulDataLoader protocol resumes exactly); the DataLoader's per-worker batches consume a
prefix of the rank's sequence when its batch is the run (``batch_size`` given, or a DataLoader
batch of 64 with the default run), else an elastic resume needs the batch in the dataset.
"""

from __future__ import annotations

import hashlib
import random
import reprlib
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

__all__ = ["EVEN_MODES", "remaining", "Deal", "GlobalOrder", "epoch_order", "seeded_rng", "parse_position",
           "check_state", "worker_place"]

EVEN_MODES = (None, "pad", "drop")
_LIMIT = 1 << 62  # positions and epochs are stored as int64 (shared with workers)


def parse_position(state: Any) -> Tuple[int, int]:
    """(epoch, samples_seen) of a reading state, checked: non-negative ints (not bools)."""
    if not isinstance(state, dict) or "epoch" not in state:
        raise ValueError("a dsconvert reading state is a dict with 'epoch' and 'samples_seen', "
                         f"not {reprlib.repr(state)}")
    epoch, seen = state["epoch"], state.get("samples_seen", 0)
    if type(epoch) is not int or type(seen) is not int or not 0 <= epoch < _LIMIT or not 0 <= seen < _LIMIT:
        raise ValueError(f"epoch and samples_seen must be non-negative ints, not {reprlib.repr(epoch)}, "
                         f"{reprlib.repr(seen)}")
    return epoch, seen


def check_state(state: Any, identity: Optional[str], total: int, ranks: int, even: Optional[str]) -> Tuple[int, int]:
    """(epoch, samples_seen) of a reading state for the dataset ``identity`` (a
    :meth:`Manifest.identity`; None: unknown) of ``total`` samples, refused in one line when it
    names another dataset or counts more samples than an epoch can deal (``total``; with
    ``even="pad"`` up to twice that, or the padding for ``ranks``: a job on more ranks pads
    more): it cannot be a state of this one. A state without ``dataset`` (an older version's,
    or one written by hand) is taken."""
    epoch, seen = parse_position(state)
    theirs = state.get("dataset")
    if theirs is not None and (not isinstance(theirs, str) or len(theirs) > 64):
        raise ValueError(f"a reading state's 'dataset' is a short digest string, not {reprlib.repr(theirs)}")
    if theirs is not None and identity is not None and theirs != identity:
        raise ValueError(f"this reading state was saved from another dataset ({theirs}; this one is {identity}): "
                         "load it into the dataset it came from")
    most = max(total, remaining(total, 0, ranks, even), 2 * total if even == "pad" else 0)
    yielded = state.get("yielded")
    for name, value in (("samples_seen", seen), ("yielded", yielded)):
        if type(value) is int and value > most:
            raise ValueError(f"{name} {value} is beyond the epoch, which deals {most} samples here: "
                             "not a state of this dataset")
    return epoch, seen

def worker_place(state: Dict[str, Any]) -> Tuple[list, int]:
    """(worker: [rank, world, worker id, workers, chunk], samples it yielded) of a worker's state."""
    where, yielded = state.get("worker"), state.get("yielded")
    if (not isinstance(where, (list, tuple)) or len(where) != 5 or any(type(x) is not int for x in where)
            or type(yielded) is not int or not 0 <= yielded < _LIMIT):
        raise ValueError(f"not a dsconvert worker state: {reprlib.repr(state)}")
    return list(where), yielded


def seeded_rng(*parts: object) -> np.random.Generator:
    """A numpy generator seeded by the text of ``parts`` (any seed the user gives, stable
    across processes and Python's hash randomisation)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def remaining(total: int, seen: int, ranks: int, even: Optional[str]) -> int:
    """How many positions are left to deal after ``seen``: ``total - seen``, less the last
    ``% ranks`` (``drop``) or rounded up to a multiple of ``ranks`` by repeating positions from
    the start of what is left (``pad``), so that every rank takes as many steps."""
    if even not in EVEN_MODES:
        raise ValueError(f"even must be one of {EVEN_MODES}, not {even!r}")
    left = max(0, total - seen)
    if even == "drop":
        return left - left % ranks
    if even == "pad":
        return -(-left // ranks) * ranks
    return left


class Deal:
    """One (rank, worker)'s share of ``length`` remaining positions: see the module doc.

    Ranks take the positions in runs of ``chunk``, and a rank's DataLoader workers take its
    sequence in runs of ``worker_chunk`` (``chunk`` unless given): a stream that does not know
    the DataLoader's batch still hands each worker runs of consecutive positions (neighbours in
    a shard, fetched by one request), where runs of one would interleave the workers sample by
    sample. ``rank_length`` is the rank's count (the counts of two ranks differ by at most one);
    ``offsets(start, stop)`` gives, for the worker's items ``start..stop`` (samples, or whole
    chunks with ``batched``), their offsets into the remaining positions, in reading order.
    """

    def __init__(self, length: int, ranks: int, rank: int, workers: int, worker: int, chunk: int,
                 worker_chunk: Optional[int] = None):
        wc = chunk if worker_chunk is None else worker_chunk
        if not (0 <= rank < ranks and 0 <= worker < workers and chunk >= 1 and wc >= 1 and length >= 0):
            raise ValueError(f"bad deal: length={length} rank={rank}/{ranks} worker={worker}/{workers} chunk={chunk}"
                             f"/{wc}")
        self.ranks, self.rank, self.workers, self.worker, self.chunk = ranks, rank, workers, worker, chunk
        self.worker_chunk = wc
        self.rounds = length // (ranks * chunk)  # whole steps of every rank
        tail = length - self.rounds * ranks * chunk
        self.tail_lo, tail_hi = (rank * tail) // ranks, ((rank + 1) * tail) // ranks
        self.rank_length = self.rounds * chunk + tail_hi - self.tail_lo
        chunks = -(-self.rank_length // wc)  # the rank's runs; only its last may be short
        mine = max(0, -(-(chunks - worker) // workers))
        self.chunks = mine
        last = worker + (mine - 1) * workers  # this worker's last run
        self.length = 0 if mine == 0 else (mine - 1) * wc + min(wc, self.rank_length - last * wc)

    def batches(self) -> int:
        """Whole (possibly short) runs this worker reads (its batches when batched)."""
        return self.chunks

    def offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets into the remaining positions of this worker's samples [start, stop)."""
        stop = min(stop, self.length)
        if start >= stop:
            return np.zeros(0, dtype=np.int64)
        t = np.arange(start, stop, dtype=np.int64)
        c, R, W, wc = self.chunk, self.ranks, self.workers, self.worker_chunk
        i = (self.worker + (t // wc) * W) * wc + t % wc  # index in the rank's sequence
        whole = self.rounds * c
        return np.where(i < whole, (i // c) * R * c + self.rank * c + i % c,
                        self.rounds * R * c + self.tail_lo + (i - whole))


class GlobalOrder:
    """The epoch's global sequence: position -> (shard index in ``sizes``' order, sample in it).

    ``order`` is the shards' order for the epoch (indices into ``sizes``); ``window`` > 1
    permutes each block of that many consecutive positions with its own seeded generator, so a
    position is found from one window's permutation, whatever came before it (a resume far into
    an epoch costs no more than one at its start)."""

    def __init__(self, sizes: Sequence[int], order: Sequence[int], window: int, seed: object, epoch: int):
        self.order = np.asarray(order, dtype=np.int64)
        ordered = np.asarray(sizes, dtype=np.int64)[self.order] if len(order) else np.zeros(0, np.int64)
        self.ends = np.cumsum(ordered)
        self.starts = self.ends - ordered
        self.total = int(self.ends[-1]) if len(self.ends) else 0
        self.window = max(1, int(window))
        self.seed, self.epoch = seed, epoch
        self._perms: Dict[int, np.ndarray] = {}

    def _perm(self, k: int) -> np.ndarray:
        perm = self._perms.get(k)
        if perm is None:
            n = min(self.window, self.total - k * self.window)
            perm = seeded_rng(self.seed, self.epoch, "window", k).permutation(n)
            if len(self._perms) >= 4:
                self._perms.pop(next(iter(self._perms)))
            self._perms[k] = perm
        return perm

    def physical(self, positions: np.ndarray) -> np.ndarray:
        """Positions in the shuffled sequence -> positions in the concatenated shards."""
        if self.window <= 1 or not len(positions):
            return positions
        out = np.empty_like(positions)
        win = positions // self.window
        for k in np.unique(win):
            sel = win == k
            out[sel] = k * self.window + self._perm(int(k))[positions[sel] - k * self.window]
        return out

    def locate(self, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(shard index into ``sizes``, sample index in that shard) for each position."""
        p = self.physical(positions)
        k = np.searchsorted(self.ends, p, side="right")
        return self.order[k], p - self.starts[k]


def epoch_order(sizes: Sequence[int], shuffle: bool, window: int, seed: object, epoch: int) -> GlobalOrder:
    """The streaming reader's epoch: with ``shuffle``, the shards in a seeded order
    (``Random(f"{seed}:{epoch}")``) and each ``window`` of positions permuted; else the shards
    as stored."""
    shards = list(range(len(sizes)))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(shards)
    return GlobalOrder(sizes, shards, window if shuffle else 1, seed, epoch)
