"""Benchmark: reading from an S3 protocol server on loopback (moto, through s3fs), with and
without dsconvert's local cache, against the same shards read locally and the source's small
files read from S3, with 0 ms and 10 ms added per request (a delaying TCP proxy); and
conversion on a Dask LocalCluster against the local process pool. Raw bytes in one process
(no DataLoader, no decode), interleaved rounds: every reader and executor once per round, in a
shuffled order; medians and ranges over the rounds, and each ratio the median of the
per-round ratios.

    python -m benchmarks remote --photos 2000 --rounds 3 --json docs/bench/remote.json

The server and the proxies (tests/support/) listen on 127.0.0.1 only; this suite ends the ones it started.
Datasets are opened once per round (outside the timing) and iterated once, as a training
loop's epoch; the cached reader's first and second epochs are one pass each over a fresh cache.
Each executor converts once, untimed, before the rounds (the first pool in a process pays
one-time start-up costs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List

from benchmarks.common import fmt_spread, meta, spread
from dsconvert import convert, open_dataset, open_source
from dsconvert.demo import make_demo_dataset
from tests.support import latency_proxy, s3server

SHARD_SAMPLES = 500


def rate(fn: Callable[[], int], n_expected: int) -> float:
    t = time.perf_counter()
    n = fn()
    seconds = time.perf_counter() - t
    assert n == n_expected, (n, n_expected)
    return n / seconds



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--small-files", type=int, default=300, help="source files read from S3 per pass")
    p.add_argument("--delays", default="0,10", help="ms added per request, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-remote"))
    p.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    from dsconvert.cluster import cluster_executor

    os.environ.update(s3server.CREDENTIALS)
    src = make_demo_dataset(os.path.join(args.work, f"photos-{args.photos}"), num_per_class=args.photos // 8)
    local = os.path.join(args.work, f"wds-{args.photos}")
    convert(src, local, samples_per_shard=SHARD_SAMPLES)
    n = sum(1 for _ in open_dataset(local, decode="raw"))
    shard_bytes = sum(os.path.getsize(os.path.join(local, f)) for f in os.listdir(local) if f.endswith(".tar"))
    shards = sum(1 for f in os.listdir(local) if f.endswith(".tar"))
    tags = [f"{float(d):g}" for d in args.delays.split(",")]
    vals: Dict[str, List[float]] = {}

    def put(key: str, value: float) -> None:
        vals.setdefault(key, []).append(value)

    def converted(name: str) -> float:
        out = os.path.join(args.work, f"convert-{name}")
        shutil.rmtree(out, ignore_errors=True)
        if name == "dask":
            with cluster_executor("local:2") as executor:
                t = time.perf_counter()  # the cluster's start is measured apart
                convert(src, out, samples_per_shard=SHARD_SAMPLES, executor=executor)
                return n / (time.perf_counter() - t)
        t = time.perf_counter()
        convert(src, out, samples_per_shard=SHARD_SAMPLES, workers=2)
        return n / (time.perf_counter() - t)

    started = time.perf_counter()
    server, endpoint = s3server.start()
    proxies: List[subprocess.Popen] = []
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**s3server.storage_options(endpoint))
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        fs.put(local, f"{bucket}/wds", recursive=True)
        first = sorted(os.listdir(src))[0]
        subset = sorted(os.listdir(os.path.join(src, first)))[: args.small_files]
        fs.put([os.path.join(src, first, f) for f in subset], f"{bucket}/small/c/")
        port = int(endpoint.rsplit(":", 1)[1])
        options = {}
        for tag in tags:
            if float(tag):
                proxy, pport = latency_proxy.start(port, float(tag))
                proxies.append(proxy)
                options[tag] = s3server.storage_options(f"http://127.0.0.1:{pport}")
            else:
                options[tag] = s3server.storage_options(endpoint)
        url = f"s3://{bucket}/wds"

        def measure(variant: str) -> None:
            kind, _, tag = variant.partition("@")
            so = options.get(tag)
            if kind == "local":
                ds = open_dataset(local, decode="raw")
                put("local", rate(lambda: sum(1 for _ in ds), n))
            elif kind in ("pool", "dask"):
                put(f"convert_{kind}", converted(kind))
            elif kind == "dask_start":
                t = time.perf_counter()
                with cluster_executor("local:2"):
                    pass
                put("dask_start_s", time.perf_counter() - t)
            elif kind == "small_files":
                small = open_source(f"s3://{bucket}/small", decode="raw", storage_options=so)
                put(variant, rate(lambda: sum(1 for i in range(len(small)) if small[i]), len(subset)))
            elif kind == "s3_wds":
                uncached = open_dataset(url, decode="raw", storage_options=so)
                put(variant, rate(lambda: sum(1 for _ in uncached), n))
            else:  # a fresh cache: its first epoch downloads and verifies, its second reads the copies
                cache = os.path.join(args.work, f"cache-{tag}ms")
                shutil.rmtree(cache, ignore_errors=True)
                cached = open_dataset(url, decode="raw", storage_options=so, cache_dir=cache)
                for epoch in ("first", "second"):
                    put(f"cached_{epoch}@{tag}", rate(lambda: sum(1 for _ in cached), n))

        variants = ["local", "pool", "dask", "dask_start"] + [f"{kind}@{tag}" for tag in tags
                                                             for kind in ("small_files", "s3_wds", "cached")]
        for name in ("pool", "dask"):  # untimed: a process's first pool pays one-time start-up costs
            converted(name)
        for r in range(args.rounds):
            order = list(variants)
            random.Random(r).shuffle(order)
            t = time.perf_counter()
            for variant in order:
                measure(variant)
            print(f"round {r + 1} in {time.perf_counter() - t:.1f} s: " + ", ".join(
                f"{k} {v[-1]:,.2f}" for k, v in vals.items()), flush=True)
    finally:
        for proxy in proxies:
            s3server.end(proxy)
        s3server.stop(server)

    def ratio(a: str, b: str) -> Dict[str, Any]:
        return spread([x / y for x, y in zip(vals[a], vals[b])])

    res: Dict[str, Any] = {
        "meta": meta(), "photos": n, "shards": shards, "shard_samples": SHARD_SAMPLES,
        "shard_bytes": shard_bytes, "small_files": len(subset), "delays_ms": tags, "rounds": args.rounds,
        "wall_s": time.perf_counter() - started,
        "reading": {"local": spread(vals["local"]),
                    **{kind: {tag: spread(vals[f"{kind}@{tag}"]) for tag in tags}
                       for kind in ("small_files", "s3_wds", "cached_first", "cached_second")}},
        "ratios": {"wds_vs_small_files": {tag: ratio(f"s3_wds@{tag}", f"small_files@{tag}") for tag in tags},
                   "cached_second_vs_uncached": {tag: ratio(f"cached_second@{tag}", f"s3_wds@{tag}") for tag in tags},
                   "cached_second_vs_local": {tag: ratio(f"cached_second@{tag}", "local") for tag in tags}},
        "convert": {"pool": spread(vals["convert_pool"]), "dask": spread(vals["convert_dask"]),
                    "dask_vs_pool": ratio("convert_dask", "convert_pool"),
                    "dask_cluster_start_s": spread(vals["dask_start_s"])},
    }
    print(f"\n{n} samples, {args.rounds} rounds: median [range]")
    for k, v in vals.items():
        print(f"{k:28s} {statistics.median(v):12,.2f} [{min(v):,.2f}-{max(v):,.2f}]")
    for k, per_tag in res["ratios"].items():
        for tag, r in per_tag.items():
            print(f"{k + ' ' + tag + ' ms':40s} {r['median']:8.2f}x [{r['min']:.2f}-{r['max']:.2f}]")
    r = res["convert"]["dask_vs_pool"]
    print(f"{'dask_vs_pool':40s} {r['median']:8.2f}x [{r['min']:.2f}-{r['max']:.2f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    tags = data["delays_ms"]
    read, ratios, conv = data["reading"], data["ratios"], data["convert"]

    def cells(per_tag: Dict[str, Any], fmt: str) -> str:
        return " | ".join(fmt_spread(per_tag[t], fmt)
                          if t in per_tag else "" for t in tags)

    lines = [f"{data['photos']:,} demo photos in {data['shards']} wds shards of at most "
             f"{data['shard_samples']} samples ({data['shard_bytes'] / 1e6:.0f} MB) in moto's S3 server on "
             "127.0.0.1 (one Python process), reached through s3fs; a delay > 0 puts a TCP proxy "
             "(`tests/support/latency_proxy.py`) in front of it that delays every request; "
             f"{data['small_files']} of the source's small files are read from S3 per pass. Raw bytes read "
             "in one process (no decode, no DataLoader); datasets opened once per round and iterated once, "
             f"as an epoch. {data['rounds']} interleaved rounds (every reader and executor once per round, "
             "in a shuffled order), median [range]; each ratio is the median of the per-round ratios.", "",
             "| reader | " + " | ".join(f"{t} ms, samples/s" for t in tags) + " |", "| --- |" + " --- |" * len(tags)]
    loc = read["local"]
    lines.append("| local wds shards (baseline) | " + fmt_spread(loc)
                 + " |" * len(tags))
    names = {"small_files": "the source's small files from S3 (one GET each)",
             "s3_wds": "wds shards from S3, no cache (4 MB ranged GETs, 8 at a time)",
             "cached_first": "wds from S3 with `cache_dir`, first epoch (download + verify)",
             "cached_second": "wds from S3 with `cache_dir`, second epoch (local copies)"}
    for key, label in names.items():
        lines.append(f"| {label} | {cells(read[key], '{:,.0f}')} |")
    lines += ["", "| ratio (same round) | " + " | ".join(f"{t} ms" for t in tags) + " |",
              "| --- |" + " --- |" * len(tags)]
    names = {"wds_vs_small_files": "S3 shards vs S3 small files", "cached_second_vs_uncached":
             "cached second epoch vs uncached", "cached_second_vs_local": "cached second epoch vs local shards"}
    for key, label in names.items():
        lines.append(f"| {label} | {cells(ratios[key], '{:.2f}x')} |")
    pool, dask, vs = conv["pool"], conv["dask"], conv["dask_vs_pool"]
    start = conv["dask_cluster_start_s"]
    lines += ["", f"Conversion of the same {data['photos']:,} photos (verification on), same rounds, after one "
              "untimed conversion by each executor:", "",
              "| executor | photos/s | vs the process pool |", "| --- | --- | --- |",
              f"| local process pool, 2 workers | {fmt_spread(pool)} | 1.00x |",
              f"| Dask LocalCluster, 2 single-threaded worker processes | "
              f"{fmt_spread(dask)} | "
              f"{fmt_spread(vs, '{:.2f}x')} |",
              "", f"The cluster's start and close, not included above: "
              f"{fmt_spread(start, '{:.2f}')} s."]
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "32", "--small-files", "8", "--delays", "0,5", "--rounds", "1",
         "--work", os.path.join(tempfile.gettempdir(), "dsconvert-bench-remote-quick")]
TABLES = {"remote": {"argv": lambda a: ["--photos", "2000", "--rounds", str(a.rounds + 2)], "render": render}}
