"""Inventory of a source tree without reading any file: counts, sizes, codecs, fan-out.

scandir in parallel threads (directory listing and stat release the GIL, and on network
storage the round trips overlap), stopping at a time budget with an honest estimate of
what the rest of the tree holds.

In bounded memory, whatever the tree's size: counts and bytes are running totals, sizes go
into a fixed power-of-two histogram (exact counts) and a sample of at most ``keep_entries``
files, chosen as the ones whose path hashes lowest (a bottom-k sample: uniform, and the same
files whatever order the threads list them in), from which the size quantiles come (exact up
to that many files; p0 and p100 always exact). Fan-out is a histogram of files per folder;
samples are counted per folder (distinct stems). Only folder names are kept for every folder.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import os
import stat as stat_mod
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..io.localfs import is_latency_bound
from ..io.location import mtime_ns_of
from ..source.folders import LIST_SUFFIXES, FolderListing, is_ignored, looks_like_image_folder

__all__ = ["Inventory", "take_inventory", "quantiles", "size_histogram", "counted_quantiles", "listings_for",
           "KEEP_ENTRIES"]

LAYOUT_FOLDERS = 256
KEEP_ENTRIES = 50_000  # files kept for sampling (and the size quantiles), whatever the tree's size


def quantiles(values: Sequence[float], qs=(0.0, 0.1, 0.5, 0.9, 0.99, 1.0)) -> Dict[str, float]:
    """Linearly interpolated quantiles (numpy's default method), keyed p0, p10, ... p100."""
    if not values:
        return {}
    found = np.quantile(np.asarray(values, dtype=np.float64), qs, method="linear")
    return {f"p{q * 100:g}": float(v) for q, v in zip(qs, found)}


def counted_quantiles(counts: Dict[int, int], qs=(0.0, 0.1, 0.5, 0.9, 0.99, 1.0)) -> Dict[str, float]:
    """:func:`quantiles` of the values a histogram ``{value: count}`` holds, without expanding it."""
    n = sum(counts.values())
    if not n:
        return {}
    values = sorted(counts)
    ends = []  # the index one past each value's last occurrence
    total = 0
    for v in values:
        total += counts[v]
        ends.append(total)

    def at(i: int) -> float:
        return float(values[bisect.bisect_right(ends, i)])

    out = {}
    for q in qs:
        h = (n - 1) * q
        lo = int(h)
        out[f"p{q * 100:g}"] = at(lo) + (h - lo) * (at(min(lo + 1, n - 1)) - at(lo))
    return out


class BottomK:
    """The ``k`` items whose keys hash lowest: a uniform sample of a stream of unknown length in
    O(k) memory, the same whatever order the stream comes in."""

    def __init__(self, k: int):
        self.k = k
        self.heap: List[Tuple[int, str, int]] = []  # (-hash, key, size): the largest hash on top

    def add(self, key: str, size: int) -> None:
        h = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "big")
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, (-h, key, size))
        elif self.k and h < -self.heap[0][0]:
            heapq.heapreplace(self.heap, (-h, key, size))

    def items(self) -> List[Tuple[str, int]]:
        return sorted((key, size) for _, key, size in self.heap)


def size_histogram(sizes: List[int]) -> List[Dict[str, int]]:
    """Counts of sizes in power-of-two bins: [{"le": 2**k bytes, "count": n}] (empty bins out)."""
    counts: Counter = Counter(max(0, int(s) - 1).bit_length() for s in sizes)
    return [{"le": 1 << k, "count": counts[k]} for k in sorted(counts)]


@dataclass
class Inventory:
    root: str
    files: int = 0
    bytes: int = 0
    dirs: int = 0
    complete: bool = True
    estimated_files: int = 0  # files + the estimate for folders not walked in the budget
    estimated_bytes: int = 0
    seconds: float = 0.0
    max_depth: int = 0
    layout: str = "flat"
    extensions: Dict[str, int] = field(default_factory=dict)
    size_quantiles: Dict[str, float] = field(default_factory=dict)
    fanout_quantiles: Dict[str, float] = field(default_factory=dict)  # files per folder
    size_histogram: List[Dict[str, int]] = field(default_factory=list)  # [{le: bytes, count}], log2 bins
    stems: int = 0  # distinct (folder, name up to its last dot): the samples of a flat layout
    sampled: bool = False  # entries is a sample of the files (more than keep_entries of them)
    entries: List[Tuple[str, int]] = field(default_factory=list)  # (relative path, size): all, or a bottom-k sample
    listings: List[FolderListing] = field(default_factory=list)  # the first LAYOUT_FOLDERS folders by name
    folders: List[str] = field(default_factory=list)  # every folder walked (relative), sorted

    def to_dict(self) -> Dict:
        d = dict(self.__dict__)
        for key in ("entries", "listings", "folders"):
            d.pop(key)
        return d


