"""Benchmark: what `dsconvert bench` measures through a real DataLoader, before and after
conversion, in interleaved rounds.

    python -m benchmarks loader --photos 1200 --rounds 3 --json docs/bench/loader.json

The demo photos (an ImageFolder tree of small JPEGs) are converted once to wds shards and to an
npy cache at ``--resize 256``; then each round runs ``dsconvert.bench`` on the three, in a
rotating order, with 0 and 2 workers, cold (pages evicted) and warm, the eval transform and
batches of 64. Per (dataset, workers, cache): samples/s and the wait per batch, median [range];
the ratio to the source is the median of the same round's ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List

from benchmarks.common import fmt_spread, meta, spread
from dsconvert import convert
from dsconvert.bench import bench
from dsconvert.demo import PHOTOS, make_demo_dataset


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=1200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", default="0,2", help="worker counts, comma-separated")
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    workers = [int(w) for w in args.workers.split(",")]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        src = make_demo_dataset(os.path.join(tmp, "photos"), -(-args.photos // len(PHOTOS)))
        paths = {"source (small JPEG files)": src, "wds shards": os.path.join(tmp, "wds"),
                 "npy cache (--resize 256)": os.path.join(tmp, "npy")}
        convert(src, paths["wds shards"], "wds")
        convert(src, paths["npy cache (--resize 256)"], "npy", resize=256)
        sizes = {name: _size(path) for name, path in paths.items()}
        names = list(paths)
        by_path = {path: name for name, path in paths.items()}
        per: Dict[tuple, Dict[str, List[float]]] = {}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            report = bench([paths[n] for n in order], workers=workers, max_samples=args.photos, seed=r)
            rates = {}
            for run in report["runs"]:
                key = (by_path[run["dataset"]], run["workers"], run["cache"])
                entry = per.setdefault(key, {"per_s": [], "wait_p50_ms": [], "worker_cpu_pct": []})
                entry["per_s"].append(run["samples_per_s"])
                entry["wait_p50_ms"].append(run["wait_ms"]["p50"])
                if run["worker_cpu_pct"] is not None:
                    entry["worker_cpu_pct"].append(run["worker_cpu_pct"])
                rates[key] = run["samples_per_s"]
            for (name, w, cache), rate in rates.items():
                base = rates.get((names[0], w, cache))
                per[(name, w, cache)].setdefault("vs_source", []).append(rate / base if base else float("nan"))
            print(f"round {r + 1}: " + ", ".join(f"{n} {w}w {c} {v:,.0f}/s" for (n, w, c), v in rates.items()),
                  flush=True)
    rows = []
    for (name, w, cache), e in per.items():
        rows.append({"dataset": name, "workers": w, "cache": cache, "per_s": spread(e["per_s"]),
                     "wait_p50_ms": spread(e["wait_p50_ms"]), "vs_source": spread(e["vs_source"]),
                     "worker_cpu_pct": statistics.median(e["worker_cpu_pct"]) if e["worker_cpu_pct"] else None})
    rows.sort(key=lambda row: (row["workers"], names.index(row["dataset"]), row["cache"]))
    res = {"meta": dict(meta(), rounds=args.rounds, photos=args.photos, workers=workers, batch=64,
                        transform="eval", bytes=sizes, seconds=round(time.time() - started)), "rows": rows}
    for row in rows:
        print(f"{row['dataset']:28s} {row['workers']}w {row['cache']:4s} {row['per_s']['median']:8,.0f}/s "
              f"[{row['per_s']['min']:,.0f}-{row['per_s']['max']:,.0f}]  {row['vs_source']['median']:.2f}x")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    mb = {name: b / 1e6 for name, b in meta["bytes"].items()}
    lines = [f"{meta['photos']:,} demo photos ({', '.join(f'{n}: {v:,.0f} MB' for n, v in mb.items())}), read by "
             f"`dsconvert bench` through `torch.utils.data.DataLoader` with the eval transform (shorter side to 256, "
             f"centre crop 224, uint8 tensor), batches of {meta['batch']}. Rates are steady-state (first batch to "
             "last); cold evicts every file's pages first. "
             f"{meta['rounds']} interleaved rounds (the datasets in a rotating order), median [range]; the ratio is "
             "the median of the same round's ratios to the source.", "",
             "| dataset | workers | cache | samples/s | vs source | wait p50 ms | worker CPU |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["rows"]:
        cpu = f"{r['worker_cpu_pct']:.0f} %" if r.get("worker_cpu_pct") is not None else "-"
        vs = "(baseline)" if r["dataset"].startswith("source") else fmt_spread(r["vs_source"], "{:.2f}x")
        lines.append(f"| {r['dataset']} | {r['workers']} | {r['cache']} | {fmt_spread(r['per_s'])} | {vs} | "
                     f"{fmt_spread(r['wait_p50_ms'], '{:.1f}')} | {cpu} |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "48", "--rounds", "1", "--workers", "0"]
TABLES = {"loader": {"argv": lambda a: ["--photos", "1200", "--rounds", str(a.rounds)], "render": render}}
