"""From measurements to a verdict: what limits loading, and the fix that removes most of it.

A pure function of :class:`Measurements` (no I/O), so it is tested on recorded measurements.
Every rate in it was measured through a real DataLoader with the machine's workers and the
reference transform (:mod:`dsconvert.analyze.loader`): the data as it is (cold and warm), the
same samples from memory (decode + transform + IPC, no storage), and each candidate output
made from the sample. :func:`decide` runs six small steps:

1. **predict** (:func:`_predict`): each pass's samples/s with a range. A warm pass that
   recorded CPU time per sample (its workers' and the main process's CPU clocks) predicts the
   rate that CPU time allows on the machine's CPUs (load makes a worker wait, not work more);
   the wall rate (less the CPU other processes took) and repeats widen the range, which is at
   least ``SPREAD`` either side. Cold passes (the storage's) are wall rates. Which pass
   predicts is chosen per output: warm when it (or the data as it is) fills at most half the
   page cache, cold otherwise;
2. **split the costs** (:func:`_costs`): one worker's ms per sample, read + per-file overhead +
   decode + transform + collate/IPC/other, computed so that they add up to the total. Read
   warm, from the workers' CPU clocks (the source's less the from-memory pass's); read cold,
   reading is the wall time the workers were not on a CPU (idle readers: waiting on the
   storage), unless the main process is busy half the time (then they may wait for it);
3. **what limits loading** (:func:`_limit`): the storage when the loader loses half its rate to
   reading (as-is vs from memory; without a from-memory pass, vs the warm pass where the page
   cache works), or, with no such reference, moves about what the storage gave cold (0.7-1.4x
   its measured MB/s or files/s) read cold; and read cold (or where nothing caches) whenever
   the storage's best MB/s, in samples, is within 1.4x of the loader's rate (the rate is then
   capped by it), or when reading is the largest share. Its kind is the first row of
   :data:`STORAGE_RULES` that holds (files of 4 MB or more: bandwidth; scaling 2x with readers
   at >= 2 ms a cold file: latency; files under 256 kB: per-file overhead; else latency when it
   scales, bandwidth when not). Otherwise the main process when it is on a CPU ``MAIN_BOUND``
   (90%) of the time or more (``collate-ipc``: it receives every batch, alone); else the
   largest CPU share of :data:`CPU_STAGES`: ``decode``, ``transform`` or ``collate-ipc``
   (stages within ``STAGE_TIE``, 25%, of the largest are named together, the first in that
   order deciding).
   ``none`` only when a ``target`` is met;
4. **the fix** (:func:`_fix`), judged on the ranges: a conversion is worth it when the fastest
   measured output that fits is ``WORTH`` (1.3x) faster; every output whose range overlaps the
   fastest's is equal to it, whatever its own point gain (above or below ``WORTH`` decides
   nothing); among equals :data:`TIE_RULE` picks by what each does a sample when read (in
   place: nothing converted; npy: nothing decoded; then the fewest bytes), which load does not
   move, and the others are named as equal alternatives. A verdict can then change between
   runs only where the fastest crosses ``WORTH`` or the preferred output's range stops
   overlapping the fastest's; where the preferred output is also the fastest (npy --resize
   on photos, a smaller re-encoded output on a flat folder), nowhere;
5. **commands and notes**: only commands that accept the data (a conversion only of a source
   whose sample converted in the measurement, into a real path);
6. **the sentences**, from :mod:`.sentences`, each made from the numbers it states.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..advice import output_for, shard_command, source_stem
from ..optional import BUILD_PACKAGES, REBUILD
from ..units import format_size
from . import sentences as say

__all__ = ["Measurements", "Verdict", "decide", "round_gains", "SOURCE", "MEMORY", "ROUND_SPREAD"]

SOURCE = "source"
MEMORY = "from memory"
LATENCY_MS = 2.0  # a cold per-file read slower than this is network-like latency
SMALL_FILE_BYTES = 256_000  # below this, a local read is mostly per-file work
LARGE_FILE_BYTES = 4_000_000  # at or above this, files are shard-sized: per-file costs are a few % of a read
READ_SHARE = 0.5  # the share of the loader's time lost to reading that makes it storage-bound
STORAGE_USE = 0.7  # a loader moving 0.7-1.4x the storage's measured MB/s (cold) is storage-bound
SCALES = 2.0  # throughput growth from 1 to N readers that means latency hidden by concurrency
WORTH = 1.3  # the smallest measured gain worth a conversion
MAIN_BOUND = 0.9  # a main process on the CPU this share of the time is what limits loading (it is serial)
MAIN_BUSY = 0.5  # a main process on the CPU this share of the time may be what idle workers wait for
CPU_SPREAD = 0.15  # a pass's CPU time per sample moved up to ~15% between runs on a busy 2-core machine
SPREAD = 0.1  # a pass's rate is known to +-10% at best: outputs closer than that are equal
ROUND_SPREAD = 0.25  # paired rounds go on (up to 5) while the best output's per-round gains spread more than this


@dataclass
class Measurements:
    source: str
    storage_kind: str  # local-disk, tmpfs, nfs, ceph, fuse, overlay, s3, ... (reported, not decided on)
    num_samples: int
    files_per_sample: float
    mean_sample_bytes: float
    mean_file_bytes: float
    cold_latency_ms: float  # p50 of one reader's cold per-file reads
    fixed_ms: Optional[float]  # fitted per-file fixed cost; None when the sizes cannot separate it
    bandwidth_mb_s: float  # best cold MB/s over the concurrency sweep (its median round)
    sweep: List[Tuple[int, float]]  # (readers, files/s), cold
    loader: Dict[str, Dict[str, Any]]  # SOURCE, MEMORY, each output -> {cold, warm, bytes_per_sample, ...}
    decode_ms: Dict[str, float]  # library -> ms per sample, one thread, the sample's codec mix
    transform_ms: float  # the reference transform on a decoded image, one thread
    cores: int  # the workers of every DataLoader pass
    cache: str = "auto"  # which passes predict: warm, cold, or auto (warm for data that fits in half the page cache)
    page_cache_bytes: Optional[int] = None  # memory the page cache may use (None: assume room)
    page_cache_works: bool = True  # warm reads measured 1.5x faster than cold (FUSE and object stores: not)
    transform: str = "eval"
    kind: str = "files"  # what the path holds (dsconvert.analyze.detect)
    convertible: bool = True  # dsconvert shard takes it as a source
    label: Optional[str] = None  # tar shards and Parquet: where the class label is (--label)
    numpy_decoder: str = "pil"
    region_decoder: bool = True  # dsconvert's C extension for decode="fused" is built here
    resize_kernel: str = "runs"  # dsconvert's resize kernel: "runs", "not built", "no AVX2" (torch resizes)
    suggested_resize: Optional[int] = None
    free_bytes: Optional[int] = None
    output_dir: str = "OUT"
    target: Optional[float] = None
    remote: bool = False
    bandwidth_runs: List[float] = field(default_factory=list)  # the best level's MB/s in each round of the sweep


@dataclass
class Verdict:
    bottleneck: str  # storage-latency, small-files, storage-bandwidth, decode, transform, collate-ipc, none, unknown
    summary: str
    evidence: List[str]
    commands: List[str]
    alternative: List[str]
    per_worker_ms: Dict[str, float]  # read, overhead, decode, transform, other, total (one worker, per sample)
    workers: int
    loader_per_s: float  # the data as it is, through the DataLoader
    predicted_per_s: Dict[str, float]  # output -> samples/s measured on the sample
    output_bytes: Dict[str, float]
    fits: Dict[str, bool]
    recommended: Optional[str]
    predicted_speedup: float
    keeps_up: Optional[bool] = None
    cache: str = "warm"  # the pass the data as it is was predicted from (outputs: see the notes)
    read_share: float = 0.0
    notes: List[str] = field(default_factory=list)
    limit: str = "unknown"  # what limits loading: a storage kind, decode, transform or collate-ipc
    predicted_range: Dict[str, List[float]] = field(default_factory=dict)  # output -> [low, high] samples/s
    speedup_range: List[float] = field(default_factory=lambda: [1.0, 1.0])
    equal_alternatives: List[str] = field(default_factory=list)  # outputs within the recommended one's range

    def to_dict(self) -> Dict:
        return asdict(self)


def _rate_at(sweep: List[Tuple[int, float]], readers: int) -> float:
    """files/s with ``readers`` concurrent readers, interpolated in the sweep."""
    if not sweep:
        return float("inf")
    pts = sorted(sweep)
    if readers <= pts[0][0]:
        return pts[0][1]
    for (r0, v0), (r1, v1) in zip(pts, pts[1:]):
        if r0 <= readers <= r1:
            return v0 + (v1 - v0) * (readers - r0) / (r1 - r0)
    return pts[-1][1]


def _cache_for(m: Measurements, total_bytes: float) -> str:
    """The pass that predicts training on ``total_bytes`` of data: epochs after the first read it
    from the page cache when it fills at most half of it and the storage lets pages be cached."""
    if m.cache != "auto":
        return m.cache
    if m.remote or not m.page_cache_works:
        return "cold"
    return "warm" if m.page_cache_bytes is None or total_bytes <= m.page_cache_bytes / 2 else "cold"


def _fused_extensions_note(m: Measurements) -> List[str]:
    """What decode="fused" was measured without, of dsconvert's two C extensions, and how to
    get them: a note, or none when both ran."""
    missing = []
    if not m.region_decoder:
        missing.append("region decoder, which is not built here: with it, the rows and columns the transform does "
                       "not read skip most of their decoding (train 1.2x faster on photos)")
    if m.resize_kernel == "not built":
        missing.append("resize kernel, which is not built here: with it, only the crop's pixels are resized (eval "
                       "1.3x faster on photos)")
    notes = []
    if missing:
        notes.append("decode=\"fused\" measured without dsconvert's " + "; and its ".join(missing) + ". To build "
                     f"them: {BUILD_PACKAGES}, then {REBUILD}")
    if m.resize_kernel == "no AVX2":
        notes.append("decode=\"fused\" resizes with torch here: dsconvert's resize kernel needs an x86-64 CPU with "
                     "AVX2, which this is not (the same pixels, slower)")
    return notes


# --- step 1: what each pass predicts, with its range ----------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A predicted samples/s with its range. From CPU time per sample: that rate, ``CPU_SPREAD``
    either side (the wall rate, which load moves, decides nothing). From wall rates only (cold
    passes): the pass's rate less the CPU others took and any repeats, at least ``SPREAD``
    either side, the least a single pass is known to within."""

    value: float
    low: float
    high: float
    gain: Optional[Tuple[float, float, float]] = None  # over the data as it is, from paired rounds: median, low, high

    def overlaps(self, other: Estimate) -> bool:
        return self.high >= other.low and other.high >= self.low


