"""The epoch and a pending resume, in memory that DataLoader workers share with the trainer.

A worker started with ``persistent_workers=True`` keeps its copy of the Dataset for the whole
run, so ``set_epoch`` on the trainer's copy would never reach it (every later epoch would
repeat the first one's order). The epoch lives in a small shared block instead: forked workers
map the same pages, spawned ones receive them while they start (the one time multiprocessing
lets shared memory travel by pickle); a plain pickle or deepcopy takes a private copy.

**Epochs advance by themselves.** A rank's iterations come in rounds: a DataLoader with W
workers starts one iteration in each of its W workers when its iterator is made (one in the
process itself with no workers). The first worker to begin after a whole round starts the next
round, which reads the next epoch; the other W - 1 join it. The first round after the epoch is
set (``set_epoch``, a resume, or 0 at the start) reads that epoch. So a plain loop (or
Lightning without a callback) reshuffles every epoch, as MosaicML Streaming does, whatever the
worker count of each loader (a peek with ``next(iter(ds))`` is a round of one). ``set_epoch``
wins when called.

An elastic resume (``load_state_dict({"epoch", "samples_seen"})``) sits here too, with one flag
per (rank, worker id): each worker applies it to the first iteration it runs of that epoch and
marks it, so the next iteration, in the same persistent worker or in a fresh one, starts the
following epoch from its beginning. The flags are per rank because DDP ranks started by fork or
spawn from the process that made the dataset share the block too; for the same reason loading
the resume that is already pending changes nothing (every rank loads it).
"""

from __future__ import annotations

import multiprocessing
import numbers
import reprlib
from multiprocessing.context import get_spawning_popen
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["SharedEpoch", "MAX_SLOTS", "MAX_RANKS", "begin_iteration", "order_of", "check_order"]

MAX_SLOTS = 1 << 16  # ranks x workers per rank that an elastic resume can tell apart
MAX_RANKS = 1 << 14  # ranks whose rounds of iterations are counted apart
_GEN_OF, _EPOCH_OF, _BEGUN, _OF = range(4)  # a rank's round: its generation, epoch, workers begun, workers
_EPOCH, _PENDING, _RESUME_EPOCH, _RESUME_SEEN, _TAKEN, _GEN, _LATEST, _STARTED = range(8)
_LIMIT = 1 << 62


