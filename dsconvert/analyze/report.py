"""The analyze report as a terminal table (colour only on a tty) or as JSON.

JSON schema ``dsconvert.analyze`` version 2 (a stable subset; more keys may be added). Version 2
added ``detected`` and ``loader`` and replaced ``stall`` (the single-worker model) with the
DataLoader passes; ``read.fixed_ms_per_file`` may be null (not determined):

    schema, schema_version, source, seconds
    storage      {kind, fstype, mount, latency_bound}
    inventory    {files, bytes, dirs, complete, estimated_files, estimated_bytes, seconds,
                  max_depth, layout, extensions{ext: n}, size_quantiles{p0..p100} (from a sample of
                  at most 50,000 files chosen by their paths' hash; p0 and p100 exact),
                  fanout_quantiles{p0..p100}, size_histogram[{le, count}] (power-of-two bins,
                  exact), stems (distinct names up to the last dot, per folder), sampled}
    sample       {files, images, seed, strata}
    read         {cold_sequential, cold_random, warm: {files, bytes, seconds, files_per_s,
                  mb_per_s, latency_ms{p50,p90,p99}, latency_mean_ms, latencies_ms[] (per file,
                  in read order)}, fixed_ms_per_file, fit_bandwidth_mb_s}
    sweep        [{readers, files_per_s, mb_per_s, latency_ms{...}, files_per_s_runs[], mb_per_s_runs[]}]
                  (each level's median round, and every round's rates: at least 2 rounds)
    decode       {per_codec{codec: {library: {ms, mp_per_s, images, share}}},
                  per_sample_ms{library: ms}, images{width, height, megapixels, ...},
                  npy_load_ms?, npy_not_loaded? (how many .npy files
                  were not loaded, and why), pickle? (why it was not measured)}
    detected     {kind, description, reader, convertible, advice, num_samples, files (count; the
                  inventory's where detect's listing stopped at its cap), files_listed, ...}
    loader       {workers, transform, cache (the passes predictions use: warm when the data
                  fits in half the page cache), passes{name: {cold?, warm, bytes_per_sample,
                  samples, format?, decode?, options?, warm_cpu_ms?, warm_main_cpu_ms? (CPU ms per
                  sample in the steady state: the workers' together, the main process's)}}}: name
                  "source" (as it is), "from memory", and each output made from the sample
    disk         {output_dir, free_bytes}
    measurements the verdict's input (dsconvert.analyze.verdict.Measurements)
    verdict      {bottleneck (what limits loading: storage-latency | small-files | storage-bandwidth |
                  decode | transform | collate-ipc; none when a --target is met; unknown), limit (the
                  same, target or not), summary, evidence[], commands[], alternative[],
                  per_worker_ms{read, overhead, decode, transform, other, total} (they add up),
                  workers, loader_per_s, predicted_per_s{option: n}, predicted_range{option: [low,
                  high]}, output_bytes{option: n}, fits{option: bool}, recommended (the fix, or
                  null), predicted_speedup, speedup_range [low, high], equal_alternatives[] (outputs
                  within the recommended one's range), keeps_up, cache, read_share, notes[]}
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional

from ..units import format_size
from . import sentences as say

__all__ = ["render_text", "render_json"]


def render_json(report: Dict[str, Any]) -> str:
    return json.dumps(report, indent=1, default=float)


def _style(text: str, code: str, tty: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if tty else text


def render_text(report: Dict[str, Any], tty: Optional[bool] = None) -> str:
    if tty is None:
        tty = sys.stdout.isatty()
    v = report["verdict"]
    inv = report["inventory"]
    rd = report["read"]
    lines: List[str] = []
    add = lines.append
    bold = lambda t: _style(t, "1", tty)  # noqa: E731
    add(bold(f"dsconvert analyze {report['source']}"))
    det = report.get("detected") or {}
    if det.get("description"):
        add(f"  what it is: {det['description']}")
    colour = "32" if v["bottleneck"] == "none" else "31"
    add(_style(f"verdict: {v['summary']}", "1;" + colour, tty))
    for e in v["evidence"]:
        add(f"  - {e}")
    if v["commands"]:
        add(bold("fix:"))
        for c in v["commands"]:
            add(f"  {c}")
    if v.get("alternative"):
        add(bold("or:"))
        for c in v["alternative"]:
            add(f"  {c}")
    if v["recommended"]:
        add(f"  {say.fastest(v)}")
    for n in v["notes"]:
        add(f"  note: {n}")
    add("")
    st = report["storage"]
    est = "" if inv["complete"] else f" (walk stopped at the time budget; about {inv['estimated_files']:,} in all)"
    add(bold("source"))
    add(f"  storage    {st['kind']} ({st['fstype']} at {st['mount']})")
    add(f"  files      {inv['files']:,} in {inv['dirs']:,} folders, {format_size(inv['bytes'])}{est}; "
        f"layout {inv['layout']}")
    q = inv["size_quantiles"]
    if q:
        add("  sizes      " + "  ".join(f"{k} {format_size(q[k])}" for k in ("p10", "p50", "p90", "p99", "p100")))
    add("  types      " + ", ".join(f"{k or '(none)'} {n:,}" for k, n in list(inv["extensions"].items())[:6]))
    fq = inv["fanout_quantiles"]
    if fq:
        add(f"  fan-out    {fq['p50']:.0f} files per folder (p50), {fq['p100']:.0f} max; depth {inv['max_depth']}")
    add("")
    add(bold(f"read cost ({report['sample']['files']} sampled files, seed {report['sample']['seed']})"))
    add(f"  {'':18s}{'files/s':>10s}{'MB/s':>10s}{'p50 ms':>10s}{'p90 ms':>10s}{'p99 ms':>10s}")
    for label, key in (("cold, sequential", "cold_sequential"), ("cold, random", "cold_random"), ("warm", "warm")):
        r = rd[key]
        lat = r["latency_ms"]
        add(f"  {label:18s}{r['files_per_s']:10,.0f}{r['mb_per_s']:10,.1f}{lat.get('p50', 0):10.3f}"
            f"{lat.get('p90', 0):10.3f}{lat.get('p99', 0):10.3f}")
    fixed = rd["fixed_ms_per_file"]
    add(f"  per-file fixed cost {fixed:.3f} ms (cold; fitted latency = fixed + size / bandwidth)" if fixed is not None
        else "  per-file fixed cost not determined: the sampled files have about one size")
    sweep = [(r["readers"], r["files_per_s"]) for r in report["sweep"]]
    add(f"  concurrency (cold): {say.concurrency(sweep)}" + (f": {say.concurrency_reading(sweep)}"
                                                             if len(sweep) > 1 else ""))
    add("")
    dec = report["decode"]
    add(bold("decode cost (from memory)"))
    for codec, libs in dec["per_codec"].items():
        if not libs:  # every sampled file of this codec failed to decode
            add(f"  {codec:5s} none of the sampled files decoded (corrupt, truncated, or too large)")
            continue
        share = next(iter(libs.values()))["share"]
        add(f"  {codec:5s} ({share:.0%} of images): " + ", ".join(
            f"{lib} {c['ms']:.2f} ms ({c['mp_per_s']:.0f} MP/s)" for lib, c in libs.items()))
    g = dec.get("images") or {}
    if g:
        add(f"  images     {g['width']['p50']:.0f}x{g['height']['p50']:.0f} median, "
            f"{g['megapixels']['p10']:.2f}-{g['megapixels']['p90']:.2f} MP (p10-p90)")
    if "npy_load_ms" in dec:
        add(f"  np.load    {dec['npy_load_ms']:.3f} ms per file")
    if "npy_not_loaded" in dec:
        add(f"  .npy       {dec['npy_not_loaded']}")
    if "pickle" in dec:
        add(f"  pickle     {dec['pickle']}")
    lo = report.get("loader") or {}
    passes = lo.get("passes") or {}
    if passes:
        pw = v["per_worker_ms"]
        free = report["disk"]["free_bytes"]
        add(bold(f"DataLoader passes ({lo['workers']} workers, transform {lo['transform']}; predictions use the "
                 f"{lo['cache']} passes; free at {report['disk']['output_dir']}: "
                 f"{format_size(free) if free is not None else 'unknown'})"))
        # measured (cold, warm: wall rates less other processes' CPU), the workers' CPU per sample, and
        # the prediction the verdict uses with the gain it states: the same figures
        add(f"  {'':36s}{'cold/s':>10s}{'warm/s':>10s}{'CPU ms':>9s}{'predicted/s':>13s}{'vs as is':>10s}"
            f"{'full size':>12s}")
        base = v["loader_per_s"]
        for name, row in passes.items():
            label = "as it is" if name == "source" else name
            predicted = base if name == "source" else v["predicted_per_s"].get(name)
            vs = f"{predicted / base:.2f}x" if base and predicted and name != "source" else ""
            size = v["output_bytes"].get(name)
            fit = "" if v["fits"].get(name, True) else " (does not fit)"
            cold = f"{row['cold']:10,.0f}" if "cold" in row else f"{'-':>10s}"
            cpu = f"{row['warm_cpu_ms']:9.3f}" if row.get("warm_cpu_ms") else f"{'-':>9s}"
            shown = f"{predicted:,.0f}" if predicted else "-"
            add(f"  {label[:35]:36s}{cold}{row.get('warm', 0.0):10,.0f}{cpu}"
                f"{shown:>13s}{vs:>10s}{format_size(size) if size else '':>12s}{fit}")
        add(f"  {say.breakdown(pw)}")
    if v["keeps_up"] is not None:
        add(_style(f"target: {'the loader keeps up' if v['keeps_up'] else 'the loader cannot keep up'}",
                   "32" if v["keeps_up"] else "31", tty))
    add(f"({report['seconds']:.1f} s)")
    return "\n".join(lines)
