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
reference transform, by :func:`dsconvert.bench._one_pass`, the pass ``dsconvert bench``
runs. A candidate's rate on the sample is its predicted rate on the whole dataset.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import DsconvertError
from ..source import FolderListing, Source
from ..source.samples import source_of_listings

__all__ = ["Candidate", "candidates", "sample_source", "loader_passes", "run_passes", "transform_cost", "decoded_sample",
           "page_cache_bytes", "MEMORY", "SOURCE"]

MEMORY = "from memory"  # the prep-only pass's name
SOURCE = "source"


class Candidate:
    """One output to try: a name as the report shows it, the convert options, the decode mode."""

    def __init__(self, name: str, fmt: str, decode: str = "pil", **options: Any):
        self.name, self.fmt, self.decode, self.options = name, fmt, decode, options

    def command(self, src: str, out: str) -> str:
        extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in self.options.items() if v is not None)
        return f"dsconvert shard {src} --format {self.fmt} -o {out}{extra}"

    def __repr__(self) -> str:
        return f"Candidate({self.name!r})"


def candidates(source: Source, fast_decoder: str, resize: Optional[int]) -> List[Candidate]:
    """The outputs worth predicting for a source: shards of the encoded bytes (decoded with
    Pillow, and with the fast JPEG decoder when one loads), HDF5, and the decoded npy cache,
    full size and resized; for dict samples only the formats that hold them."""
    from ..convert import accepts

    out = [Candidate("wds", "wds")]
    if fast_decoder != "pil":
        out.append(Candidate(f"wds, decode={fast_decoder}", "wds", decode="numpy"))
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
    random.Random(seed).shuffle(source.samples)
    return source


def transform_cost(images: Sequence[Any], transform: Optional[Callable], repeats: int = 2) -> float:
    """ms per image of ``transform`` on decoded images, in this process (best of ``repeats``)."""
    if transform is None or not images:
        return 0.0
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for image in images:
            transform(image)
        best = min(best, (time.perf_counter() - t) / len(images) * 1000)
    return best


def _memory_dataset(source: Source, transform: Optional[Callable], storage_options: Optional[Dict[str, Any]]) -> Any:
    """The sample with its bytes preloaded: the loader's work without the storage."""
    from ..source.dataset import SourceDataset

    class InMemory(SourceDataset):
        def __init__(self) -> None:
            super().__init__(source, transform=transform, storage_options=storage_options)
            self.blobs = {f.path: SourceDataset._read(self, f.path) for s in source.samples for f in s.files}

        def _read(self, rel: str) -> bytes:
            return self.blobs[rel]

    return InMemory()


def loader_passes(source: Source, out_dir: Optional[str], transform: Optional[Callable],
                  options: Sequence[Candidate], workers: int, max_seconds: float, batch_size: int = 64,
                  storage_options: Optional[Dict[str, Any]] = None,
                  log: Callable[[str], None] = lambda m: None) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """Read the sample as it is, from memory, and as each candidate output, through a
    DataLoader: ``({name: {cold, warm, bytes_per_sample, ...}}, notes)``; ``cold``/``warm`` are
    steady-state rates (after every worker's first batch), ``cold_whole``/``warm_whole`` the
    whole pass's (a shard reader's reads come in bursts the steady state can miss). A candidate that
    cannot be made from this source is left out with the reason in the notes."""
    from ..bench import BenchTarget, _as_list, _default_collate
    from ..io.location import Location
    from ..readers.open import open_dataset
    from ..source.dataset import SourceDataset

    collate = _default_collate() if transform is not None and source.sample_type == "classification" else _as_list
    if source.sample_type != "classification":
        transform = None
    n = len(source.samples)
    results: Dict[str, Dict[str, Any]] = {}
    notes: List[str] = []

    rate_hint: List[float] = []

    def measure(name: str, ds: Any, target: BenchTarget, caches: Sequence[str]) -> Dict[str, Any]:
        row = run_passes(ds, target, workers, collate, caches, n, max_seconds, batch_size,
                         rate_hint[0] if rate_hint else None, lambda m: log(f"{name}, {m}"))
        rate_hint[:] = [row.get("cold") or row.get("warm") or 0.0]
        row["bytes_per_sample"] = target.bytes_per_sample
        return row

    location = Location(source.root, storage_options, flat=False)
    ds = SourceDataset(source, transform=transform, storage_options=storage_options)
    files = [] if location.remote else [p for i in range(n) for p in ds.paths(i)]
    per_sample = source.nbytes / max(1, n)
    target = BenchTarget(source.root, "source", source.sample_type, n, per_sample, False, files)
    results[SOURCE] = measure(SOURCE, ds, target, ("cold", "warm"))
    rate_hint[:] = [results[SOURCE].get("warm", 0.0)]
    results[MEMORY] = measure(MEMORY, _memory_dataset(source, transform, storage_options),
                              BenchTarget(source.root, "memory", source.sample_type, n, per_sample, False, []), ("warm",))
    if not options:
        return results, notes
    from ..convert import convert
    from ..manifest import Manifest

    parent = out_dir if out_dir and os.path.isdir(out_dir) else None
    scratch = tempfile.mkdtemp(prefix=".dsconvert-analyze-", dir=parent)
    try:
        made: Dict[Tuple[str, Tuple], str] = {}
        for c in options:
            key = (c.fmt, tuple(sorted(c.options.items())))
            path = made.get(key)
            if path is None:
                path = os.path.join(scratch, f"{c.fmt}-{len(made)}")
                try:
                    convert(source.root, path, c.fmt, scanned=source, verify=False, force=True,
                            workers=workers, storage_options=storage_options, **c.options)
                except (DsconvertError, ValueError) as exc:
                    notes.append(f"{c.name}: not measured, the sample does not convert: {exc}")
                    continue
                made[key] = path
            manifest = Manifest.load(Location(path))
            written = manifest.num_samples
            if not written:
                notes.append(f"{c.name}: not measured, no sample of the sample converted")
                continue
            out_files = [os.path.join(path, f) for f in os.listdir(path) if os.path.isfile(os.path.join(path, f))]
            out_bytes = sum(s.bytes for s in manifest.shards)
            ds = open_dataset(path, transform=transform, decode=c.decode)
            row = measure(c.name, ds, BenchTarget(path, c.fmt, manifest.sample_type, written, out_bytes / written,
                                                  manifest.format == "wds", out_files), ("cold", "warm"))
            row.update(format=c.fmt, decode=c.decode, options=dict(c.options))
            results[c.name] = row
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results, notes