class SharedEpoch:
    """``epoch`` and a pending resume ``(epoch, samples_seen)``, shared with workers, and
    each rank's round of iterations (the module doc)."""

    def __init__(self, epoch: int = 0):
        self._a = multiprocessing.RawArray("q", 8)
        self._flags = multiprocessing.RawArray("b", MAX_SLOTS)
        self._rounds = multiprocessing.RawArray("q", 4 * MAX_RANKS)  # per rank: _GEN_OF, _EPOCH_OF, _BEGUN, _OF
        # a round's workers begin at the same moment; made in the spawn context so that it can reach
        # workers of any start method (a fork-context lock refuses to be pickled for spawn)
        self._lock = multiprocessing.get_context("spawn").Lock()
        self._a[_EPOCH] = epoch
        self._a[_GEN] = 1

    @property
    def epoch(self) -> int:
        """The epoch of the latest iteration started since the epoch was last set, else the
        epoch set (what the next iteration reads)."""
        a = self._a
        return int(a[_LATEST] if a[_STARTED] else a[_EPOCH])

    def _new_generation(self) -> None:
        a = self._a
        a[_GEN] += 1
        a[_STARTED] = 0

    @staticmethod
    def _slot(rank: int, worker: int, workers: int) -> int:
        slot = rank * workers + worker
        if slot >= MAX_SLOTS:
            raise ValueError(f"a dataset tells apart up to {MAX_SLOTS} ranks x DataLoader workers")
        return slot

    def _round(self, rank: int, workers: int, epoch: Optional[int] = None) -> int:
        """The epoch of the iteration a worker of ``rank``'s ``workers``-worker loader begins now:
        its round's, or the next one's when the last round is whole (``epoch``: the one it reads,
        from a saved place)."""
        if not 0 <= rank < MAX_RANKS:
            raise ValueError(f"a dataset counts the epochs of up to {MAX_RANKS} ranks apart, not rank {rank}")
        a, r, i = self._a, self._rounds, 4 * rank
        with self._lock:
            if r[i + _GEN_OF] != a[_GEN]:  # the first round since the epoch was set
                r[i + _GEN_OF], r[i + _EPOCH_OF], r[i + _BEGUN], r[i + _OF] = a[_GEN], a[_EPOCH], 0, workers
            if r[i + _BEGUN] >= r[i + _OF] or r[i + _OF] != workers:  # a whole round: this begins the next
                r[i + _EPOCH_OF] += 1 if r[i + _BEGUN] else 0
                r[i + _BEGUN], r[i + _OF] = 0, workers
            if epoch is not None:
                r[i + _EPOCH_OF] = epoch
            r[i + _BEGUN] += 1
            return int(r[i + _EPOCH_OF])

    def begin(self, rank: int, worker: int, workers: int) -> Tuple[int, int]:
        """(epoch, samples_seen at its start) of the iteration this (rank, worker) starts now:
        its round's epoch, and the pending resume's samples_seen the first time the slot asks
        for that resume's epoch, else 0."""
        a, slot = self._a, self._slot(rank, worker, workers)
        epoch = self._round(rank, workers)
        self._started(epoch)
        seen = 0
        if a[_PENDING] and a[_RESUME_EPOCH] == epoch and not self._flags[slot]:
            self._flags[slot] = 1
            a[_TAKEN] = 1
            seen = int(a[_RESUME_SEEN])
        return epoch, seen

    def resumed(self, rank: int, worker: int, workers: int, epoch: int) -> None:
        """This (rank, worker)'s iteration reads ``epoch`` from a worker's saved place: it joins
        a round of that epoch, and the next round reads the epoch after."""
        self._slot(rank, worker, workers)
        self._started(self._round(rank, workers, epoch))

    def _started(self, epoch: int) -> None:
        a = self._a
        a[_LATEST] = max(a[_LATEST], epoch) if a[_STARTED] else epoch
        a[_STARTED] = 1

    def set_epoch(self, epoch: int) -> None:
        """The next iterations read ``epoch``; a resume saved for another epoch is dropped."""
        if not -_LIMIT <= epoch < _LIMIT:
            raise ValueError(f"epoch {epoch} is out of range")
        a = self._a
        a[_EPOCH] = epoch
        self._new_generation()
        if a[_PENDING] and a[_RESUME_EPOCH] != epoch:
            a[_PENDING] = 0

    def resume(self, epoch: int, samples_seen: int) -> None:
        """The next iteration of ``epoch``, in every worker of every rank, starts after
        ``samples_seen`` (the same resume again: nothing changes)."""
        a = self._a
        a[_EPOCH] = epoch
        if a[_PENDING] and (a[_RESUME_EPOCH], a[_RESUME_SEEN]) == (epoch, samples_seen):
            return
        self._new_generation()
        a[_PENDING] = 0
        a[_TAKEN] = 0
        self._flags[:] = bytes(MAX_SLOTS)
        a[_RESUME_EPOCH] = epoch
        a[_RESUME_SEEN] = samples_seen
        a[_PENDING] = 1

    def pending(self) -> Optional[int]:
        """samples_seen of a resume for the current epoch that no worker has applied yet
        (for ``len``), else None."""
        a = self._a
        return int(a[_RESUME_SEEN]) if a[_PENDING] and not a[_TAKEN] and a[_RESUME_EPOCH] == a[_EPOCH] else None

    def __getstate__(self) -> Dict[str, Any]:
        if get_spawning_popen() is not None:  # a process being started: share the block itself
            return {"shared": self._a, "flags": self._flags, "rounds": self._rounds, "lock": self._lock}
        return {"values": list(self._a), "taken": bytes(self._flags),  # pickle / deepcopy: a private copy
                "rounds": bytes(memoryview(self._rounds).cast("B"))}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "shared" in state:
            self._a, self._flags = state["shared"], state["flags"]
            self._rounds, self._lock = state["rounds"], state["lock"]
        else:
            self._a = multiprocessing.RawArray("q", len(state["values"]))
            self._a[:] = state["values"]
            self._flags = multiprocessing.RawArray("b", MAX_SLOTS)
            self._flags[:] = state["taken"]
            self._rounds = multiprocessing.RawArray("q", 4 * MAX_RANKS)
            memoryview(self._rounds).cast("B")[:] = state["rounds"]
            self._lock = multiprocessing.get_context("spawn").Lock()


