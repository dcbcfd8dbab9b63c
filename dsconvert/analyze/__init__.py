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
    from .loader import candidates, loader_passes, page_cache_bytes, sample_source, transform_cost
    say = log or (lambda msg: None)
    started = time.perf_counter()
    src = local_form(src)  # file:// URLs as the paths they name
    output_dir = local_form(output_dir) if output_dir is not None else None
    fs = None
    if is_remote(src):
        fs, root = filesystem(src, storage_options)
        src = src.rstrip("/")
        storage = _remote_storage(src)
        reader = Reader(fs)
    else:
        src = os.path.abspath(src)
        if os.path.basename(src) == MANIFEST_NAME:  # a dsconvert output named by its manifest
            src = os.path.dirname(src)
        root = src
        storage = storage_kind(src)
        reader = LOCAL
    spec = transform if isinstance(transform, str) else getattr(transform, "__name__", repr(transform))
    transform_fn = load_transform(transform) if isinstance(transform, str) else transform
    cores = workers or available_cpus()
    found = what_is(root if fs is not None else src, fs=fs)
    say(f"{src}: {found.description}")
    # a folder of arrays is read file by file, as a source is; one array file is not a dataset here
    folder = fs.isdir(root) if fs is not None else os.path.isdir(root)
    measured_as = "files" if found.kind == "files" or (found.kind in ("npy", "npz") and folder) else found.kind
    has_manifest = Location(src, storage_options).exists(MANIFEST_NAME) if found.kind == "dsconvert" else False
    say(f"inventory of {src} ({storage['kind']}, {storage['fstype']} at {storage['mount']})")
    with progress_bar(progress, "inventory", unit=" files") as bar:
        inv = take_inventory(root, time_budget=time_budget, progress=bar.update, fs=fs)
    if found.kind == "dsconvert" or measured_as != "files":
        entries = [(p, s) for p, s in inv.entries if not p.endswith((".json", ".idx", ".lock"))] or inv.entries
    else:
        entries = inv.entries
    if not entries and not folder:  # one file (a .parquet, a .tar): the at-rest passes read it
        info = fs.info(root) if fs is not None else {"size": os.path.getsize(src)}
        entries = [(root.rstrip("/").rsplit("/", 1)[-1] if fs is not None else os.path.basename(src),
                    int(info.get("size") or 0))]
    listed = None
    if inv.layout == "list" and measured_as == "files":
        # a list file: the files it names are the data, measured in place of the list itself
        import random

        from ..readers.source import SourceDataset
        from ..source import scan

        listed = scan(src, storage_options=storage_options)
        listed_total = len(listed.samples)
        listed.samples = random.Random(seed).sample(listed.samples, min(listed_total, sample))
        listed_ds = SourceDataset(listed, storage_options=storage_options)
        entries = [(p, f.size) for i, s in enumerate(listed.samples) for p, f in zip(listed_ds.paths(i), s.files)]
        paths = [p for p, _ in entries]
        picked = entries
    else:
        picked = stratified_sample(entries, sample, seed)
        if fs is not None:
            base = root if folder else root.rstrip("/").rsplit("/", 1)[0]
            paths = [f"{base}/{p}" for p, _ in picked]
        else:
            base = src if os.path.isdir(src) else os.path.dirname(src)
            paths = [os.path.join(base, p) for p, _ in picked]
    images = [p for p in paths if field_kind(p) == "image"]
    contained = _container_sample(src, found.kind, sample, seed, label, storage_options, say)
    decode_reader = reader
    if contained is not None:  # decode costs and geometry from the sampled samples' own images
        decode_reader = MemberReader(contained, storage_options)
        images = [p for p, f in decode_reader.files.items() if field_kind(f.field) == "image"]
    say(f"reading {len(paths)} sampled files cold and warm, sequential and random")
    cold = read_pass(paths, cold=True, order="sequential", reader=reader)
    cold_random = read_pass(paths, cold=True, order="random", seed=seed, reader=reader)
    warm = read_pass(paths, cold=False, order="sequential", reader=reader)
    fixed_ms, fit_mb_s = fit_fixed_cost(cold["latencies_ms"], cold.pop("sizes"))
    for r in (cold_random, warm):  # per-file latencies stay in the report: the HTML plots their ECDFs
        r.pop("sizes")
    # object stores keep scaling with concurrent requests well past the core count
    levels = sweep_levels or sorted({1, 2, 4, 8, 16, cores} | ({32, 64} if fs is not None else set()))
    say(f"concurrency sweep over {levels} readers")
    sweep = concurrency_sweep(paths[: max(16, min(len(paths), 128))], levels, reader=reader)
    say(f"decode cost of {len(images)} images per codec and library")
    costs, other = decode_costs(images + [p for p in paths if p.lower().endswith(".npy") and contained is None],
                                reader=decode_reader)
    pickles = sum(n for ext, n in inv.extensions.items() if ext in ("pkl", "pickle"))
    if pickles:
        other["pickle"] = (f"{pickles} pickle files: unpickling is not measured, since it runs code "
                           "from the data; a decoded npy cache or np.save'd arrays avoid it")
    geometry = image_geometry(images, reader=decode_reader)
    mem_mb_s = memory_bandwidth()
    mix: Dict[str, float] = {}  # the sample's codec mix, weighted as it occurs: library -> ms per sample
    measured = {c: per for c, per in costs.items() if "pil" in per}
    for lib in sorted({lib for per in measured.values() for lib in per}):
        mix[lib] = sum(per["pil"]["share"] * per.get(lib, per["pil"])["ms"] for per in measured.values())
    out_dir = _output_dir(src, output_dir, storage, fs is not None)
    free = free_bytes(out_dir)  # an output folder not made yet: the free space of where it will be

    fps = _files_per_sample(inv)
    num_samples = int(inv.estimated_files / fps) if fps else 0
    data_bytes: float = inv.estimated_bytes
    if listed is not None:
        num_samples = listed_total
        data_bytes = listed.nbytes / max(1, len(listed.samples)) * listed_total
    if contained is not None:  # a sample reads a part of a container file
        num_samples = contained.options["total_samples"]
        fps = min(1.0, inv.estimated_files / max(1, num_samples))
    loader: Dict[str, Dict[str, Any]] = {}
    notes: List[str] = []
    transform_ms = 0.0
    resize = None
    convertible = False
    unmeasured = None
    if found.kind == "dsconvert" and not has_manifest:
        unmeasured = (f"{found.description}; analyze each output on its own (dsconvert analyze FOLDER, the folder "
                      "that holds dsconvert.json)")
    elif found.kind == "dsconvert":
        try:
            loader, transform_ms, num_samples, decode_extra = _output_passes(
                src, transform_fn, cores, sample, seed, decode, pass_seconds, batch_size, storage_options, say)
        except (DsconvertError, OSError, ValueError) as exc:
            unmeasured = (f"{found.description}; it could not be read ({type(exc).__name__}: {str(exc)[:200]}): "
                          f"dsconvert verify {src} says what is wrong")
        else:
            mix = mix or decode_extra
    elif measured_as == "files" or contained is not None:
        source = contained or listed or sample_source(src, listings_for(inv, [p for p, _ in picked], fs),
                                                           [p for p, _ in picked], inv.layout, seed)
        convertible = True
        if source.sample_type != "classification":
            transform_fn, spec = None, "none"
        transform_ms = transform_cost(source, transform_fn, storage_options=storage_options)
        if geometry and geometry["short_side_median"] > SUGGESTED_SHORT_SIDE:
            resize = SUGGESTED_SHORT_SIDE
        fast = jpeg_decoders()[0][0]
        from ..fused import fuse

        folded = fuse(transform_fn) if transform_fn is not None else None
        fusable = folded is not None and folded.fused
        if folded is not None and not folded.fused:  # what open_dataset's FusedFallbackWarning says
            notes.append(f"decode=\"fused\" not measured: it cannot fold this transform's crop or resize into "
                         f"decoding ({folded.why_not}); with the crop or resize first it decodes only what it keeps")
        # images larger than the training size: the same shards with them re-encoded at the
        # size whose shorter side is the suggested one, at the median aspect ratio
        max_size = None
        if resize and geometry:
            w50, h50 = geometry["width"]["p50"], geometry["height"]["p50"]
            max_size = int(round(resize * max(w50, h50) / max(1.0, min(w50, h50))))
        options = candidates(source, fast if "jpeg" in costs else "pil", resize, fusable, max_size)
        trial_budget = 2 << 30  # a full-size decoded trial of very large images is left out
        if geometry and geometry.get("decoded_bytes_mean", 0) * len(source.samples) > trial_budget:
            options = [c for c in options if not (c.fmt == "npy" and not c.options)]
            notes.append("npy at full size: not measured, its trial on the sample alone would need more than 2 GB")
        say(f"DataLoader passes ({cores} workers, transform {spec}): the source, from memory, "
            f"and {len(options)} outputs made from the {len(source.samples)}-sample sample")
        loader, trial_notes = loader_passes(source, out_dir, transform_fn, options, cores, pass_seconds,
                                            batch_size, storage_options, say)
        notes += trial_notes
        if contained is not None and found.kind == "webdataset":
            loader.update(_in_place_passes(src, contained, transform_fn, fusable, cores, sample, seed,
                                           pass_seconds, batch_size, storage_options, say))
    mean_sample_bytes = data_bytes / max(1, num_samples)
    cache_bytes = page_cache_bytes()
    m = Measurements(
        source=src, storage_kind=storage["kind"], num_samples=num_samples, files_per_sample=fps,
        mean_sample_bytes=mean_sample_bytes, mean_file_bytes=sum(s for _, s in entries) / max(1, len(entries)),
        cold_latency_ms=cold["latency_ms"].get("p50", 0.0), fixed_ms=fixed_ms,
        bandwidth_mb_s=max(r["mb_per_s"] for r in sweep) if sweep else fit_mb_s,
        bandwidth_runs=(max(sweep, key=lambda r: r["mb_per_s"]).get("mb_per_s_runs") or []) if sweep else [],
        sweep=[(r["readers"], r["files_per_s"]) for r in sweep], loader=loader, decode_ms=mix,
        transform_ms=transform_ms, cores=cores, cache=cache, page_cache_bytes=cache_bytes, transform=spec,
        kind=found.kind, label=contained.options.get("label") if contained is not None else None,
        # the kernel caches local disks; on FUSE and network mounts it is measured (caching may be off)
        page_cache_works=fs is None and (not storage.get("latency_bound")
                                         or warm["mb_per_s"] >= 1.5 * cold["mb_per_s"]),
        convertible=convertible, numpy_decoder=jpeg_decoders()[0][0], suggested_resize=resize,
        region_decoder=jpeg_region() is not None, resize_kernel=resample.state(),
        free_bytes=free, output_dir=out_dir, target=target, remote=fs is not None,
    )
    verdict = decide(m) if loader else _unmeasured(m, found, unmeasured)
    verdict.notes[:0] = notes
    return {
        "schema": REPORT_SCHEMA, "schema_version": REPORT_VERSION, "source": src,
        "seconds": round(time.perf_counter() - started, 3),
        "storage": storage,
        "detected": _detected_dict(found, inv),
        "inventory": inv.to_dict(),
        "sample": {"files": len(paths), "images": len(images), "seed": seed,
                   "strata": "top-level folder x size quartile"},
        "read": {"cold_sequential": cold, "cold_random": cold_random, "warm": warm,
                 "fixed_ms_per_file": fixed_ms, "fit_bandwidth_mb_s": fit_mb_s},
        "sweep": sweep,
        "decode": {"per_codec": costs, "per_sample_ms": mix, "images": geometry, **other},
        "loader": {"workers": cores, "transform": spec, "cache": verdict.cache, "batch_size": batch_size,
                   "passes": loader},
        "memory_bandwidth_mb_s": mem_mb_s,
        "disk": {"output_dir": out_dir, "free_bytes": free},
        "measurements": m.__dict__,
        "verdict": verdict.to_dict(),
    }


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
