"""Benchmark: compressed tar shards (.tar.gz, .tar.zst) read in place and converted.

The same samples (demo photos as jpg + cls + json, webdataset's ShardWriter) as plain .tar,
as .tar.gz (``ShardWriter(..., compress=True)``) and as .tar.zst (zstd -3 of the plain tars),
read in one process, samples/s in interleaved rounds:

    webdataset .tar.gz      webdataset.WebDataset(urls): its own streaming reader
    in order                open_dataset(folder, decode="raw", stream=True): in the stream's order
    shuffled stream         the same with shuffle=True (windows of 1,000: steps back in a stream)
    random order            map-style ds[i] in a random permutation (each jump back restarts from
                            a gzip checkpoint, or from the start of a zstd stream)

and the first open's indexing, and ``dsconvert shard`` of each into plain wds shards.

    python -m benchmarks compressed --photos 4000 --rounds 3 --json docs/bench/compressed.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Dict, List

from benchmarks.common import fmt_spread, interleaved, meta, spread


def make_data(work: str, photos: int, per_shard: int) -> Dict[str, str]:
    import webdataset as wds

    from dsconvert.demo import make_demo_dataset
    from dsconvert.source import scan

    src = os.path.join(work, "photos")
    make_demo_dataset(src, num_per_class=-(-photos // 8))
    source = scan(src)
    folders = {k: os.path.join(work, k) for k in ("tar", "tar.gz", "tar.zst")}
    for f in folders.values():
        os.makedirs(f)
    samples = source.samples[:photos]
    for kind, compress in (("tar", False), ("tar.gz", True)):
        with wds.ShardWriter(os.path.join(folders[kind], f"train-%06d.{kind}"), maxcount=per_shard,
                             compress=compress, verbose=0) as sink:
            for i, s in enumerate(samples):
                sink.write({"__key__": f"{i:09d}", "jpg": open(os.path.join(src, s.files[0].path), "rb").read(),
                            "cls": s.label, "json": {"label": source.classes[s.label], "i": i}})
    for tar in sorted(glob.glob(os.path.join(folders["tar"], "*.tar"))):
        out = os.path.join(folders["tar.zst"], os.path.basename(tar) + ".zst")
        subprocess.run(["zstd", "-q", "-3", tar, "-o", out], check=True)
    return folders


def _drop_indexes(folder: str) -> None:
    shutil.rmtree(os.path.join(folder, ".dsconvert-index"), ignore_errors=True)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--photos", type=int, default=4000)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)


def run(a: argparse.Namespace) -> None:
    import webdataset as wds

    from dsconvert import convert, open_dataset

    work = tempfile.mkdtemp(prefix="bench-compressed-")
    try:
        folders = make_data(work, a.photos, a.per_shard)
        sizes = {k: sum(os.path.getsize(p) for p in glob.glob(os.path.join(f, "train-*"))) for k, f in folders.items()}
        n = a.photos
        order = random.Random(0).sample(range(n), n)

        def count(it: Any) -> Callable[[], None]:
            def go() -> None:
                got = sum(1 for _ in it())
                assert got == n, (got, n)
            return go

        def random_order(folder: str) -> Callable[[], None]:
            def go() -> None:
                ds = open_dataset(folder, decode="raw")
                for i in order:
                    ds[i]
            return go

        gz_urls = sorted(glob.glob(os.path.join(folders["tar.gz"], "*.tar.gz")))
        runs: Dict[str, Callable[[], None]] = {
            "webdataset .tar.gz": count(lambda: wds.WebDataset(gz_urls, shardshuffle=False)),
        }
        for kind, folder in folders.items():
            open_dataset(folder, decode="raw")  # indexed once, before the rounds
            runs[f"{kind}, in order"] = count(lambda f=folder: open_dataset(f, decode="raw", stream=True))
            runs[f"{kind}, shuffled stream"] = count(lambda f=folder: open_dataset(f, decode="raw", shuffle=True))
            runs[f"{kind}, random order"] = random_order(folder)
        read = interleaved(runs, a.rounds)

        def index(folder: str) -> Callable[[], None]:
            def go() -> None:
                _drop_indexes(folder)
                open_dataset(folder, decode="raw")
            return go

        def shard(kind: str, folder: str) -> Callable[[], None]:
            def go() -> None:
                out = os.path.join(work, "out-" + kind)
                shutil.rmtree(out, ignore_errors=True)
                convert(folder, out, "wds", workers=2)
            return go

        indexing = interleaved({k: index(f) for k, f in folders.items()}, a.rounds)
        conversion = interleaved({k: shard(k, f) for k, f in folders.items()}, a.rounds)
        data = {
            "meta": meta(), "photos": n, "per_shard": a.per_shard, "bytes": sizes,
            "read_samples_per_s": {k: spread([n / s for s in v]) for k, v in read.items()},
            "index_s": {k: spread(v) for k, v in indexing.items()},
            "convert_samples_per_s": {k: spread([n / s for s in v]) for k, v in conversion.items()},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(data))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    lines = [f"{data['photos']:,} demo photos in shards of {data['per_shard']:,} (jpg + cls + json); bytes: "
             + ", ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in data["bytes"].items()) + ".", "",
             "| read, raw bytes, one process | samples/s, median [range] |", "| --- | --- |"]
    lines += [f"| {k} | {fmt_spread(v)} |" for k, v in data["read_samples_per_s"].items()]
    lines += ["", "| first open (indexing) | seconds | `dsconvert shard` to wds, 2 workers | samples/s |",
              "| --- | --- | --- | --- |"]
    for k in data["index_s"]:
        lines.append(f"| {k} | {fmt_spread(data['index_s'][k], '{:.2f}')} | {k} | "
                     f"{fmt_spread(data['convert_samples_per_s'][k])} |")
    return "\n".join(lines) + "\n"


QUICK: List[str] = ["--photos", "64", "--per-shard", "16", "--rounds", "1"]
TABLES = {"compressed": {"argv": lambda a: ["--rounds", str(a.rounds)], "render": render}}