def _cpu_rate(row: Dict[str, Any], cache: str, cores: int) -> Optional[float]:
    """The samples/s a pass's CPU time per sample allows on ``cores`` CPUs: the workers' and the
    main process's CPU together, no worker faster than one CPU, the main process one CPU. Only
    for warm passes (a cold one waits on the storage, which CPU time does not see)."""
    if cache != "warm":
        return None
    return _rate(row.get(f"{cache}_cpu_ms"), row.get(f"{cache}_main_cpu_ms"), cores)


def _rate(worker_ms: Optional[float], main_ms: Optional[float], cores: int) -> Optional[float]:
    """samples/s from CPU ms per sample: the workers' and the main process's together on
    ``cores`` CPUs, no worker faster than one CPU, the main process one CPU."""
    if not worker_ms or worker_ms <= 0 or main_ms is None:
        return None
    rates = [cores * 1000.0 / (worker_ms + main_ms), cores * 1000.0 / worker_ms]
    if main_ms > 0:
        rates.append(1000.0 / main_ms)
    return min(rates)


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def round_gains(source_rounds: List[Dict[str, Any]], output_rounds: List[Dict[str, Any]], cores: int) -> List[float]:
    """An output's gain in each paired round: its CPU rate over the mean of the rates of the two
    passes of the data as it is beside it (before and after, under the same load). Rounds with
    a figure missing are left out."""
    rates = [_rate(r.get("cpu_ms"), r.get("main_cpu_ms"), cores) for r in source_rounds]
    gains = []
    for i, r in enumerate(output_rounds[:max(0, len(rates) - 1)]):
        out, before, after = _rate(r.get("cpu_ms"), r.get("main_cpu_ms"), cores), rates[i], rates[i + 1]
        if out and before and after:
            gains.append(out / ((before + after) / 2))
    return gains


