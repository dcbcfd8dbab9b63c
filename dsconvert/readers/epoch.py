"""The epoch and a pending resume, in memory that DataLoader workers share with the trainer.

A worker started with ``persistent_workers=True`` keeps its copy of the Dataset for the whole
run, so ``set_epoch`` on the trainer's copy would never reach it (every later epoch would
repeat the first one's order). The epoch lives in a small shared block instead: forked workers
map the same pages, spawned ones receive them while they start (the one time multiprocessing
lets shared memory travel by pickle); a plain pickle or deepcopy takes a private copy.

**Epochs advance by themselves.** Each (rank, worker) slot counts its own iterations: the
first reads the epoch last set (``set_epoch``, a resume, or 0), each later one the next epoch,
so a plain loop (or Lightning without a callback) reshuffles every epoch, as MosaicML
Streaming does. Every worker of a rank iterates once per epoch, so they agree. ``set_epoch``
wins when called: it starts every slot's count again from the epoch it names.

An elastic resume (``load_state_dict({"epoch", "samples_seen"})``) sits here too, with one flag
per (rank, worker id): each worker applies it to the first iteration it runs of that epoch and
marks it, so the next iteration, in the same persistent worker or in a fresh one, starts the
following epoch from its beginning. The flags are per rank because DDP ranks started by fork or
spawn from the process that made the dataset share the block too; for the same reason loading
the resume that is already pending changes nothing (every rank loads it).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen
from typing import Any, Dict, Optional, Tuple

__all__ = ["SharedEpoch", "MAX_SLOTS"]

MAX_SLOTS = 1 << 16  # ranks x workers per rank that an elastic resume can tell apart
_EPOCH, _PENDING, _RESUME_EPOCH, _RESUME_SEEN, _TAKEN, _GEN, _LATEST, _STARTED = range(8)
_LIMIT = 1 << 62


class SharedEpoch:
    """``epoch`` and a pending resume ``(epoch, samples_seen)``, shared with workers, and
    each (rank, worker) slot's next epoch (the module doc)."""

    def __init__(self, epoch: int = 0):
        self._a = multiprocessing.RawArray("q", 8)
        self._flags = multiprocessing.RawArray("b", MAX_SLOTS)
        self._gen = multiprocessing.RawArray("q", MAX_SLOTS)  # the generation a slot's ``_next`` belongs to
        self._next = multiprocessing.RawArray("q", MAX_SLOTS)  # the epoch the slot's next iteration reads
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

    def begin(self, rank: int, worker: int, workers: int) -> Tuple[int, int]:
        """(epoch, samples_seen at its start) of the iteration this (rank, worker) starts now:
        the slot's next epoch, and the pending resume's samples_seen the first time it asks
        for that resume's epoch, else 0."""
        a, slot = self._a, self._slot(rank, worker, workers)
        if self._gen[slot] != a[_GEN]:
            self._gen[slot], self._next[slot] = a[_GEN], a[_EPOCH]
        epoch = int(self._next[slot])
        self._next[slot] = epoch + 1
        self._started(epoch)
        seen = 0
        if a[_PENDING] and a[_RESUME_EPOCH] == epoch and not self._flags[slot]:
            self._flags[slot] = 1
            a[_TAKEN] = 1
            seen = int(a[_RESUME_SEEN])
        return epoch, seen

    def resumed(self, rank: int, worker: int, workers: int, epoch: int) -> None:
        """This slot's iteration reads ``epoch`` from a worker's saved place: its next one reads
        the epoch after."""
        a, slot = self._a, self._slot(rank, worker, workers)
        self._gen[slot], self._next[slot] = a[_GEN], epoch + 1
        self._started(epoch)

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
            return {"shared": self._a, "flags": self._flags, "gen": self._gen, "next": self._next}
        return {"values": list(self._a), "taken": bytes(self._flags),  # pickle / deepcopy: a private copy
                "gen": list(self._gen), "next": list(self._next)}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "shared" in state:
            self._a, self._flags, self._gen, self._next = state["shared"], state["flags"], state["gen"], state["next"]
        else:
            self._a = multiprocessing.RawArray("q", len(state["values"]))
            self._a[:] = state["values"]
            self._flags = multiprocessing.RawArray("b", MAX_SLOTS)
            self._flags[:] = state["taken"]
            self._gen = multiprocessing.RawArray("q", MAX_SLOTS)
            self._gen[:] = state["gen"]
            self._next = multiprocessing.RawArray("q", MAX_SLOTS)
            self._next[:] = state["next"]
