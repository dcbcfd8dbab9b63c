"""A seeded, stratified random sample of the files to measure.

Strata are (top-level folder, size quartile): every class folder and every size range is
represented in proportion, so a few huge files or one odd folder cannot skew the read and
decode figures, and the same seed picks the same files.
"""

from __future__ import annotations

import random
from typing import Dict, List, Sequence, Tuple

__all__ = ["stratified_sample"]


def _quartile_edges(sizes: Sequence[int]) -> List[int]:
    ordered = sorted(sizes)
    return [ordered[int(q * (len(ordered) - 1))] for q in (0.25, 0.5, 0.75)]


def stratified_sample(entries: Sequence[Tuple[str, int]], n: int, seed: int = 0) -> List[Tuple[str, int]]:
    """Up to ``n`` of ``entries`` ((relative path, size)), proportionally from each stratum,
    at least one from each while ``n`` allows; sorted by path."""
    if n >= len(entries):
        return sorted(entries)
    edges = _quartile_edges([s for _, s in entries])
    strata: Dict[Tuple[str, int], List[Tuple[str, int]]] = {}
    for path, size in entries:
        top = path.split("/", 1)[0] if "/" in path else ""
        bucket = sum(size > e for e in edges)
        strata.setdefault((top, bucket), []).append((path, size))
    rng = random.Random(seed)
    keys = sorted(strata)
    quota = {k: len(strata[k]) * n / len(entries) for k in keys}
    take = {k: int(q) for k, q in quota.items()}
    if n >= len(keys):
        for k in keys:
            take[k] = max(1, take[k])
    # hand out what rounding left, largest remainders first, seeded for ties
    left = n - sum(take.values())
    order = sorted(keys, key=lambda k: (-(quota[k] - int(quota[k])), rng.random()))
    for k in order:
        if left <= 0:
            break
        if take[k] < len(strata[k]):
            take[k] += 1
            left -= 1
    while sum(take.values()) > n:  # the at-least-one rule overshot: trim the largest
        k = max(keys, key=lambda k: take[k])
        take[k] -= 1
    picked: List[Tuple[str, int]] = []
    for k in keys:
        picked.extend(rng.sample(strata[k], min(take[k], len(strata[k]))))
    return sorted(picked)
