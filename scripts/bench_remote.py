"""Benchmark: reading from an S3 protocol server on loopback (moto, through s3fs), with and
without dsconvert's local cache, against the same shards read locally and the source's small
files read from S3, with 0 ms and 10 ms added per request (a delaying TCP proxy); and
conversion on a Dask LocalCluster against the local process pool. Same run, one process per
reader pass (no DataLoader), raw bytes (no decode).

    python scripts/bench_remote.py --photos 2000 --json bench_remote.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import latency_proxy  # noqa: E402
import s3server  # noqa: E402

from dsconvert import convert, open_dataset  # noqa: E402
from dsconvert.demo import make_demo_dataset  # noqa: E402
from dsconvert.source import open_source  # noqa: E402


def rate(fn, n_expected=None):
    t = time.perf_counter()
    n = fn()
    seconds = time.perf_counter() - t
    if n_expected is not None:
        assert n == n_expected, (n, n_expected)
    return n / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--small-files", type=int, default=300, help="source files read from S3 per pass")
    p.add_argument("--delays", default="0,10", help="ms added per request, comma-separated")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-remote"))
    p.add_argument("--json")
    args = p.parse_args()
    os.environ.update(s3server.CREDENTIALS)
    src = make_demo_dataset(os.path.join(args.work, "photos"), num_per_class=args.photos // 8)
    res = {}
    local = os.path.join(args.work, "wds")
    convert(src, local, samples_per_shard=500)
    n = sum(1 for _ in open_dataset(local, decode="raw"))
    res["samples"] = n
    local_ds = open_dataset(local, decode="raw")
    res["local_wds_per_s"] = rate(lambda: sum(1 for _ in local_ds), n)

    # conversion: Dask LocalCluster(2) against the process pool (2), same tree, same bytes
    from dsconvert.cluster import cluster_executor

    for name in ("pool", "dask"):
        out = os.path.join(args.work, f"convert-{name}")
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        if name == "dask":
            with cluster_executor("local:2") as executor:
                t = time.perf_counter()  # the cluster's start is reported apart
                convert(src, out, samples_per_shard=500, executor=executor)
        else:
            convert(src, out, samples_per_shard=500, workers=2)
        res[f"convert_{name}_per_s"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    with cluster_executor("local:2"):
        pass
    res["dask_local_cluster_start_s"] = time.perf_counter() - t

    server, endpoint = s3server.start()
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**s3server.storage_options(endpoint))
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        fs.put(local, f"{bucket}/wds", recursive=True)
        subset = sorted(os.listdir(os.path.join(src, os.listdir(src)[0])))[: args.small_files]
        fs.put([os.path.join(src, os.listdir(src)[0], f) for f in subset], f"{bucket}/small/c/")
        port = int(endpoint.rsplit(":", 1)[1])
        for delay in (float(d) for d in args.delays.split(",")):
            proxy = None
            if delay:
                proxy, pport = latency_proxy.start(port, delay)
                so = s3server.storage_options(f"http://127.0.0.1:{pport}")
            else:
                so = s3server.storage_options(endpoint)
            tag = f"{delay:g}ms"
            url = f"s3://{bucket}/wds"
            small = open_source(f"s3://{bucket}/small", decode="raw", storage_options=so)
            res[f"s3_small_files_{tag}_per_s"] = rate(lambda: sum(1 for i in range(len(small)) if small[i]),
                                                      len(subset))
            # opened once, iterated per epoch, as a training loop does (the manifest is one request)
            uncached = open_dataset(url, decode="raw", storage_options=so)
            res[f"s3_wds_{tag}_per_s"] = rate(lambda: sum(1 for _ in uncached), n)
            cache = os.path.join(args.work, f"cache-{tag}")
            shutil.rmtree(cache, ignore_errors=True)
            cached = open_dataset(url, decode="raw", storage_options=so, cache_dir=cache)
            for epoch in ("first", "second"):
                res[f"s3_wds_cached_{tag}_{epoch}_epoch_per_s"] = rate(lambda: sum(1 for _ in cached), n)
            if proxy is not None:
                proxy.terminate()
                proxy.wait()
            res[f"ratio_wds_vs_small_files_{tag}"] = res[f"s3_wds_{tag}_per_s"] / res[f"s3_small_files_{tag}_per_s"]
            res[f"ratio_cached_second_epoch_vs_uncached_{tag}"] = (
                res[f"s3_wds_cached_{tag}_second_epoch_per_s"] / res[f"s3_wds_{tag}_per_s"])
            res[f"ratio_cached_second_epoch_vs_local_{tag}"] = (
                res[f"s3_wds_cached_{tag}_second_epoch_per_s"] / res["local_wds_per_s"])
    finally:
        s3server.stop(server)
    res["ratio_dask_vs_pool"] = res["convert_dask_per_s"] / res["convert_pool_per_s"]
    for k, v in res.items():
        print(f"{k:48s} {v:12,.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
