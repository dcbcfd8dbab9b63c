"""``dsconvert bench``: what a real ``torch.utils.data.DataLoader`` delivers, end to end.

analyze predicts; bench measures. Each dataset given (a source tree, read file by file as
ImageFolder does, or a dsconvert output) is read through a DataLoader for every combination
of worker count and batch size, first with the dataset's pages evicted from the page cache
(cold, ``posix_fadvise(DONTNEED)``) and then again (warm). Several datasets in one run are
compared config by config, so "before and after conversion" is one command::

    dsconvert bench /data/train /ssd/train-wds /ssd/train-npy --workers 0,2,4

Per pass: samples/s and MB/s in the steady state (from the batch by which every worker has
delivered its first, to the last; the wait until then, which includes starting the workers, is
``startup_s``), the wait for each
batch (p50/p99, from :class:`dsconvert.monitor.DataLoadingMonitor`), and the CPU the workers
used (their user + system time, collected when they exit, over the time from the start of
the pass until they were reaped, per worker) and the main process used. The transform is what
a training job does before the GPU (:mod:`dsconvert.transforms`): ``eval`` (the default:
shorter side to 256, centre crop 224, uint8 CHW tensor), ``train`` (random resized crop 224 and
flip), ``module:callable`` (the user's own), or none (``size=0`` or ``transform="none"``: the
decoded samples as they come, in a list).

Every pass reads the same samples: a seeded random subset of ``max_samples`` for map-style
datasets (sources, hdf5, npy, in that random order, as training reads them), the first
``max_samples`` in shard order for wds shards (read sequentially, as they are meant to be).
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import optional, schedstat
from .codecs import DECODE_MODES, ENCODED_MODES
from .errors import OptionError, SourceError
from .io.localfs import evict_page_cache
from .io.location import Location, local_form
from .manifest import MANIFEST_NAME, Manifest
from .monitor import DataLoadingMonitor
from .optional import require
from .transforms import CropToTensor, load_transform

__all__ = ["bench", "BenchTarget", "CropToTensor", "render_text", "BENCH_SCHEMA", "BENCH_VERSION",
           "default_worker_counts", "open_target", "as_list", "torch_default_collate", "one_pass", "BatchClocks"]

BENCH_SCHEMA = "dsconvert.bench"
BENCH_VERSION = 1
CACHES = ("cold", "warm")


def as_list(batch: List[Any]) -> List[Any]:
    """collate_fn for samples that do not stack (images of many sizes, bytes, dicts)."""
    return batch


@dataclass
class BenchTarget:
    """One dataset to read: a source tree or a dsconvert output."""

    path: str
    kind: str  # "source", or the output's format id
    sample_type: str  # "classification" or "dict"
    num_samples: int
    bytes_per_sample: float
    iterable: bool
    files: List[str]  # evicted before a cold pass

    @property
    def label(self) -> str:
        return f"{os.path.basename(self.path.rstrip('/')) or self.path} ({self.kind})"


def _is_stream(ds: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(ds, IterableDataset)


def open_target(path: str, decode: str, transform: Optional[Callable], max_samples: int,
          seed: int, storage_options: Optional[Dict[str, Any]] = None,
          label: Optional[str] = None) -> Tuple[Any, BenchTarget]:
    """(dataset limited to max_samples, target description) of ``path`` as bench and analyze read
    it. Tar shards another tool wrote
    are read in place by the indexed reader (``label``: where their class label is)."""
    from torch.utils.data import Subset

    from .readers.open import open_dataset
    from .source.tars import looks_like_tars

    location = Location(path, storage_options)
    path = location.url
    if not location.remote and not os.path.exists(path):
        raise SourceError(f"does not exist: {path}", path)
    if location.exists(MANIFEST_NAME):
        manifest = Manifest.load(location)
        _check_transform(path, manifest.sample_type, transform)
        ds = open_dataset(path, transform=transform, decode=decode, storage_options=storage_options)
        iterable = _is_stream(ds)  # local wds outputs open map-style, read as training reads them
        n = manifest.num_samples
        files = [] if location.remote else [os.path.join(path, name) for name in sorted(os.listdir(path))
                                             if os.path.isfile(os.path.join(path, name))]
        per_sample = sum(s.bytes for s in manifest.shards) / max(1, n)
        kind, sample_type = manifest.format, manifest.sample_type
    elif looks_like_tars(path, storage_options):
        if transform is not None and label is None:
            _check_transform(path, "dict", transform)
        ds = open_dataset(path, transform=transform, decode=decode, storage_options=storage_options, label=label)
        manifest = ds.manifest
        iterable = True
        n = manifest.num_samples
        files = [] if location.remote else [os.path.join(path, e.name) for e in manifest.shards]
        per_sample = sum(s.bytes for s in manifest.shards) / max(1, n)
        kind, sample_type = "tars", manifest.sample_type
    else:
        from .readers.source import SourceDataset
        from .source import scan

        source = scan(path, storage_options=storage_options)
        _check_transform(path, source.sample_type, transform)
        ds = SourceDataset(source, transform=transform, decode=decode, storage_options=storage_options)
        iterable = False
        n = len(ds)
        files = []
        per_sample = source.nbytes / max(1, n)
        kind, sample_type = "source", source.sample_type
    if not iterable and max_samples < n:
        order = np.random.default_rng(seed).permutation(n)[:max_samples].tolist()
        ds = Subset(ds, order)
    if kind == "source":
        base: Any = ds.dataset if isinstance(ds, Subset) else ds  # a SourceDataset
        picked = ds.indices if isinstance(ds, Subset) else range(len(base))
        files = [] if location.remote else [p for i in picked for p in base.paths(i)]
    return ds, BenchTarget(path, kind, sample_type, n, per_sample, iterable, files)


def _check_transform(path: str, sample_type: str, transform: Optional[Callable]) -> None:
    if transform is not None and sample_type != "classification":
        raise OptionError(f"{path} holds dict samples, which the image transform does not take; "
                          "bench it with --transform none")


def _cpu() -> Tuple[float, float]:
    """(this process's CPU seconds, reaped children's CPU seconds)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def _batch_len(batch: Any) -> int:
    if isinstance(batch, (list, tuple)):
        if len(batch) == 2 and not isinstance(batch[0], (bytes, dict)) and hasattr(batch[1], "__len__"):
            return len(batch[1])  # (images, labels) collated
        return len(batch)
    return len(batch)


