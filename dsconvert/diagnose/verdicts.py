"""The verdict of ``dsconvert diagnose``, as data: ordered rule records, each a condition over
the measured quantities (:class:`Measured`), the verdict it gives and the bottleneck it names;
the first rule whose condition holds decides (:func:`decide`). The fixes each bottleneck gets
are :data:`dsconvert.diagnose.fixes.FIXES`.

Following the seed's rule of thumb, a main thread that spends ``INPUT_BOUND_SHARE`` (30 %) or
more of its time getting data is input-bound; without workers, ``NO_WORKERS_SHARE`` (15 %) of
loading of its own is enough (that loading is never overlapped with the step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

__all__ = ["INPUT_BOUND_SHARE", "NO_WORKERS_SHARE", "MIN_MAIN_SAMPLES", "Measured", "VerdictRule", "VERDICTS",
           "decide"]

INPUT_BOUND_SHARE = 0.30
# without workers the loop's own loading is serial with its step, never overlapped: a share of
# 15 % is a 1.18x speedup from one argument (held-out runs at 29-32 % flipped at 30 %)
NO_WORKERS_SHARE = 0.15
MIN_MAIN_SAMPLES = 20  # samples of the training loop's main thread below which nothing is decided
BUSY_WORKERS = 0.5  # workers busy less than this share of the time do not hold the loop up


@dataclass(frozen=True)
class Measured:
    """What a verdict is decided on, from both recordings."""

    main_samples: int  # wall-clock samples of the training loop's main thread
    input_share: float  # the loop's time getting data: waiting, pinning, receiving, loading itself
    own: Dict[str, float]  # data work the main thread does itself: category -> share
    workers: int  # DataLoader worker processes
    worker_busy: float  # the workers' share of time not idle
    receive: float  # the loop's time receiving batches (ipc, pin, and collate with workers)
    wait: float  # the loop's time waiting for a batch
    pool: Dict[str, float]  # the data categories' shares: the workers' plus the main thread's own
    # CPU, in CPUs (seconds on a CPU per second): the workers' in their largest loading category
    # (all workers together), and the main thread's receiving batches. 0.0: not measured
    loading_cpu: float = 0.0
    receive_cpu: float = 0.0

    @property
    def input_bound(self) -> bool:
        return self.input_share >= INPUT_BOUND_SHARE or (
            not self.workers and sum(self.own.values()) >= NO_WORKERS_SHARE)


@dataclass(frozen=True)
class VerdictRule:
    """``verdict`` and ``bottleneck`` when ``when`` holds: a category, ``None`` (no bottleneck),
    or :data:`LARGEST` (the pool's largest category)."""

    verdict: str
    bottleneck: Optional[str]
    when: Callable[[Measured], bool]
    why: str  # the condition in words


LARGEST = "largest"

VERDICTS: Tuple[VerdictRule, ...] = (
    VerdictRule("unknown", None, lambda q: q.main_samples < MIN_MAIN_SAMPLES,
                "too few samples of the training loop's main thread to decide"),
    VerdictRule("input-bound", "no-workers", lambda q: q.input_bound and not q.workers and bool(q.own),
                "no workers: the loop loads its own data"),
    VerdictRule("input-bound", "ipc",
                lambda q: q.input_bound and (not q.pool or (bool(q.workers) and q.receive_cpu >= q.loading_cpu and (
                    q.worker_busy < BUSY_WORKERS or q.receive > q.wait))),
                "receiving batches takes at least the CPU the workers' loading does, and the workers are mostly "
                "idle or the loop spends more time receiving batches than waiting for them: the transfer, not the "
                "workers' loading, holds the loop up (the CPU, taken without the time spent waiting for one, does "
                "not move with the machine's load; the idle and waiting shares do)"),
    VerdictRule("input-bound", LARGEST, lambda q: q.input_bound, "the loaders' largest category"),
    VerdictRule("compute-bound", None, lambda q: True, "the input pipeline keeps up"),
)


def decide(q: Measured) -> Tuple[str, Optional[str]]:
    """(verdict, bottleneck) of the first rule of :data:`VERDICTS` whose condition holds."""
    rule = next(r for r in VERDICTS if r.when(q))
    if rule.bottleneck == LARGEST:
        return rule.verdict, max(q.pool, key=q.pool.__getitem__)
    return rule.verdict, rule.bottleneck