def _paired(source: Estimate, row: Dict[str, Any], source_row: Dict[str, Any], cores: int) -> Optional[Estimate]:
    """An output's estimate from its paired rounds: the data as it is times the median of the
    per-round gains, the range their min-max, at least ``SPREAD`` either side. None without
    paired rounds."""
    gains = round_gains(source_row.get("warm_rounds") or [], row.get("warm_rounds") or [], cores)
    if not gains:
        return None
    mid = _median(gains)
    low, high = min(min(gains), mid * (1 - SPREAD)), max(max(gains), mid * (1 + SPREAD))
    return Estimate(source.value * mid, source.value * low, source.value * high, (mid, low, high))


def _source_estimate(row: Dict[str, Any], cache: str, cores: int) -> Optional[Estimate]:
    """The data as it is: from its paired rounds where there are (the median of its passes' CPU
    rates, measured as the outputs' beside them; their min-max, at least ``SPREAD`` either
    side), else as any pass."""
    rates = [r for r in (_rate(x.get("cpu_ms"), x.get("main_cpu_ms"), cores) for x in row.get("warm_rounds") or [])
             if r]
    first = _estimate(row, cache, cores)
    if cache != "warm" or len(rates) < 2 or first is None:  # a round is two passes of it at least
        return first
    mid = _median(rates)
    return Estimate(mid, min(min(rates), mid * (1 - SPREAD)), max(max(rates), mid * (1 + SPREAD)))


def _estimate(row: Dict[str, Any], cache: str, cores: int) -> Optional[Estimate]:
    wall = float(row.get(cache) or 0.0)
    if wall <= 0:
        return None
    cpu = _cpu_rate(row, cache, cores)
    if cpu:  # CPU time where there is one: load does not move it
        return Estimate(cpu, cpu * (1 - CPU_SPREAD), cpu * (1 + CPU_SPREAD))
    points = [wall] + [float(r) for r in row.get(f"{cache}_runs") or [] if r]
    return Estimate(wall, min(min(points), wall * (1 - SPREAD)), max(max(points), wall * (1 + SPREAD)))


