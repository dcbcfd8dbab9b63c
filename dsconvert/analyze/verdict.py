"""From measurements to a verdict: the bottleneck, the evidence, the fix and its measured gain.

A pure function of :class:`Measurements` (no I/O), so it is tested on recorded measurements.
Every rate in it was measured through a real DataLoader with the machine's workers and the
reference transform (:mod:`dsconvert.analyze.loader`): the data as it is (cold and warm), the
same samples from memory (decode + transform + IPC, no storage), and each candidate output
made from the sample. The decision reads them in this order:

1. a ``target`` the loader meets: ``none``;
2. storage: the loader loses half its rate to reading (as-is vs from memory; without a
   from-memory pass, vs the warm pass where the page cache works), or, with no such reference,
   moves about what the storage gave cold (0.7-1.4x its measured MB/s or files/s) when read
   cold; and read cold (or where nothing caches) whenever the storage's best measured MB/s, in samples, is
   within 1.4x of the loader's rate (that rate is then capped by it: a shard reader fetching
   ahead can run faster at its start than an epoch allows). Which storage limit is decided from the measurements,
   never from the mount type, in this order: files of 4 MB or more are *bandwidth* (sharding
   cannot reduce their requests; a copy on faster storage can); throughput that grows 2x or
   more with concurrent readers at >= 2 ms per cold file is *latency*; files under 256 kB are
   *per-file overhead* (small files); the rest is *latency* when it scales 2x with readers and
   *bandwidth* when it does not. Which pass predicts is chosen per output: warm when that
   output (or the data as it is) fills at most half the page cache, cold otherwise;
3. otherwise the CPU: ``decode`` when an output measured >= 1.3x faster (it removes or
   speeds up decoding); when none is, ``none`` (the data's form is not what limits the
   loader), or with an unmet target the larger of decode and ``transform``.

Commands are only those that accept the data: a conversion only of a source whose sample
converted in the measurement, into a real path.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..advice import output_for, shard_command, source_stem
from ..optional import BUILD_PACKAGES, REBUILD
from ..units import format_size

__all__ = ["Measurements", "Verdict", "decide", "SOURCE", "MEMORY"]

SOURCE = "source"
MEMORY = "from memory"
LATENCY_MS = 2.0  # a cold per-file read slower than this is network-like latency
SMALL_FILE_BYTES = 256_000  # below this, a local read is mostly per-file work
LARGE_FILE_BYTES = 4_000_000  # at or above this, files are shard-sized: per-file costs are a few % of a read
READ_SHARE = 0.5  # the share of the loader's time lost to reading that makes it storage-bound
STORAGE_USE = 0.7  # a loader moving 0.7-1.4x the storage's measured MB/s (cold) is storage-bound
SCALES = 2.0  # throughput growth from 1 to N readers that means latency hidden by concurrency
WORTH = 1.3  # the smallest measured gain worth a conversion


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
    bandwidth_mb_s: float  # best cold MB/s over the concurrency sweep
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


@dataclass
class Verdict:
    bottleneck: str  # storage-latency, small-files, storage-bandwidth, decode, transform, none, unknown
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


IN_PLACE_MARGIN = 0.9  # reading the data in place wins over a conversion measured up to 10% faster


def _storage_kind(m: Measurements, scaling: float) -> str:
    if m.mean_file_bytes >= LARGE_FILE_BYTES:
        return "storage-bandwidth"
    if scaling >= SCALES and m.cold_latency_ms >= LATENCY_MS:
        return "storage-latency"
    if m.mean_file_bytes < SMALL_FILE_BYTES:
        return "small-files"
    return "storage-latency" if scaling >= SCALES else "storage-bandwidth"


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


def decide(m: Measurements) -> Verdict:
    """Name what limits loading ``m.source`` as it is, and the fastest measured fix that fits."""
    n = max(1, m.cores)
    src_row = m.loader.get(SOURCE, {})
    cache = _cache_for(m, m.mean_sample_bytes * m.num_samples)
    as_is = src_row.get(cache, 0.0)
    memory = m.loader.get(MEMORY, {}).get("warm", 0.0)
    sizes = {k: float(v.get("bytes_per_sample", 0.0)) * m.num_samples for k, v in m.loader.items()
             if k not in (SOURCE, MEMORY)}
    caches = {k: _cache_for(m, size) for k, size in sizes.items()}  # a 10x larger npy cache may not stay cached
    outputs = {k: v for k, v in m.loader.items() if k in sizes and v.get(caches[k])}
    predicted = {k: float(v[caches[k]]) for k, v in outputs.items()}
    sizes = {k: sizes[k] for k in outputs}
    # reading the same data another way (a decoder) writes nothing: only new outputs need the room
    fits = {k: m.free_bytes is None or v <= m.free_bytes or bool(outputs[k].get("same_data")) for k, v in sizes.items()}
    fitting = [k for k in predicted if fits[k]]
    best = max(fitting, key=lambda k: predicted[k]) if fitting else None
    in_place = [k for k in fitting if outputs[k].get("same_data")]
    if best is not None and in_place:  # the data read where it is, within noise of a conversion: no copy
        alt = max(in_place, key=lambda k: predicted[k])
        if predicted[alt] >= IN_PLACE_MARGIN * predicted[best]:
            best = alt

    # one worker's time per sample: n workers each deliver as_is / n samples/s
    t_total = n / as_is * 1000 if as_is > 0 else 0.0
    whole = src_row.get(f"{cache}_whole") or as_is  # the whole pass: a shard reader's reads come in bursts
    reference = memory
    if memory > 0:
        t_cpu = min(t_total, n / memory * 1000)
    elif m.page_cache_works and cache == "cold" and src_row.get("warm_whole"):
        reference = src_row["warm_whole"]  # no from-memory pass (a dsconvert output): cold vs warm, whole passes
        t_cpu = t_total * min(1.0, whole / reference)
    else:
        reference = 0.0
        t_cpu = t_total
    t_read = max(0.0, t_total - t_cpu)
    read_share = t_read / t_total if t_total > 0 else 0.0
    decoder = "pil"
    t_decode = min(m.decode_ms.get(decoder, 0.0), t_cpu)
    t_transform = min(m.transform_ms, max(0.0, t_cpu - t_decode))
    t_other = max(0.0, t_cpu - t_decode - t_transform)
    t_overhead = min(t_read, (m.fixed_ms or 0.0) * m.files_per_sample)
    scaling = (max(r for _, r in m.sweep) / m.sweep[0][1]) if len(m.sweep) > 1 and m.sweep[0][1] > 0 else 1.0
    storage_files_s = _rate_at(m.sweep, n)
    loader_mb_s = whole * m.mean_sample_bytes / 1e6
    per_file = whole * m.files_per_sample / storage_files_s if storage_files_s and m.convertible else 0.0
    storage_use = max(per_file, loader_mb_s / m.bandwidth_mb_s if m.bandwidth_mb_s > 0 else 0.0)
    # a loader moving about what the storage gave cold is held by it; far more means a cache serves it
    # over a whole epoch read cold every byte crosses the storage: at best its measured MB/s
    cold_like = cache == "cold" or not m.page_cache_works
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
    speedup = predicted[best] / as_is if best and as_is > 0 else 1.0
    keeps_up = None if m.target is None else as_is >= m.target

    evidence = [f"through a DataLoader with {n} workers and the {m.transform} transform ({cache} page cache): "
                f"{as_is:,.0f} samples/s as it is" + (f", {memory:,.0f}/s from memory: reading costs "
                                                      f"{read_share:.0%} of the loader's time" if memory else "")]
    evidence.append(f"one worker per sample: {t_total:.2f} ms = read {t_read:.2f} + decode {t_decode:.2f} "
                    f"+ transform {t_transform:.2f} + collate/IPC/other {t_other:.2f}")
    if m.sweep:
        kind = ("throughput grows with concurrent readers: latency that parallelism hides" if scaling >= SCALES
                else "throughput does not grow with readers: bandwidth or CPU bound")
        evidence.append(f"cold reads scale {scaling:.1f}x from {m.sweep[0][0]} to {max(m.sweep)[0]} readers ({kind})")
    if capped:
        evidence.insert(1, f"the storage delivers at most {storage_samples_s:,.1f} samples/s cold "
                           f"({m.bandwidth_mb_s:,.1f} MB/s at best over the sweep, "
                           f"{m.mean_sample_bytes / 1e6:,.2f} MB a sample): over an epoch the loader cannot go "
                           "faster, whatever its start showed")
    fixed = (f"per-file fixed cost {m.fixed_ms:.2f} ms (fitted)" if m.fixed_ms is not None
             else "per-file fixed cost not determined (the sampled files have about one size)")
    evidence.append(f"cold read {m.cold_latency_ms:.2f} ms per file (p50), {fixed}, "
                    f"up to {m.bandwidth_mb_s:,.0f} MB/s; "
                    f"{m.mean_file_bytes / 1e3:,.0f} kB per file; storage: {m.storage_kind}; "
                    f"the loader moves {loader_mb_s:,.1f} MB/s ({storage_use:.0%} of what the storage gave)")

    if keeps_up:
        bottleneck = "none"
    elif storage_bound:
        bottleneck = _storage_kind(m, scaling)
    elif best is not None and speedup >= WORTH:
        bottleneck = "decode"
    elif m.target is None:
        bottleneck = "none"
    else:
        bottleneck = "transform" if t_transform >= t_decode else "decode"

    src = m.source
    stem = source_stem(src)  # a list file: its outputs are named without the suffix

    def out_for(fmt: str) -> str:  # in the output folder (by default beside the source), named after it
        return output_for(src, fmt, m.output_dir)

    q = shlex.quote  # paths go into shell commands as they are, spaces and all

    def command(name: str) -> str:
        row = outputs[name]
        if row.get("same_data"):  # the data as it is, read another way
            mode = row.get("decode", "numpy")
            label = f", label={row['label']!r}" if row.get("label") else ""
            if mode == "fused":
                return f'open_dataset({src!r}{label}, transform=T, decode="fused")   # reads them in place'
            return f'open_dataset({src!r}{label}, decode="{mode}")   # decodes JPEGs with {m.numpy_decoder}'
        fmt = row.get("format", name.split(",")[0].split()[0])
        comment = None
        if row.get("decode") == "numpy":
            comment = f'then open_dataset({out_for(fmt)!r}, decode="numpy") decodes JPEGs with {m.numpy_decoder}'
        elif row.get("decode") == "fused":
            comment = f'then open_dataset({out_for(fmt)!r}, transform=T, decode="fused")'
        return shard_command(src, fmt, out_for(fmt), label=m.label, options=row.get("options"), comment=comment)

    commands: List[str] = []
    alternative: List[str] = []
    notes: List[str] = []
    large = m.mean_file_bytes >= LARGE_FILE_BYTES
    recommended = best if best is not None and speedup >= WORTH and bottleneck not in ("none",) else None
    if recommended and large and bottleneck == "storage-bandwidth" and outputs[recommended].get("format") != "npy":
        recommended = None  # re-packing large files into shards only copies them
    if recommended and (m.convertible or outputs[recommended].get("same_data")):
        commands.append(command(recommended))
        encoded = [k for k in fitting if outputs[k].get("format") == "wds" and k != recommended]
        if outputs[recommended].get("format") == "npy" and encoded:
            alt = max(encoded, key=lambda k: predicted[k])
            alternative.append(command(alt) + f"   # {predicted[alt]:,.0f}/s in {format_size(sizes[alt])} "
                               f"instead of {format_size(sizes[recommended])}")
    shrunk = (outputs[recommended].get("options") or {}).get("max_size") if recommended else None
    if shrunk:
        notes.append(f"--max-size {shrunk} re-encodes images whose longer side is larger (JPEG quality 90): lossy, "
                     f"and meant for training at about {m.suggested_resize or shrunk} pixels; keep the source for "
                     "anything that needs full resolution")
    if bottleneck == "storage-bandwidth":
        if large:
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
    if m.remote and m.convertible and bottleneck in ("storage-latency", "small-files") or (
            m.remote and m.convertible and bottleneck == "storage-bandwidth" and not large):
        # shards kept in the store, beside the source, read through a local verified copy
        shards = output_for(src, "wds")
        local = posixpath.join(m.output_dir, "dsconvert-cache")
        alternative = [shard_command(src, "wds", shards, label=m.label),
                       f"dsconvert cache {q(shards)} {q(local)}   # then open_dataset({shards!r}, "
                       f"cache_dir={local!r}) reads verified local copies"]
    if bottleneck in ("storage-latency", "small-files") and not m.convertible:
        notes.append(f"{m.kind} data: pack it into fewer, larger files (dsconvert shard takes folders of files)")
    if bottleneck == "transform" or (t_transform >= 0.5 * t_cpu and t_cpu > 0):
        notes.append(f"the transform takes {t_transform:.2f} of {t_total:.2f} ms per sample in a worker: run it on "
                     "the GPU (torchvision.transforms.v2 on CUDA tensors, kornia.augmentation, NVIDIA DALI) or give "
                     "the loader more CPUs")
    if any(row.get("decode") == "fused" for row in outputs.values()):  # measured, recommended or not
        notes.extend(_fused_extensions_note(m))
    if bottleneck == "decode" and m.numpy_decoder == "pil" and "pil" in m.decode_ms:
        notes.append("no faster JPEG decoder loads here: "
                     "apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'")
    if bottleneck == "none" and m.target is None:
        notes.append("no output measured 1.3x faster than the data as it is: if training still waits for data, "
                     "the cause is in the training job (run dsconvert diagnose on it), or pass --target with its "
                     "samples/s to compare")
    for k, ok in fits.items():
        if not ok:
            notes.append(f"{k} would need {format_size(sizes[k])}, more than the {format_size(m.free_bytes or 0)} "
                         f"free at {m.output_dir}")
    if m.cache == "auto" and cache == "warm":
        notes.append("the data fits in half the page cache: predictions are warm passes (epochs after the first); "
                     "the report lists cold ones too")
    cold_outputs = [k for k in outputs if caches[k] != cache]
    if cold_outputs:
        notes.append(f"{', '.join(cold_outputs)}: predicted from the {caches[cold_outputs[0]]} pass (too large to stay "
                     "in the page cache)")

    names = {
        "storage-latency": lambda: f"loading is bound by storage latency ({m.cold_latency_ms:.1f} ms per file, "
                           f"{scaling:.1f}x with concurrent readers)",
        "small-files": lambda: f"loading is bound by per-file overhead ({m.mean_file_bytes / 1e3:.0f} kB files, "
                       f"{m.cold_latency_ms:.2f} ms each)",
        "storage-bandwidth": lambda: f"loading is bound by storage bandwidth ({m.bandwidth_mb_s:,.0f} MB/s, flat with "
                             "more readers)" if scaling < SCALES else
                             f"loading is bound by storage throughput ({m.bandwidth_mb_s:,.0f} MB/s)",
        "decode": lambda: f"loading is bound by decode ({t_decode:.2f} ms of {t_total:.2f} ms per sample in a worker)",
        "transform": lambda: f"loading is bound by the transform ({t_transform:.2f} of {t_total:.2f} ms per sample)",
        "none": lambda: (f"the loader keeps up: {as_is:,.0f} samples/s with {n} workers for a target of {m.target:,.0f}"
                         if keeps_up else f"loading is not limited by the data's form: {as_is:,.0f} samples/s with "
                         f"{n} workers, and no output measured {WORTH}x faster"),
    }
    summary = names[bottleneck]()
    if recommended:
        summary += f"; {recommended} measured {speedup:.1f}x faster"
    if m.target is not None and not keeps_up:
        summary += f"; {as_is:,.0f} samples/s with {n} workers is short of the {m.target:,.0f}/s target"
    return Verdict(
        bottleneck=bottleneck, summary=summary, evidence=evidence, commands=commands, alternative=alternative,
        per_worker_ms={"read": t_read - t_overhead, "overhead": t_overhead, "decode": t_decode,
                       "transform": t_transform, "other": t_other, "total": t_total},
        workers=n, loader_per_s=as_is, predicted_per_s=predicted, output_bytes=sizes, fits=fits,
        recommended=recommended, predicted_speedup=speedup if recommended else 1.0, keeps_up=keeps_up,
        cache=cache, read_share=read_share, notes=notes,
    )
