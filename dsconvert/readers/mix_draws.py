"""Mixtures of datasets, subsamples and resampling as arithmetic: which source, and which of its
samples, each position of a mixture reads. Pure numpy, no torch: the Datasets over it are in
:mod:`dsconvert.readers.mix_datasets`; :func:`dsconvert.mix` and :func:`dsconvert.subsample`
(:mod:`dsconvert.readers.mix`) make them.

A mixture of K sources of ``sizes`` n_s is read in **rounds** of P positions (the mixture's
length; by default the sources' total), of which source s holds ``counts`` c_s (the weights
apportioned over P by largest remainders, or ``epochs`` e_s giving c_s = round(e_s * n_s)), so
its proportions are exact over a round. Round ``r`` is the epoch ``r`` of a map-style mixture
and of a finite stream; an infinite stream reads rounds 0, 1, 2, ... one after another.

**Interleaving.** Within a round, source s's j-th draw sits at key floor((2j + 1) P / (2 c_s)),
ties broken by source: every source is spread evenly over the round, so any stretch of m
consecutive positions holds m * c_s / P of source s to within one, and the proportions hold in
any prefix, whatever the reading order. Position i is found by a binary search over keys
(K counts per step), with no table: nothing grows with P.

**Draws.** Source s's d-th draw over all rounds (d = r * c_s + j) is, without replacement,
sample ``perm_(s, d // n_s)(d % n_s)``: the source's samples in a seeded order, each once before
any twice, a new order each time round (a subsample takes the next part of that order each
round: ``set_epoch`` sees new samples). The permutation is a seeded Feistel network with cycle
walking, computed per position (no n_s-long array in each worker). With replacement, each draw
is an independent uniform one, from a seeded generator per block of 4096 draws.

Everything is fixed by ``seed``: two processes, or a run and its resume, read the same.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from fractions import Fraction
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import OptionError
from .order import seeded_rng

__all__ = ["apportion", "exact", "Mixture", "FeistelPermutation"]

_DRAW_BLOCK = 4096
_MASK64 = (1 << 64) - 1


def exact(value: Any) -> Fraction:
    """A weight, an epoch count or a size as an exact fraction (ints of any size, floats up to
    1e308, numpy scalars), so that shares and counts never overflow or round to NaN."""
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    return Fraction(float(value))  # ValueError / OverflowError for NaN and infinities


def apportion(total: int, weights: Sequence[Any]) -> List[int]:
    """``total`` split in proportion to ``weights`` by largest remainders (ties to the earlier
    source): integers summing to ``total``, each within one of its exact share (exact
    arithmetic: a weight of 1e308 or 10**400 is a share like any other)."""
    w = [exact(x) for x in weights]
    whole = sum(w)
    shares = [total * x / whole for x in w]
    counts = [int(s) for s in shares]
    order = sorted(range(len(w)), key=lambda k: (-(shares[k] - counts[k]), k))
    for k in order[: total - sum(counts)]:
        counts[k] += 1
    return counts


class FeistelPermutation:
    """A seeded permutation of range(n), computed per element: a 4-round Feistel network over
    the smallest even number of bits that covers n, walking cycles until the value is below n
    (at most 4 steps expected)."""

    def __init__(self, n: int, *key: object):
        self.n = int(n)
        bits = max(2, (max(1, self.n - 1)).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self.mask = (1 << self.half) - 1
        digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
        self.keys = np.frombuffer(digest, dtype="<u8").astype(np.uint64)  # 4 round keys

    def _round(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(self.half), x & np.uint64(self.mask)
        for k in self.keys:
            h = (right + k) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
            h = h * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
            left, right = right, left ^ (h & np.uint64(self.mask))
        return (left << np.uint64(self.half)) | right

    def one(self, position: int) -> int:
        """The permutation of one position, in Python ints (the same as :meth:`__call__`)."""
        half, mask, x = self.half, self.mask, int(position)
        keys = [int(k) for k in self.keys]
        while True:
            left, right = x >> half, x & mask
            for k in keys:
                h = ((right + k) * 0x9E3779B97F4A7C15) & _MASK64
                h ^= h >> 29
                h = (h * 0xBF58476D1CE4E5B9) & _MASK64
                h ^= h >> 32
                left, right = right, left ^ (h & mask)
            x = (left << half) | right
            if x < self.n:
                return x

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        x = np.asarray(positions, dtype=np.uint64)
        with np.errstate(over="ignore"):
            x = self._round(x)
            out = x >= np.uint64(self.n)
            while out.any():
                x[out] = self._round(x[out])
                out = x >= np.uint64(self.n)
        return x.astype(np.int64)


class Mixture:
    """Where each position of a mixture reads: see the module doc. Picklable."""

    def __init__(self, sizes: Sequence[int], counts: Sequence[int], seed: object = 0, replacement: bool = False,
                 identities: Optional[Sequence[str]] = None):
        self.sizes = [int(n) for n in sizes]
        self.counts = [int(c) for c in counts]
        if len(self.sizes) != len(self.counts) or not self.sizes:
            raise OptionError("a mixture needs one count per source, and at least one source")
        for n, c in zip(self.sizes, self.counts):
            if c < 0:
                raise OptionError(f"a source's count of draws must be >= 0, not {c}")
            if c and not n:
                raise OptionError("an empty source cannot be drawn from: give it weight 0 or leave it out")
        self.length = sum(self.counts)
        self.seed = seed
        self.replacement = bool(replacement)
        self._perms: Dict[Tuple[int, int], FeistelPermutation] = {}
        self._draws: Dict[Tuple[int, int], np.ndarray] = {}
        blob = json.dumps([list(identities) if identities is not None else None, self.sizes, self.counts,
                           str(seed), self.replacement]).encode()
        self.identity = hashlib.sha256(blob).hexdigest()[:16]

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_perms"], state["_draws"] = {}, {}  # caches: each process makes its own
        return state

    # --- interleaving: position in a round -> (source, its draw within the round) ---------

    def _below(self, x: np.ndarray) -> np.ndarray:
        """For each key bound x, per source: its draws whose key is < x (shape K x len(x))."""
        c = np.asarray(self.counts, dtype=object if self.length >= 1 << 30 else np.int64)[:, None]
        P = self.length
        num = 2 * c * x[None, :] - P
        return np.clip(-((-num) // (2 * P)), 0, c)

    def _below_one(self, x: int) -> List[int]:
        P = self.length
        return [min(max(-((P - 2 * c * x) // (2 * P)), 0), c) for c in self.counts]

    def interleave_one(self, i: int) -> Tuple[int, int]:
        """:meth:`interleave` of one position, in Python ints (a lookup a sample)."""
        k = len(self.counts)
        lo, hi = max(i - k, 0), min(i + k + 1, self.length)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if sum(self._below_one(mid)) <= i:
                lo = mid
            else:
                hi = mid
        before, after = self._below_one(lo), self._below_one(lo + 1)
        offset = i - sum(before)
        for s, (b, a) in enumerate(zip(before, after)):
            if offset < a - b:
                return s, b + offset
            offset -= a - b
        raise AssertionError("position past the round")  # F(lo + 1) > i: never reached

    def interleave(self, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(source, draw j within the round) of each position in [0, length)."""
        i = np.asarray(positions, dtype=np.int64)
        big = self.length >= 1 << 30  # 2 c x would overflow int64: Python ints
        if big:
            i = i.astype(object)
        # each source's count below x is within 1/2 of c_s x / P, so the total F(x) is within K/2
        # of x: F(i - K) <= i < F(i + K + 1), and the search spans 2K + 1 keys, whatever P
        k = len(self.counts)
        lo = np.maximum(i - k, 0)
        hi = np.minimum(i + k + 1, self.length)
        while True:
            open_ = hi - lo > 1
            if not open_.any():
                break
            mid = (lo + hi) // 2
            ok = self._below(mid).sum(axis=0) <= i
            lo = np.where(open_ & ok, mid, lo)
            hi = np.where(open_ & ~ok, mid, hi)
        before = self._below(lo)  # K x len
        at = self._below(lo + 1) - before  # draws whose key is exactly lo
        offset = i - before.sum(axis=0)
        ends = np.cumsum(at, axis=0)
        source = (ends <= offset[None, :]).sum(axis=0)
        cols = np.arange(len(i))
        j = before[source, cols] + offset - (ends[source, cols] - at[source, cols])
        return source.astype(np.int64), np.asarray(j, dtype=np.int64)

    # --- draws: (source, draw over all rounds) -> sample index -------------------------------

    def _perm(self, s: int, cycle: int) -> FeistelPermutation:
        perm = self._perms.get((s, cycle))
        if perm is None:
            if len(self._perms) >= 8:
                self._perms.pop(next(iter(self._perms)))
            perm = self._perms[(s, cycle)] = FeistelPermutation(self.sizes[s], self.seed, "mix", s, cycle)
        return perm

    def _block(self, s: int, block: int) -> np.ndarray:
        draws = self._draws.get((s, block))
        if draws is None:
            if len(self._draws) >= 8:
                self._draws.pop(next(iter(self._draws)))
            draws = seeded_rng(self.seed, "mix-draws", s, block).integers(0, self.sizes[s], size=_DRAW_BLOCK)
            self._draws[(s, block)] = draws
        return draws

    def draw(self, s: int, d: np.ndarray) -> np.ndarray:
        """Sample indices of source s's draws ``d`` (counted over all rounds)."""
        d = np.asarray(d, dtype=np.int64)
        out = np.empty(len(d), dtype=np.int64)
        n = self.sizes[s]
        keys = d // _DRAW_BLOCK if self.replacement else d // n
        for key in np.unique(keys).tolist():
            sel = keys == key
            if self.replacement:
                out[sel] = self._block(s, key)[d[sel] % _DRAW_BLOCK]
            else:
                out[sel] = self._perm(s, key)(d[sel] % n)
        return out

    def locate_one(self, round_: int, position: int) -> Tuple[int, int]:
        """:meth:`locate` of one position, in Python ints (``ds[i]``: a few microseconds)."""
        s, j = self.interleave_one(int(position))
        d = round_ * self.counts[s] + j
        if self.replacement:
            return s, int(self._block(s, d // _DRAW_BLOCK)[d % _DRAW_BLOCK])
        n = self.sizes[s]
        return s, self._perm(s, d // n).one(d % n)

    def locate(self, round_: int, positions: Union[Sequence[int], np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """(source, sample index in it) of each position of round ``round_``."""
        source, j = self.interleave(np.asarray(positions, dtype=np.int64))
        sample = np.empty(len(j), dtype=np.int64)
        for s in np.unique(source).tolist():
            sel = source == s
            sample[sel] = self.draw(s, round_ * self.counts[s] + j[sel])
        return source, sample
