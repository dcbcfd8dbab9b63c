"""From measurements to a verdict: the bottleneck, the evidence, the fix and its speedup.

A pure function of :class:`Measurements` (no I/O), so it is tested on constructed
measurements. The model of one DataLoader worker is the differential stall measurement:

    t_sample = t_prep + t_read_stall,  t_prep = 1 / prep_only_rate,  t_sample = 1 / both_rate
    t_read_stall = t_overhead (fixed per-file cost x files per sample) + t_transfer

and N workers (one per core) reach ``min(N / t_sample, storage rate at N concurrent readers,
cores / t_prep)``. Each output format changes one term: shards replace per-file latency by a
sequential transfer at the measured bandwidth, a fast JPEG decoder shrinks t_prep, a decoded
npy cache replaces decode by a memory copy.
"""

from __future__ import annotations

import posixpath
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = ["Measurements", "Verdict", "decide"]

LATENCY_MS = 2.0  # a per-file fixed cost above this is network-like latency, not local overhead
SMALL_FILE_BYTES = 256_000  # below this, a local read is mostly per-file work (syscalls, metadata,
                            # a seek), whatever the noisy fit of the fixed cost says


@dataclass
class Measurements:
    source: str
    storage_kind: str  # local-disk, tmpfs, nfs, ceph, fuse, overlay, ...
    latency_bound_storage: bool
    num_samples: int
    files_per_sample: float
    mean_sample_bytes: float
    fixed_ms: float  # fitted per-file fixed cost of a cold read
    bandwidth_mb_s: float  # best cold MB/s over the concurrency sweep
    sweep: List[Tuple[int, float]]  # (readers, files/s), cold
    prep_only_per_s: float  # one worker, the decoder the source is read with today (Pillow)
    fetch_only_per_s: float
    both_per_s: float
    decode_ms: Dict[str, float]  # library -> ms per sample, over the sample's codec mix
    cores: int
    numpy_decoder: str = "pil"  # what decode="numpy" and --decoder auto use here
    decoded_bytes_per_sample: float = 0.0
    resized_bytes_per_sample: float = 0.0
    suggested_resize: Optional[int] = None
    memory_bandwidth_mb_s: float = 5000.0
    free_bytes: Optional[int] = None
    output_dir: str = "OUT"
    target: Optional[float] = None
    remote: bool = False  # an object store or other fsspec URL: every file is a request


@dataclass
class Verdict:
    bottleneck: str  # storage-latency, small-files, storage-bandwidth, decode or none
    summary: str
    evidence: List[str]
    commands: List[str]
    alternative: List[str]  # another fix, when the first needs more room (decoded) than it
    per_worker_ms: Dict[str, float]  # read, overhead, decode, total
    workers: int
    loader_per_s: float  # the source as it is, N workers
    predicted_per_s: Dict[str, float]  # output option -> samples/s with N workers
    output_bytes: Dict[str, float]
    fits: Dict[str, bool]
    recommended: Optional[str]
    predicted_speedup: float
    keeps_up: Optional[bool] = None
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


def _loader(n: int, t_sample_s: float, t_prep_s: float, cores: int, storage_rate: float) -> float:
    rates = [n / t_sample_s if t_sample_s > 0 else float("inf"), storage_rate]
    if t_prep_s > 0:
        rates.append(cores / t_prep_s)
    return min(rates)


