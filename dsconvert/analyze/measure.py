"""Measurements on the sample: read latency and throughput (cold and warm, sequential and
random, 1..N concurrent readers), and decode cost per codec and library. (The
differential stall measurement of DS-Analyzer/CoorDL, prep with no I/O against both, is made
through a real DataLoader in :mod:`.loader`.)

Cold reads evict each file's pages with posix_fadvise(DONTNEED) first (see
dsconvert.io.localfs): the host's own cache may still serve some of them, so cold figures are
compared with warm ones from the same run, never with absolute numbers.
"""

from __future__ import annotations

import io
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs import IMAGE_EXTENSIONS, decode_rgb, field_kind, jpeg_decoders
from ..io.localfs import evict_page_cache
from ..schedstat import thread_wait_s
from .inventory import quantiles

__all__ = ["read_pass", "concurrency_sweep", "fit_fixed_cost", "decode_costs",
           "memory_bandwidth", "image_geometry", "Reader", "LOCAL"]


class Reader:
    """How the measurements reach the files: local paths (a cold read first evicts the file's
    pages) or an fsspec file system, where every read is a request (GET) and there is no page
    cache to evict, so "cold" is a first request and "warm" a repeated one."""

    def __init__(self, fs: Any = None, limit: int = 16 << 20):
        self.fs = fs
        self.limit = limit  # a shard-sized file is timed on its first 16 MB: enough for a rate

    def read(self, path: str) -> bytes:
        if self.fs is not None:
            return self.fs.cat_file(path, start=0, end=self.limit)
        with open(path, "rb") as f:
            return f.read(self.limit)

    def head(self, path: str, n: int = 1 << 16) -> bytes:
        """The first ``n`` bytes: enough for an image's header."""
        if self.fs is not None:
            return self.fs.cat_file(path, start=0, end=n)
        with open(path, "rb") as f:
            return f.read(n)

    def evict(self, paths: Sequence[str]) -> None:
        if self.fs is None:
            evict_page_cache(paths)


LOCAL = Reader()


def _read(path: str, reader: Reader = LOCAL) -> Tuple[int, float, float]:
    """(bytes, seconds, seconds of it the thread waited for a CPU): a latency less the wait is
    the storage's, whatever else the machine runs (dsconvert.schedstat)."""
    w = thread_wait_s()
    t = time.perf_counter()
    n = len(reader.read(path))
    took = time.perf_counter() - t
    waited = min(took, max(0.0, thread_wait_s() - w))
    return n, took - waited, waited


def _summary(results: List[Tuple[int, float, float]], wall: float, threads: int = 1) -> Dict[str, Any]:
    """Latency quantiles and rates; the wall time less the readers' mean wait for a CPU."""
    wall = max(wall - sum(r[2] for r in results) / max(1, threads), wall * 0.05)
    lat = [r[1] * 1000 for r in results]
    nbytes = sum(r[0] for r in results)
    q = quantiles(lat, (0.5, 0.9, 0.99))
    return {"files": len(results), "bytes": nbytes, "seconds": wall,
            "files_per_s": len(results) / wall if wall else 0.0,
            "mb_per_s": nbytes / wall / 1e6 if wall else 0.0,
            "latency_ms": {k: round(v, 4) for k, v in q.items()},
            "latency_mean_ms": sum(lat) / len(lat) if lat else 0.0}


def read_pass(paths: Sequence[str], cold: bool, order: str = "sequential", seed: int = 0,
              reader: Reader = LOCAL) -> Dict:
    """One reader: open + read + close each file (one request each on an object store); per-file
    latency quantiles and throughput."""
    paths = list(paths)
    if order == "random":
        random.Random(seed).shuffle(paths)
    if cold:
        reader.evict(paths)
    t = time.perf_counter()
    results = [_read(p, reader) for p in paths]
    out = _summary(results, time.perf_counter() - t)
    out.update(cold=cold, order=order, latencies_ms=[round(r[1] * 1000, 4) for r in results],
               sizes=[r[0] for r in results])
    return out


SWEEP_ROUNDS = (2, 4)  # the sweep's rounds: at least 2, more while a level's rounds disagree by more than SWEEP_SPREAD
SWEEP_SPREAD = 0.2


