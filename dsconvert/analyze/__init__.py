"""``dsconvert analyze``: why is loading slow, and what to run about it.

:func:`analyze` measures the source at rest (inventory, read cost cold and warm, the
concurrency sweep, decode cost per codec and library, the differential stall measurement),
then :func:`dsconvert.analyze.verdict.decide` turns the measurements into a verdict. The
report is a plain dict, versioned (``schema``/``schema_version``), rendered by
:mod:`dsconvert.analyze.report` as a terminal table or JSON.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Optional

from ..codecs import field_kind, jpeg_decoders, resized_shape
from ..processes import available_cpus
from ..progress import progress_bar
from ..io.location import filesystem, is_remote, protocol_of
from ..source.samples import CLASSIFICATION_LAYOUTS
from ..io.localfs import free_bytes, storage_kind
from .inventory import Inventory, take_inventory
from .measure import (LOCAL, Reader, concurrency_sweep, decode_costs, fit_fixed_cost, image_geometry,
                      memory_bandwidth, read_pass, stall_rates)
from .sampling import stratified_sample
from .verdict import Measurements, Verdict, decide

__all__ = ["analyze", "REPORT_SCHEMA", "REPORT_VERSION", "Measurements", "Verdict", "decide"]

REPORT_SCHEMA = "dsconvert.analyze"
REPORT_VERSION = 1
SUGGESTED_SHORT_SIDE = 256  # a --resize that still allows the usual 224-pixel crops


def _files_per_sample(inv: Inventory) -> float:
    if inv.layout in CLASSIFICATION_LAYOUTS or not inv.entries:
        return 1.0
    stems = {p.rpartition(".")[0] or p for p, _ in inv.entries}
    return len(inv.entries) / max(1, len(stems))


def _remote_storage(url: str) -> Dict[str, Any]:
    """What an object store or other fsspec URL is, in storage_kind's terms."""
    proto = protocol_of(url)
    endpoint = url.split("://", 1)[1].split("/", 1)[0]
    return {"kind": proto, "fstype": proto, "mount": f"{proto}://{endpoint}", "latency_bound": True}