def begin_iteration(shared: SharedEpoch, resume: Optional[Dict[str, Any]], here: List[int],
                    unit: str = "chunk") -> Tuple[int, int, int]:
    """(epoch, samples_seen at its start, samples this worker yielded already) of an iteration
    starting now: the worker's saved place where one is pending (``resume``, from a
    StatefulDataLoader), refused in one line in a loader of another shape (``here``: [rank,
    world, worker, workers, ``unit``]), else the shared epoch's next."""
    rank, _, wid, nworkers, _ = here
    if resume is None:
        epoch, seen = shared.begin(rank, wid, nworkers)
        return epoch, seen, 0
    if resume["worker"] != here:
        raise ValueError(
            f"this reading position was saved by (rank, world, worker, workers, {unit}) = "
            f"{tuple(resume['worker'])}, and this loader is {tuple(here)}: resume a job of another "
            "shape with ds.load_state_dict({'epoch': e, 'samples_seen': n}), n the samples it consumed")
    shared.resumed(rank, wid, nworkers, resume["epoch"])
    return resume["epoch"], resume["samples_seen"], resume["yielded"]


def order_of(seed: object, shuffle: int) -> Dict[str, Any]:
    """What a reading state records of the order it counts positions in, beside its dataset:
    ``seed`` (an int or a string as given, another object as its text) and ``shuffle`` (the
    window permuted at once; 0 when not shuffled, and then the seed plays no part)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        seed = int(seed)
    elif not isinstance(seed, str):
        seed = str(seed)
    return {"seed": seed, "shuffle": int(shuffle)}


def check_order(state: Dict[str, Any], seed: object, shuffle: int) -> None:
    """Refuse, in one line, a state saved in another order than the one ``seed`` and
    ``shuffle`` give (its positions would name other samples: some read twice, some never). A
    state that names no order (an older version's, or one written by hand) is taken."""
    ours = order_of(seed, shuffle)
    theirs = {key: state[key] for key in ("seed", "shuffle") if key in state}
    if "shuffle" in theirs and (type(theirs["shuffle"]) is not int or theirs["shuffle"] < 0):
        raise ValueError(f"a reading state's 'shuffle' is a window size >= 0, not {reprlib.repr(theirs['shuffle'])}")
    if "seed" in theirs and (type(theirs["seed"]) not in (int, str) or len(str(theirs["seed"])) > 200):
        raise ValueError(f"a reading state's 'seed' is an int or a short string, not {reprlib.repr(theirs['seed'])}")
    shuffle_differs = theirs.get("shuffle", ours["shuffle"]) != ours["shuffle"]
    seed_differs = ours["shuffle"] and theirs.get("seed", ours["seed"]) != ours["seed"]
    if shuffle_differs or seed_differs:
        said = ", ".join(f"{k}={reprlib.repr(v)}" for k, v in theirs.items())
        raise ValueError(f"this reading state was saved in another order ({said}; this dataset reads with "
                         f"seed={reprlib.repr(ours['seed'])}, shuffle={ours['shuffle']}): open it as it was "
                         "opened to resume")