class _Repeat:
    """An IterableDataset read ``times`` over (each DataLoader worker repeats its own slice)."""

    def __new__(cls, inner: Any, times: int) -> Any:
        from torch.utils.data import IterableDataset

        class Repeat(IterableDataset):
            def __iter__(self) -> Any:
                for _ in range(times):
                    yield from inner

            def __len__(self) -> int:
                return len(inner) * times

        return Repeat()


def repeated(ds: Any, times: int) -> Any:
    """``ds`` read ``times`` over in one pass: a warm pass long enough for the batch size."""
    from torch.utils.data import IterableDataset, Subset

    if times <= 1:
        return ds
    if isinstance(ds, IterableDataset):
        return _Repeat(ds, times)
    return Subset(ds, list(range(len(ds))) * times)


def run_passes(ds: Any, target: Any, workers: int, collate: Callable, caches: Sequence[str], n: int,
               max_seconds: float, batch_size: int = 64, rate_hint: Optional[float] = None,
               log: Callable[[str], None] = lambda m: None) -> Dict[str, Any]:
    """Cold and/or warm DataLoader passes over ``ds`` (``n`` samples), as ``dsconvert bench``
    runs them, within about ``max_seconds`` each. A cold pass reads the sample once, in
    batches small enough for eight per worker; a warm pass reads it as many times over as
    eight batches of ``batch_size`` per worker need (the per-batch costs, collate and IPC,
    weigh on fast loaders), with batches no larger than the rate seen so far allows in time."""
    from ..bench import _one_pass

    row: Dict[str, Any] = {"samples": n}
    w = max(1, workers)
    for cache in caches:
        if cache == "cold":
            batch = max(1, min(batch_size, n // (8 * w)))
            data, count = ds, n
        else:
            hint = rate_hint or row.get("cold")
            batch = batch_size if not hint else int(max(1, min(batch_size, hint * max_seconds / (8 * w))))
            times = max(1, -(-8 * w * batch // max(1, n)))
            data, count = repeated(ds, times), n * times
        r = _one_pass(data, target, workers, batch, collate, cache, count, max_seconds)
        row[cache] = r["samples_per_s"]
        row[f"{cache}_startup_s"] = r["startup_s"]
        row[f"{cache}_whole"] = r["samples"] / r["seconds"] if r["seconds"] > 0 else 0.0
        row[f"{cache}_batch"] = batch
        log(f"{cache}: {r['samples_per_s']:,.0f} samples/s ({r['samples']} samples in batches of {batch}, "
            f"{workers} workers)")
    return row


def decoded_sample(source: Source, count: int = 16, storage_options: Optional[Dict[str, Any]] = None) -> List[Any]:
    """Up to ``count`` decoded images of the sample (PIL), to time the transform on."""
    from ..source.dataset import SourceDataset

    if source.sample_type != "classification":
        return []
    ds = SourceDataset(source, storage_options=storage_options)
    out = []
    for i in range(min(count, len(ds))):
        try:
            out.append(ds[i][0])
        except Exception:  # a file that does not decode is the conversion's to skip, not ours
            continue
    return out


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