def analyze(src: str, target: Optional[float] = None, sample: int = 200, seed: int = 0,
            time_budget: float = 30.0, output_dir: Optional[str] = None,
            sweep_levels: Optional[List[int]] = None, progress: bool = False,
            log: Optional[Callable[[str], None]] = None,
            storage_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Measure ``src`` (a path, or a URL fsspec reaches, with ``storage_options``) and return
    the report (see the module doc and the README's schema). On object stores every read is a
    request: "cold" is the first request for a file and "warm" a repeated one, and the
    concurrency sweep shows how far parallel requests hide their latency."""
    say = log or (lambda msg: None)
    started = time.perf_counter()
    fs = None
    if is_remote(src):
        fs, root = filesystem(src, storage_options)
        src = src.rstrip("/")
        storage = _remote_storage(src)
        reader = Reader(fs)
    else:
        src = root = os.path.abspath(src)
        storage = storage_kind(src)
        reader = LOCAL
    say(f"inventory of {src} ({storage['kind']}, {storage['fstype']} at {storage['mount']})")
    with progress_bar(progress, "inventory", unit=" files") as bar:
        inv = take_inventory(root, time_budget=time_budget, progress=bar.update, fs=fs)
    picked = stratified_sample(inv.entries, sample, seed)
    if fs is not None:
        base = root if inv.layout != "list" else root.rsplit("/", 1)[0]
        paths = [f"{base}/{p}" for p, _ in picked]
    else:
        base = src if os.path.isdir(src) else os.path.dirname(src)
        paths = [os.path.join(base, p) for p, _ in picked]
    images = [p for p in paths if field_kind(p) == "image"]
    say(f"reading {len(paths)} sampled files cold and warm, sequential and random")
    cold = read_pass(paths, cold=True, order="sequential", reader=reader)
    cold_random = read_pass(paths, cold=True, order="random", seed=seed, reader=reader)
    warm = read_pass(paths, cold=False, order="sequential", reader=reader)
    fixed_ms, fit_mb_s = fit_fixed_cost(cold["latencies_ms"], cold.pop("sizes"))
    for r in (cold_random, warm):  # per-file latencies stay in the report: the HTML plots their ECDFs
        r.pop("sizes")
    cores = available_cpus()
    # object stores keep scaling with concurrent requests well past the core count
    levels = sweep_levels or sorted({1, 2, 4, 8, 16, cores} | ({32, 64} if fs is not None else set()))
    say(f"concurrency sweep over {levels} readers")
    sweep = concurrency_sweep(paths[: max(16, min(len(paths), 128))], levels, reader=reader)
    say(f"decode cost of {len(images)} images per codec and library")
    costs, other = decode_costs(images + [p for p in paths if p.lower().endswith(".npy")], reader=reader)
    pickles = sum(n for ext, n in inv.extensions.items() if ext in ("pkl", "pickle"))
    if pickles:
        other["pickle"] = (f"{pickles} pickle files: unpickling is not measured, since it runs code "
                           "from the data; a decoded npy cache or np.save'd arrays avoid it")
    geometry = image_geometry(images, reader=reader)
    stall = stall_rates(images[:64], reader=reader) if images else {}
    mem_mb_s = memory_bandwidth()

    fps = _files_per_sample(inv)
    num_samples = int(inv.estimated_files / fps) if fps else 0
    mean_sample_bytes = inv.estimated_bytes / max(1, num_samples)
    # the sample's codec mix, weighted as it occurs: library -> ms per sample
    mix: Dict[str, float] = {}
    measured = {c: per for c, per in costs.items() if "pil" in per}
    for lib in sorted({lib for per in measured.values() for lib in per}):
        mix[lib] = sum(per["pil"]["share"] * per.get(lib, per["pil"])["ms"] for per in measured.values())
    decoded = geometry.get("decoded_bytes_mean", 0.0)
    resize = None
    resized = 0.0
    if geometry and geometry["short_side_median"] > SUGGESTED_SHORT_SIDE:
        resize = SUGGESTED_SHORT_SIDE
        h = geometry["height"]["p50"]
        w = geometry["width"]["p50"]
        rh, rw = resized_shape(int(h), int(w), resize=resize)
        resized = decoded * (rh * rw) / max(1.0, h * w)
    out_dir = output_dir or os.getcwd()
    free = free_bytes(out_dir)
    m = Measurements(
        source=src, storage_kind=storage["kind"], latency_bound_storage=storage["latency_bound"],
        num_samples=num_samples, files_per_sample=fps, mean_sample_bytes=mean_sample_bytes,
        fixed_ms=fixed_ms, bandwidth_mb_s=max(r["mb_per_s"] for r in sweep) if sweep else fit_mb_s,
        sweep=[(r["readers"], r["files_per_s"]) for r in sweep],
        prep_only_per_s=stall.get("prep_only_per_s", 0.0), fetch_only_per_s=stall.get("fetch_only_per_s", cold["files_per_s"]),
        both_per_s=stall.get("both_per_s", cold["files_per_s"]), decode_ms=mix, cores=cores,
        numpy_decoder=jpeg_decoders()[0][0],
        decoded_bytes_per_sample=decoded, resized_bytes_per_sample=resized, suggested_resize=resize,
        memory_bandwidth_mb_s=mem_mb_s, free_bytes=free, output_dir=out_dir if output_dir else "OUT", target=target,
        remote=fs is not None,
    )
    verdict = decide(m)
    return {
        "schema": REPORT_SCHEMA, "schema_version": REPORT_VERSION, "source": src,
        "seconds": round(time.perf_counter() - started, 3),
        "storage": storage,
        "inventory": inv.to_dict(),
        "sample": {"files": len(paths), "images": len(images), "seed": seed, "strata": "top-level folder x size quartile"},
        "read": {"cold_sequential": cold, "cold_random": cold_random, "warm": warm,
                 "fixed_ms_per_file": fixed_ms, "fit_bandwidth_mb_s": fit_mb_s},
        "sweep": sweep,
        "decode": {"per_codec": costs, "per_sample_ms": mix, "images": geometry, **other},
        "stall": stall,
        "memory_bandwidth_mb_s": mem_mb_s,
        "disk": {"output_dir": out_dir, "free_bytes": free},
        "measurements": m.__dict__,
        "verdict": verdict.to_dict(),
    }