class BatchClocks:
    """A collate that also clocks each worker's CPU at the end of every batch it makes, in a
    shared array the main process reads once the workers are gone.

    A batch's CPU is its worker's CPU from the end of its previous batch to the end of this
    one, over the batch's samples: whole batches, and each worker's first batch (its start-up:
    imports, first-touch page faults, decoder set-up) left out. Clocking from the main process
    instead (the workers' CPU clocks read when their first batches arrive and when the pass
    ends) counted the batches in flight at the start as done by then. The worker's clock is its
    process's (``time.process_time``: every thread, the queue's feeder thread that pickles the
    batch included)."""

    def __init__(self, collate: Callable, workers: int, batches: int):
        import multiprocessing

        self.collate = collate
        self.per_worker = max(2, batches + 1)  # a worker makes at most every batch of the pass
        # per worker: the batches made so far, then (CPU s at its end, samples) for each
        self.slots = multiprocessing.RawArray("d", max(1, workers) * (1 + 2 * self.per_worker))

    def __call__(self, batch: List[Any]) -> Any:
        from torch.utils.data import get_worker_info

        out = self.collate(batch)
        now = time.process_time()
        info = get_worker_info()
        at = (info.id if info is not None else 0) * (1 + 2 * self.per_worker)
        made = int(self.slots[at])
        if made < self.per_worker:
            self.slots[at + 1 + 2 * made] = now
            self.slots[at + 2 + 2 * made] = sum(1 for b in batch if b is not None)
            self.slots[at] = made + 1
        return out

    def batches(self) -> List[Tuple[float, int]]:
        """(CPU ms, samples) of every batch after each worker's first, worker by worker."""
        out: List[Tuple[float, int]] = []
        stride = 1 + 2 * self.per_worker
        for at in range(0, len(self.slots), stride):
            made = int(self.slots[at])
            for k in range(1, made):
                cpu = self.slots[at + 1 + 2 * k] - self.slots[at + 1 + 2 * (k - 1)]
                out.append((cpu * 1000, int(self.slots[at + 2 + 2 * k])))
        return out


