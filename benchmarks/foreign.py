"""Benchmark: data users already have, read and converted in place.

Reading the same tar shards written by webdataset's ShardWriter (jpg + cls + json per sample),
through a DataLoader with ``--workers`` workers, samples/s in interleaved rounds:

    webdataset        webdataset.WebDataset(urls) (its own streaming reader)
    dsconvert         open_dataset(folder): the tars indexed by their headers (once) and read by
                      the indexed reader

each raw (the members' bytes) and with the reference train transform (RandomResizedCrop 224 +
flip to a uint8 tensor; webdataset decodes with Pillow, dsconvert as ImageFolder does, and
with ``decode="fused"``); the first open's indexing time is reported too.

Converting a Parquet file written by Hugging Face ``datasets`` (Image + ClassLabel), photos/s:
dsconvert shard to wds (default verification) and to npy --resize 256, against pyarrow's
iter_batches into webdataset's ShardWriter (no verification), the plain way to do it.

    python -m benchmarks foreign --photos 4000 --rounds 3 --json docs/bench/foreign.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List

from benchmarks.common import fmt_range, fmt_spread


def make_data(work: str, photos: int) -> Dict[str, Any]:
    """An ImageFolder of demo photos, the same as ShardWriter tars, and as a Parquet file."""
    import webdataset as wds
    from datasets import ClassLabel, Dataset, Features, Image

    from dsconvert.demo import make_demo_dataset
    from dsconvert.source import scan

    src = os.path.join(work, "photos")
    make_demo_dataset(src, num_per_class=-(-photos // 8))
    source = scan(src)
    samples = source.samples[:photos]
    tars = os.path.join(work, "tars")
    os.makedirs(tars, exist_ok=True)
    images, labels = [], []
    with wds.ShardWriter(os.path.join(tars, "train-%06d.tar"), maxcount=1000, verbose=0) as sink:
        for i, s in enumerate(samples):
            data = open(os.path.join(src, s.files[0].path), "rb").read()
            sink.write({"__key__": f"{i:09d}", "jpg": data, "cls": s.label,
                        "json": {"label": source.classes[s.label], "i": i}})
            images.append({"bytes": data, "path": None})
            labels.append(s.label)
    parquet = os.path.join(work, "train.parquet")
    Dataset.from_dict({"image": images, "label": labels},
                      features=Features({"image": Image(), "label": ClassLabel(names=source.classes)})
                      ).to_parquet(parquet)
    nbytes = sum(len(x["bytes"]) for x in images)
    return {"tars": tars, "parquet": parquet, "photos": len(samples), "bytes": nbytes}


def _loader(ds: Any, workers: int, batch: int, collate: Any) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=collate,
                      persistent_workers=False)


def readers(tars: str, workers: int, batch: int) -> Dict[str, Callable[[], Any]]:
    import webdataset as wds

    from dsconvert import open_dataset
    from dsconvert.transforms import load_transform

    urls = sorted(glob.glob(os.path.join(tars, "*.tar")))
    train = load_transform("train")

    def as_list(b: List[Any]) -> List[Any]:
        return b

    def stack(b: List[Any]) -> Any:
        import torch

        return torch.stack([x for x, _ in b]), torch.tensor([y for _, y in b])

    return {
        "webdataset, raw": lambda: _loader(wds.WebDataset(urls, shardshuffle=False), workers, batch, as_list),
        "dsconvert, raw": lambda: _loader(open_dataset(tars, decode="raw"), workers, batch, as_list),
        "webdataset, train": lambda: _loader(
            wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg", "cls").map_tuple(train, int),
            workers, batch, stack),
        "dsconvert, train": lambda: _loader(open_dataset(tars, label="cls", transform=train), workers, batch, stack),
        "dsconvert, train, decode=fused": lambda: _loader(
            open_dataset(tars, label="cls", transform=train, decode="fused"), workers, batch, stack),
    }


def one_pass(make: Callable[[], Any]) -> float:
    n = 0
    t = time.perf_counter()
    for b in make():
        n += len(b[1]) if isinstance(b, tuple) else len(b)
    return n / (time.perf_counter() - t)


def conversions(parquet: str, work: str, workers: int) -> Dict[str, Callable[[], int]]:
    from dsconvert import convert

    def ours(fmt: str, **kw: Any) -> Callable[[], int]:
        def go() -> int:
            out = os.path.join(work, f"conv-{fmt}")
            shutil.rmtree(out, ignore_errors=True)
            return convert(parquet, out, fmt, workers=workers, **kw).manifest.num_samples
        return go

    def shardwriter() -> int:
        import pyarrow.parquet as pq
        import webdataset as wds

        out = os.path.join(work, "conv-shardwriter")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        n = 0
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=10000, verbose=0) as sink:
            for batch in pq.ParquetFile(parquet).iter_batches(batch_size=256, columns=["image", "label"]):
                for image, label in zip(batch.column("image").to_pylist(), batch.column("label").to_pylist()):
                    sink.write({"__key__": f"{n:09d}", "jpg": image["bytes"], "cls": label})
                    n += 1
        return n

    return {"dsconvert shard --format wds": ours("wds"),
            "dsconvert shard --format npy --resize 256": ours("npy", resize=256),
            "pyarrow + ShardWriter (no verification)": shardwriter}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--photos", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--work", help="a scratch folder (default: a new temporary one, removed after)")
    ap.add_argument("--json")


def run(args: argparse.Namespace) -> None:
    work = args.work or tempfile.mkdtemp(prefix="bench-foreign-")
    data = make_data(work, args.photos)
    print(f"dataset: {data['photos']} photos, {data['bytes'] / 1e6:.1f} MB", flush=True)

    from dsconvert import open_dataset

    shutil.rmtree(os.path.join(data["tars"], ".dsconvert-index"), ignore_errors=True)
    t = time.perf_counter()
    open_dataset(data["tars"])
    index_s = time.perf_counter() - t
    print(f"first open (indexing {len(glob.glob(os.path.join(data['tars'], '*.tar')))} tars): {index_s:.3f} s")

    read = readers(data["tars"], args.workers, args.batch)
    conv = conversions(data["parquet"], work, args.workers)
    rates: Dict[str, List[float]] = {}
    for r in range(args.rounds):
        jobs = list(read.items())
        random.Random(r).shuffle(jobs)
        for name, make in jobs:
            rates.setdefault(name, []).append(one_pass(make))
            print(f"round {r + 1}: {name:34s} {rates[name][-1]:9,.0f} samples/s", flush=True)
        jobs2 = list(conv.items())
        random.Random(r).shuffle(jobs2)
        for name, go in jobs2:
            t = time.perf_counter()
            n = go()
            rates.setdefault(name, []).append(n / (time.perf_counter() - t))
            print(f"round {r + 1}: {name:34s} {rates[name][-1]:9,.0f} photos/s", flush=True)

    def row(name: str, ref: str) -> Dict[str, Any]:
        v = rates[name]
        ratios = [a / b for a, b in zip(v, rates[ref])]
        return {"name": name, "median": statistics.median(v), "min": min(v), "max": max(v),
                "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": v}

    reading = [row(n, "webdataset, raw" if "raw" in n else "webdataset, train") for n in read]
    converting = [row(n, "pyarrow + ShardWriter (no verification)") for n in conv]
    for r in reading + converting:
        print(f"{r['name']:44s} {r['median']:9,.0f} [{r['min']:,.0f}-{r['max']:,.0f}]  {r['ratio']:.2f}x")
    if args.json:
        from benchmarks.common import meta as record

        meta = dict(record(), photos=data["photos"], bytes=data["bytes"], workers=args.workers,
                    batch=args.batch, rounds=args.rounds, index_s=index_s)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "reading": reading, "converting": converting}, f, indent=1)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [f"{meta['photos']:,} photos ({meta['bytes'] / 1e6:.0f} MB) in tar shards by webdataset's ShardWriter "
             f"and in one Parquet file by Hugging Face datasets; {meta['workers']} DataLoader workers, batches of "
             f"{meta['batch']}, {meta['rounds']} interleaved rounds, median [range]; the ratio is the median of the "
             f"per-round ratios. Indexing the tars on first open: {meta['index_s']:.2f} s.", "",
             "| reading the same tars | samples/s | vs webdataset |"]
    for key, head in (("reading", None), ("converting", "| converting the Parquet file | photos/s | "
                                                        "vs pyarrow + ShardWriter |")):
        lines += ["", head] if head else []
        lines.append("| --- | --- | --- |")
        for r in data[key]:
            lines.append(f"| {r['name']} | {fmt_spread(r)} | "
                         f"{fmt_range(r['ratio'], r['ratio_min'], r['ratio_max'], '{:.2f}x')} |")
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "32", "--rounds", "1", "--workers", "0", "--batch", "8"]
TABLES = {"foreign": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds)], "render": render}}
