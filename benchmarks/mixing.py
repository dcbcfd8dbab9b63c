"""Benchmark: how well each read mode mixes classes, on a class-sorted source.

A class-sorted ImageFolder (``--classes`` x ``--per-class`` tiny JPEGs) is converted twice,
with dsconvert's default order (a seeded shuffle at write time) and with ``--order source``.
Each read mode's labels are taken over one epoch, and batches of ``--batch`` are scored by
their distinct classes and their label entropy (bits), against a uniform permutation
(``RandomSampler``). The same arithmetic runs at ImageNet's shape (1,000 x 1,281 in shards of
10,000), where the reads are not made, only located. Conversion time with and without the
shuffle is timed in interleaved rounds (the read amplification of a shuffled order is zero:
every sample is still read once, from one place).

    python -m benchmarks mixing --json docs/bench/mixing.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List

import numpy as np

from benchmarks import common


def scores(labels: List[int], batch: int) -> Dict[str, float]:
    """Mean distinct classes and mean label entropy (bits) over the whole batches."""
    a = np.asarray(labels)
    whole = a[: len(a) // batch * batch].reshape(-1, batch)
    distinct, entropy = [], []
    for row in whole:
        _, counts = np.unique(row, return_counts=True)
        p = counts / batch
        distinct.append(len(counts))
        entropy.append(float(-(p * np.log2(p)).sum()))
    return {"classes": float(np.mean(distinct)), "entropy": float(np.mean(entropy))}


def make_source(root: str, classes: int, per_class: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 60, 30)).save(buf, "JPEG", quality=90)
    src = os.path.join(root, "src")
    for c in range(classes):
        folder = os.path.join(src, f"c{c:04d}")
        os.makedirs(folder)
        for i in range(per_class):
            with open(os.path.join(folder, f"{i:04d}.jpg"), "wb") as f:
                f.write(buf.getvalue())
    return src


def real_modes(shuffled: str, source: str, seed: int) -> Dict[str, List[int]]:
    import glob

    import torch
    import webdataset as wds

    from dsconvert import open_dataset

    def stream(out: str, **kw: Any) -> List[int]:
        return [label for _, label in open_dataset(out, decode="raw", **kw)]

    def webdataset_labels(out: str) -> List[int]:
        urls = sorted(glob.glob(os.path.join(out, "*.tar")))
        ds = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(1000).to_tuple("cls")
        return [int(c) for (c,) in ds]

    ds = open_dataset(shuffled, decode="raw")
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
    return {
        "RandomSampler (ImageFolder, shuffle=True)": [ds[i][1] for i in sampler],
        "dsconvert map-style, DataLoader(shuffle=True)": [ds[i][1] for i in sampler],
        "dsconvert stream, stored order": stream(shuffled, stream=True),
        "dsconvert stream, shuffle=True": stream(shuffled, shuffle=True, seed=seed),
        "webdataset .shuffle(1000), dsconvert's shards": webdataset_labels(shuffled),
        "dsconvert stream, shuffle=True, --order source": stream(source, shuffle=True, seed=seed),
        "webdataset .shuffle(1000), --order source shards": webdataset_labels(source),
    }


def imagenet_modes(seed: int) -> Dict[str, np.ndarray]:
    from dsconvert.readers.order import epoch_order
    from dsconvert.shuffle import shuffled_order

    classes, per_class, shard = 1000, 1281, 10000
    n = classes * per_class
    stored = np.asarray(shuffled_order(n, seed)) // per_class
    sizes = [shard] * (n // shard) + ([n % shard] if n % shard else [])
    starts = np.cumsum([0] + sizes[:-1])
    out: Dict[str, np.ndarray] = {
        "RandomSampler": np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))}
    for shuffle in (False, True):
        k, j = epoch_order(sizes, shuffle, 1000, seed, 0).locate(np.arange(n, dtype=np.int64))
        name = "shuffle=True" if shuffle else "stored order"
        out[f"dsconvert stream, {name}"] = stored[starts[k] + j]
        out[f"dsconvert stream, {name}, --order source"] = (starts[k] + j) // per_class
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="conversion timing rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)


def run(a: argparse.Namespace) -> None:
    from dsconvert import convert

    root = tempfile.mkdtemp(prefix="bench-mixing-")
    try:
        src = make_source(root, a.classes, a.per_class)
        outs = {"shuffled": os.path.join(root, "shuffled"), "source": os.path.join(root, "source")}

        def converter(order: str):
            def run() -> None:
                shutil.rmtree(outs[order], ignore_errors=True)
                convert(src, outs[order], order="auto" if order == "shuffled" else "source", workers=2)
            return run

        seconds = common.interleaved({k: converter(k) for k in outs}, a.rounds)
        n = a.classes * a.per_class
        real = {mode: scores(labels, a.batch)
                for mode, labels in real_modes(outs["shuffled"], outs["source"], a.seed).items()}
        big = {mode: scores(labels.tolist(), a.batch) for mode, labels in imagenet_modes(a.seed).items()}
        order_bytes = os.path.getsize(os.path.join(outs["shuffled"], "dsconvert.order.npy"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    data = {"meta": common.meta(), "classes": a.classes, "per_class": a.per_class, "batch": a.batch,
            "real": real, "imagenet": big, "order_file_bytes": order_bytes,
            "convert_samples_per_s": {k: common.spread([n / s for s in v]) for k, v in seconds.items()}}
    print(render(data))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    lines = []
    for title, rows, ref in (
        (f"a real conversion, {data['classes']:,} classes x {data['per_class']} images", data["real"],
         "RandomSampler (ImageFolder, shuffle=True)"),
        ("order arithmetic at ImageNet's shape, 1,000 x 1,281, shards of 10,000", data["imagenet"], "RandomSampler"),
    ):
        lines += [f"**{title}**, batches of {data['batch']}:", "",
                  "| read mode | classes per batch | vs uniform | label entropy (bits) |", "| --- | --- | --- | --- |"]
        base = rows[ref]["classes"]
        for mode, r in rows.items():
            lines.append(f"| {mode} | {r['classes']:.1f} | {r['classes'] / base:.2f}x | {r['entropy']:.2f} |")
        lines.append("")
    conv = data["convert_samples_per_s"]
    lines.append("Conversion of the same source (samples/s, median [range] over interleaved rounds): "
                 + "; ".join(f"`--order {k}` {v['median']:,.0f} [{v['min']:,.0f}-{v['max']:,.0f}]"
                             for k, v in conv.items())
                 + f". Order file: {data['order_file_bytes']:,} bytes "
                 f"({data['order_file_bytes'] / (data['classes'] * data['per_class']):.1f} per sample).")
    return "\n".join(lines) + "\n"


QUICK = ["--classes", "8", "--per-class", "8", "--batch", "16", "--rounds", "1"]
TABLES = {"mixing": {"argv": lambda a: ["--rounds", str(a.rounds)], "render": render}}
