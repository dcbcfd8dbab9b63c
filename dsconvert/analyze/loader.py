"""Predictions that hold in a training loop: the measured sample read through a real DataLoader.

A model of reading and decoding alone predicts ceilings no training loop reaches (the
transform, collate and the workers' IPC come on top, and compete for the same cores). So
analyze measures instead of modelling: the sample of the source is

* read as it is (file by file, as ``ImageFolder``), cold (pages evicted) and warm;
* read from memory (the same bytes preloaded: decode + transform + IPC, no storage), the
  differential "prep only" pass of DS-Analyzer, which separates read stall from CPU work;
* converted into each candidate output (the real ``convert`` on the sample, in a scratch
  folder under the output folder, so the output's storage is the one measured) and read
  back through ``open_dataset``, cold and warm;

each time through ``torch.utils.data.DataLoader`` with the workers the machine has and the
reference transform, by :func:`dsconvert.bench.one_pass`, the pass ``dsconvert bench``
runs. A candidate's rate on the sample is its predicted rate on the whole dataset.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import skips
from ..readers.base import TorchDataset, TorchIterableDataset
from ..readers.source import SourceDataset
from ..samples import Source, SourceFile
from ..source.folders import FolderListing, source_of_listings
from .verdict import MEMORY, ROUND_SPREAD, SOURCE, round_gains

__all__ = ["Candidate", "candidates", "sample_source", "loader_passes", "run_passes", "transform_cost",
           "page_cache_bytes", "repeated",
           "paired_rounds", "ROUNDS"]


class Candidate:
    """One output to try: a name as the report shows it, the convert options, the decode mode."""

    def __init__(self, name: str, fmt: str, decode: str = "pil", **options: Any):
        self.name, self.fmt, self.decode, self.options = name, fmt, decode, options

    def __repr__(self) -> str:
        return f"Candidate({self.name!r})"


def candidates(source: Source, fast_decoder: str, resize: Optional[int], fused: bool = False,
               max_size: Optional[int] = None) -> List[Candidate]:
    """The outputs worth predicting for a source: shards of the encoded bytes (decoded with
    Pillow, with the fast JPEG decoder when one loads, and with decoding fused into the
    transform when it is one ``decode="fused"`` reads), the same shards with images larger
    than the training size re-encoded (``max_size``), HDF5, and the decoded npy cache, full
    size and resized; for dict samples only the formats that hold them."""
    from ..convert import accepts

    out = [Candidate("wds", "wds")]
    if fast_decoder != "pil":
        out.append(Candidate(f"wds, decode={fast_decoder}", "wds", decode="numpy"))
    if fused:
        out.append(Candidate("wds, decode=fused", "wds", decode="fused"))
    if max_size:
        out.append(Candidate(f"wds --max-size {max_size}" + (", decode=fused" if fused else ""), "wds",
                             decode="fused" if fused else "pil", max_size=max_size))
    out.append(Candidate("hdf5", "hdf5"))
    out.append(Candidate("npy", "npy"))
    if resize:
        out.append(Candidate(f"npy --resize {resize}", "npy", resize=resize))
    return [c for c in out if accepts(c.fmt, source)]


def sample_source(src: str, listings: Sequence[FolderListing], picked: Sequence[str], layout: str,
                  seed: int = 0) -> Source:
    """The :class:`Source` of the sampled files (relative paths ``picked``), from the
    inventory's listings: for a flat source a picked file brings its whole sample (the files of
    its stem). Samples are shuffled with ``seed``, as a training job reads them."""
    wanted = set(picked)
    stems = {p.rpartition(".")[0] for p in wanted}
    dirs: List[FolderListing] = []
    for d in listings:
        keep = []
        for name, size, mtime in d.files:
            rel = f"{d.rel}/{name}" if d.rel else name
            if rel in wanted or (layout == "flat" and rel.rpartition(".")[0] in stems):
                keep.append((name, size, mtime))
        if keep or d.rel == "" or layout == "imagefolder":
            dirs.append(FolderListing(d.rel, keep))
    source = source_of_listings(src, dirs, layout)
    samples = list(source.samples)
    random.Random(seed).shuffle(samples)
    source.samples = samples
    return source


def transform_cost(source: Source, transform: Optional[Callable], count: int = 16,
                   storage_options: Optional[Dict[str, Any]] = None) -> float:
    """ms per image of ``transform`` on up to ``count`` decoded images of the sample, in this
    process; each image is decoded, timed and let go (huge images are not held together)."""
    if transform is None or source.sample_type != "classification":
        return 0.0
    ds = SourceDataset(source, storage_options=storage_options)
    seconds, timed = 0.0, 0
    for i in range(min(count, len(ds))):
        try:
            image = ds[i][0]
        except Exception:  # a file that does not decode is the conversion's to skip, not ours
            continue
        t = time.thread_time()  # CPU time: what load does not move (the transforms run in this thread)
        transform(image)
        seconds += time.thread_time() - t
        timed += 1
    return seconds / timed * 1000 if timed else 0.0


class InMemory(SourceDataset):
    """The sample with its bytes preloaded: the loader's work without the storage."""

    def __init__(self, source: Source, transform: Optional[Callable], storage_options: Optional[Dict[str, Any]]):
        super().__init__(source, transform=transform, storage_options=storage_options)
        self.blobs = {f.path: SourceDataset._read(self, f) for s in source.samples for f in s.files}

    def _read(self, f: SourceFile) -> bytes:
        return self.blobs[f.path]


