"""``dsconvert analyze``: why is loading slow, and what to run about it.

:func:`analyze` first says what the path holds (:mod:`.detect`: a source of files, a
dsconvert output, or another training format), then measures it at rest (inventory, read cost
cold and warm, the concurrency sweep, decode cost per codec and library) and through a real
DataLoader with the machine's workers and a reference transform, as it is and as each
candidate output made from the sample (:mod:`.loader`); :func:`dsconvert.analyze.verdict.decide`
turns the measurements into a verdict. The report is a plain dict, versioned
(``schema``/``schema_version``), rendered by :mod:`dsconvert.analyze.report` as a terminal
table or JSON.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import resample
from ..codecs import field_kind, jpeg_decoders
from ..errors import DsconvertError, OptionError
from ..io.localfs import free_bytes, storage_kind
from ..io.location import Location, filesystem, is_remote, local_form, protocol_of
from ..manifest import MANIFEST_NAME, Manifest
from ..optional import jpeg_region, require
from ..processes import available_cpus
from ..progress import progress_bar
from ..samples import CLASSIFICATION_LAYOUTS
from ..units import format_size
from .detect import (
    Detected,
    detect as what_is,  # the name detect stays the module's
)
from .inventory import Inventory, listings_for, take_inventory
from .measure import (
    LOCAL,
    Reader,
    concurrency_sweep,
    decode_costs,
    fit_fixed_cost,
    image_geometry,
    memory_bandwidth,
    read_pass,
)
from .sampling import stratified_sample
from .verdict import SOURCE, Measurements, Verdict, decide

__all__ = ["analyze", "REPORT_SCHEMA", "REPORT_VERSION", "Measurements", "Verdict", "decide"]

REPORT_SCHEMA = "dsconvert.analyze"
REPORT_VERSION = 2
SUGGESTED_SHORT_SIDE = 256  # a --resize that still allows the usual 224-pixel crops


def _files_per_sample(inv: Inventory) -> float:
    """Files per sample of a flat layout: the files over their distinct stems, counted per folder
    during the walk (a sample of the files would split a sample's files apart)."""
    if inv.layout in CLASSIFICATION_LAYOUTS or not inv.files:
        return 1.0
    return inv.files / max(1, inv.stems)


def _remote_storage(url: str) -> Dict[str, Any]:
    """What an object store or other fsspec URL is, in storage_kind's terms."""
    proto = protocol_of(url)
    endpoint = url.split("://", 1)[1].split("/", 1)[0]
    return {"kind": proto, "fstype": proto, "mount": f"{proto}://{endpoint}", "latency_bound": True}


def _output_dir(src: str, given: Optional[str], storage: Dict[str, Any], remote: bool) -> str:
    """Where outputs go, are measured, and their free space is checked: ``given``; else beside
    a local source on storage that is not latency-bound, where its parent is writable; else the
    current folder (a remote or network source's outputs belong on local disk)."""
    if given:
        return os.path.abspath(given)
    parent = os.path.dirname(src.rstrip("/"))
    if not remote and not storage.get("latency_bound") and os.access(parent, os.W_OK):
        return parent
    return os.getcwd()


def analyze(src: str, target: Optional[float] = None, sample: int = 256, seed: int = 0,
            time_budget: float = 30.0, output_dir: Optional[str] = None,
            sweep_levels: Optional[List[int]] = None, progress: bool = False,
            log: Optional[Callable[[str], None]] = None,
            storage_options: Optional[Dict[str, Any]] = None, transform: Any = "eval",
            workers: Optional[int] = None, decode: str = "pil", pass_seconds: float = 6.0,
            cache: str = "auto", batch_size: int = 64, label: Optional[str] = None) -> Dict[str, Any]:
    """Measure ``src`` (a path, or a URL fsspec reaches, with ``storage_options``) and return
    the report (see the module doc and the README's schema). ``transform`` is what each
    sample goes through in the DataLoader passes (``eval``, ``train``, ``none``,
    ``module:callable`` or a callable), ``workers`` their worker count (default: the CPUs),
    ``cache`` which passes the predictions use (``auto``: warm when the whole dataset fits in
    half the page cache, else cold), ``batch_size`` the training loop's (as bench's, 64).
    On object stores every read is a request: "cold" is the first request for a file and
    "warm" a repeated one.

    Tar shards another tool wrote and Parquet files are measured as the sources they are for
    dsconvert: a seeded sample of their samples, read in place and through the outputs made
    from it; ``label`` says where their class label is (tars with a ``cls`` member in every
    sampled sample use it; Parquet's ClassLabel column is found by itself)."""
    from ..transforms import load_transform

    if cache not in ("auto", "cold", "warm"):
        raise OptionError(f"cache must be auto, cold or warm, not {cache!r}")
    require("torch", "dsconvert analyze (it measures through a real DataLoader)")
    say = log or (lambda msg: None)
    started = time.perf_counter()
    place = _locate(src, storage_options)
    src = place.src
    spec = transform if isinstance(transform, str) else getattr(transform, "__name__", repr(transform))
    run = Run(place=place, storage_options=storage_options, say=say, sample=sample, seed=seed, label=label,
              cores=workers or available_cpus(), transform_fn=load_transform(transform) if isinstance(transform, str)
              else transform, spec=spec, decode=decode, pass_seconds=pass_seconds, batch_size=batch_size,
              output_dir=local_form(output_dir) if output_dir is not None else None)
    # the steps, in order: what it is, what it holds, the files measured, at rest, through a loader
    found, inv = _what_it_holds(run, time_budget, progress)
    entries, paths, picked, listed = _pick(run, found, inv)
    rest = _at_rest(run, found, inv, paths, sweep_levels)
    passes = _through_loader(run, found, inv, picked, listed, rest)
    m = _measurements(run, inv, entries, rest, passes, target, cache)
    verdict = decide(m) if passes.loader else _unmeasured(m, found, passes.unmeasured)
    verdict.notes[:0] = passes.notes
    return {
        "schema": REPORT_SCHEMA, "schema_version": REPORT_VERSION, "source": src,
        "seconds": round(time.perf_counter() - started, 3),
        "storage": place.storage,
        "detected": _detected_dict(found, inv),
        "inventory": inv.to_dict(),
        "sample": {"files": len(paths), "images": len(rest.images), "seed": seed,
                   "strata": "top-level folder x size quartile"},
        "read": {"cold_sequential": rest.cold, "cold_random": rest.cold_random, "warm": rest.warm,
                 "fixed_ms_per_file": rest.fixed_ms, "fit_bandwidth_mb_s": rest.fit_mb_s},
        "sweep": rest.sweep,
        "decode": {"per_codec": rest.costs, "per_sample_ms": m.decode_ms, "images": rest.geometry, **rest.other},
        "loader": {"workers": run.cores, "transform": passes.spec, "cache": verdict.cache, "batch_size": batch_size,
                   "passes": passes.loader},
        "memory_bandwidth_mb_s": rest.mem_mb_s,
        "disk": {"output_dir": rest.out_dir, "free_bytes": rest.free},
        "measurements": m.__dict__,
        "verdict": verdict.to_dict(),
    }


@dataclass
class Place:
    """Where the data is: the path or URL as given back, the root to walk, the file system."""

    src: str
    root: str
    fs: Any
    storage: Dict[str, Any]
    reader: Reader


@dataclass
class Run:
    """What every step of one analyze shares: where, how, and with which loader settings."""

    place: Place
    storage_options: Optional[Dict[str, Any]]
    say: Callable[[str], None]
    sample: int
    seed: int
    label: Optional[str]
    cores: int
    transform_fn: Any
    spec: str
    decode: str
    pass_seconds: float
    batch_size: int
    output_dir: Optional[str]
    folder: bool = True
    measured_as: str = "files"
    kind: str = "files"  # what detect found
    contained: Any = None  # tar shards and Parquet: a Source of a seeded sample of their samples


@dataclass
class AtRest:
    """The measurements of the data at rest: reads cold and warm, the sweep, decode costs."""

    images: List[str]
    cold: Dict[str, Any]
    cold_random: Dict[str, Any]
    warm: Dict[str, Any]
    fixed_ms: Optional[float]
    fit_mb_s: float
    sweep: List[Dict[str, Any]]
    costs: Dict[str, Any]
    other: Dict[str, Any]
    geometry: Optional[Dict[str, Any]]
    mem_mb_s: float
    mix: Dict[str, float]  # the sample's codec mix: library -> ms per sample
    out_dir: str
    free: Optional[int]


@dataclass
class Passes:
    """The DataLoader passes and what came with them."""

    loader: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    transform_ms: float = 0.0
    resize: Optional[int] = None
    convertible: bool = False
    unmeasured: Optional[str] = None
    spec: str = "none"
    num_samples: Optional[int] = None  # where the passes know the count better (an output's manifest)
    data_bytes: Optional[float] = None
    files_per_sample: Optional[float] = None
    decode_ms: Dict[str, float] = field(default_factory=dict)  # where at-rest decoding measured none


def _locate(src: str, storage_options: Optional[Dict[str, Any]]) -> Place:
    src = local_form(src)  # file:// URLs as the paths they name
    if is_remote(src):
        fs, root = filesystem(src, storage_options)
        src = src.rstrip("/")
        return Place(src, root, fs, _remote_storage(src), Reader(fs))
    src = os.path.abspath(src)
    if os.path.basename(src) == MANIFEST_NAME:  # a dsconvert output named by its manifest
        src = os.path.dirname(src)
    return Place(src, src, None, storage_kind(src), LOCAL)


def _what_it_holds(run: Run, time_budget: float, progress: bool) -> Tuple[Detected, Inventory]:
    """What the path is (detect) and what it holds (the inventory)."""
    p, say = run.place, run.say
    found = what_is(p.root if p.fs is not None else p.src, fs=p.fs)
    run.kind = found.kind
    say(f"{p.src}: {found.description}")
    # a folder of arrays is read file by file, as a source is; one array file is not a dataset here
    run.folder = p.fs.isdir(p.root) if p.fs is not None else os.path.isdir(p.root)
    run.measured_as = ("files" if found.kind == "files" or (found.kind in ("npy", "npz") and run.folder)
                       else found.kind)
    say(f"inventory of {p.src} ({p.storage['kind']}, {p.storage['fstype']} at {p.storage['mount']})")
    with progress_bar(progress, "inventory", unit=" files") as bar:
        inv = take_inventory(p.root, time_budget=time_budget, progress=bar.update, fs=p.fs)
    return found, inv


def _pick(run: Run, found: Detected, inv: Inventory) -> Tuple[List[Tuple[str, int]], List[str], List[Tuple[str, int]],
                                                               Any]:
    """The files measured: (entries considered, the sampled files' paths, the picked entries, the
    scanned list source or None)."""
    p = run.place
    if found.kind == "dsconvert" or run.measured_as != "files":
        entries = [(e, s) for e, s in inv.entries if not e.endswith((".json", ".idx", ".lock"))] or inv.entries
    else:
        entries = inv.entries
    if not entries and not run.folder:  # one file (a .parquet, a .tar): the at-rest passes read it
        info = p.fs.info(p.root) if p.fs is not None else {"size": os.path.getsize(p.src)}
        entries = [(p.root.rstrip("/").rsplit("/", 1)[-1] if p.fs is not None else os.path.basename(p.src),
                    int(info.get("size") or 0))]
    if inv.layout == "list" and run.measured_as == "files":
        # a list file: the files it names are the data, measured in place of the list itself
        import random

        from ..readers.source import SourceDataset
        from ..source import scan

        listed = scan(p.src, storage_options=run.storage_options)
        listed.options = {**listed.options, "total_samples": len(listed.samples)}
        listed.samples = random.Random(run.seed).sample(listed.samples, min(len(listed.samples), run.sample))
        listed_ds = SourceDataset(listed, storage_options=run.storage_options)
        entries = [(q, f.size) for i, s in enumerate(listed.samples) for q, f in zip(listed_ds.paths(i), s.files)]
        return entries, [q for q, _ in entries], entries, listed
    picked = stratified_sample(entries, run.sample, run.seed)
    if p.fs is not None:
        base = p.root if run.folder else p.root.rstrip("/").rsplit("/", 1)[0]
        paths = [f"{base}/{q}" for q, _ in picked]
    else:
        base = p.src if os.path.isdir(p.src) else os.path.dirname(p.src)
        paths = [os.path.join(base, q) for q, _ in picked]
    return entries, paths, picked, None


def _at_rest(run: Run, found: Detected, inv: Inventory, paths: List[str],
             sweep_levels: Optional[List[int]]) -> AtRest:
    """Reads cold and warm, sequential and random, the concurrency sweep, decode costs per codec
    and library, the images' geometry: the data at rest, no loader."""
    p, say = run.place, run.say
    images = [q for q in paths if field_kind(q) == "image"]
    run.contained = _container_sample(p.src, found.kind, run.sample, run.seed, run.label, run.storage_options, say)
    decode_reader = p.reader
    if run.contained is not None:  # decode costs and geometry from the sampled samples' own images
        decode_reader = MemberReader(run.contained, run.storage_options)
        images = [q for q, f in decode_reader.files.items() if field_kind(f.field) == "image"]
    say(f"reading {len(paths)} sampled files cold and warm, sequential and random")
    cold = read_pass(paths, cold=True, order="sequential", reader=p.reader)
    cold_random = read_pass(paths, cold=True, order="random", seed=run.seed, reader=p.reader)
    warm = read_pass(paths, cold=False, order="sequential", reader=p.reader)
    fixed_ms, fit_mb_s = fit_fixed_cost(cold["latencies_ms"], cold.pop("sizes"))
    for r in (cold_random, warm):  # per-file latencies stay in the report: the HTML plots their ECDFs
        r.pop("sizes")
    # object stores keep scaling with concurrent requests well past the core count
    levels = sweep_levels or sorted({1, 2, 4, 8, 16, run.cores} | ({32, 64} if p.fs is not None else set()))
    say(f"concurrency sweep over {levels} readers")
    sweep = concurrency_sweep(paths[: max(16, min(len(paths), 128))], levels, reader=p.reader)
    say(f"decode cost of {len(images)} images per codec and library")
    costs, other = decode_costs(images + [q for q in paths if q.lower().endswith(".npy") and run.contained is None],
                                reader=decode_reader)
    pickles = sum(n for ext, n in inv.extensions.items() if ext in ("pkl", "pickle"))
    if pickles:
        other["pickle"] = (f"{pickles} pickle files: unpickling is not measured, since it runs code "
                           "from the data; a decoded npy cache or np.save'd arrays avoid it")
    geometry = image_geometry(images, reader=decode_reader)
    mix: Dict[str, float] = {}  # the sample's codec mix, weighted as it occurs: library -> ms per sample
    measured = {c: per for c, per in costs.items() if "pil" in per}
    for lib in sorted({lib for per in measured.values() for lib in per}):
        mix[lib] = sum(per["pil"]["share"] * per.get(lib, per["pil"])["ms"] for per in measured.values())
    out_dir = _output_dir(p.src, run.output_dir, p.storage, p.fs is not None)
    free = free_bytes(out_dir)  # an output folder not made yet: the free space of where it will be
    return AtRest(images, cold, cold_random, warm, fixed_ms, fit_mb_s, sweep, costs, other, geometry,
                  memory_bandwidth(), mix, out_dir, free)


def _through_loader(run: Run, found: Detected, inv: Inventory, picked: List[Tuple[str, int]], listed: Any,
                    rest: AtRest) -> Passes:
    """The DataLoader passes, by what the path holds (the first row of :data:`LOADER_STEPS` that
    applies): a dsconvert output read as training reads it, a source (files, a list, tars,
    Parquet) as it is and as each output made from its sample, or nothing dsconvert reads."""
    for applies, step in LOADER_STEPS:
        if applies(run, found, listed):
            return step(run, found, inv, picked, listed, rest)
    return Passes(spec=run.spec)


def _output_step(run: Run, found: Detected, inv: Inventory, picked: List[Tuple[str, int]], listed: Any,
                 rest: AtRest) -> Passes:
    src = run.place.src
    if not Location(src, run.storage_options).exists(MANIFEST_NAME):
        return Passes(unmeasured=f"{found.description}; analyze each output on its own (dsconvert analyze FOLDER, "
                                 "the folder that holds dsconvert.json)", spec=run.spec)
    try:
        loader, transform_ms, num_samples, decode_extra = _output_passes(
            src, run.transform_fn, run.cores, run.sample, run.seed, run.decode, run.pass_seconds, run.batch_size,
            run.storage_options, run.say)
    except (DsconvertError, OSError, ValueError) as exc:
        return Passes(unmeasured=(f"{found.description}; it could not be read ({type(exc).__name__}: "
                                  f"{str(exc)[:200]}): dsconvert verify {src} says what is wrong"), spec=run.spec)
    return Passes(loader=loader, transform_ms=transform_ms, num_samples=num_samples, decode_ms=decode_extra,
                  spec=run.spec)


def _source_step(run: Run, found: Detected, inv: Inventory, picked: List[Tuple[str, int]], listed: Any,
                 rest: AtRest) -> Passes:
    from ..fused import fuse
    from .loader import candidates, loader_passes, sample_source, transform_cost

    src, contained, say = run.place.src, run.contained, run.say
    source = contained or listed or sample_source(src, listings_for(inv, [q for q, _ in picked], run.place.fs),
                                                  [q for q, _ in picked], inv.layout, run.seed)
    out = Passes(convertible=True, spec=run.spec)
    transform_fn = run.transform_fn
    if source.sample_type != "classification":
        transform_fn, out.spec = None, "none"
    out.transform_ms = transform_cost(source, transform_fn, storage_options=run.storage_options)
    geometry = rest.geometry
    if geometry and geometry["short_side_median"] > SUGGESTED_SHORT_SIDE:
        out.resize = SUGGESTED_SHORT_SIDE
    fast = jpeg_decoders()[0][0]
    folded = fuse(transform_fn) if transform_fn is not None else None
    fusable = folded is not None and folded.fused
    if folded is not None and not folded.fused:  # what open_dataset's FusedFallbackWarning says
        out.notes.append(f"decode=\"fused\" not measured: it cannot fold this transform's crop or resize into "
                         f"decoding ({folded.why_not}); with the crop or resize first it decodes only what it keeps")
    # images larger than the training size: the same shards with them re-encoded at the
    # size whose shorter side is the suggested one, at the median aspect ratio
    max_size = None
    if out.resize and geometry:
        w50, h50 = geometry["width"]["p50"], geometry["height"]["p50"]
        max_size = int(round(out.resize * max(w50, h50) / max(1.0, min(w50, h50))))
    options = candidates(source, fast if "jpeg" in rest.costs else "pil", out.resize, fusable, max_size)
    trial_budget = 2 << 30  # a full-size decoded trial of very large images is left out
    if geometry and geometry.get("decoded_bytes_mean", 0) * len(source.samples) > trial_budget:
        options = [c for c in options if not (c.fmt == "npy" and not c.options)]
        out.notes.append("npy at full size: not measured, its trial on the sample alone would need more than 2 GB")
    say(f"DataLoader passes ({run.cores} workers, transform {out.spec}): the source, from memory, "
        f"and {len(options)} outputs made from the {len(source.samples)}-sample sample")
    out.loader, trial_notes = loader_passes(source, rest.out_dir, transform_fn, options, run.cores, run.pass_seconds,
                                            run.batch_size, run.storage_options, say)
    out.notes += trial_notes
    if contained is not None and found.kind == "webdataset":
        out.loader.update(_in_place_passes(src, contained, transform_fn, fusable, run.cores, run.sample, run.seed,
                                           run.pass_seconds, run.batch_size, run.storage_options, say))
    if listed is not None:
        total = listed.options["total_samples"]
        out.num_samples = total
        out.data_bytes = listed.nbytes / max(1, len(listed.samples)) * total
    if contained is not None:  # a sample reads a part of a container file
        out.num_samples = contained.options["total_samples"]
        out.files_per_sample = min(1.0, inv.estimated_files / max(1, out.num_samples))
    return out


# which DataLoader passes a path gets: the first row whose test holds (run, found, listed)
LOADER_STEPS: Tuple[Tuple[Callable[[Run, Detected, Any], bool], Callable[..., Passes]], ...] = (
    (lambda run, found, listed: found.kind == "dsconvert", _output_step),
    (lambda run, found, listed: run.measured_as == "files" or run.contained is not None, _source_step),
)


def _measurements(run: Run, inv: Inventory, entries: List[Tuple[str, int]], rest: AtRest, passes: Passes,
                  target: Optional[float], cache: str) -> Measurements:
    """The verdict's input, from the steps' results."""
    from .loader import page_cache_bytes

    p = run.place
    fps = passes.files_per_sample or _files_per_sample(inv)
    num_samples = passes.num_samples if passes.num_samples is not None else (int(inv.estimated_files / fps)
                                                                               if fps else 0)
    data_bytes = passes.data_bytes if passes.data_bytes is not None else float(inv.estimated_bytes)
    sweep = rest.sweep
    contained = run.contained
    return Measurements(
        source=p.src, storage_kind=p.storage["kind"], num_samples=num_samples, files_per_sample=fps,
        mean_sample_bytes=data_bytes / max(1, num_samples),
        mean_file_bytes=sum(s for _, s in entries) / max(1, len(entries)),
        cold_latency_ms=rest.cold["latency_ms"].get("p50", 0.0), fixed_ms=rest.fixed_ms,
        bandwidth_mb_s=max(r["mb_per_s"] for r in sweep) if sweep else rest.fit_mb_s,
        bandwidth_runs=(max(sweep, key=lambda r: r["mb_per_s"]).get("mb_per_s_runs") or []) if sweep else [],
        sweep=[(r["readers"], r["files_per_s"]) for r in sweep], loader=passes.loader,
        decode_ms=rest.mix or passes.decode_ms, transform_ms=passes.transform_ms, cores=run.cores, cache=cache,
        page_cache_bytes=page_cache_bytes(), transform=passes.spec, kind=run.kind,
        label=contained.options.get("label") if contained is not None else None,
        # the kernel caches local disks; on FUSE and network mounts it is measured (caching may be off)
        page_cache_works=p.fs is None and (not p.storage.get("latency_bound")
                                           or rest.warm["mb_per_s"] >= 1.5 * rest.cold["mb_per_s"]),
        convertible=passes.convertible, numpy_decoder=jpeg_decoders()[0][0], suggested_resize=passes.resize,
        region_decoder=jpeg_region() is not None, resize_kernel=resample.state(),
        free_bytes=rest.free, output_dir=rest.out_dir, target=target, remote=p.fs is not None,
    )


def _container_sample(src: str, kind: str, sample: int, seed: int, label: Optional[str],
                      storage_options: Optional[Dict[str, Any]], say: Callable[[str], None]) -> Optional[Any]:
    """For tar shards and Parquet files dsconvert reads in place: a :class:`Source` of a seeded
    sample of their samples (shuffled, as training reads them), with ``options`` saying the
    total count and the label used; None for anything else, or when they cannot be scanned."""
    import dataclasses
    import random

    from ..source import scan

    if kind not in ("webdataset", "parquet"):
        return None
    layout = "tars" if kind == "webdataset" else "parquet"
    try:
        full = scan(src, layout, storage_options=storage_options, label=label)
        if label is None and kind == "webdataset" and full.samples and all(
                any(f.field == "cls" for f in s.files) for s in full.samples[:1000]):
            label = "cls"  # every sample carries a class member: measure (image, label) training
            full = scan(src, layout, storage_options=storage_options, label=label)
    except (DsconvertError, OSError, ValueError) as exc:
        say(f"{src} cannot be read as a {layout} source: {exc}")
        return None
    picked = random.Random(seed).sample(full.samples, min(sample, len(full.samples)))
    used = label if kind == "webdataset" else full.options.get("label")
    return dataclasses.replace(full, samples=picked, skipped=[], ignored=[],
                               options={**full.options, "total_samples": len(full.samples), "label": used})


class MemberReader(Reader):
    """The measurements' reader for inputs inside containers: a path is an input's display
    path (``TAR/MEMBER``; a Parquet row's gets its field as extension, which names the codec),
    read through the source's own dataset."""

    def __init__(self, source: Any, storage_options: Optional[Dict[str, Any]]):
        from ..readers.source import SourceDataset

        super().__init__()
        self.ds = SourceDataset(source, decode="raw", storage_options=storage_options)
        self.files = {(f.path if f.path.endswith("." + f.field) else f"{f.path}.{f.field}"): f
                      for s in source.samples for f in s.files}

    def read(self, path: str) -> bytes:
        return self.ds._read(self.files[path])[: self.limit]

    def head(self, path: str, n: int = 1 << 16) -> bytes:
        return self.ds._read(self.files[path])[:n]

    def evict(self, paths: Any) -> None:
        pass


def _detected_dict(found: Detected, inv: Optional[Inventory] = None) -> Dict[str, Any]:
    """What detect found, its counts true at any size: where its listing stopped at its cap,
    the description says so and adds the whole folder's totals from the inventory, and
    ``files`` is the inventory's count (``files_listed`` what detect listed)."""
    d = found.to_dict()
    d["files"] = d["files_listed"] = len(found.files)
    d["damaged"] = found.damaged[:20]
    if not found.complete and inv is not None:
        about = "" if inv.complete else "about "  # the walk stopped at its time budget: an estimate
        d["files"] = inv.estimated_files
        d["description"] = (f"{found.description}; the whole folder holds {about}{inv.estimated_files:,} files, "
                            f"{about}{format_size(inv.estimated_bytes)} (the inventory)")
    return d


def _output_passes(path: str, transform: Any, workers: int, sample: int, seed: int, decode: str,
                   pass_seconds: float, batch_size: int, storage_options: Optional[Dict[str, Any]],
                   say: Callable[[str], None]) -> Tuple[Dict[str, Dict[str, Any]], float, int, Dict[str, float]]:
    """A dsconvert output read as training reads it: open_dataset with the transform, cold and
    warm; also the transform's and the decode's cost on a few of its samples."""
    from ..bench import as_list, open_target, torch_default_collate
    from ..codecs import decode_image
    from ..readers.open import open_dataset
    from .loader import run_passes

    manifest = Manifest.load(Location(path, storage_options))
    stores_pixels = bool(manifest.options.get("decode"))
    classification = manifest.sample_type == "classification"
    plain = open_dataset(path, decode="numpy" if stores_pixels else "raw", storage_options=storage_options)
    if not classification:
        transform = None
    decode_s = transform_s = 0.0
    decoded = 0
    for i, item in enumerate(plain):  # a few samples, decoded and transformed one at a time
        if i >= 16:
            break
        data = item[0] if isinstance(item, tuple) else item
        t = time.perf_counter()
        image = decode_image(bytes(data), "pil") if isinstance(data, (bytes, bytearray, memoryview)) else data
        decode_s += time.perf_counter() - t
        decoded += 1
        if transform is not None:
            t = time.perf_counter()
            transform(image)
            transform_s += time.perf_counter() - t
    decode_ms: Dict[str, float] = {"pil": decode_s / decoded * 1000} if decoded and not stores_pixels else {}
    transform_ms = transform_s / decoded * 1000 if decoded else 0.0
    ds, target = open_target(path, decode, transform, sample, seed, storage_options)
    collate = torch_default_collate() if transform is not None else as_list
    n = min(sample, target.num_samples)
    runs = [(SOURCE, ds, decode)]
    fast = jpeg_decoders()[0][0]
    if not stores_pixels and decode == "pil" and fast != "pil":  # the same shards, the fast JPEG decoder
        runs.append((f"decode={fast}", open_target(path, "numpy", transform, sample, seed, storage_options)[0],
                     "numpy"))
    passes: Dict[str, Dict[str, Any]] = {}
    for name, dataset, mode in runs:
        def log(m: str, name: str = name) -> None:
            say(f"{target.label} ({name}), {m}")

        row = run_passes(dataset, target, workers, collate, ("cold", "warm"), n, pass_seconds, batch_size,
                         log=log)
        row.update(bytes_per_sample=target.bytes_per_sample, format=target.kind, decode=mode)
        if name != SOURCE:
            row["same_data"] = True
        passes[name] = row
    return passes, transform_ms, target.num_samples, decode_ms


def _in_place_passes(src: str, source: Any, transform: Any, fusable: bool, workers: int, sample: int,
                     seed: int, pass_seconds: float, batch_size: int, storage_options: Optional[Dict[str, Any]],
                     say: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
    """Tar shards read where they are by the indexed reader (open_dataset on the folder), with
    the fast decoder and, where the transform fuses, decode="fused": no conversion at all."""
    from ..bench import as_list, open_target, torch_default_collate
    from .loader import run_passes

    label = source.options.get("label")
    collate = torch_default_collate() if transform is not None and label is not None else as_list
    modes = ["numpy"] + (["fused"] if fusable and label is not None else [])
    passes: Dict[str, Dict[str, Any]] = {}
    for mode in modes:
        name = f"tars in place, decode={mode}"
        try:
            ds, target = open_target(src, mode, transform if label is not None else None, sample, seed,
                               storage_options, label)
        except (DsconvertError, OSError, ValueError) as exc:
            say(f"{name}: not measured ({exc})")
            continue
        def log(m: str, name: str = name) -> None:
            say(f"{name}, {m}")

        row = run_passes(ds, target, workers, collate, ("cold", "warm"), min(sample, target.num_samples),
                         pass_seconds, batch_size, log=log)
        row.update(bytes_per_sample=target.bytes_per_sample, format="wds", decode=mode, same_data=True,
                   label=label)
        passes[name] = row
    return passes


def _unmeasured(m: Measurements, found: Detected, why: Optional[str] = None) -> Verdict:
    """Data analyze recognises but cannot read through a loader: what it is, and what to do."""
    return Verdict(
        bottleneck="unknown",
        summary=why or f"{found.description}; dsconvert does not read it, so the loader was not measured",
        evidence=[f"read with {found.reader} in training"] if getattr(found, "reader", None) else [],
        commands=[], alternative=[],
        per_worker_ms={"read": 0.0, "overhead": 0.0, "decode": 0.0, "transform": 0.0, "other": 0.0, "total": 0.0},
        workers=m.cores, loader_per_s=0.0, predicted_per_s={}, output_bytes={}, fits={}, recommended=None,
        predicted_speedup=1.0, keeps_up=None, cache=m.cache,
        notes=[found.advice] if getattr(found, "advice", None) else [])