def concurrency_sweep(paths: Sequence[str], levels: Sequence[int] = (1, 2, 4, 8, 16),
                      reader: Reader = LOCAL, rounds: Tuple[int, int] = SWEEP_ROUNDS) -> List[Dict]:
    """Cold reads of the same files by 1, 2, 4, ... threads: throughput that grows with readers
    means latency-bound storage (parallelism hides it); flat means bandwidth (or CPU) bound.

    A storage rate is a wall rate, which other work on the machine (and on the storage) moves:
    the levels are read in rounds (each round every level once, interleaved), at least
    ``rounds[0]`` and up to ``rounds[1]`` while some level's rounds differ by more than
    ``SWEEP_SPREAD`` of their median. A level's row is its median round, with every round's
    files/s and MB/s beside it (``files_per_s_runs``, ``mb_per_s_runs``): the spread is known."""
    runs: Dict[int, List[Dict]] = {n: [] for n in levels}
    done = 0
    while done < rounds[0] or (done < rounds[1] and any(_spread([r["files_per_s"] for r in rs]) > SWEEP_SPREAD
                                                         for rs in runs.values())):
        for n in levels:
            reader.evict(paths)
            with ThreadPoolExecutor(max_workers=n) as pool:
                t = time.perf_counter()
                results = list(pool.map(lambda p: _read(p, reader), paths))
                wall = time.perf_counter() - t
            runs[n].append(_summary(results, wall, min(n, len(paths))))
        done += 1
    out = []
    for n in levels:
        rs = sorted(runs[n], key=lambda r: r["files_per_s"])
        row = dict(rs[(len(rs) - 1) // 2])  # the median round (the lower of two)
        row["readers"] = n
        row["files_per_s_runs"] = [r["files_per_s"] for r in runs[n]]
        row["mb_per_s_runs"] = [r["mb_per_s"] for r in runs[n]]
        out.append(row)
    return out


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far repeated measurements of one rate disagree."""
    if len(values) < 2:
        return 0.0
    mid = float(np.median(values))
    return (max(values) - min(values)) / mid if mid > 0 else 0.0


def fit_fixed_cost(latencies_ms: Sequence[float], sizes: Sequence[int],
                   min_spread: float = 0.5) -> Tuple[Optional[float], float]:
    """Least-squares ``latency = fixed + size / bandwidth``: (fixed ms per file, MB/s).
    The fixed part is what many small files pay again and again; a tar shard pays it once.

    Only sizes that vary can separate the two terms: when the sampled sizes span less than
    ``min_spread`` of their median (p90 - p10), or there are fewer than 8, the fixed cost is
    ``None`` (not determined) and the bandwidth the mean over the sample, rather than a noisy
    fit that swings from 0 to hundreds of ms between runs."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(latencies_ms, dtype=float)
    if len(x) == 0:
        return None, 0.0
    p10, p50, p90 = np.quantile(x, (0.1, 0.5, 0.9))
    if len(x) < 8 or p90 - p10 < min_spread * max(p50, 1.0):
        seconds = y.sum() / 1000
        return None, float(x.sum() / seconds / 1e6) if seconds > 0 else 0.0
    slope, intercept = np.polyfit(x, y, 1)
    fixed = float(max(0.0, min(intercept, np.median(y))))
    bandwidth = float(1e-3 / slope) if slope > 0 else 0.0  # bytes per ms -> MB/s
    return fixed, bandwidth


def _codec_of(path: str, head: bytes) -> str:
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return path.rpartition(".")[2].lower()


def decode_costs(paths: Sequence[str], per_codec: int = 40, reader: Reader = LOCAL
                 ) -> Tuple[Dict[str, Dict[str, Dict[str, float]]], Dict[str, Any]]:
    """Per codec (by content, not extension) and per library that loads: ms per image and
    megapixels/s, decoding from memory; plus the cost of np.load for .npy files."""
    blobs: Dict[str, List[bytes]] = {}
    seen: Dict[str, int] = {}  # images per codec in the sample (the mix), before the cap
    npys: List[bytes] = []
    for p in paths:
        ext = p.rpartition(".")[2].lower()
        try:
            data = reader.read(p)
        except OSError:
            continue
        if ext == "npy":
            npys.append(data)
        elif ext in IMAGE_EXTENSIONS:
            codec = _codec_of(p, data[:8])
            seen[codec] = seen.get(codec, 0) + 1
            if len(blobs.setdefault(codec, [])) < per_codec:
                blobs[codec].append(data)
    libs = [name for name, _ in jpeg_decoders()]
    costs: Dict[str, Dict[str, Dict[str, float]]] = {}
    for codec, items in sorted(blobs.items()):
        costs[codec] = {}
        for lib in (libs if codec == "jpeg" else ["pil"]):
            try:
                decode_rgb(items[0], lib)  # warm-up: library load, caches
            except Exception:
                pass
            pixels = 0
            ok = 0
            t = time.thread_time()  # CPU time: a shared machine's load does not move it
            for data in items:
                try:
                    arr = decode_rgb(data, lib)
                except Exception:
                    continue
                pixels += arr.shape[0] * arr.shape[1]
                ok += 1
            wall = max(time.thread_time() - t, 1e-9)
            if ok:
                costs[codec][lib] = {"ms": wall / ok * 1000, "mp_per_s": pixels / wall / 1e6, "images": ok,
                                     "share": seen[codec] / sum(seen.values())}
    other: Dict[str, Any] = {}
    if npys:
        loaded, seconds = 0, 0.0
        left_out: Counter = Counter()
        for data in npys:
            kind = _npy_kind(data)
            if kind == "array":
                t = time.thread_time()
                try:
                    np.load(io.BytesIO(data), allow_pickle=False)
                except Exception:  # a header that reads but a body that does not
                    kind = "invalid"
                else:
                    seconds += time.thread_time() - t
                    loaded += 1
            if kind != "array":
                left_out[kind] += 1
        if loaded:
            other["npy_load_ms"] = seconds / loaded * 1000
        if left_out:
            other["npy_not_loaded"] = "; ".join(f"{n} of {len(npys)} .npy files {_NPY_KINDS[kind]}"
                                                for kind, n in sorted(left_out.items()))
    return costs, other


_NPY_KINDS = {
    "invalid": "are not valid arrays (truncated, or another format under the name)",
    "object": "hold Python objects (dtype object): loading them unpickles, which runs code from the data, "
              "so they were not loaded",
}


def _npy_kind(data: bytes) -> str:
    """'array', 'object' or 'invalid', from the header alone: an object array is never loaded,
    nor one whose header promises more bytes than the file has (np.load on bytes would
    allocate them all first)."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:  # (2, 0); (3, 0) differs only in allowing UTF-8 field names
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception:  # numpy raises ValueError, SyntaxError, EOFError... for a bad header
        return "invalid"
    if dtype.hasobject:
        return "object"
    needed = dtype.itemsize
    for n in shape:
        needed *= n
    return "array" if needed <= len(data) - f.tell() else "invalid"


def image_geometry(paths: Sequence[str], reader: Reader = LOCAL) -> Dict:
    """Width, height and megapixel quantiles from file headers (no decode)."""
    from PIL import Image

    ws, hs = [], []
    for p in paths:
        if field_kind(p) != "image":
            continue
        try:
            with Image.open(io.BytesIO(reader.head(p))) as img:
                w, h = img.size
        except Exception:
            continue
        ws.append(w)
        hs.append(h)
    if not ws:
        return {}
    mp = [w * h / 1e6 for w, h in zip(ws, hs)]
    return {"images": len(ws), "width": quantiles(ws, (0.1, 0.5, 0.9)), "height": quantiles(hs, (0.1, 0.5, 0.9)),
            "megapixels": quantiles(mp, (0.1, 0.5, 0.9)),
            "decoded_bytes_mean": sum(w * h * 3 for w, h in zip(ws, hs)) / len(ws),
            "short_side_median": float(np.median([min(w, h) for w, h in zip(ws, hs)]))}


def memory_bandwidth(mb: int = 64, repeats: int = 3) -> float:
    """MB/s of a large memcpy: the ceiling of a warm decoded (npy) cache."""
    src = np.ones(mb << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, mb * 1.048576 / (time.perf_counter() - t))
    return best
