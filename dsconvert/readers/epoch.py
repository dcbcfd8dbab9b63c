"""The epoch and a pending resume, in memory that DataLoader workers share with the trainer.

A worker started with ``persistent_workers=True`` keeps its copy of the Dataset for the whole
run, so ``set_epoch`` on the trainer's copy would never reach it (every later epoch would
repeat the first one's order). The epoch lives in a small shared block instead: forked workers
map the same page, spawned ones receive it while they start (the one time multiprocessing lets
shared memory travel by pickle); a plain pickle or deepcopy takes a private copy of the values.

An elastic resume (``load_state_dict({"epoch", "samples_seen"})`` on the trainer's copy) sits
here too, with one flag per worker id: each worker applies it to the first iteration it runs
of that epoch and marks it, so the next iteration, in the same persistent worker or in a
fresh one, starts the following epoch from its beginning.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen
from typing import Any, Dict, Optional

__all__ = ["SharedEpoch", "MAX_WORKERS"]

MAX_WORKERS = 4096
_EPOCH, _PENDING, _RESUME_EPOCH, _RESUME_SEEN, _TAKEN, _FLAGS = range(6)


class SharedEpoch:
    """``epoch`` and a pending resume ``(epoch, samples_seen)``, shared with workers."""

    def __init__(self, epoch: int = 0):
        self._a = multiprocessing.RawArray("q", _FLAGS + MAX_WORKERS)
        self._a[_EPOCH] = epoch

    @property
    def epoch(self) -> int:
        return int(self._a[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """The next iterations read ``epoch``; a resume saved for another epoch is dropped."""
        if not -(1 << 62) <= epoch < 1 << 62:
            raise ValueError(f"epoch {epoch} is out of range")
        self._a[_EPOCH] = epoch
        if self._a[_PENDING] and self._a[_RESUME_EPOCH] != epoch:
            self._a[_PENDING] = 0

    def resume(self, epoch: int, samples_seen: int) -> None:
        """The next iteration of ``epoch``, in every worker, starts after ``samples_seen``."""
        self._a[_PENDING] = 0
        self._a[_TAKEN] = 0
        self._a[_FLAGS:] = [0] * MAX_WORKERS
        self._a[_EPOCH] = epoch
        self._a[_RESUME_EPOCH] = epoch
        self._a[_RESUME_SEEN] = samples_seen
        self._a[_PENDING] = 1

    def pending(self) -> Optional[int]:
        """samples_seen of a resume for the current epoch that no worker has applied yet
        (for ``len``), else None."""
        a = self._a
        return int(a[_RESUME_SEEN]) if a[_PENDING] and not a[_TAKEN] and a[_RESUME_EPOCH] == a[_EPOCH] else None

    def take(self, worker: int) -> int:
        """Where worker ``worker``'s iteration of the current epoch starts: the pending resume's
        samples_seen the first time this worker id asks, else 0."""
        a = self._a
        if not a[_PENDING] or a[_RESUME_EPOCH] != a[_EPOCH]:
            return 0
        if worker >= MAX_WORKERS:
            raise ValueError(f"an elastic resume supports up to {MAX_WORKERS} DataLoader workers")
        if a[_FLAGS + worker]:
            return 0
        a[_FLAGS + worker] = 1
        a[_TAKEN] = 1
        return int(a[_RESUME_SEEN])

    def __getstate__(self) -> Dict[str, Any]:
        if get_spawning_popen() is not None:  # a worker being started: share the block itself
            return {"shared": self._a}
        return {"values": list(self._a)}  # pickle / deepcopy: a private copy

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "shared" in state:
            self._a = state["shared"]
        else:
            self._a = multiprocessing.RawArray("q", len(state["values"]))
            self._a[:] = state["values"]
