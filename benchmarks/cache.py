"""Benchmark: reading decoded caches against decoding the original JPEGs, in interleaved rounds.

Readers (samples/s, page cache warm; each measurement a fresh process, whose own peak RSS, VmHWM,
is reported):
  pil_decode        the original JPEGs, read and decoded by Pillow (ImageFolder's loader)
  turbojpeg_decode  the same, decoded by PyTurboJPEG (when libturbojpeg loads)
  hdf5_encoded      dsconvert hdf5 (encoded bytes), decode="numpy"
  hdf5_decoded      dsconvert hdf5 --decode, decode="numpy"
  npy_cache         dsconvert npy, decode="numpy" (zero-copy views of the memory map)
  bare_mmap_slices  np.load(mmap_mode="r") and slicing by the index, nothing else: the floor
Every reader hands each image to the same consumer, a copy into a fresh array (what a collate
does), so that memory is really touched; "npy_view"/"bare_view" skip the copy. A process takes
the best of 3 passes after a warm-up read.
Then the same through a torch DataLoader with 2 workers: a 224x224 crop of each image as a
tensor, stacked into batches of 64, best of 2 epochs after a warm-up epoch (peak RSS counts the
memory-mapped pages a reader touched, and torch's ~300 MB where the reader imports it).

The caches are converted once, outside the timing. Each round runs every measurement once, in a
shuffled order; the figures are the median and range over rounds, the ratios the median of the
per-round ratios.

    python -m benchmarks cache --photos 2000 --rounds 3 --json docs/bench/cache.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List, Tuple

import numpy as np

from benchmarks.common import fmt_range, ratio_table, run_self, spread
from dsconvert import convert, open_dataset
from dsconvert.demo import PHOTOS, load_photos, make_demo_dataset
from dsconvert.source import scan


def _jpegs(work: str) -> List[Tuple[str, int]]:
    src = os.path.join(work, "photos")
    return [(os.path.join(src, s.files[0].path), s.label) for s in scan(src).samples]


class Files:
    """The original JPEGs as a map-style dataset, decoded by ``decoder``."""

    def __init__(self, work: str, decoder: str, transform=None):
        self.items = _jpegs(work)
        self.decoder = decoder
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from dsconvert.codecs import decode_rgb

        path, label = self.items[i]
        with open(path, "rb") as f:
            data = f.read()
        image = decode_rgb(data, self.decoder)
        return (self.transform(image) if self.transform else image), label


class Bare:
    """np.load(mmap) + slicing by the samples index: no dsconvert code at all."""

    def __init__(self, out: str, transform=None):
        self.parts = []
        for rows_path in sorted(glob.glob(os.path.join(out, "*.samples.npy"))):
            pixels = np.load(rows_path.replace(".samples.npy", ".npy"), mmap_mode="r")
            rows = np.load(rows_path).tolist()
            self.parts.append((pixels, rows))
        self.index = [(k, j) for k, (_, rows) in enumerate(self.parts) for j in range(len(rows))]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        k, j = self.index[i]
        pixels, rows = self.parts[k]
        o, h, w, c, label = rows[j]
        image = pixels[o: o + h * w * c].reshape(h, w, c)
        return (self.transform(image) if self.transform else image), label


def copy(image):
    return np.array(image)


def to_tensor(image):
    """A 224x224 crop as a tensor: the fixed-size batches a training step receives."""
    import torch

    return torch.from_numpy(np.array(np.asarray(image)[:224, :224]))


def make(reader: str, work: str, transform=None):
    if reader == "pil_decode":
        return Files(work, "pil", transform)
    if reader == "turbojpeg_decode":
        return Files(work, "turbojpeg", transform)
    if reader in ("bare_mmap_slices", "bare_view"):
        return Bare(os.path.join(work, "npy"), transform)
    folder = {"hdf5_encoded": "hdf5", "hdf5_decoded": "hdf5_decoded", "npy_cache": "npy", "npy_view": "npy"}[reader]
    return open_dataset(os.path.join(work, folder), decode="numpy", transform=transform)


def child(reader: str, work: str, mode: str) -> Dict[str, float]:
    if mode == "single":
        ds = make(reader, work, None if reader.endswith("view") else copy)
        n = len(ds)
        ds[0]
        best = 0.0
        for _ in range(3):
            t = time.perf_counter()
            for i in range(n):
                ds[i]
            best = max(best, n / (time.perf_counter() - t))
    else:
        import torch

        ds = make(reader, work, to_tensor)
        loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2)
        sum(len(labels) for _, labels in loader)
        best = 0.0
        for _ in range(2):
            t = time.perf_counter()
            n = sum(len(labels) for _, labels in loader)
            best = max(best, n / (time.perf_counter() - t))
    return {"per_s": best, "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM, which starts again at exec (ru_maxrss keeps the
    parent's peak across fork + exec, so a child would report at least the parent's)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(reader: str, work: str, mode: str) -> Dict[str, float]:
    out = run_self("cache", ["--child", reader, work, mode], check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


SINGLE = ("pil_decode", "turbojpeg_decode", "hdf5_encoded", "hdf5_decoded", "npy_cache", "bare_mmap_slices",
          "npy_view", "bare_view")
LOADER = ("pil_decode", "turbojpeg_decode", "hdf5_encoded", "npy_cache", "bare_mmap_slices")
MODES = {"single": "single", "dataloader_2_workers": "loader"}
# (name, mode, reader, baseline): the reader's rate over the baseline's, in the same round
RATIOS = (("npy_vs_pil_decode", "single", "npy_cache", "pil_decode"),
          ("npy_vs_turbojpeg_decode", "single", "npy_cache", "turbojpeg_decode"),
          ("hdf5_decoded_vs_pil_decode", "single", "hdf5_decoded", "pil_decode"),
          ("npy_vs_bare_mmap (copying)", "single", "npy_cache", "bare_mmap_slices"),
          ("npy_vs_bare_mmap (views)", "single", "npy_view", "bare_view"),
          ("dataloader_npy_vs_pil_decode", "dataloader_2_workers", "npy_cache", "pil_decode"))



def prepare(work: str, photos: int) -> Dict[str, Any]:
    """The demo photos and their three conversions (once: reused while they match)."""
    src = os.path.join(work, "photos")
    make_demo_dataset(src, num_per_class=-(-photos // len(load_photos(PHOTOS))))  # those this scikit-image ships
    n = len(scan(src).samples)
    mb = {}
    for folder, kw in (("npy", {"format": "npy"}), ("hdf5", {"format": "hdf5"}),
                       ("hdf5_decoded", {"format": "hdf5", "decode": True})):
        out = os.path.join(work, folder)
        m = None
        if os.path.exists(os.path.join(out, "dsconvert.json")):
            m = open_dataset(out).manifest
            if m.num_samples != n:
                m = None
        if m is None:
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            m = convert(src, out, samples_per_shard=1000, **kw).manifest
            print(f"converted {folder}: {m.num_samples} samples, "
                  f"{sum(s.bytes for s in m.shards) / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s", flush=True)
        mb[folder] = sum(s.bytes for s in m.shards) / 1e6
    rows = np.concatenate([np.load(p) for p in sorted(glob.glob(os.path.join(work, "npy", "*.samples.npy")))])
    return {"photos": n, "mb": mb, "mean_height": float(rows["height"].mean()),
            "mean_width": float(rows["width"].mean())}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", help="a scratch folder, kept for reuse (default: one per --photos in the temp dir)")
    p.add_argument("--json")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    work = args.work or os.path.join(tempfile.gettempdir(), f"dsconvert-bench-cache-{args.photos}")
    data = prepare(work, args.photos)
    print(f"dataset: {data['photos']} photos, mean {data['mean_width']:.0f}x{data['mean_height']:.0f}; "
          + ", ".join(f"{k} {v:.0f} MB" for k, v in data["mb"].items()), flush=True)
    from dsconvert.codecs import jpeg_decoders

    has_turbo = "turbojpeg" in [n for n, _ in jpeg_decoders()]
    jobs = [(mode, reader) for mode, readers in (("single", SINGLE), ("dataloader_2_workers", LOADER))
            for reader in readers if has_turbo or reader != "turbojpeg_decode"]
    got: Dict[Tuple[str, str], List[Dict[str, float]]] = {job: [] for job in jobs}
    for r in range(args.rounds):
        order = list(jobs)
        random.Random(r).shuffle(order)
        for mode, reader in order:
            res = run_child(reader, work, MODES[mode])
            got[(mode, reader)].append(res)
            print(f"round {r + 1}: {mode:20s} {reader:18s} {res['per_s']:10,.0f} samples/s   "
                  f"peak RSS {res['peak_rss_mb']:7,.0f} MB", flush=True)

    results: Dict[str, Any] = {"single": [], "dataloader_2_workers": []}
    for mode, reader in jobs:
        rates = [x["per_s"] for x in got[(mode, reader)]]
        rss = [x["peak_rss_mb"] for x in got[(mode, reader)]]
        results[mode].append({"reader": reader, "median_per_s": statistics.median(rates), "min_per_s": min(rates),
                              "max_per_s": max(rates), "rounds": rates, "peak_rss_mb": statistics.median(rss),
                              "peak_rss_mb_min": min(rss), "peak_rss_mb_max": max(rss), "peak_rss_mb_rounds": rss})
    results["ratios"] = []
    for name, mode, reader, base in RATIOS:
        if (mode, reader) in got and (mode, base) in got:
            per_round = [a["per_s"] / b["per_s"] for a, b in zip(got[(mode, reader)], got[(mode, base)])]
            results["ratios"].append(dict(name=name, **spread(per_round)))

    print(f"\n{data['photos']} photos, {args.rounds} rounds: median [range]")
    for mode in MODES:
        for row in results[mode]:
            print(f"{mode:20s} {row['reader']:18s} {row['median_per_s']:10,.0f} samples/s "
                  f"[{row['min_per_s']:,.0f}-{row['max_per_s']:,.0f}]   peak RSS {row['peak_rss_mb']:7,.0f} MB")
    for row in results["ratios"]:
        print(f"ratio {row['name']:34s} {row['median']:8.2f}x [{row['min']:.2f}-{row['max']:.2f}]")
    if args.json:
        from benchmarks.common import meta as record

        meta = dict(record(), rounds=args.rounds, **data)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, **results}, f, indent=1)


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    mb = meta.get("mb", {})
    lines = [f"{meta['photos']:,} demo photos (mean {meta['mean_width']:.0f}x{meta['mean_height']:.0f} pixels); npy "
             f"cache {mb.get('npy', 0):,.0f} MB, hdf5 encoded {mb.get('hdf5', 0):,.0f} MB, hdf5 decoded "
             f"{mb.get('hdf5_decoded', 0):,.0f} MB. Page cache warm; each measurement a fresh process, "
             f"{meta['rounds']} interleaved rounds, median [range]; the ratios are the medians of the per-round "
             "ratios. Peak RSS is the measuring process's own high-water mark (VmHWM): the memory-mapped pages "
             "a reader touched, and torch where the reader's Dataset class imports it.", "",
             "| reader, single process (best of 3 passes) | samples/s | peak RSS MB |", "| --- | --- | --- |"]
    for r in data["single"]:
        lines.append(f"| {r['reader']} | {fmt_range(r['median_per_s'], r['min_per_s'], r['max_per_s'])} | "
                     f"{fmt_range(r['peak_rss_mb'], r['peak_rss_mb_min'], r['peak_rss_mb_max'])} |")
    lines += ["", "| reader, DataLoader 2 workers, 224x224 crops as tensors, batches of 64 | samples/s |",
              "| --- | --- |"]
    for r in data["dataloader_2_workers"]:
        lines.append(f"| {r['reader']} | {fmt_range(r['median_per_s'], r['min_per_s'], r['max_per_s'])} |")
    lines += ratio_table("ratio of rates (same round)", ((r["name"], r) for r in data["ratios"]))
    return "\n".join(lines) + "\n"


QUICK = ["--photos", "24", "--rounds", "1"]
TABLES = {"cache": {"argv": lambda a: ["--photos", "2000", "--rounds", str(a.rounds)], "render": render}}