def cpu_ms_per_sample(batches: Sequence[Tuple[float, int]]) -> Optional[float]:
    """CPU ms per sample over whole batches (each worker's first left out); None without any."""
    samples = sum(n for _, n in batches)
    return sum(ms for ms, _ in batches) / samples if samples else None


def median_batch_ms(batches: Sequence[Tuple[float, int]]) -> Optional[float]:
    """The median of the batches' CPU ms per sample, each batch weighted by its samples: a burst
    of other processes' load that slowed a few batches (their caches flushed by preemption)
    does not move it."""
    rows = sorted((ms / n, n) for ms, n in batches if n > 0)
    if not rows:
        return None
    half, seen = sum(n for _, n in rows) / 2, 0
    for per, n in rows:
        seen += n
        if seen >= half:
            return per
    return rows[-1][0]


def one_pass(ds: Any, target: BenchTarget, workers: int, batch_size: int, collate: Callable,
             cache: str, max_samples: int, max_seconds: Optional[float] = None) -> Dict[str, Any]:
    """One DataLoader pass; ``max_seconds`` ends it early (after at least four batches past the
    first), for callers that need a rate rather than every sample."""
    from torch.utils.data import DataLoader

    if cache == "cold":
        evict_page_cache(target.files)
    clocks = BatchClocks(collate, workers, -(-max_samples // max(1, batch_size)) + max(1, workers))
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=clocks,
                        shuffle=False, persistent_workers=False)
    monitor = DataLoadingMonitor(window=1 << 30, warmup=1)
    before = set(schedstat.children())
    cpu0 = _cpu()
    started = time.perf_counter()
    first_at: Optional[float] = None
    workers_cpu0: Dict[int, float] = {}
    main_cpu0 = main_last = 0.0
    first_n = 0
    batches = 0
    ramp = max(1, workers)  # each worker's first batch comes at once: the steady state starts after them
    n = 0
    steps = monitor.wrap(loader)
    main_batches: List[Tuple[float, int]] = []  # (main CPU ms, samples) of each batch received after the ramp
    for batch in steps:
        got = _batch_len(batch)
        n += got
        if first_at is not None:
            now_cpu = time.process_time()
            main_batches.append(((now_cpu - main_last) * 1000, got))
            main_last = now_cpu
        batches += 1
        if first_at is None and batches >= ramp:
            first_at, first_n = time.perf_counter(), n
            # the steady state's CPU clocks start here: the workers' (all their threads) and ours
            workers_cpu0 = schedstat.cpu_s_of(p for p in schedstat.children() if p not in before)
            main_cpu0 = main_last = time.process_time()
        if n >= max_samples:
            break
        if (max_seconds is not None and time.perf_counter() - started > max_seconds
                and first_at is not None and n >= first_n + 4 * batch_size):
            break
    ended = time.perf_counter()
    main_cpu1 = time.process_time()
    # the workers' run-queue waits, read while they live: what other processes' load cost the pass
    waits = schedstat.waits_of(p for p in schedstat.children() if p not in before) if workers else {}
    cpu_ms = main_ms = None  # CPU time per sample over the steady state: what load does not move
    if first_at is not None and n > first_n:
        workers_cpu1 = schedstat.cpu_s_of(workers_cpu0) if workers else {}
        if workers_cpu1 or not workers:
            cpu_ms = sum(workers_cpu1[p] - workers_cpu0[p] for p in workers_cpu1) / (n - first_n) * 1000
        main_ms = (main_cpu1 - main_cpu0) / (n - first_n) * 1000
    steps.close()  # the loader's iterator goes, and with it the workers, which are reaped
    del steps, loader
    gc.collect()
    cpu1 = _cpu()
    window_ms, batch_ms = cpu_ms, None
    if workers:  # the workers are gone: their batch clocks are final
        clocked = clocks.batches()
        if cpu_ms_per_sample(clocked) is not None:
            cpu_ms, batch_ms = cpu_ms_per_sample(clocked), median_batch_ms(clocked)
    reaped = time.perf_counter() - started  # the CPU times cover the workers' whole lives
    wall = ended - started
    steady = ended - first_at if first_at is not None else 0.0
    steady_n = n - first_n
    if steady_n <= 0 or steady <= 0:  # a single batch: the whole pass is all there is
        steady_n, steady = n, wall
    rate = steady_n / steady if steady > 0 else 0.0
    summary = monitor.summary()
    return {
        "dataset": target.path, "kind": target.kind, "workers": workers, "batch_size": batch_size,
        "cache": cache, "samples": n, "seconds": wall, "samples_per_s": rate,
        # the rates had no other process taken the CPU: analyze decides on these (schedstat)
        "unloaded_per_s": schedstat.unloaded(rate, waits), "unloaded_whole": schedstat.unloaded(n / wall if wall > 0
                                                                                               else 0.0, waits),
        "cpu_wait_share": (sum(w for _, w in waits.values()) / sum(a for a, _ in waits.values())
                           if waits and sum(a for a, _ in waits.values()) > 0 else 0.0),
        "mb_per_s": rate * target.bytes_per_sample / 1e6,
        "startup_s": first_at - started if first_at is not None else wall,
        "wait_ms": {"p50": summary["load_ms"]["p50"], "p99": summary["load_ms"]["p99"]},
        "worker_cpu_pct": (cpu1[1] - cpu0[1]) / reaped / workers * 100 if workers else None,
        "main_cpu_pct": (cpu1[0] - cpu0[0]) / reaped * 100,
        # CPU ms per sample in the steady state, the workers' together and the main process's
        # (receiving, collating in the main process): None where the pass was one batch
        "worker_cpu_ms": cpu_ms, "main_cpu_ms": main_ms,
        # the workers' CPU over the main process's steady-state window, as it was measured before
        # the batch clocks: kept to compare (issue 41)
        "worker_cpu_ms_window": window_ms,
        # the median batch's CPU ms per sample (after each worker's first batch): bursts do not move it
        "worker_batch_cpu_ms": batch_ms, "main_batch_cpu_ms": median_batch_ms(main_batches),
    }


def default_worker_counts(cpus: Optional[int] = None) -> List[int]:
    """0, 1, 2, 4, ... up to the CPUs this process may use."""
    from .processes import available_cpus

    cpus = cpus or available_cpus()
    counts = [0, 1]
    while counts[-1] * 2 <= cpus:
        counts.append(counts[-1] * 2)
    if counts[-1] != cpus:
        counts.append(cpus)
    return counts


def bench(paths: Sequence[str], workers: Optional[Sequence[int]] = None, batch_sizes: Sequence[int] = (64,),
          decode: str = "pil", size: int = 224, max_samples: int = 2000, caches: Sequence[str] = CACHES,
          seed: int = 0, log: Optional[Callable[[str], None]] = None, transform: Any = "eval",
          storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Read each of ``paths`` through a DataLoader per worker count, batch size and cache
    state; return the report (schema ``dsconvert.bench``, version 1). See the module doc."""
    require("torch", "dsconvert bench")
    paths = [local_form(p) for p in paths]  # file:// URLs as the paths they name
    from .processes import available_cpus

    say = log or (lambda msg: None)
    if not paths:
        raise OptionError("give at least one dataset to bench")
    if decode not in DECODE_MODES:
        raise OptionError(f"decode must be one of {DECODE_MODES}, not {decode!r}")
    if any(c not in CACHES for c in caches) or not caches:
        raise OptionError(f"caches must be among {CACHES}")
    workers = list(workers) if workers is not None else default_worker_counts()
    if any(w < 0 for w in workers) or any(b < 1 for b in batch_sizes) or max_samples < 1:
        raise OptionError("workers must be >= 0; batch sizes and max_samples >= 1")
    spec = (transform if isinstance(transform, str) or transform is None
            else getattr(transform, "__name__", repr(transform)))
    if not size or decode in ENCODED_MODES:
        transform = None
    elif isinstance(transform, str) or transform is None:
        transform = load_transform(transform, size)
    opened = [open_target(p, decode, transform, max_samples, seed, storage_options) for p in paths]
    started = time.perf_counter()
    runs: List[Dict[str, Any]] = []
    for batch_size in batch_sizes:
        for w in workers:
            for ds, target in opened:
                collate = torch_default_collate() if transform is not None else as_list
                for cache in caches:
                    row = one_pass(ds, target, w, batch_size, collate, cache, max_samples)
                    runs.append(row)
                    say(f"{target.label}: {w} workers, batch {batch_size}, {cache}: "
                        f"{row['samples_per_s']:,.0f} samples/s")
    first = opened[0][1].path
    base = {(r["workers"], r["batch_size"], r["cache"]): r["samples_per_s"] for r in runs if r["dataset"] == first}
    for r in runs:
        b = base.get((r["workers"], r["batch_size"], r["cache"]))
        r["vs_first"] = r["samples_per_s"] / b if b else None
    missing = optional.missing_extensions() if decode == "fused" else []
    return {
        "schema": BENCH_SCHEMA, "schema_version": BENCH_VERSION,
        "settings": {"workers": workers, "batch_sizes": list(batch_sizes), "decode": decode, "size": size,
                     "transform": spec if transform is not None else "none",
                     "max_samples": max_samples, "caches": list(caches), "seed": seed,
                     "cpus": available_cpus()},
        "datasets": [dict(asdict(t), label=t.label, files=len(t.files)) for _, t in opened],
        "runs": runs,
        "seconds": time.perf_counter() - started,
        "notes": [optional.extension_notice(missing)] if missing else [],
    }


def torch_default_collate() -> Callable:
    """torch's default_collate, imported when first needed (conversion never imports torch)."""
    from torch.utils.data import default_collate

    return default_collate


def render_text(report: Dict[str, Any]) -> str:
    s = report["settings"]
    spec = s.get("transform", "eval")
    what = (f"transform {spec}, {s['size']}x{s['size']} uint8 tensors" if spec in ("eval", "train")
            else f"transform {spec}" if spec != "none" else "decoded samples as they come")
    lines = [f"dsconvert bench: DataLoader throughput, decode={s['decode']}, {what}, "
             f"up to {s['max_samples']} samples per pass, {s['cpus']} CPUs",
             f"{'dataset':32s}{'workers':>8s}{'batch':>6s}{'cache':>6s}{'samples/s':>11s}{'MB/s':>8s}"
             f"{'startup s':>10s}{'wait p50':>9s}{'p99 ms':>8s}{'worker CPU':>11s}{'main CPU':>9s}{'vs first':>9s}"]
    labels = {d["path"]: d["label"] for d in report["datasets"]}
    for r in report["runs"]:
        wcpu = f"{r['worker_cpu_pct']:.0f}%" if r["worker_cpu_pct"] is not None else "-"
        vs = f"{r['vs_first']:.2f}x" if r.get("vs_first") else "-"
        lines.append(f"{labels[r['dataset']][:31]:32s}{r['workers']:8d}{r['batch_size']:6d}{r['cache']:>6s}"
                     f"{r['samples_per_s']:11,.0f}{r['mb_per_s']:8,.1f}{r['startup_s']:10.2f}"
                     f"{r['wait_ms']['p50']:9.1f}{r['wait_ms']['p99']:8.1f}{wcpu:>11s}{r['main_cpu_pct']:8.0f}%{vs:>9s}")
    best = max(report["runs"], key=lambda r: r["samples_per_s"])
    lines.append(f"fastest: {labels[best['dataset']]} with {best['workers']} workers, batch {best['batch_size']}, "
                 f"{best['cache']}: {best['samples_per_s']:,.0f} samples/s ({report['seconds']:.1f} s in all)")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)
