"""Benchmark: the training input, end to end, against every peer on the same cores.

Each reader feeds the standard ImageNet transforms to a loader with ``--workers`` workers (or
threads, where that is how the peer works) and ``--batch`` samples per batch, and the
consumer takes uint8 224x224 CHW batches, as a training loop would before moving them to the
GPU. ``train`` is RandomResizedCrop(224) + RandomHorizontalFlip, ``eval`` is Resize(256) +
CenterCrop(224). Readers:

    imagefolder          torchvision.datasets.ImageFolder over the photos (decode by Pillow), shuffle=True
    dsconvert_pil        dsconvert wds shards, decode="pil": the drop-in, map-style, shuffle=True
    dsconvert_numpy      the same, decode="numpy" (the fast JPEG decoder) + the transform
    dsconvert_fused      the same, decode="fused" (the same torchvision transform)
    dsconvert_fused_stream   the streaming reader (stream=True), decode="fused", DataLoader batching
    dsconvert_fused_batched  the streaming reader, batches built in the worker (batch_size= on the dataset)
    dsconvert_fused_restart  dsconvert_fused over shards written with --jpeg-restart (restart-marked JPEGs:
                         only the segments a crop covers are decoded)
    dsconvert_npy        dsconvert npy --resize 256 cache, decode="numpy" + the transform
    dsconvert_npy_fused  the same cache, decode="fused"
    webdataset           webdataset.WebDataset over the same tars, .decode("pil")
    litdata              litdata.StreamingDataset over the photos written by litdata.optimize
    mosaic               MosaicML Streaming over an MDS copy ('jpeg' column)
    ffcv                 FFCV 1.0.2: RGBImageField(write_mode="jpg", jpeg_quality=90), its
                         RandomResizedCrop/CenterCrop decoders, Loader(os_cache=True)
    dali                 NVIDIA DALI, CPU operators (device_id=None), fn.readers.file over the photos

Every reader runs in a fresh process (peers from their own virtual environments:
``--python-ffcv``, ``--python-dali``, ``--python-peers``; torchvision's from ``--python``),
once per round, in a shuffled order per round, so all see the same background load; the
figure is the steady-state rate (samples after the first batch / time after it), the median
over rounds, with the range; ratios are the median of per-round ratios. Peak RSS is the main
process's plus the largest worker's (FFCV and DALI work in threads: theirs is one figure).

    python -m benchmarks train_input --photos 4000 --rounds 3 --json bench_train_input.json
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from benchmarks.common import ROOT, meta, self_command

READERS = ("imagefolder", "dsconvert_pil", "dsconvert_numpy", "dsconvert_fused", "dsconvert_fused_stream",
           "dsconvert_fused_batched", "dsconvert_fused_restart", "dsconvert_npy", "dsconvert_npy_fused",
           "webdataset", "litdata", "mosaic", "ffcv", "dali")
THREADED = ("ffcv", "dali")  # readers that decode in threads of the main process: no worker to report
PEER_PYTHON = {"ffcv": "ffcv", "dali": "dali", "litdata": "peers", "mosaic": "peers", "webdataset": "peers"}


# --- the transforms, as users write them -------------------------------------------------


def torchvision_transform(kind: str) -> Any:
    import torchvision.transforms as T

    if kind == "train":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])


def loader(dataset: Any, workers: int, batch: int, **kw: Any) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=batch, num_workers=workers, **kw)


# --- readers (each runs in a child process and yields batches of (images, labels)) --------


def read_imagefolder(work: str, kind: str, workers: int, batch: int) -> Any:
    from torchvision.datasets import ImageFolder

    return loader(ImageFolder(os.path.join(work, "photos"), torchvision_transform(kind)), workers, batch,
                  shuffle=True)


def _dsconvert(path: str, kind: str, workers: int, batch: int, decode: str, batched: bool = False,
               stream: bool = False) -> Any:
    """The drop-in (map-style, DataLoader(shuffle=True)), or the streaming reader (``stream``),
    or the stream building whole batches in the worker (``batched``)."""
    from dsconvert import open_dataset

    T = torchvision_transform(kind)
    if decode == "numpy":  # the pixels are arrays: the transform starts from a PIL image
        import torchvision.transforms as TV

        T = TV.Compose([TV.ToPILImage()] + T.transforms)
    if batched:
        ds = open_dataset(path, transform=T, decode=decode, batch_size=batch)
        return loader(ds, workers, None)
    if stream:
        return loader(open_dataset(path, transform=T, decode=decode, stream=True), workers, batch)
    return loader(open_dataset(path, transform=T, decode=decode), workers, batch, shuffle=True)


def read_dsconvert_pil(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "wds"), kind, workers, batch, "pil")


def read_dsconvert_numpy(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "wds"), kind, workers, batch, "numpy")


def read_dsconvert_fused(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "wds"), kind, workers, batch, "fused")


def read_dsconvert_fused_stream(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "wds"), kind, workers, batch, "fused", stream=True)


def read_dsconvert_fused_batched(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "wds"), kind, workers, batch, "fused", batched=True)


def read_dsconvert_fused_restart(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "wds-restart"), kind, workers, batch, "fused")


def read_dsconvert_npy(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "npy"), kind, workers, batch, "numpy")


def read_dsconvert_npy_fused(work, kind, workers, batch):
    return _dsconvert(os.path.join(work, "npy"), kind, workers, batch, "fused")


def read_webdataset(work, kind, workers, batch):
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(work, "wds", "*.tar")))
    ds = (wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil").to_tuple("jpg", "cls")
          .map_tuple(torchvision_transform(kind), int))
    return loader(ds, workers, batch)


def read_litdata(work, kind, workers, batch):
    import litdata
    from PIL import Image

    T = torchvision_transform(kind)

    class Images(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return T(Image.open(io.BytesIO(item["image"])).convert("RGB")), item["label"]

    return litdata.StreamingDataLoader(Images(os.path.join(work, "litdata")), batch_size=batch, num_workers=workers)


def read_mosaic(work, kind, workers, batch):
    from streaming import StreamingDataset

    T = torchvision_transform(kind)

    class Images(StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return T(item["image"].convert("RGB")), item["label"]

    ds = Images(local=os.path.join(work, "mds"), shuffle=False, batch_size=batch)
    return loader(ds, workers, batch)


def read_ffcv(work, kind, workers, batch):
    from ffcv.fields.decoders import (
        CenterCropRGBImageDecoder,
        IntDecoder,
        RandomResizedCropRGBImageDecoder,
    )
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

    if kind == "train":
        image = [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
    else:
        image = [CenterCropRGBImageDecoder((224, 224), ratio=224 / 256), ToTensor(), ToTorchImage()]
    return Loader(os.path.join(work, "ffcv.beton"), batch_size=batch, num_workers=workers, os_cache=True,
                  order=OrderOption.SEQUENTIAL, drop_last=False,
                  pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})


def read_dali(work, kind, workers, batch):
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch, num_threads=workers, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=os.path.join(work, "photos"), random_shuffle=False, name="reader")
        if kind == "train":
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=224, resize_y=224)
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                              mirror=fn.random.coin_flip())
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", crop=(224, 224))
        return images, labels

    p = pipe()
    p.build()
    size = p.epoch_size("reader")

    def batches():
        import torch

        seen = 0
        while seen < size:
            images, labels = p.run()
            out = torch.from_numpy(images.as_array()), torch.from_numpy(labels.as_array())
            seen += len(out[0])
            yield out
    return batches()


def _children_cpu() -> float:
    """CPU seconds (user + system) spent so far by this process's living children (DataLoader
    workers), from /proc; 0 where there is no /proc."""
    me, total = os.getpid(), 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid; utime and stime are fields 14 and 15 of stat
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(reader: str, work: str, kind: str, workers: int, batch: int) -> Dict[str, Any]:
    """One reader's pass. ``cpu_per_1000``: CPU seconds of every process and thread (the main
    one's threads, its workers) per 1,000 samples after the first batch: what the pass costs,
    which the machine's load does not change the way it changes samples/s."""
    started = time.perf_counter()
    batches = globals()[f"read_{reader}"](work, kind, workers, batch)
    n = first_n = 0
    t_first = None
    shape = None
    cpu_first = 0.0
    for images, labels in batches:
        if t_first is None:
            t_first, first_n = time.perf_counter(), len(labels)
            cpu_first = _own_cpu() + _children_cpu()
            shape = [tuple(images.shape), str(images.dtype)]
        n += len(labels)
    end = time.perf_counter()
    # the workers have been joined by now (the loader shut them down at its end): theirs is in RUSAGE_CHILDREN
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = _own_cpu() + children.ru_utime + children.ru_stime + _children_cpu() - cpu_first
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_child = children.ru_maxrss / 1024
    return {"reader": reader, "transform": kind, "samples": n, "per_s": (n - first_n) / (end - t_first),
            "startup_s": t_first - started, "seconds": end - started, "peak_rss_mb": rss_self + rss_child,
            "peak_rss_worker_mb": rss_child, "cpu_per_1000": cpu / max(1, n - first_n) * 1000,
            "first_batch": shape}