@dataclass
class Predictions:
    cache: str  # the pass that predicts the data as it is
    source: Optional[Estimate]
    memory: float
    outputs: Dict[str, Dict[str, Any]]  # the measured outputs' rows
    caches: Dict[str, str]
    estimates: Dict[str, Estimate]
    sizes: Dict[str, float]
    fits: Dict[str, bool]


def _predict(m: Measurements) -> Predictions:
    cache = _cache_for(m, m.mean_sample_bytes * m.num_samples)
    sizes = {k: float(v.get("bytes_per_sample", 0.0)) * m.num_samples for k, v in m.loader.items()
             if k not in (SOURCE, MEMORY)}
    caches = {k: _cache_for(m, size) for k, size in sizes.items()}  # a 10x larger npy cache may not stay cached
    cores = max(1, m.cores)
    source = _source_estimate(m.loader.get(SOURCE, {}), cache, cores)
    estimates = {k: e for k in sizes if (e := _estimate(m.loader[k], caches[k], cores)) is not None}
    if source is not None and cache == "warm":  # measured beside the data as it is: the gains are the paired rounds'
        for k in estimates:
            paired = _paired(source, m.loader[k], m.loader.get(SOURCE, {}), cores) if caches[k] == "warm" else None
            estimates[k] = paired or estimates[k]
    outputs = {k: m.loader[k] for k in estimates}
    # reading the same data another way (a decoder) writes nothing: only new outputs need the room
    fits = {k: m.free_bytes is None or sizes[k] <= m.free_bytes or bool(outputs[k].get("same_data"))
            for k in outputs}
    memory = _estimate(m.loader.get(MEMORY, {}), "warm", max(1, m.cores))
    return Predictions(cache, source,
                       memory.value if memory is not None else 0.0, outputs, caches, estimates,
                       {k: sizes[k] for k in outputs}, fits)


# --- step 2: one worker's time per sample, and what the storage gives -----------------------


@dataclass
class Costs:
    as_is: float  # samples/s of the data as it is, through the loader (capped by the storage cold)
    per_worker: Dict[str, float]  # read, overhead, decode, transform, other, total: they add up
    read_share: float
    scaling: float  # best over one reader's files/s in the cold sweep
    storage_samples_s: float
    storage_use: float
    loader_mb_s: float
    capped: bool
    storage_bound: bool
    main_ms: float = 0.0  # the main process's CPU ms per sample (receiving, collating), where measured
    main_busy: float = 0.0  # the share of time the main process is on a CPU at the rate as it is


