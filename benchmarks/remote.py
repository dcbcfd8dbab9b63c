"""Benchmark: reading from an S3 protocol server on loopback (moto, through s3fs), with and
without dsconvert's local cache, against the same shards read locally and the source's small
files read from S3, with 0 ms and 10 ms added per request (a delaying TCP proxy); and
conversion on a Dask LocalCluster against the local process pool. Raw bytes in one process
(no DataLoader, no decode), interleaved rounds: every reader and executor once per round, in a
shuffled order; medians and ranges over the rounds, and each ratio the median of the
per-round ratios.

    python scripts/bench_remote.py --photos 2000 --rounds 3 --json docs/bench/remote.json

The server and the proxies listen on 127.0.0.1 only; this script ends the ones it started.
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
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import latency_proxy  # noqa: E402
import s3server  # noqa: E402
from benchmeta import meta, spread  # noqa: E402

from dsconvert import convert, open_dataset  # noqa: E402
from dsconvert.demo import make_demo_dataset  # noqa: E402
from dsconvert.source import open_source  # noqa: E402

SHARD_SAMPLES = 500


def rate(fn: Callable[[], int], n_expected: int) -> float:
    t = time.perf_counter()
    n = fn()
    seconds = time.perf_counter() - t
    assert n == n_expected, (n, n_expected)
    return n / seconds



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--small-files", type=int, default=300, help="source files read from S3 per pass")
    p.add_argument("--delays", default="0,10", help="ms added per request, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-remote"))
    p.add_argument("--json")
    args = p.parse_args()
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
        "meta": meta(__file__), "photos": n, "shards": shards, "shard_samples": SHARD_SAMPLES,
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


if __name__ == "__main__":
    main()
