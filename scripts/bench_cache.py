"""Benchmark: reading decoded caches against decoding the original JPEGs, in one run.

Readers (samples/s, page cache warm; each in a fresh process, whose peak RSS is reported):
  pil_decode        the original JPEGs, read and decoded by Pillow (ImageFolder's loader)
  turbojpeg_decode  the same, decoded by PyTurboJPEG (when libturbojpeg loads)
  hdf5_encoded      dsconvert hdf5 (encoded bytes), decode="numpy"
  hdf5_decoded      dsconvert hdf5 --decode, decode="numpy"
  npy_cache         dsconvert npy, decode="numpy" (zero-copy views of the memory map)
  bare_mmap_slices  np.load(mmap_mode="r") and slicing by the index, nothing else: the floor
Every reader hands each image to the same consumer, a copy into a fresh array (what a collate
does), so that memory is really touched; "npy_view"/"bare_view" skip the copy.
Then the same through a torch DataLoader with 2 workers: a 224x224 crop of each image as a
tensor, stacked into batches of 64 (peak RSS counts the memory-mapped pages a reader touched,
and torch's ~300 MB where the reader imports it).

    python scripts/bench_cache.py --photos 2000 --json bench_cache.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from dsconvert import convert, open_dataset  # noqa: E402
from dsconvert.demo import make_demo_dataset  # noqa: E402
from dsconvert.source import scan  # noqa: E402


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
    return {"per_s": best, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(reader: str, work: str, mode: str) -> Dict[str, float]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", reader, work, mode],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-cache"))
    p.add_argument("--json")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    src = os.path.join(args.work, "photos")
    make_demo_dataset(src, num_per_class=-(-args.photos // 8))
    for folder, kw in (("npy", {"format": "npy"}), ("hdf5", {"format": "hdf5"}),
                       ("hdf5_decoded", {"format": "hdf5", "decode": True})):
        out = os.path.join(args.work, folder)
        if not os.path.exists(os.path.join(out, "dsconvert.json")):
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            m = convert(src, out, samples_per_shard=1000, **kw).manifest
            print(f"converted {folder}: {m.num_samples} samples, "
                  f"{sum(s.bytes for s in m.shards) / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s", flush=True)
    from dsconvert.codecs import jpeg_decoders

    readers = ["pil_decode", "turbojpeg_decode", "hdf5_encoded", "hdf5_decoded", "npy_cache",
               "bare_mmap_slices", "npy_view", "bare_view"]
    if "turbojpeg" not in [n for n, _ in jpeg_decoders()]:
        readers.remove("turbojpeg_decode")
    results: Dict[str, Dict] = {"single": {}, "dataloader_2_workers": {}}
    for reader in readers:
        results["single"][reader] = r = run_child(reader, args.work, "single")
        print(f"single      {reader:18s} {r['per_s']:10.0f} samples/s   peak RSS {r['peak_rss_mb']:7.0f} MB", flush=True)
    for reader in ("pil_decode", "turbojpeg_decode", "hdf5_encoded", "npy_cache", "bare_mmap_slices"):
        if reader in readers:
            results["dataloader_2_workers"][reader] = r = run_child(reader, args.work, "loader")
            print(f"dataloader  {reader:18s} {r['per_s']:10.0f} samples/s", flush=True)
    s = results["single"]
    ratios = {
        "npy_vs_pil_decode": s["npy_cache"]["per_s"] / s["pil_decode"]["per_s"],
        "npy_vs_bare_mmap (copying)": s["npy_cache"]["per_s"] / s["bare_mmap_slices"]["per_s"],
        "npy_vs_bare_mmap (views)": s["npy_view"]["per_s"] / s["bare_view"]["per_s"],
        "hdf5_decoded_vs_pil_decode": s["hdf5_decoded"]["per_s"] / s["pil_decode"]["per_s"],
    }
    if "turbojpeg_decode" in s:
        ratios["npy_vs_turbojpeg_decode"] = s["npy_cache"]["per_s"] / s["turbojpeg_decode"]["per_s"]
    d = results["dataloader_2_workers"]
    ratios["dataloader_npy_vs_pil_decode"] = d["npy_cache"]["per_s"] / d["pil_decode"]["per_s"]
    results["ratios"] = ratios
    for k, v in ratios.items():
        print(f"ratio       {k:32s} {v:8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