def _costs(m: Measurements, p: Predictions) -> Costs:
    n = max(1, m.cores)
    src_row = m.loader.get(SOURCE, {})
    as_is = src_row.get(p.cache, 0.0)
    t_total = n / as_is * 1000 if as_is > 0 else 0.0
    whole = src_row.get(f"{p.cache}_whole") or as_is  # the whole pass: a shard reader's reads come in bursts
    reference = p.memory
    if p.memory > 0:
        t_cpu = min(t_total, n / p.memory * 1000)
    elif m.page_cache_works and p.cache == "cold" and src_row.get("warm_whole"):
        reference = src_row["warm_whole"]  # no from-memory pass (a dsconvert output): cold vs warm, whole passes
        t_cpu = t_total * min(1.0, whole / reference)
    else:
        reference = 0.0
        t_cpu = t_total
    mem_row = m.loader.get(MEMORY, {})
    cpu_split = p.cache == "warm" and bool(src_row.get("warm_cpu_ms")) and bool(mem_row.get("warm_cpu_ms"))
    if cpu_split:  # read warm, every part of a worker's time is CPU: split its CPU clocks, which load does not move
        t_total = float(src_row["warm_cpu_ms"])
        t_cpu = min(t_total, float(mem_row["warm_cpu_ms"]))
    elif p.cache == "cold" and src_row.get("cold_cpu_ms") and t_total > 0:
        # read cold, a worker's time is its CPU plus its waits for the storage: the CPU clocks say
        # how idle the readers were, whatever the from-memory pass lost to other processes' load,
        # unless the main process (busy half the time or more) is what the workers wait for
        main_busy = float(src_row.get("cold_main_cpu_ms") or 0.0) * as_is / 1000
        if main_busy < MAIN_BUSY:
            t_cpu = min(t_cpu, float(src_row["cold_cpu_ms"]))
    t_read = max(0.0, t_total - t_cpu)
    read_share = t_read / t_total if t_total > 0 else 0.0
    scaling = (max(r for _, r in m.sweep) / sorted(m.sweep)[0][1]) if len(m.sweep) > 1 and sorted(m.sweep)[0][1] > 0 \
        else 1.0
    storage_files_s = _rate_at(m.sweep, n)
    loader_mb_s = whole * m.mean_sample_bytes / 1e6
    per_file = whole * m.files_per_sample / storage_files_s if storage_files_s and m.convertible else 0.0
    storage_use = max(per_file, loader_mb_s / m.bandwidth_mb_s if m.bandwidth_mb_s > 0 else 0.0)
    # a loader moving about what the storage gave cold is held by it; far more means a cache serves it.
    # Over a whole epoch read cold every byte crosses the storage: at best its measured MB/s
    cold_like = p.cache == "cold" or not m.page_cache_works
    storage_samples_s = (m.bandwidth_mb_s * 1e6 / m.mean_sample_bytes
                         if m.bandwidth_mb_s > 0 and m.mean_sample_bytes > 0 else float("inf"))
    capped = cold_like and storage_samples_s < as_is
    # read warm from a page cache that works, the storage is out of the loop: only a measured loss counts
    storage_bound = (read_share >= READ_SHARE
                     or (cold_like and reference <= 0 and STORAGE_USE <= storage_use <= 1 / STORAGE_USE)
                     or (cold_like and storage_samples_s * STORAGE_USE <= as_is))
    if capped:
        t_total = n / storage_samples_s * 1000
        t_read = max(0.0, t_total - t_cpu)
        read_share = t_read / t_total
        as_is = storage_samples_s
    elif p.source is not None:
        as_is = p.source.value  # the rate the gains are measured against (its CPU time's where there is one)
    t_decode = min(m.decode_ms.get("pil", 0.0), t_cpu)
    t_transform = min(m.transform_ms, max(0.0, t_cpu - t_decode))
    t_other = max(0.0, t_cpu - t_decode - t_transform)
    t_overhead = min(t_read, (m.fixed_ms or 0.0) * m.files_per_sample)
    per_worker = {"read": t_read - t_overhead, "overhead": t_overhead, "decode": t_decode,
                  "transform": t_transform, "other": t_other, "total": t_total}
    main_ms = float(src_row.get(f"{p.cache}_main_cpu_ms") or 0.0)
    return Costs(as_is, per_worker, read_share, scaling, storage_samples_s, storage_use, loader_mb_s, capped,
                 storage_bound, main_ms, main_ms * as_is / 1000)


# --- step 3: what limits loading (rules as data) --------------------------------------------

# the storage's kind, the first row whose test holds (m, scaling): from the measurements, never the mount type
STORAGE_RULES: Tuple[Tuple[str, Callable[[Measurements, float], bool]], ...] = (
    ("storage-bandwidth", lambda m, s: m.mean_file_bytes >= LARGE_FILE_BYTES),  # sharding cannot help
    ("storage-latency", lambda m, s: s >= SCALES and m.cold_latency_ms >= LATENCY_MS),
    ("small-files", lambda m, s: m.mean_file_bytes < SMALL_FILE_BYTES),
    ("storage-latency", lambda m, s: s >= SCALES),
    ("storage-bandwidth", lambda m, s: True),
)
# the CPU stages a worker's time splits into, in the order a tie goes: bottleneck -> per_worker key
CPU_STAGES = (("decode", "decode"), ("transform", "transform"), ("collate-ipc", "other"))
STAGE_TIE = 0.25  # CPU stages within 25% of the largest are about as large: named together, the first decides


def _storage_kind(m: Measurements, scaling: float) -> str:
    return next(kind for kind, holds in STORAGE_RULES if holds(m, scaling))


def _close_stages(per_worker: Dict[str, float]) -> List[Tuple[str, str]]:
    """The CPU stages within ``STAGE_TIE`` of the largest, in :data:`CPU_STAGES` order: shares
    that close are equal within what their CPU times move between runs."""
    top = max(per_worker[key] for _, key in CPU_STAGES)
    return [s for s in CPU_STAGES if top > 0 and per_worker[s[1]] >= (1 - STAGE_TIE) * top]


def _largest_stage(per_worker: Dict[str, float]) -> Tuple[str, str]:
    """The largest CPU stage; among stages about as large, the first in :data:`CPU_STAGES`
    (stable: which of two equal shares measured larger on a run does not decide)."""
    close = _close_stages(per_worker)
    return close[0] if close else max(CPU_STAGES, key=lambda s: per_worker[s[1]])


def _limit(m: Measurements, c: Costs) -> str:
    """What limits loading: the storage when the loader loses half its time to it (or runs at
    its measured throughput) or reading is the largest share, its kind by :data:`STORAGE_RULES`;
    else the largest CPU share."""
    stage = _largest_stage(c.per_worker)
    read = c.per_worker["read"] + c.per_worker["overhead"]
    if c.storage_bound or (read > 0 and read >= c.per_worker[stage[1]]):  # reading is the largest share
        return _storage_kind(m, c.scaling)
    if c.main_busy >= MAIN_BOUND:  # one process receives every batch: on a CPU all the time, it is the limit
        return "collate-ipc"
    return stage[0]