def _list(root: str, rel: str) -> Tuple[str, List[Tuple[str, int, int]], List[Tuple[str, Tuple[int, int]]]]:
    path = os.path.join(root, rel) if rel else root
    files: List[Tuple[str, int, int]] = []
    subdirs: List[Tuple[str, Tuple[int, int]]] = []
    try:
        entries = list(os.scandir(path))
    except OSError:
        return rel, files, subdirs
    for entry in entries:
        if is_ignored(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError:
            continue
        child = f"{rel}/{entry.name}" if rel else entry.name
        if stat_mod.S_ISDIR(st.st_mode):
            subdirs.append((child, (st.st_dev, st.st_ino)))
        elif stat_mod.S_ISREG(st.st_mode):
            files.append((entry.name, st.st_size, st.st_mtime_ns))
    return rel, files, subdirs


def _lister_remote(fs: Any) -> Callable[[str, str], Tuple[str, List[Tuple[str, int, int]], List[Tuple[str, Any]]]]:
    """``_list`` for an fsspec file system: one ``ls`` per folder (S3: a delimiter listing, one
    request per 1000 keys), so the same parallel walk with its time budget serves both."""
    def list_remote(root: str, rel: str) -> Tuple[str, List[Tuple[str, int, int]], List[Tuple[str, Any]]]:
        path = f"{root}/{rel}" if rel else root
        files: List[Tuple[str, int, int]] = []
        subdirs: List[Tuple[str, Any]] = []
        try:
            entries = fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return rel, files, subdirs
        for e in entries:
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if not name or is_ignored(name):
                continue
            child = f"{rel}/{name}" if rel else name
            if e.get("type") == "directory":
                subdirs.append((child, e["name"]))
            else:
                files.append((name, int(e.get("size") or 0), mtime_ns_of(e)))
        return rel, files, subdirs

    return list_remote


def _estimate_rest(inv: Inventory, root: str, pending: List[str], threads: int, probes: int = 20,
                   lister: Callable = _list) -> None:
    """Extrapolate the folders left unwalked from a seeded sample of them: their files, and
    their own subfolders at the rate of files per folder seen so far."""
    import random

    probe = random.Random(0).sample(pending, min(probes, len(pending)))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        listed = list(pool.map(lambda rel: lister(root, rel), probe))
    files = sum(len(f) for _, f, _ in listed) / len(listed)
    nbytes = sum(s for _, f, _ in listed for _, s, _ in f) / len(listed)
    subdirs = sum(len(d) for _, _, d in listed) / len(listed)
    seen_files = (inv.files + files * len(listed)) / (inv.dirs + len(listed))
    seen_bytes = (inv.bytes + nbytes * len(listed)) / (inv.dirs + len(listed))
    inv.estimated_files = inv.files + int(len(pending) * (files + subdirs * seen_files))
    inv.estimated_bytes = inv.bytes + int(len(pending) * (nbytes + subdirs * seen_bytes))


def take_inventory(root: str, time_budget: float = 30.0, threads: Optional[int] = None,
                   keep_entries: int = KEEP_ENTRIES, progress: Optional[Callable[[int], None]] = None,
                   fs: Any = None) -> Inventory:
    """Walk ``root`` for at most ``time_budget`` seconds; see the module doc. ``threads``
    defaults to 16 on latency-bound storage (NFS, FUSE, object stores), where listings overlap
    their round trips, and 2 on local disks, where more threads only contend for the GIL.
    With ``fs`` (an fsspec file system), ``root`` is a path within it. ``keep_entries`` bounds
    the files kept (see the module doc)."""
    root = root.rstrip("/") if fs is not None else os.path.abspath(root)
    lister = _lister_remote(fs) if fs is not None else _list
    if threads is None:
        threads = 16 if fs is not None or is_latency_bound(root) else 2
    started = time.perf_counter()
    inv = Inventory(root)
    info = fs.info(root) if fs is not None else None
    if (info["type"] == "file") if info is not None else os.path.isfile(root):
        inv.files, inv.bytes = 1, int(info["size"]) if info is not None else os.path.getsize(root)
        inv.layout = "list" if root.lower().endswith(LIST_SUFFIXES) else "flat"
        inv.estimated_files, inv.estimated_bytes = 1, inv.bytes
        return inv
    if fs is not None:
        seen: set = {root}
    else:
        st = os.stat(root)
        seen = {(st.st_dev, st.st_ino)}
    kept = BottomK(keep_entries)
    bins: Counter = Counter()  # power-of-two size bins: exact counts in O(64)
    smallest: Optional[int] = None
    largest = 0
    fanout: Counter = Counter()  # files per folder -> folders
    exts: Counter = Counter()
    listings: List[FolderListing] = []  # the LAYOUT_FOLDERS first by name, kept sorted
    folders: List[str] = []
    pending_dirs: List[str] = []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dsconvert-inventory") as pool:
        running = {pool.submit(lister, root, ""): ""}
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            over = time.perf_counter() - started > time_budget
            for fut in done:
                running.pop(fut)
                rel, files, subdirs = fut.result()
                inv.dirs += 1
                inv.max_depth = max(inv.max_depth, rel.count("/") + 1 if rel else 0)
                fanout[len(files)] += 1
                folders.append(rel)
                if len(listings) < LAYOUT_FOLDERS or rel < listings[-1].rel:
                    bisect.insort(listings, FolderListing(rel, sorted(files)), key=lambda d: d.rel)
                    del listings[LAYOUT_FOLDERS:]
                inv.stems += len({name.rpartition(".")[0] or name for name, _, _ in files})
                for name, size, _ in files:
                    bins[max(0, int(size) - 1).bit_length()] += 1
                    smallest = size if smallest is None else min(smallest, size)
                    largest = max(largest, size)
                    inv.bytes += size
                    exts[name.rpartition(".")[2].lower() if "." in name else ""] += 1
                    kept.add(f"{rel}/{name}" if rel else name, size)
                inv.files += len(files)
                if progress is not None:
                    progress(len(files))
                for child, ident in subdirs:
                    if ident in seen:
                        continue  # a symlink loop or a second link to a folder
                    seen.add(ident)
                    if over:
                        pending_dirs.append(child)
                    else:
                        running[pool.submit(lister, root, child)] = child
            if over:  # out of time: what has not started yet is left to the estimate
                for fut, rel in list(running.items()):
                    if fut.cancel():
                        running.pop(fut)
                        pending_dirs.append(rel)
    inv.complete = not pending_dirs
    inv.estimated_files, inv.estimated_bytes = inv.files, inv.bytes
    if pending_dirs:
        _estimate_rest(inv, root, pending_dirs, threads, lister=lister)
    inv.seconds = time.perf_counter() - started
    inv.extensions = dict(exts.most_common())
    inv.entries = kept.items()
    inv.sampled = len(inv.entries) < inv.files
    inv.size_quantiles = quantiles([s for _, s in inv.entries])
    if inv.size_quantiles:  # the ends are known exactly, sampled or not
        inv.size_quantiles["p0"], inv.size_quantiles["p100"] = float(smallest or 0), float(largest)
    inv.size_histogram = [{"le": 1 << k, "count": bins[k]} for k in sorted(bins)]
    inv.fanout_quantiles = counted_quantiles(fanout)
    inv.listings = listings
    inv.folders = sorted(folders)
    # the layout test reads every name; a few hundred folders (the root first) decide it
    if listings and looks_like_image_folder(listings[:LAYOUT_FOLDERS]):
        inv.layout = "imagefolder"
    return inv


def listings_for(inv: Inventory, picked: Sequence[str], fs: Any = None) -> List[FolderListing]:
    """The listings :func:`dsconvert.analyze.loader.sample_source` builds the sample's source
    from: each folder of a picked file listed again (a flat sample's other files are its
    siblings), and every other folder the walk saw, empty (an ImageFolder's classes)."""
    lister = _lister_remote(fs) if fs is not None else _list
    wanted = sorted({p.rpartition("/")[0] for p in picked})
    listed = {rel: FolderListing(rel, sorted(files)) for rel, files, _ in (lister(inv.root, rel) for rel in wanted)}
    return [listed.get(rel) or FolderListing(rel, []) for rel in sorted(set(inv.folders) | set(listed))]
