"""Benchmark: `dsconvert verify` against `sha256sum` of the same shard files (the checksum
floor) and, for --decode, against decoding the source JPEGs with Pillow in one process, in
interleaved rounds. Page cache warm.

The demo photos are converted to wds and to hdf5 (encoded) once, at most 500 samples a shard
(spread over up to 16 shards), outside the timing. Each round runs every check once, in a
shuffled order: `sha256sum` (a fresh process), `verify` with 1 thread and with the default
threads (the CPUs) best of 3 each, `verify --decode` and Pillow's decode once each. The figures
are the median and range over rounds; the ratios are times over the baseline's time in the same
round (below 1x: faster), their median.

    python -m benchmarks verify --photos 4000 --rounds 3 --json docs/bench/verify.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

from PIL import Image

from benchmarks.common import fmt_spread, ratio_table, spread
from dsconvert import convert, open_dataset
from dsconvert.demo import PHOTOS, load_photos, make_demo_dataset
from dsconvert.processes import available_cpus
from dsconvert.verify import verify

FORMATS = ("wds", "hdf5")
# (name, check, format, baseline check, baseline format): a time over the baseline's, same round
RATIOS = (("verify, default threads / sha256sum, wds", "verify", "wds", "sha256sum", "wds"),
          ("verify, default threads / sha256sum, hdf5", "verify", "hdf5", "sha256sum", "hdf5"),
          ("verify 1 thread / sha256sum, wds", "verify_1thread", "wds", "sha256sum", "wds"),
          ("verify 1 thread / sha256sum, hdf5", "verify_1thread", "hdf5", "sha256sum", "hdf5"),
          ("verify --decode / Pillow 1 process, wds", "verify_decode", "wds", "pil_decode_1proc", ""),
          ("verify --decode / Pillow 1 process, hdf5", "verify_decode", "hdf5", "pil_decode_1proc", ""))


def timed(fn: Callable[[], Any], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
        if isinstance(out, dict):
            assert out["ok"], out
    return best



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", help="a scratch folder (default: one per --photos in the temp dir)")
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    work = args.work or os.path.join(tempfile.gettempdir(), f"dsconvert-bench-verify-{args.photos}")
    classes = len(load_photos(PHOTOS))  # those this scikit-image ships
    src = make_demo_dataset(os.path.join(work, "photos"), num_per_class=-(-args.photos // classes))
    jpegs = sorted(glob.glob(os.path.join(src, "*", "*.jpg")))
    mb: Dict[str, float] = {}
    nshards: Dict[str, int] = {}
    checks: Dict[Tuple[str, str], Callable[[], float]] = {}
    for fmt in FORMATS:
        out = os.path.join(work, fmt)
        convert(src, out, fmt, samples_per_shard=500)
        shards = sorted(glob.glob(os.path.join(out, "shard-*")))
        mb[fmt] = sum(os.path.getsize(f) for f in shards if not f.endswith(".json")) / 1e6
        nshards[fmt] = len(open_dataset(out).manifest.shards)
        checks[("sha256sum", fmt)] = lambda shards=shards: timed(
            lambda: subprocess.run(["sha256sum", *shards], check=True, stdout=subprocess.DEVNULL))
        checks[("verify_1thread", fmt)] = lambda out=out: timed(lambda: verify(out, workers=1))
        checks[("verify", fmt)] = lambda out=out: timed(lambda: verify(out))
        checks[("verify_decode", fmt)] = lambda out=out: timed(lambda: verify(out, decode=True), repeats=1)

    def pil_decode_all() -> None:
        for path in jpegs:
            with Image.open(path) as img:
                img.convert("RGB")

    checks[("pil_decode_1proc", "")] = lambda: timed(pil_decode_all, repeats=1)
    print(f"{len(jpegs)} photos; " + ", ".join(f"{k} {nshards[k]} shards, {v:.0f} MB" for k, v in mb.items()),
          flush=True)

    seconds: Dict[Tuple[str, str], List[float]] = {job: [] for job in checks}
    for r in range(args.rounds):
        order = list(checks)
        random.Random(r).shuffle(order)
        for job in order:
            seconds[job].append(checks[job]())
            print(f"round {r + 1}: {job[0]:18s} {job[1]:5s} {seconds[job][-1]:8.3f} s", flush=True)

    rows = [dict(check=check, format=fmt, **spread(v)) for (check, fmt), v in seconds.items()]
    ratios = []
    for name, check, fmt, base, base_fmt in RATIOS:
        per_round = [a / b for a, b in zip(seconds[(check, fmt)], seconds[(base, base_fmt)])]
        ratios.append(dict(name=name, **spread(per_round)))
    print(f"\n{len(jpegs)} photos, {args.rounds} rounds: seconds, median [range]")
    for row in rows:
        print(f"{row['check']:18s} {row['format']:5s} {row['median']:8.3f} [{row['min']:.3f}-{row['max']:.3f}]")
    for row in ratios:
        print(f"{row['name']:42s} {row['median']:6.2f}x [{row['min']:.2f}-{row['max']:.2f}]")
    if args.json:
        from benchmarks.common import meta as record

        meta = dict(record(), photos=len(jpegs), mb=mb, shards=nshards, samples_per_shard=500,
                    threads=available_cpus(), rounds=args.rounds)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "ratios": ratios}, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    rows = {(r["check"], r["format"]): r for r in data["rows"]}
    threads = meta.get("threads", "?")
    fmts = [f for f in ("wds", "hdf5") if ("verify", f) in rows]
    shards = meta.get("shards", {})
    lines = [f"{meta['photos']:,} demo photos, " + ", ".join(
        f"{f} {shards.get(f, '?')} shards ({meta['mb'][f]:.0f} MB)" for f in fmts)
             + f"; page cache warm, {meta['rounds']} interleaved rounds, seconds, median [range].", "",
             "| check | " + " | ".join(fmts) + " |", "| --- |" + " --- |" * len(fmts)]
    labels = (("sha256sum", "`sha256sum` of the shard files (baseline; best of 3)"),
              ("verify_1thread", "`verify` (sizes, sha256, records, structure), 1 thread, best of 3"),
              ("verify", f"`verify`, {threads} threads (the CPUs), best of 3"),
              ("verify_decode", f"`verify --decode` (every image decoded in full, {threads} processes)"))
    for check, label in labels:
        cells = [fmt_spread(rows[(check, f)], "{:.3f}")
                 for f in fmts]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    pil = rows.get(("pil_decode_1proc", ""))
    if pil:
        lines.append(f"| Pillow decoding the {meta['photos']:,} source JPEGs, 1 process (baseline) | "
                     f"{fmt_spread(pil, '{:.3f}')} |" + " |" * (len(fmts) - 1))
    lines += ratio_table("time over the baseline's (same round; below 1x: faster)",
                         ((r["name"], r) for r in data["ratios"]))
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "24", "--rounds", "1"]
TABLES = {"verify": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds)], "render": render}}