# --- step 4: the fix that removes most of it ------------------------------------------------


@dataclass
class Fix:
    name: Optional[str]
    speedup: float = 1.0
    low: float = 1.0
    high: float = 1.0
    equals: List[str] = field(default_factory=list)  # within the chosen one's range: equal alternatives


TIE_RULE = "the one read in place, then decoded arrays (npy), then the smaller output"


def _tie_key(p: Predictions, name: str) -> Tuple[bool, bool, float, str]:
    """:data:`TIE_RULE` as a sort key. Where the measurements cannot tell outputs apart, the
    one that by construction does the least work a sample when read: nothing converted (read
    in place), then nothing decoded (npy's arrays), then the fewest bytes to read and decode.
    None of it moves with load, so the choice among equals is the same on every run. Not "the
    one keeping every pixel" first: a lossless output about 1.35x slower than a lossy one is
    equal on one run and not on the next (the flat folder's 1 flip in 6, issue 41); nor the
    smaller output first: a shrunk wds output 1.3x slower than npy --resize flipped photos."""
    row = p.outputs[name]
    return (not row.get("same_data"), row.get("format") != "npy", p.sizes[name], name)


def _fix(m: Measurements, p: Predictions, c: Costs, bottleneck: str) -> Fix:
    """Step 4, judged on the ranges: no output's eligibility rests on where its own point
    estimate falls against ``WORTH`` (a 1.25-1.6x output straddling 1.3x flipped the fix)."""
    fitting = [k for k in p.estimates if p.fits[k]]
    if not fitting or c.as_is <= 0:
        return Fix(None)
    src = p.source if p.source is not None and not c.capped else Estimate(c.as_is, c.as_is * (1 - SPREAD),
                                                                         c.as_is * (1 + SPREAD))
    if src.value <= 0:
        return Fix(None)
    fastest = max(fitting, key=lambda k: p.estimates[k].value)
    if p.estimates[fastest].value / src.value < WORTH:
        return Fix(None)
    # every output as fast as the fastest within the ranges is equal, whatever its own point gain
    equal = [k for k in fitting if p.estimates[k].overlaps(p.estimates[fastest])]
    chosen = min(equal, key=lambda k: _tie_key(p, k))
    e = p.estimates[chosen]
    speedup = e.value / src.value
    if m.mean_file_bytes >= LARGE_FILE_BYTES and bottleneck == "storage-bandwidth" \
            and p.outputs[chosen].get("format") != "npy":
        return Fix(None)  # re-packing large files into shards only copies them
    if not (m.convertible or p.outputs[chosen].get("same_data")):
        return Fix(None)
    equals = [k for k in sorted(equal, key=lambda k: _tie_key(p, k)) if k != chosen]
    if e.gain is not None and src is p.source:  # measured beside the data as it is: the rounds' gains
        return Fix(chosen, e.gain[0], e.gain[1], e.gain[2], equals)
    return Fix(chosen, speedup, e.low / src.high, e.high / src.low, equals)


# --- step 5: commands and notes -------------------------------------------------------------


def _command(m: Measurements, row: Dict[str, Any], name: str) -> str:
    src = m.source
    if row.get("same_data"):  # the data as it is, read another way
        mode = row.get("decode", "numpy")
        label = f", label={row['label']!r}" if row.get("label") else ""
        if mode == "fused":
            return f'open_dataset({src!r}{label}, transform=T, decode="fused")   # reads them in place'
        return f'open_dataset({src!r}{label}, decode="{mode}")   # decodes JPEGs with {m.numpy_decoder}'
    fmt = row.get("format", name.split(",")[0].split()[0])
    out = output_for(src, fmt, m.output_dir)  # in the output folder (by default beside the source), named after it
    comment = None
    if row.get("decode") == "numpy":
        comment = f'then open_dataset({out!r}, decode="numpy") decodes JPEGs with {m.numpy_decoder}'
    elif row.get("decode") == "fused":
        comment = f'then open_dataset({out!r}, transform=T, decode="fused")'
    return shard_command(src, fmt, out, label=m.label, options=row.get("options"), comment=comment)