class Skipping(TorchDataset):
    """A map-style dataset whose samples that fail to load are None (dropped by the collate):
    one corrupt file in the sample must not end the measurement."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.inner[index]
        except Exception:
            return None


class DropNone:
    """A collate that leaves out the samples :class:`Skipping` gave up on."""

    def __init__(self, collate: Callable):
        self.collate = collate

    def __call__(self, batch: List[Any]) -> Any:
        return self.collate([b for b in batch if b is not None])


def loader_passes(source: Source, out_dir: str, transform: Optional[Callable],
                  options: Sequence[Candidate], workers: int, max_seconds: float, batch_size: int = 64,
                  storage_options: Optional[Dict[str, Any]] = None,
                  log: Callable[[str], None] = lambda m: None) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """Read the sample as it is, from memory, and as each candidate output, through a
    DataLoader: ``({name: {cold, warm, bytes_per_sample, ...}}, notes)``; ``cold``/``warm`` are
    steady-state rates (after every worker's first batch), ``cold_whole``/``warm_whole`` the
    whole pass's (a shard reader's reads come in bursts the steady state can miss). A candidate that
    cannot be made from this source is left out with the reason in the notes."""
    from ..bench import BenchTarget, as_list, torch_default_collate
    from ..io.location import Location
    from ..readers.open import open_dataset

    collate = DropNone(torch_default_collate() if transform is not None and source.sample_type == "classification"
                       else as_list)
    if source.sample_type != "classification":
        transform = None
    n = len(source.samples)
    results: Dict[str, Dict[str, Any]] = {}
    notes: List[str] = []

    def measure(name: str, ds: Any, target: BenchTarget, caches: Sequence[str],
                hint: Optional[float] = None) -> Dict[str, Any]:
        row = run_passes(ds, target, workers, collate, caches, n, max_seconds, batch_size, hint,
                         lambda m: log(f"{name}, {m}"))
        row["bytes_per_sample"] = target.bytes_per_sample
        return row

    location = Location(source.root, storage_options, flat=False)
    plain = SourceDataset(source, transform=transform, storage_options=storage_options)
    files = [] if location.remote else [p for i in range(n) for p in plain.paths(i)]
    ds = Skipping(plain)
    per_sample = source.nbytes / max(1, n)
    target = BenchTarget(source.root, "source", source.sample_type, n, per_sample, False, files)
    results[SOURCE] = measure(SOURCE, ds, target, ("cold", "warm"))
    ds_source, target_source = ds, target
    results[MEMORY] = measure(MEMORY, Skipping(InMemory(source, transform, storage_options)),
                              BenchTarget(source.root, "memory", source.sample_type, n, per_sample, False, []),
                              ("warm",),
                              hint=results[SOURCE].get("warm"))  # no cold pass of its own to size the batches
    if not options:
        return results, notes
    from ..convert import convert
    from ..manifest import Manifest

    prefix = f"{SCRATCH_PREFIX}{os.getpid()}-"
    try:
        remove_abandoned(out_dir)
        scratch = tempfile.mkdtemp(prefix=prefix, dir=out_dir)
    except OSError as exc:  # a read-only or missing output folder: measured in the system's temporary folder
        remove_abandoned(tempfile.gettempdir())
        scratch = tempfile.mkdtemp(prefix=prefix)
        notes.append(f"outputs measured in {os.path.dirname(scratch)}, not {out_dir} ({exc.strerror or exc})")
    try:
        made: Dict[Tuple[str, Tuple], str] = {}
        opened: List[Tuple[str, Any, Any, int]] = []  # (name, dataset, target, samples): read again in rounds
        for c in options:
            try:
                key = (c.fmt, tuple(sorted(c.options.items())))
                path = made.get(key)
                if path is None:
                    path = os.path.join(scratch, f"{c.fmt}-{len(made)}")
                    convert(source.root, path, c.fmt, scanned=source, verify=False, force=True,
                            workers=workers, storage_options=storage_options, **c.options)
                    made[key] = path
                manifest = Manifest.load(Location(path))
                written = manifest.num_samples
                if not written:
                    notes.append(f"{c.name}: not measured, no sample of the sample converted")
                    continue
                if manifest.skipped and c is options[0]:
                    first = manifest.skipped[0]
                    notes.append(f"{skips.total(manifest.skipped)} of the {n} sampled samples do not convert (e.g. "
                                 f"{first.get('path')}: {first.get('reason')}); the passes leave them out")
                out_files = [os.path.join(path, f) for f in os.listdir(path) if os.path.isfile(os.path.join(path, f))]
                out_bytes = sum(s.bytes for s in manifest.shards)
                ds = open_dataset(path, transform=transform, decode=c.decode)
                out_target = BenchTarget(path, c.fmt, manifest.sample_type, written, out_bytes / written,
                                         manifest.format == "wds", out_files)
                row = measure(c.name, ds, out_target, ("cold", "warm"))
            except Exception as exc:  # one candidate that cannot be made or read is a note, not the end
                notes.append(f"{c.name}: not measured: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            row.update(format=c.fmt, decode=c.decode, options=dict(c.options))
            results[c.name] = row
            opened.append((c.name, ds, out_target, n))
        try:  # the gains, measured beside the data as it is: what the fix's gain is decided from
            paired_rounds(results, [(SOURCE, ds_source, target_source, n)] + opened, workers, collate, max_seconds,
                          log)
        except Exception as exc:
            for row in results.values():
                row.pop("warm_rounds", None)
            notes.append(f"paired rounds not measured: {type(exc).__name__}: {str(exc)[:200]}; the gains are the "
                         "first passes'")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results, notes


SCRATCH_PREFIX = ".dsconvert-analyze-"  # + the pid of the analyze that made it + a random part


def remove_abandoned(folder: str) -> int:
    """Remove the scratch folders that an analyze killed before it could clean up left in
    ``folder`` (their process is gone); return how many."""
    from ..diagnose.procs import is_alive

    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        pid = name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if name.startswith(SCRATCH_PREFIX) and pid.isdigit() and not is_alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            removed += 1
    return removed


class Repeat(TorchIterableDataset):
    """An IterableDataset whose workers each read the first ``limit`` samples of the pass
    (their share of them; all with None), ``times`` over: a warm pass over the sample, long
    enough for the batch size."""

    def __init__(self, inner: Any, times: int, limit: Optional[int] = None):
        self.inner, self.times, self.limit = inner, times, limit

    def __iter__(self) -> Any:
        import itertools

        from ..distributed import worker_info

        each = None if self.limit is None else -(-self.limit // max(1, worker_info()[1]))
        for _ in range(self.times):
            yield from itertools.islice(iter(self.inner), each)


def repeated(ds: Any, times: int, limit: Optional[int] = None) -> Any:
    """``ds`` read ``times`` over in one pass (an iterable one: its first ``limit`` samples)."""
    from torch.utils.data import IterableDataset, Subset

    if isinstance(ds, IterableDataset):
        return Repeat(ds, times, limit) if times > 1 or limit is not None else ds
    if times <= 1:
        return ds
    return Subset(ds, list(range(len(ds))) * times)


def run_passes(ds: Any, target: Any, workers: int, collate: Callable, caches: Sequence[str], n: int,
               max_seconds: float, batch_size: int = 64, rate_hint: Optional[float] = None,
               log: Callable[[str], None] = lambda m: None) -> Dict[str, Any]:
    """Cold and/or warm DataLoader passes over ``ds`` (``n`` samples), as ``dsconvert bench``
    runs them, within about ``max_seconds`` each. A cold pass reads the sample once, in
    batches small enough for eight per worker; a warm pass reads it as many times over as
    eight batches of ``batch_size`` per worker need (the per-batch costs, collate and IPC,
    weigh on fast loaders), with batches no larger than the rate seen so far allows in time."""
    from ..bench import one_pass

    row: Dict[str, Any] = {"samples": n}
    w = max(1, workers)
    for cache in caches:
        if cache == "cold":
            batch = max(1, min(batch_size, n // (8 * w)))
            data, count = ds, n
        else:
            hint = row.get("cold") or rate_hint
            batch = batch_size if not hint else int(max(1, min(batch_size, hint * max_seconds / (8 * w))))
            data, count = _warm(ds, n, batch, w)
        r = one_pass(data, target, workers, batch, collate, cache, count, max_seconds)
        # decided on the rates less what other processes' CPU load cost the workers (a shared
        # machine's load moves wall rates from pass to pass); the wall rates are kept beside them
        row[cache] = r["unloaded_per_s"]
        row[f"{cache}_wall"] = r["samples_per_s"]
        row[f"{cache}_cpu_wait"] = r["cpu_wait_share"]
        row[f"{cache}_startup_s"] = r["startup_s"]
        row[f"{cache}_whole"] = r["unloaded_whole"]
        row[f"{cache}_batch"] = batch
        if r.get("worker_cpu_ms") is not None:  # CPU per sample: the figure load does not move
            row[f"{cache}_cpu_ms"] = r["worker_cpu_ms"]
            row[f"{cache}_main_cpu_ms"] = r["main_cpu_ms"]
        log(passed(cache, r["samples_per_s"], r["unloaded_per_s"], r["samples"], batch, workers))
    return row


def _warm(ds: Any, n: int, batch: int, workers: int) -> Tuple[Any, int]:
    """A warm pass's data and sample count: the sample read as many times over as eight
    batches per worker need (the per-batch costs, collate and IPC, weigh on fast loaders)."""
    times = max(1, -(-8 * workers * batch // max(1, n)))
    return repeated(ds, times, n), n * times


ROUNDS = (3, 5)  # paired rounds: at least 3, up to 5 while the fastest output's gains spread more than ROUND_SPREAD
ROUNDS_ENV = "DSCONVERT_ANALYZE_ROUNDS"


def round_bounds() -> Tuple[int, int]:
    """The paired rounds' (least, most): ``ROUNDS``, or ``$DSCONVERT_ANALYZE_ROUNDS`` as ``N`` or
    ``N,M`` (0: none, the gains are then the first passes', a quicker and less steady run)."""
    text = os.environ.get(ROUNDS_ENV, "").strip()
    if not text:
        return ROUNDS
    try:
        parts = [int(v) for v in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) < 0 or parts[-1] < parts[0]:
        raise ValueError(f"{ROUNDS_ENV} must be N or N,M rounds (0 <= N <= M), not {text!r}")
    return parts[0], parts[-1]


def paired_rounds(results: Dict[str, Dict[str, Any]], runs: Sequence[Tuple[str, Any, Any, int]], workers: int,
                  collate: Callable, max_seconds: float, log: Callable[[str], None] = lambda m: None,
                  rounds: Optional[Tuple[int, int]] = None) -> int:
    """Warm passes again, in rounds: the data as it is (``runs[0]``), then every output, then
    the data as it is again, and so on; each output's gain in a round is its CPU rate over the
    mean of the two as-is passes beside it, measured under the same load. A pass's figures are
    its median batch's CPU ms per sample, the workers' and the main process's
    (:func:`dsconvert.bench.one_pass`; each worker's first batch, its start-up, left out).
    At least ``rounds[0]`` rounds, up to ``rounds[1]`` while the per-round gains of the output
    with the largest median gain spread more than ``ROUND_SPREAD`` of that median. Adds
    ``warm_rounds`` (a list of ``{cpu_ms, main_cpu_ms}``) to each row of ``results``; returns
    the rounds run (0 where the data as it is has no warm pass to pair with, or where
    ``rounds`` (default :func:`round_bounds`) asks for none)."""
    from ..bench import one_pass

    rounds = round_bounds() if rounds is None else rounds
    if not rounds[1] or not runs or "warm_batch" not in results.get(runs[0][0], {}) or len(runs) < 2:
        return 0
    w = max(1, workers)

    def once(name: str, ds: Any, target: Any, n: int) -> None:
        batch = int(results[name]["warm_batch"])
        data, count = _warm(ds, n, batch, w)
        r = one_pass(data, target, workers, batch, collate, "warm", count, max_seconds)
        cpu = r.get("worker_batch_cpu_ms") or r.get("worker_cpu_ms")
        main = r.get("main_batch_cpu_ms") if r.get("main_batch_cpu_ms") is not None else r.get("main_cpu_ms")
        results[name].setdefault("warm_rounds", []).append({"cpu_ms": cpu, "main_cpu_ms": main})

    def spread() -> float:
        src = results[runs[0][0]]["warm_rounds"]
        gains = [round_gains(src, results[name].get("warm_rounds") or [], workers) for name, *_ in runs[1:]]
        gains = [g for g in gains if g]
        if not gains:
            return 0.0
        best = max(gains, key=lambda g: sorted(g)[(len(g) - 1) // 2])
        mid = sorted(best)[(len(best) - 1) // 2]
        return (max(best) - min(best)) / mid if mid > 0 else 0.0

    done = 0
    once(*runs[0])
    while done < rounds[0] or (done < rounds[1] and spread() > ROUND_SPREAD):
        for run in runs[1:]:
            once(*run)
        once(*runs[0])
        done += 1
    log(f"paired rounds: {done}, the outputs' gains over the data as it is measured beside it")
    return done


def passed(cache: str, wall: float, unloaded: float, samples: int, batch: int, workers: int) -> str:
    """The progress line of one pass: its wall rate and, where other processes took the CPU, the
    rate less that wait (the one the report's table shows and the verdict uses), both named."""
    rates = f"{wall:,.0f} samples/s"
    if unloaded > wall * 1.05:
        rates += f" wall, {unloaded:,.0f}/s less the time other processes had the CPU (the table's figure)"
    return f"{cache}: {rates} ({samples} samples in batches of {batch}, {workers} workers)"


def page_cache_bytes() -> int:
    """What the page cache can hold at most: the machine's memory (the cgroup limit if lower)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return int(total)

