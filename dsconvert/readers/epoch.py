"""The epoch and a pending resume, in memory that DataLoader workers share with the trainer.

A worker started with ``persistent_workers=True`` keeps its copy of the Dataset for the whole
run, so ``set_epoch`` on the trainer's copy would never reach it (every later epoch would
repeat the first one's order). The epoch lives in a small shared block instead: forked workers
map the same pages, spawned ones receive them while they start (the one time multiprocessing
lets shared memory travel by pickle); a plain pickle or deepcopy takes a private copy.

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
from typing import Any, Dict, Optional

__all__ = ["SharedEpoch", "MAX_SLOTS"]

MAX_SLOTS = 1 << 16  # ranks x workers per rank that an elastic resume can tell apart
_EPOCH, _PENDING, _RESUME_EPOCH, _RESUME_SEEN, _TAKEN = range(5)
_LIMIT = 1 << 62


class SharedEpoch:
    """``epoch`` and a pending resume ``(epoch, samples_seen)``, shared with workers."""

    def __init__(self, epoch: int = 0):
        self._a = multiprocessing.RawArray("q", 5)
        self._flags = multiprocessing.RawArray("b", MAX_SLOTS)
        self._a[_EPOCH] = epoch

    @property
    def epoch(self) -> int:
        return int(self._a[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """The next iterations read ``epoch``; a resume saved for another epoch is dropped."""
        if not -_LIMIT <= epoch < _LIMIT:
            raise ValueError(f"epoch {epoch} is out of range")
        a = self._a
        a[_EPOCH] = epoch
        if a[_PENDING] and a[_RESUME_EPOCH] != epoch:
            a[_PENDING] = 0

    def resume(self, epoch: int, samples_seen: int) -> None:
        """The next iteration of ``epoch``, in every worker of every rank, starts after
        ``samples_seen`` (the same resume again: nothing changes)."""
        a = self._a
        a[_EPOCH] = epoch
        if a[_PENDING] and (a[_RESUME_EPOCH], a[_RESUME_SEEN]) == (epoch, samples_seen):
            return
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

    def take(self, rank: int, worker: int, workers: int) -> int:
        """Where this (rank, worker)'s iteration of the current epoch starts: the pending
        resume's samples_seen the first time it asks, else 0."""
        a = self._a
        if not a[_PENDING] or a[_RESUME_EPOCH] != a[_EPOCH]:
            return 0
        slot = rank * workers + worker
        if slot >= MAX_SLOTS:
            raise ValueError(f"an elastic resume tells apart up to {MAX_SLOTS} ranks x DataLoader workers")
        if self._flags[slot]:
            return 0
        self._flags[slot] = 1
        a[_TAKEN] = 1
        return int(a[_RESUME_SEEN])

    def __getstate__(self) -> Dict[str, Any]:
        if get_spawning_popen() is not None:  # a process being started: share the block itself
            return {"shared": self._a, "flags": self._flags}
        return {"values": list(self._a), "taken": bytes(self._flags)}  # pickle / deepcopy: a private copy

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "shared" in state:
            self._a, self._flags = state["shared"], state["flags"]
        else:
            self._a = multiprocessing.RawArray("q", len(state["values"]))
            self._a[:] = state["values"]
            self._flags = multiprocessing.RawArray("b", MAX_SLOTS)
            self._flags[:] = state["taken"]