def _commands(m: Measurements, p: Predictions, fix: Fix, bottleneck: str) -> Tuple[List[str], List[str]]:
    commands: List[str] = []
    alternative: List[str] = []
    q = shlex.quote  # paths go into shell commands as they are, spaces and all
    if fix.name:
        commands.append(_command(m, p.outputs[fix.name], fix.name))
        for k in fix.equals:  # as fast within the ranges: named as equal alternatives
            alternative.append(_command(m, p.outputs[k], k) + f"   # {p.estimates[k].value:,.0f}/s in "
                               f"{format_size(p.sizes[k])}: as fast within the ranges")
        encoded = [k for k in p.estimates if p.fits[k] and p.outputs[k].get("format") == "wds"
                   and k != fix.name and k not in fix.equals]
        if p.outputs[fix.name].get("format") == "npy" and encoded:
            alt = max(encoded, key=lambda k: p.estimates[k].value)
            alternative.append(_command(m, p.outputs[alt], alt) + f"   # {p.estimates[alt].value:,.0f}/s in "
                               f"{format_size(p.sizes[alt])} instead of {format_size(p.sizes[fix.name])}")
    large = m.mean_file_bytes >= LARGE_FILE_BYTES
    if m.remote and m.convertible and (bottleneck in ("storage-latency", "small-files")
                                       or (bottleneck == "storage-bandwidth" and not large)):
        # shards kept in the store, beside the source, read through a local verified copy
        shards = output_for(m.source, "wds")
        local = posixpath.join(m.output_dir, "dsconvert-cache")
        alternative = [shard_command(m.source, "wds", shards, label=m.label),
                       f"dsconvert cache {q(shards)} {q(local)}   # then open_dataset({shards!r}, "
                       f"cache_dir={local!r}) reads verified local copies"]
    return commands, alternative


def _storage_notes(m: Measurements, bottleneck: str) -> List[str]:
    notes: List[str] = []
    q = shlex.quote
    src = m.source
    stem = source_stem(src)  # a list file: its outputs are named without the suffix
    if bottleneck == "storage-bandwidth":
        if m.mean_file_bytes >= LARGE_FILE_BYTES:
            notes.append(f"the files are already large ({m.mean_file_bytes / 1e6:,.0f} MB each): sharding cannot "
                         "reduce the number of requests; the storage's bandwidth is the limit")
        cache_dir = posixpath.join(m.output_dir, "dsconvert-cache")
        if m.kind == "dsconvert":
            notes.append(f"read a verified local copy: dsconvert cache {q(src)} {q(cache_dir)}, then "
                         f"open_dataset({src!r}, cache_dir={cache_dir!r})")
        elif m.remote:
            notes.append("copy the data to local SSD (or a faster tier) before training, with the store's own tool "
                         "(aws s3 sync, gsutil rsync, azcopy)")
        elif stem != src.rstrip("/"):
            notes.append("copy the files the list names to local SSD (or a faster tier) before training")
        else:
            notes.append(f"copy the data to local SSD (or a faster tier) before training, e.g. rsync -a {q(src)}/ "
                         f"{q(posixpath.join('/local/ssd', posixpath.basename(stem) or 'data'))}/")
    if bottleneck == "storage-latency":
        notes.append("write the output to local SSD: the conversion is then also the pre-cache")
    if bottleneck in ("storage-latency", "small-files") and not m.convertible:
        notes.append(f"{m.kind} data: pack it into fewer, larger files (dsconvert shard takes folders of files)")
    return notes


def _notes(m: Measurements, p: Predictions, c: Costs, fix: Fix, bottleneck: str) -> List[str]:
    notes: List[str] = []
    shrunk = (p.outputs[fix.name].get("options") or {}).get("max_size") if fix.name else None
    if shrunk:
        notes.append(f"--max-size {shrunk} re-encodes images whose longer side is larger (JPEG quality 90): lossy, "
                     f"and meant for training at about {m.suggested_resize or shrunk} pixels; keep the source for "
                     "anything that needs full resolution")
    if fix.equals:
        notes.append(f"{fix.name} and {', '.join(fix.equals)} measured within each other's range: chosen by a rule "
                     f"that does not move with load, {TIE_RULE}")
    notes += _storage_notes(m, bottleneck)
    pw = c.per_worker
    t_cpu = pw["decode"] + pw["transform"] + pw["other"]
    if bottleneck == "transform" or (pw["transform"] >= 0.5 * t_cpu and t_cpu > 0):
        notes.append(f"the transform takes {pw['transform']:.2f} of {pw['total']:.2f} ms per sample in a worker: "
                     "run it on the GPU (torchvision.transforms.v2 on CUDA tensors, kornia.augmentation, NVIDIA "
                     "DALI) or give the loader more CPUs")
    if any(row.get("decode") == "fused" for row in p.outputs.values()):  # measured, recommended or not
        notes.extend(_fused_extensions_note(m))
    if bottleneck == "decode" and m.numpy_decoder == "pil" and "pil" in m.decode_ms:
        notes.append("no faster JPEG decoder loads here: "
                     "apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'")
    if fix.name is None and m.target is None and not bottleneck.startswith(("storage", "small")):
        notes.append(f"no output measured {WORTH}x faster than the data as it is: if training still waits for "
                     "data, the cause is in the training job (run dsconvert diagnose on it), or pass --target with "
                     "its samples/s to compare")
    for k, ok in p.fits.items():
        if not ok:
            notes.append(f"{k} would need {format_size(p.sizes[k])}, more than the {format_size(m.free_bytes or 0)} "
                         f"free at {m.output_dir}")
    if m.cache == "auto" and p.cache == "warm":
        notes.append("the data fits in half the page cache: predictions are warm passes (epochs after the first); "
                     "the report lists cold ones too")
    cold_outputs = [k for k in p.outputs if p.caches[k] != p.cache]
    if cold_outputs:
        notes.append(f"{', '.join(cold_outputs)}: predicted from the {p.caches[cold_outputs[0]]} pass (too large to "
                     "stay in the page cache)")
    return notes


