"""Who reads what: rank/world from torch.distributed or the environment, and exact splits.

The global sample sequence (shards in epoch order, concatenated) is cut into contiguous,
balanced blocks, one per rank, then each rank's block into one per DataLoader worker, so
every sample is read exactly once per epoch and blocks differ in length by at most one.
For DDP, where every rank must take the same number of steps, ``even="pad"`` repeats
samples from the start of the sequence and ``even="drop"`` drops the last ``N % world``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Tuple

__all__ = ["EVEN_MODES", "world_info", "worker_info", "split_range", "rank_span", "distributed_initialized"]

EVEN_MODES = (None, "pad", "drop")


def _dist() -> Optional[Any]:
    """torch.distributed with an initialised process group, else None."""
    if "torch" not in sys.modules:  # only ask torch when the process already uses it
        return None
    try:
        import torch.distributed as dist
    except Exception:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def distributed_initialized() -> bool:
    return _dist() is not None


def world_info(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """(rank, world_size): explicit arguments, else torch.distributed, else RANK/WORLD_SIZE."""
    if rank is None or world_size is None:
        dist = _dist()
        if dist is not None:
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r = int(os.environ.get("RANK", 0))
            w = int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


def worker_info() -> Tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker; (0, 1) outside one."""
    if "torch" in sys.modules:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    return 0, 1


def split_range(n: int, parts: int, i: int) -> Tuple[int, int]:
    """The i-th of ``parts`` contiguous blocks of range(n), lengths differing by at most one."""
    return (i * n) // parts, ((i + 1) * n) // parts


def rank_span(n: int, rank: int, world: int, even: Optional[str] = None) -> Tuple[int, int]:
    """[start, stop) of this rank's block in the global sequence; with ``pad`` the stop may
    pass ``n``, and positions are then taken modulo ``n``."""
    if even not in EVEN_MODES:
        raise ValueError(f"even must be one of {EVEN_MODES}, not {even!r}")
    if even is None:
        return split_range(n, world, rank)
    if even == "drop":
        length = n // world
    else:
        length = -(-n // world) if n else 0
    return rank * length, (rank + 1) * length