def decide(m: Measurements) -> Verdict:
    """Name the bottleneck of loading ``m.source`` as it is, and the fastest fix that fits."""
    n = max(1, m.cores)
    t_prep = 1.0 / m.prep_only_per_s if m.prep_only_per_s > 0 else 0.0
    t_sample = 1.0 / m.both_per_s if m.both_per_s > 0 else t_prep
    t_stall = max(0.0, t_sample - t_prep)
    t_overhead = min(t_stall, m.fixed_ms / 1000 * m.files_per_sample)
    t_transfer = t_stall - t_overhead
    storage_samples = _rate_at(m.sweep, n) / max(m.files_per_sample, 1e-9)
    loader = _loader(n, t_sample, t_prep, n, storage_samples)

    # what each output option would give with the same N workers
    bw = max(m.bandwidth_mb_s, 1e-9) * 1e6  # bytes/s
    t_seq = m.mean_sample_bytes / bw  # a shard's sample: one sequential transfer, no per-file cost
    seq_rate = bw / max(m.mean_sample_bytes, 1.0)
    fast_lib = m.numpy_decoder if m.numpy_decoder in m.decode_ms else "pil"
    t_fast = m.decode_ms[fast_lib] / 1000 if m.decode_ms else t_prep
    mem = max(m.memory_bandwidth_mb_s, 1e-9) * 1e6
    predicted = {
        "wds": _loader(n, t_seq + t_prep, t_prep, n, seq_rate),
        "hdf5": _loader(n, t_seq + t_prep + 30e-6, t_prep, n, seq_rate),
    }
    sizes = {"wds": m.num_samples * m.mean_sample_bytes, "hdf5": m.num_samples * m.mean_sample_bytes}
    if fast_lib != "pil":
        predicted[f"wds+{fast_lib}"] = _loader(n, t_seq + t_fast, t_fast, n, seq_rate)
        sizes[f"wds+{fast_lib}"] = sizes["wds"]
    if m.decoded_bytes_per_sample:
        t_copy = m.decoded_bytes_per_sample / mem + 20e-6
        predicted["npy"] = n / t_copy
        sizes["npy"] = m.num_samples * m.decoded_bytes_per_sample
    if m.suggested_resize and m.resized_bytes_per_sample:
        key = f"npy --resize {m.suggested_resize}"
        predicted[key] = n / (m.resized_bytes_per_sample / mem + 20e-6)
        sizes[key] = m.num_samples * m.resized_bytes_per_sample
    fits = {k: m.free_bytes is None or v <= m.free_bytes for k, v in sizes.items()}
    fitting = [k for k in predicted if fits[k]]
    recommended = max(fitting, key=lambda k: predicted[k]) if fitting else None
    speedup = predicted[recommended] / loader if recommended and loader > 0 else 1.0

    read_share = t_stall / t_sample if t_sample > 0 else 0.0
    keeps_up = None if m.target is None else loader >= m.target
    evidence = [
        f"one worker: {m.both_per_s:,.0f} samples/s reading and decoding, {m.prep_only_per_s:,.0f}/s decoding "
        f"from memory, {m.fetch_only_per_s:,.0f}/s reading cold: read stall {read_share:.0%} of each sample",
    ]
    scaling = (m.sweep[-1][1] / m.sweep[0][1]) if len(m.sweep) > 1 and m.sweep[0][1] > 0 else 1.0
    if m.sweep:
        kind = ("latency-bound: parallel readers hide it" if scaling >= 2 else
                "bandwidth-bound: more readers do not help")
        evidence.append(f"cold reads scale {scaling:.1f}x from {m.sweep[0][0]} to {m.sweep[-1][0]} readers ({kind})")
    evidence.append(f"per-file fixed cost {m.fixed_ms:.2f} ms, bandwidth {m.bandwidth_mb_s:,.0f} MB/s, "
                    f"{m.mean_sample_bytes / 1e3:,.0f} kB per sample, storage: {m.storage_kind}")

    if keeps_up:
        bottleneck = "none"
    elif read_share >= 0.5:
        if m.latency_bound_storage or m.fixed_ms >= LATENCY_MS:
            bottleneck = "storage-latency"
        elif t_overhead >= 0.5 * t_stall or m.mean_sample_bytes / max(m.files_per_sample, 1e-9) < SMALL_FILE_BYTES:
            bottleneck = "small-files"
        else:
            bottleneck = "storage-bandwidth"
    else:
        bottleneck = "decode"

    src = m.source

    def out_for(fmt: str) -> str:  # OUT stands for "where you want it" when no folder was given
        if m.output_dir == "OUT":
            return "OUT"
        return posixpath.join(m.output_dir, f"{posixpath.basename(src.rstrip('/')) or 'data'}-{fmt}")

    commands: List[str] = []
    if bottleneck in ("storage-latency", "small-files", "storage-bandwidth"):
        commands.append(f"dsconvert shard {src} --format wds -o {out_for('wds')}")
    if recommended and recommended.startswith("npy"):
        resize = recommended.split("--resize ")[1] if "--resize" in recommended else None
        commands.append(f"dsconvert shard {src} --format npy -o {out_for('npy')}" + (f" --resize {resize}" if resize else ""))
    alternative: List[str] = []
    if bottleneck == "decode" and fast_lib != "pil":  # keeps the encoded bytes: a small output
        fast = [f"dsconvert shard {src} --format wds -o {out_for('wds')}",
                f'open_dataset("{out_for("wds")}", decode="numpy")  # decodes JPEGs with {fast_lib}']
        if commands:
            alternative = fast
        else:
            commands = fast
    if m.remote and bottleneck in ("storage-latency", "small-files", "storage-bandwidth"):
        shards = f"{src.rstrip('/')}-wds"  # shards kept in the store, read from a local SSD cache
        alternative = [f"dsconvert shard {src} --format wds -o {shards}",
                       f"dsconvert cache {shards} /local/ssd/cache   # then open_dataset(\"{shards}\", "
                       "cache_dir=\"/local/ssd/cache\") reads verified local copies"]
    notes = ["predictions are the ceiling of reading and decoding; transforms, collate and worker "
             "IPC come on top (time a DataLoader pass for the whole loader)"]
    if "pil" in m.decode_ms and fast_lib == "pil" and bottleneck == "decode":
        notes.append("no faster JPEG decoder loads here: apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'")
    if bottleneck == "storage-latency":
        notes.append("write the shards to local SSD: the conversion is then also the pre-cache")
    for k, ok in fits.items():
        if not ok:
            notes.append(f"{k} would need {sizes[k] / 1e9:.1f} GB, more than the {m.free_bytes / 1e9:.1f} GB free "
                         f"at {m.output_dir}")

    summaries = {  # lambdas: only the chosen one is formatted (a target may be None)
        "storage-latency": lambda: f"loading is bound by storage latency ({m.fixed_ms:.1f} ms per file on {m.storage_kind})",
        "small-files": lambda: f"loading is bound by per-file overhead: {m.fixed_ms:.2f} ms per file for "
                       f"{m.mean_sample_bytes / 1e3:.0f} kB of data",
        "storage-bandwidth": lambda: f"loading is bound by storage bandwidth ({m.bandwidth_mb_s:,.0f} MB/s)",
        "decode": lambda: f"loading is bound by decode ({t_prep * 1000:.2f} ms per sample with Pillow)",
        "none": lambda: f"the loader keeps up: {loader:,.0f} samples/s with {n} workers for a target of {m.target:,.0f}",
    }
    summary = summaries[bottleneck]()
    if m.target is not None and not keeps_up:
        summary += f"; {loader:,.0f} samples/s with {n} workers is short of the {m.target:,.0f}/s target"
    return Verdict(
        bottleneck=bottleneck, summary=summary, evidence=evidence, commands=commands, alternative=alternative,
        per_worker_ms={"read": t_transfer * 1000, "overhead": t_overhead * 1000, "decode": t_prep * 1000,
                       "total": t_sample * 1000},
        workers=n, loader_per_s=loader, predicted_per_s=predicted, output_bytes=sizes, fits=fits,
        recommended=recommended, predicted_speedup=speedup, keeps_up=keeps_up, notes=notes,
    )