# --- preparing the copies each reader reads ------------------------------------------------


def prepare_ours(work: str, photos: int, per_shard: int) -> None:
    from dsconvert import convert
    from dsconvert.demo import make_demo_dataset

    src = os.path.join(work, "photos")
    if not os.path.isdir(src):
        make_demo_dataset(src, num_per_class=photos // 8)
    for name, fmt, extra in (("wds", "wds", {}), ("npy", "npy", {"resize": 256}),
                             ("wds-restart", "wds", {"jpeg_restart": True})):
        out = os.path.join(work, name)
        if not os.path.exists(os.path.join(out, "dsconvert.json")):
            convert(src, out, format=fmt, samples_per_shard=per_shard, **extra)


def _photo_list(work: str):
    from dsconvert.source import scan

    src = os.path.join(work, "photos")
    return [(os.path.join(src, s.files[0].path), s.label) for s in scan(src).samples]


def _litdata_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def prepare_peers(work: str) -> None:
    import litdata
    from PIL import Image
    from streaming import MDSWriter

    items = _photo_list(work)
    lit = os.path.join(work, "litdata")
    if not os.path.isdir(lit):
        litdata.optimize(fn=_litdata_item, inputs=items, output_dir=lit, chunk_bytes="64MB", num_workers=1)
    mds = os.path.join(work, "mds")
    if not os.path.isdir(mds):
        with MDSWriter(out=mds, columns={"image": "jpeg", "label": "int"}, size_limit="64mb") as w:
            for path, label in items:
                w.write({"image": Image.open(path), "label": label})


def prepare_ffcv(work: str) -> None:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    out = os.path.join(work, "ffcv.beton")
    if os.path.exists(out):
        return
    items = _photo_list(work)

    class Photos:
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            path, label = items[i]
            return Image.open(path).convert("RGB"), label

    DatasetWriter(out + ".part", {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                  "label": IntField()}, num_workers=2).from_indexed_dataset(Photos())
    os.replace(out + ".part", out)


# --- the parent: rounds, medians, ratios ---------------------------------------------------


def run_child(python: str, args: List[str]) -> Optional[Dict[str, Any]]:
    # a peer's interpreter finds benchmarks and dsconvert in the repository root
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
    proc = subprocess.run(self_command("train_input", *args, python=python), capture_output=True, text=True,
                          env=env, cwd=ROOT)
    if proc.returncode != 0:
        print(f"  {' '.join(args[:3])} failed: {proc.stderr.strip().splitlines()[-1:] }", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(rows: List[Dict[str, Any]], readers: List[str], kinds: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for kind in kinds:
        by_round: Dict[int, Dict[str, float]] = {}
        for r in rows:
            if r["transform"] == kind:
                by_round.setdefault(r["round"], {})[r["reader"]] = r["per_s"]
        table = {}
        for reader in readers:
            rates = [rd[reader] for rd in by_round.values() if reader in rd]
            if not rates:
                continue
            mine = [r for r in rows if r["reader"] == reader and r["transform"] == kind]
            entry = {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "rounds": len(rates),
                     "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in mine)}
            if all("cpu_per_1000" in r for r in mine):  # runs recorded before the CPU figures lack them
                entry["cpu_per_1000"] = statistics.median(r["cpu_per_1000"] for r in mine)
                entry["peak_rss_worker_mb"] = statistics.median(r["peak_rss_worker_mb"] for r in mine)
            for base in ("ffcv", "imagefolder", "dali"):
                ratios = [rd[reader] / rd[base] for rd in by_round.values() if reader in rd and base in rd]
                if ratios and reader != base:
                    entry[f"vs_{base}"] = statistics.median(ratios)
            table[reader] = entry
        out[kind] = table
    return out


def summary_text(summary: Dict[str, Any]) -> str:
    lines = []
    for kind, table in summary.items():
        lines.append(f"\n{kind}: samples/s, median (range) over rounds; ratios are medians of per-round ratios")
        cpu = all("cpu_per_1000" in e for e in table.values())
        lines.append(f"{'reader':26s}{'samples/s':>10s}{'range':>16s}{'vs FFCV':>9s}{'vs IF':>7s}{'RSS MB':>8s}"
                     + (f"{'worker MB':>10s}{'CPU s/1k':>9s}" if cpu else ""))
        for reader, e in table.items():
            lines.append(f"{reader:26s}{e['median']:10,.0f}{e['min']:8,.0f}-{e['max']:<7,.0f}"
                         f"{e.get('vs_ffcv', float('nan')):9.2f}{e.get('vs_imagefolder', float('nan')):7.2f}"
                         f"{e['peak_rss_mb']:8,.0f}"
                         + ((f"{e['peak_rss_worker_mb']:10,.0f}" if reader not in THREADED else f"{'-':>10s}")
                            + f"{e['cpu_per_1000']:9.2f}" if cpu else ""))
    if any("cpu_per_1000" in e for table in summary.values() for e in table.values()):
        lines.append("\nworker MB: a DataLoader worker's peak RSS (FFCV and DALI decode in threads: their RSS MB is "
                     "all of it); CPU s/1k: CPU seconds of every process and thread per 1,000 samples after the "
                     "first batch")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=4000)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--transforms", default="train,eval")
    p.add_argument("--readers", default=",".join(READERS))
    p.add_argument("--work", default=None, help="folder for the datasets (kept between runs)")
    p.add_argument("--python", default=sys.executable, help="a Python with torch, torchvision and dsconvert")
    p.add_argument("--python-ffcv", default=None)
    p.add_argument("--python-dali", default=None)
    p.add_argument("--python-peers", default=None, help="a Python with litdata, mosaicml-streaming, webdataset")
    p.add_argument("--json", default=None)
    p.add_argument("--child", nargs=5, metavar=("READER", "WORK", "KIND", "WORKERS", "BATCH"), help=argparse.SUPPRESS)
    p.add_argument("--prepare", nargs=2, metavar=("WHAT", "WORK"), help=argparse.SUPPRESS)


def run(a: argparse.Namespace) -> int:
    if a.child:
        reader, work, kind, workers, batch = a.child
        print(json.dumps(child(reader, work, kind, int(workers), int(batch))))
        return 0
    if a.prepare:
        {"peers": prepare_peers, "ffcv": prepare_ffcv}[a.prepare[0]](a.prepare[1])
        return 0

    work = a.work or os.path.join(ROOT, ".bench-train-input")
    os.makedirs(work, exist_ok=True)
    pythons = {"ffcv": a.python_ffcv, "dali": a.python_dali, "peers": a.python_peers}
    readers = [r for r in a.readers.split(",") if r]
    unknown = set(readers) - set(READERS)
    if unknown:
        sys.exit(f"unknown readers: {sorted(unknown)}; the readers: {', '.join(READERS)}")
    readers = [r for r in readers if r not in PEER_PYTHON or pythons[PEER_PYTHON[r]]]
    print(f"preparing {a.photos} photos in {work}", file=sys.stderr)
    prepare_ours(work, a.photos, a.per_shard)
    for what in ("peers", "ffcv"):
        if pythons[what] and any(PEER_PYTHON.get(r) == what for r in readers):
            subprocess.run(self_command("train_input", "--prepare", what, work, python=pythons[what]), check=True,
                           env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    kinds = a.transforms.split(",")
    rows: List[Dict[str, Any]] = []
    rng = random.Random(0)
    for rnd in range(a.rounds):
        for kind in kinds:
            order = readers[:]
            rng.shuffle(order)
            for reader in order:
                python = pythons[PEER_PYTHON[reader]] if reader in PEER_PYTHON else a.python
                row = run_child(python, ["--child", reader, work, kind, str(a.workers), str(a.batch)])
                if row is None:
                    continue
                row["round"] = rnd
                rows.append(row)
                print(f"round {rnd} {kind:5s} {reader:26s} {row['per_s']:8,.0f} samples/s "
                      f"({row['samples']} samples, RSS {row['peak_rss_mb']:,.0f} MB)", file=sys.stderr)
    summary = summarise(rows, readers, kinds)
    print(summary_text(summary))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta(), "settings": {k: v for k, v in vars(a).items() if k not in ("child", "prepare")},
                       "cpus": os.cpu_count(), "summary": summary, "rows": rows}, f, indent=1)
    return 0


def render(data: Dict[str, Any]) -> str:
    return "```\n" + summary_text(data["summary"]) + "\n```\n"


README_READERS = {"imagefolder": "`ImageFolder`",
                  "dsconvert_pil": "`open_dataset(out, T)` (`decode=\"pil\"`: decoded as ImageFolder decodes)",
                  "dsconvert_fused": "`open_dataset(out, T, decode=\"fused\")`",
                  "dsconvert_fused_restart": "the same, converted with `--jpeg-restart`",
                  "ffcv": "FFCV (its reference configuration)"}


def render_readme(data: Dict[str, Any]) -> str:
    """The README's table of the drop-in: train and eval transforms, samples/s and the ratios
    (medians of per-round ratios), and the CPU seconds of every process per 1,000 samples."""
    summary = data["summary"]
    train, evaluation = summary.get("train", {}), summary.get("eval", {})

    def ratio(row: Optional[Dict[str, Any]], key: str, name: str, ref: str) -> str:
        if row is None:
            return "–"
        value = 1.0 if name == ref else row.get(key)
        return "–" if value is None or value != value else f"{value:.2f}x"  # nan: not measured

    lines = ["| reader | train: samples/s | vs ImageFolder | vs FFCV | eval: samples/s | vs FFCV "
             "| CPU s per 1,000 (train, eval) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, label in README_READERS.items():
        t, e = train.get(name), evaluation.get(name)
        if t is None and e is None:
            continue
        cpu = ", ".join(f"{r['cpu_per_1000']:.2f}" if r else "–" for r in (t, e))
        lines.append(f"| {label} | {t['median']:,.0f} | " if t else f"| {label} | – | ")
        lines[-1] += (f"{ratio(t, 'vs_imagefolder', name, 'imagefolder')} | {ratio(t, 'vs_ffcv', name, 'ffcv')} | "
                      + (f"{e['median']:,.0f}" if e else "–") + f" | {ratio(e, 'vs_ffcv', name, 'ffcv')} | {cpu} |")
    date = data.get("meta", {}).get("date", "(date not recorded)")
    batch = data.get("settings", {}).get("batch", "?")
    lines += ["", f"*{date}, batches of {batch}; generated by `python -m benchmarks` from docs/bench/dropin.json.*"]
    return "\n".join(lines) + "\n"


DROPIN_READERS = ("imagefolder,dsconvert_pil,dsconvert_numpy,dsconvert_fused,dsconvert_fused_stream,"
                  "dsconvert_fused_batched,ffcv")


def _peer_args(a: argparse.Namespace) -> List[str]:
    out = []
    for flag in ("python_ffcv", "python_dali", "python_peers", "python"):
        value = getattr(a, flag)
        if value:
            out += ["--" + flag.replace("_", "-"), value]
    return out


QUICK = ["--photos", "32", "--per-shard", "16", "--rounds", "1", "--workers", "1", "--batch", "8",
         "--transforms", "eval", "--readers", "imagefolder,dsconvert_pil,dsconvert_fused",
         "--work", os.path.join(tempfile.gettempdir(), "dsconvert-bench-train-input-quick")]
TABLES = {
    "train_input": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds)] + _peer_args(a),
                    "render": render, "needs": lambda a: a.python_ffcv and a.python_peers},
    "dropin": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds), "--batch", "256",
                                  "--readers", DROPIN_READERS] + _peer_args(a),
               "render": render, "readme": render_readme, "needs": lambda a: a.python_ffcv},
    # issue 42's target: the map-style drop-in against FFCV with batches of 64 too
    "dropin_64": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds), "--batch", "64",
                                     "--readers", "dsconvert_fused,ffcv"] + _peer_args(a),
                  "render": render, "needs": lambda a: a.python_ffcv},
    # the drop-in over the source's JPEGs and over restart-marked ones (--jpeg-restart), against FFCV
    "dropin_restart": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds), "--batch", "256",
                                          "--readers", "dsconvert_fused,dsconvert_fused_restart,ffcv"] + _peer_args(a),
                       "render": render, "needs": lambda a: a.python_ffcv},
    "dropin_restart_64": {"argv": lambda a: ["--photos", str(a.photos), "--rounds", str(a.rounds), "--batch", "64",
                                             "--readers", "dsconvert_fused,dsconvert_fused_restart,ffcv"]
                          + _peer_args(a), "render": render, "needs": lambda a: a.python_ffcv},
}