# --- step 6: the sentences ------------------------------------------------------------------


def _evidence(m: Measurements, p: Predictions, c: Costs) -> List[str]:
    n = max(1, m.cores)
    evidence = [f"through a DataLoader with {n} workers and the {m.transform} transform ({p.cache} page cache): "
                f"{c.as_is:,.0f} samples/s as it is" + (f", {p.memory:,.0f}/s from memory: reading costs "
                                                        f"{c.read_share:.0%} of the loader's time" if p.memory else "")]
    if c.capped:
        evidence.append(f"the storage delivers at most {c.storage_samples_s:,.1f} samples/s cold "
                        f"({m.bandwidth_mb_s:,.1f} MB/s at best over the sweep, "
                        f"{m.mean_sample_bytes / 1e6:,.2f} MB a sample): over an epoch the loader cannot go "
                        "faster, whatever its start showed")
    evidence.append(say.breakdown(c.per_worker))
    if m.sweep:
        evidence.append(f"cold reads: {say.concurrency(m.sweep)}: {say.concurrency_reading(m.sweep)}")
    fixed = (f"per-file fixed cost {m.fixed_ms:.2f} ms (fitted)" if m.fixed_ms is not None
             else "per-file fixed cost not determined (the sampled files have about one size)")
    evidence.append(f"cold read {m.cold_latency_ms:.2f} ms per file (p50), {fixed}, "
                    f"up to {m.bandwidth_mb_s:,.0f} MB/s{say.spread(m.bandwidth_runs, ' MB/s')}; "
                    f"{m.mean_file_bytes / 1e3:,.0f} kB per file; storage: {m.storage_kind}; "
                    f"the loader moves {c.loader_mb_s:,.1f} MB/s ({c.storage_use:.0%} of what the storage gave)")
    return evidence


def _summary(m: Measurements, c: Costs, limit: str, fix: Fix, keeps_up: Optional[bool]) -> str:
    n = max(1, m.cores)
    if keeps_up:
        return f"the loader keeps up: {c.as_is:,.0f} samples/s with {n} workers for a target of {m.target:,.0f}"
    if limit.startswith("storage") or limit == "small-files":
        first = say.storage_limit(limit, c.read_share, m.cold_latency_ms, m.mean_file_bytes, m.bandwidth_mb_s,
                                  m.sweep)
    elif limit == "collate-ipc" and c.main_busy >= MAIN_BOUND:
        first = say.main_limit(c.main_ms, c.main_busy)
    else:
        first = say.limit(limit, c.per_worker, [name for name, _ in _close_stages(c.per_worker) if name != limit])
    parts = [first, say.fix(fix.name, fix.speedup, fix.low, fix.high, fix.equals, WORTH, TIE_RULE)]
    if m.target is not None:
        parts.append(f"{c.as_is:,.0f} samples/s with {n} workers is short of the {m.target:,.0f}/s target")
    return say.join(parts)


def decide(m: Measurements) -> Verdict:
    """Say what limits loading ``m.source`` as it is and the fix that removes most of it: the
    steps above, in order (predict, split the costs, name the limit, choose the fix, word it)."""
    p = _predict(m)
    c = _costs(m, p)
    keeps_up = None if m.target is None else c.as_is >= m.target
    limit = _limit(m, c)
    bottleneck = "none" if keeps_up else limit
    fix = _fix(m, p, c, bottleneck) if not keeps_up else Fix(None)
    commands, alternative = _commands(m, p, fix, bottleneck)
    return Verdict(
        bottleneck=bottleneck, summary=_summary(m, c, limit, fix, keeps_up), evidence=_evidence(m, p, c),
        commands=commands, alternative=alternative, per_worker_ms=c.per_worker, workers=max(1, m.cores),
        loader_per_s=c.as_is, predicted_per_s={k: e.value for k, e in p.estimates.items()},
        output_bytes=p.sizes, fits=p.fits, recommended=fix.name, predicted_speedup=fix.speedup if fix.name else 1.0,
        keeps_up=keeps_up, cache=p.cache, read_share=c.read_share, notes=_notes(m, p, c, fix, bottleneck),
        limit=limit, predicted_range={k: [e.low, e.high] for k, e in p.estimates.items()},
        speedup_range=[fix.low, fix.high] if fix.name else [1.0, 1.0], equal_alternatives=fix.equals,
    )
